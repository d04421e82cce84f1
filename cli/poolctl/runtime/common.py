"""What every runtime operation shares: how often to poll and the hint a long wait ends
with.
"""

from __future__ import annotations

import os
import time

from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    Group,
    LaunchFailure,
    NodeState,
    ReportsLaunchFailures,
    RolloutStatus,
)
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


def stalled_launches(ops: CloudOps, group: Group, pool: Pool, cloud: Cloud,
                     since_wall: float, nodes: list[NodeState] | None = None
                     ) -> list[LaunchFailure]:
    """Launches that failed since `since_wall` (epoch seconds), none working after them,
    and nothing in flight: the group will not grow by waiting (the cloud retries, but only
    when capacity returns), so a wait can say why now instead of at its timeout. `nodes`:
    the group's as just read, else read here when there are failures."""
    if not isinstance(ops, ReportsLaunchFailures):
        return []
    placement = pool.placement(cloud)
    assert placement is not None  # a target of the pool's own placements
    failed = ops.launch_failures(group, placement.type_name, since_s=time.time() - since_wall)
    if not failed:
        return []
    # In flight: a pending node that is not itself the one failing (GCE keeps a VM it cannot
    # create, CREATING, while it retries).
    stuck = {f.instance for f in failed if f.instance}
    if any(n.phase == "pending" and n.id not in stuck
           for n in (ops.nodes(group) if nodes is None else nodes)):
        return []
    return failed
