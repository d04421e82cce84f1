"""poolctl's moto extensions (being split by feature: this commit only moves the file)."""

from poolctl.sandbox.extensions.refresh import *  # noqa: F403
