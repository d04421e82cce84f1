"""`poolctl nodes check` (being split into checks, ssh, orchestration: this commit only moves
the file)."""

from poolctl.nodecheck.checks import *  # noqa: F403
from poolctl.nodecheck.checks import _discover, _runner  # noqa: F401
