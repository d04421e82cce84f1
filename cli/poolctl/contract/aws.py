"""The AWS pool stack's contract with the runtime: its Terraform variables (names, types,
defaults) and the instance-refresh settings, for `poolctl_stacks/aws/pool.py` and
`poolctl.clouds.aws` alike."""

from __future__ import annotations

import math
from typing import Any

from poolctl.config import Config, Pool
from poolctl.contract import Var
from poolctl.sizing import PoolPlan

NODE_AMI_ID = Var("node_ami_id", "string", "Node image; empty resolves ami_ssm_parameter.")
REFRESH_MIN_HEALTHY = Var("refresh_min_healthy_percentage", "number",
                          "Instance refresh: healthy capacity kept, % of desired.")
REFRESH_MAX_HEALTHY = Var("refresh_max_healthy_percentage", "number",
                          "Instance refresh: capacity allowed during the refresh, % of desired.")
MIN_NODES = Var("min_nodes", "number",
                "Group minimum; `poolctl warm --running` raises it at runtime.")
LAUNCH_TEMPLATE_VERSION = Var(
    "launch_template_version", "string",
    "Launch template version the group runs; empty: the newest. `rollout start` pins the "
    "running one so that it starts the instance refresh itself, with a desired configuration "
    "(auto rollback then returns to the pinned version).")
WARM_NODES = Var("warm_nodes", "number", "Warm pool minimum; `poolctl warm` sets it at runtime.")
MAX_NODES = Var(
    "max_nodes", "number",
    "Group maximum: the pool's max nodes; `rollout start` adds the surge for the rollout's "
    "time (autoscaling never goes above max_replicas outside one).")


# A pool with fallback types launches On-Demand in the overrides' order: the primary type,
# then each fallback, the first with capacity ("prioritized", the Auto Scaling API
# reference's InstancesDistribution).
ON_DEMAND_ALLOCATION = "prioritized"

# A Capacity Block's ReservationType, and the InstanceMarketOptions.MarketType a launch into
# one carries (EC2 API reference; docs/cloud-facts.md, Capacity Blocks).
CAPACITY_BLOCK = "capacity-block"


def predictive_policy(group: str) -> str:
    """The pool's predictive scaling policy (`scaling.predictive`), which `status` reads."""
    return f"{group}-predictive"


def launch_types(pool: Pool) -> list[str]:
    """The types the group launches, in order; more than one: a mixed instances policy."""
    assert pool.aws is not None  # asked for the pool's aws placement
    return [pool.aws.instance_type, *pool.aws.fallback_instance_types]


def mixed_instances_policy(pool: Pool, template_id: str, version: str) -> dict[str, Any]:
    """The group's MixedInstancesPolicy in the Auto Scaling API's shape (what an instance
    refresh's DesiredConfiguration carries: giving only a launch template would drop the
    policy and with it the fallbacks)."""
    return {
        "LaunchTemplate": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id,
                                            "Version": version},
            "Overrides": [{"InstanceType": t} for t in launch_types(pool)],
        },
        "InstancesDistribution": {"OnDemandAllocationStrategy": ON_DEMAND_ALLOCATION,
                                  "OnDemandBaseCapacity": 0,
                                  "OnDemandPercentageAboveBaseCapacity": 100},
    }


def refresh_percentages(desired: int, surge_nodes: int, no_surge: bool = False
                        ) -> tuple[int, int]:
    """(min, max) healthy percentage of an instance refresh for a group of `desired` nodes.

    With surge, exactly `surge_nodes` extra nodes (floor(d * max / 100) - d) and none out of
    service; without, one node out of service at a time (d - ceil(d * min / 100) = 1). The
    stack's defaults take the file's minimum; a rollout takes the live desired size.
    """
    d = max(desired, 1)
    if surge_nodes and not no_surge:
        return 100, min(200, 100 + math.ceil(100 * surge_nodes / d))
    return (100 * (d - 1)) // d, 100


# instance_refresh.preferences: the provider's argument -> (the API's parameter, its type).
# The provider takes the delays as strings.
_PREFERENCES = {
    "checkpoint_percentages": ("CheckpointPercentages", list),
    "checkpoint_delay": ("CheckpointDelay", int),
    "instance_warmup": ("InstanceWarmup", int),
    "auto_rollback": ("AutoRollback", bool),
    "skip_matching": ("SkipMatching", bool),
    "scale_in_protected_instances": ("ScaleInProtectedInstances", str),
    "standby_instances": ("StandbyInstances", str),
}


def refresh_preferences(pool: Pool, plan: PoolPlan) -> dict[str, Any]:
    """The stack's `instance_refresh.preferences` (provider argument names) but the healthy
    percentages, which are variables."""
    return {
        "checkpoint_percentages": list(pool.rollout.checkpoints),
        "checkpoint_delay": str(pool.rollout.checkpoint_delay_s),
        "instance_warmup": str(int(plan.start_seconds["cold"])),
        "auto_rollback": True,
        "skip_matching": True,
        "scale_in_protected_instances": "Refresh",
        "standby_instances": "Terminate",
    }


