"""What every runtime operation shares: how often to poll and the hint a long wait ends
with.
"""

from __future__ import annotations

import os

from poolctl.cloud import Cloud
from poolctl.clouds.base import RolloutStatus
from poolctl.config import Pool
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import UsageError

# Seconds between polls while waiting (the endpoints may set their own: the sandbox's clock
# moves per call); tests set it low.
POLL_ENV = "POOLCTL_POLL_S"
DEFAULT_POLL_S = 15.0
ROLLOUT_DONE_OK = {RolloutStatus.successful}


def poll_interval(endpoints: CloudEndpoints = REAL_CLOUDS) -> float:
    raw = os.environ.get(POLL_ENV)
    if not raw:
        return endpoints.poll_s if endpoints.poll_s is not None else DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{POLL_ENV}={raw}: not a number of seconds; unset it or give e.g. 15"
                         ) from None
    return max(0.0, value)


def watch_hint(cloud: Cloud, file: str | os.PathLike[str] | None, pool: Pool,
               endpoints: CloudEndpoints = REAL_CLOUDS, what: str = "status") -> str:
    parts = ["poolctl", *what.split(), "--cloud", cloud]
    if file:
        parts += ["-f", str(file)]
    parts += ["--pool", pool.name]
    if endpoints.flag:
        parts.append(endpoints.flag)
    return " ".join(parts)
