"""The GCP pool stack's contract with the runtime: its Terraform variables (names,
defaults, the zone rule of a regional MIG's fixed surge) and the MIG's sizes and
rolling-update numbers, for `poolctl_stacks/gcp/pool.py` and `poolctl.clouds.gcp` alike.

The variables' meaning is the runtime's (`GcpOps.set_capacity`): `min_nodes` excludes a
running warm pool, which `warm_nodes` adds to the autoscaler's minimum; `max_nodes` is the
autoscaler's maximum as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poolctl.config import Pool
from poolctl.contract import Var
from poolctl.sizing import PoolPlan

_KEEPS = "poolctl's runtime commands pass it so that their apply keeps what `warm` set"
MIN_NODES = Var("min_nodes", "number",
                f"Autoscaler minimum in serving nodes, a running warm pool excluded; {_KEEPS}.")
MAX_NODES = Var("max_nodes", "number",
                f"Autoscaler maximum in nodes (a running warm pool included); {_KEEPS}.")
WARM_NODES = Var("warm_nodes", "number",
                 "Warm nodes: the standby pool's stopped VMs, or with a running warm pool nodes "
                 f"added to the autoscaler minimum; {_KEEPS}.")
MAX_SURGE_FIXED = Var("max_surge_fixed", "number",
                      "Rolling update: VMs created above the target size; `rollout start "
                      "--no-surge` passes 0.")
MAX_UNAVAILABLE_FIXED = Var("max_unavailable_fixed", "number",
                            "Rolling update: VMs down at a time; `rollout start --no-surge` "
                            "passes the zone count.")
# A regional MIG takes a fixed surge / unavailability of 0 or at least its zone count
# (google provider docs, update_policy): the stack refuses other values at plan time.
ZONE_RULED = (MAX_SURGE_FIXED, MAX_UNAVAILABLE_FIXED)


def update_fixed(surge_nodes: int, zones: int, no_surge: bool = False) -> tuple[int, int]:
    """(max_surge_fixed, max_unavailable_fixed) of the MIG's rolling update: the surge
    (`plan_pool` already raised it to the zone count), or without one, one node per zone
    down at a time."""
    if surge_nodes and not no_surge:
        return surge_nodes, 0
    return 0, max(zones, 1)


@dataclass(frozen=True)
class MigSizes:
    target_size: int  # running nodes at creation (the autoscaler takes over)
    min_nodes: int
    max_nodes: int
    standby: int  # stopped (or suspended) nodes in the standby pool
    max_surge: int
    max_unavailable: int


def mig_sizes(pool: Pool, plan: PoolPlan, zones: int) -> MigSizes:
    """Node counts of the group, its autoscaler and its rolling updates.

    A MIG standby pool holds only stopped or suspended VMs, so a `running` warm pool cannot
    stand aside as on AWS: its nodes join the serving set (min and max both grow by it, which
    is what `plan` prices and counts against quota). A stopped warm pool is the standby pool.
    """
    n = plan.nodes
    running_warm = n.warm if pool.warm_pool.state == "running" else 0
    surge, unavailable = update_fixed(n.surge, zones)
    return MigSizes(
        target_size=n.min + running_warm,
        min_nodes=n.min + running_warm,
        max_nodes=n.max + running_warm,
        standby=n.warm - running_warm,
        max_surge=surge,
        max_unavailable=unavailable,
    )


def stack_variables(plan: PoolPlan, sizes: MigSizes) -> list[tuple[Var, Any]]:
    """Every variable the stack declares, with its default (the file's sizes)."""
    return [
        (MIN_NODES, plan.nodes.min),
        (MAX_NODES, sizes.max_nodes),
        (WARM_NODES, plan.nodes.warm),
        (MAX_SURGE_FIXED, sizes.max_surge),
        (MAX_UNAVAILABLE_FIXED, sizes.max_unavailable),
    ]


# The MIG's versions during a rollout (`GcpOps`): their names carry what poolctl is doing,
# so that any poolctl reading the group (`rollout status` elsewhere) knows it. The stack
# creates the one version PRIMARY and ignores `version` after that (poolctl_stacks/gcp/pool.py):
# the runtime owns it, and a `deploy` never undoes a rollout in progress.
VERSION_PRIMARY = "primary"  # one template: no rollout, or the last (100 %) step
VERSION_STABLE = "stable"  # the template the pool ran before the rollout
VERSION_CANARY = "canary"  # the new template at the step's percentage, driven on by poolctl
VERSION_HELD = "canary-held"  # the same, held by `rollout cancel`
VERSION_ROLLBACK = "rollback"  # one template again: the one the rollout started from


def canary_steps(pool: Pool) -> list[int]:
    """The steps of a GCP rollout: the pool's checkpoints (the same `rollout.checkpoints`
    the AWS instance refresh pauses at), each a canary of that percentage of the group's
    serving size; the last step, 100 %, points the MIG at the new template alone. Poolctl
    moves on once the canary's VMs are healthy and `checkpoint_delay_s` has passed."""
    return sorted({int(c) for c in pool.rollout.checkpoints if 0 < c < 100}) + [100]


def rollout_env(*, min_nodes: int, max_nodes: int, warm_min_nodes: int,
                no_surge_zones: int | None) -> dict[str, str]:
    """TF_VAR_... for the apply that writes a new template: the autoscaler's bounds and the
    standby size as `warm` left them; with `no_surge_zones` (the MIG's zone count) an update
    that replaces one VM per zone at a time instead of surging."""
    env = {MIN_NODES.env: str(min_nodes), MAX_NODES.env: str(max_nodes),
           WARM_NODES.env: str(warm_min_nodes)}
    if no_surge_zones is not None:
        surge, unavailable = update_fixed(0, no_surge_zones, no_surge=True)
        env |= {MAX_SURGE_FIXED.env: str(surge), MAX_UNAVAILABLE_FIXED.env: str(unavailable)}
    return env


def dashboard_name(mig: str) -> str:
    """The pool's Cloud Monitoring dashboard's display name (the stack creates it): its
    MIG's name."""
    return mig


def slo_policy_name(mig: str, metric: str) -> str:
    """The display name of the pool's alert policy on `metric` ("ttft" or "tpot") p90 above
    its SLO."""
    return f"{mig}-{metric}-slo"