def refresh_api_preferences(pool: Pool, plan: PoolPlan, *, desired: int, no_surge: bool
                            ) -> dict[str, Any]:
    """StartInstanceRefresh `Preferences` for a rollout: the stack's preferences with the
    healthy percentages for the group's live size."""
    prefs = {api: conv(v) for k, v in refresh_preferences(pool, plan).items()
             for api, conv in [_PREFERENCES[k]]}
    min_h, max_h = refresh_percentages(desired, plan.nodes.surge, no_surge)
    prefs.update(MinHealthyPercentage=min_h, MaxHealthyPercentage=max_h)
    if prefs["CheckpointPercentages"] == [100]:
        # One batch to the end: no pause needed.
        del prefs["CheckpointPercentages"], prefs["CheckpointDelay"]
    return prefs


def stack_variables(plan: PoolPlan, ami_id: str | None) -> list[tuple[Var, Any]]:
    """Every variable the stack declares, with its default (the file's sizes). `ami_id` is
    the raw config value: Terraform reads variable defaults literally."""
    min_h, max_h = refresh_percentages(plan.nodes.min, plan.nodes.surge)
    out: list[tuple[Var, Any]] = [
        (NODE_AMI_ID, ami_id or ""),
        (REFRESH_MIN_HEALTHY, min_h),
        (REFRESH_MAX_HEALTHY, max_h),
        (MIN_NODES, plan.nodes.min),
        (LAUNCH_TEMPLATE_VERSION, ""),
        (MAX_NODES, plan.nodes.max),
    ]
    if plan.nodes.warm:
        out.append((WARM_NODES, plan.nodes.warm))
    return out


def rollout_env(plan: PoolPlan, *, running_version: str, min_nodes: int, desired_nodes: int,
                warm_min_nodes: int, no_surge: bool) -> dict[str, str]:
    """TF_VAR_... for the apply of `rollout start`: the group pinned to its running version,
    and what `warm` changed at runtime kept."""
    min_h, max_h = refresh_percentages(desired_nodes, plan.nodes.surge, no_surge)
    env = {
        LAUNCH_TEMPLATE_VERSION.env: running_version,
        MIN_NODES.env: str(min_nodes),
        REFRESH_MIN_HEALTHY.env: str(min_h),
        REFRESH_MAX_HEALTHY.env: str(max_h),
        # Room for the surge only while the rollout runs; its end returns the group's
        # maximum to the pool's (`rollout_max_nodes(..., rolling=False)`).
        MAX_NODES.env: str(rollout_max_nodes(plan, no_surge=no_surge, rolling=True)),
    }
    if plan.nodes.warm:  # the stack declares warm_nodes only then
        env[WARM_NODES.env] = str(warm_min_nodes)
    return env


def rollout_max_nodes(plan: PoolPlan, *, no_surge: bool, rolling: bool) -> int:
    """The group's maximum: the pool's max nodes, + the surge while a rollout runs."""
    surge = plan.nodes.surge if rolling and not no_surge else 0
    return plan.nodes.max + surge


def kept_sizes_env(plan: PoolPlan, *, min_nodes: int, warm_min_nodes: int) -> dict[str, str]:
    """TF_VAR_... for a `deploy` that keeps the sizes `poolctl warm` set at runtime."""
    env = {MIN_NODES.env: str(min_nodes)}
    if plan.nodes.warm:  # the stack declares warm_nodes only then
        env[WARM_NODES.env] = str(warm_min_nodes)
    return env


# The stack's warm pool returns instances to it on scale-in (pool.py).
REUSE_ON_SCALE_IN = {"ReuseOnScaleIn": True}


def put_warm_pool_request(group_name: str, *, min_nodes: int, warm_nodes: int, running: bool,
                          reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """PutWarmPool's request as the stack sets the warm pool: room for the group's minimum
    plus the warm nodes, in the pool's state; `warm` and the windows of warm nodes send it."""
    return {"AutoScalingGroupName": group_name, "MinSize": warm_nodes,
            "MaxGroupPreparedCapacity": min_nodes + warm_nodes,
            "PoolState": "Running" if running else "Stopped",
            "InstanceReusePolicy": reuse or REUSE_ON_SCALE_IN}


def dashboard_name(group: str) -> str:
    """The pool's CloudWatch dashboard (the stack creates it): its group's name."""
    return group


def slo_alarm_name(group: str, metric: str) -> str:
    """The pool's alarm on `metric` ("ttft" or "tpot") p90 above its SLO."""
    return f"{group}-{metric}-slo"


def log_group_name(cfg: Config, pool: Pool) -> str:
    """The pool's CloudWatch Logs group: the stack creates it, `poolctl logs` reads it."""
    return f"/poolctl/{cfg.project}/{pool.name}"


def sandbox_env(ami_id: str) -> dict[str, str]:
    """TF_VAR_... of a sandbox deploy: the emulator's image instead of the SSM lookup."""
    return {NODE_AMI_ID.env: ami_id}
