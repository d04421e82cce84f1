"""Warm pool instances (`warm`, `status`).

moto stores the PutWarmPool configuration but never launches warm instances. Here the pool
holds real moto EC2 instances, tagged like the group's instances, stopped or running per
PoolState, listed by DescribeWarmPool with LifecycleState Warmed:Stopped / Warmed:Running /
Warmed:Hibernated (Warmed:Pending:Wait while a launch hook is open). Size, per the PutWarmPool
reference: max(MinSize, MaxGroupPreparedCapacity - Desired), with MaxSize in place of
MaxGroupPreparedCapacity when that is unset or -1. Scale-out takes warm instances first
(started if stopped), then the pool is refilled; the group's WarmPoolSize is reported.
DeleteWarmPool and DeleteAutoScalingGroup terminate them. DescribeWarmPool on an unknown
group is a ValidationError (moto: HTTP 500). Capacity (capacity.py): a warm instance
launches (and runs) before it stops, so filling the pool needs capacity; a stopped one holds
none, so starting it (scale-out, or a Running pool) is a launch that can fail: it stays in
the pool and the group launches a new instance where there is room.
Not emulated: InstanceReusePolicy (scale-in never returns instances to the pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from poolctl.sandbox.extensions import activities, capacity
from poolctl.sandbox.extensions.common import (
    LOCK,
    ec2_state,
    find_group,
    group_version,
    warm_states,
)
from poolctl.sandbox.extensions.launches import (
    clear_actions,
    launch_hooks,
    new_group_state,
    open_actions,
    run_instances,
    terminate,
)

NAMES = ("autoscaling.warm-pool-instances",)

_WARM_SETTLED = {
    "Stopped": "Warmed:Stopped",
    "Running": "Warmed:Running",
    "Hibernated": "Warmed:Hibernated",
}


def warm_pool_target_size(
    min_size: int | None, max_prepared: int | None, max_size: int, desired: int
) -> int:
    """Warm pool size per the PutWarmPool reference (MaxGroupPreparedCapacity -1 = unset)."""
    base = max_size if max_prepared is None or int(max_prepared) < 0 else int(max_prepared)
    return max(int(min_size or 0), base - desired, 0)


def settle_warm(backend: Any, group: Any, state: Any) -> None:
    """Bring a warm instance to the pool's state (Warmed:Stopped means the instance stops).
    Starting a stopped one for a Running pool is a launch: without capacity it stays
    Warmed:Stopped, and the group tries again later."""
    pool_state = group.warm_pool.pool_state if group.warm_pool else "Stopped"
    target = _WARM_SETTLED.get(pool_state, "Warmed:Stopped")
    instance_state = ec2_state(state.instance)
    if target == "Warmed:Running" and instance_state == "stopped":
        try:
            backend.ec2_backend.start_instances([state.instance.id])
        except capacity.CapacityError as exc:
            state.lifecycle_state = "Warmed:Stopped"
            _start_failed(group, state, exc, "into")
            return
    elif target != "Warmed:Running" and instance_state == "running":
        backend.ec2_backend.stop_instances([state.instance.id])
    state.lifecycle_state = target


def _start_failed(group: Any, state: Any, exc: Any, warm: str) -> None:
    """A stopped warm instance could not start: `warm` "from" (taken for scale-out) or
    "into" (a Running pool); recorded, and the group tries again later."""
    if warm == "from":
        cause = activities.launch_cause(len(group.active_instances()),
                                        group.desired_capacity or 0)
    else:
        cause = activities.warm_state_cause()
    activities.record_failure(group, state.instance.placement.zone, state.instance.subnet_id,
                              exc.message, cause, warm)
    activities.note_shortfall(group)


def reconcile_warm_pool(group: Any) -> None:
    """Bring the pool to its target size (launching or terminating) and each settled
    instance to the pool's state."""
    backend = group.autoscaling_backend
    warm = warm_states(group)
    warm[:] = [s for s in warm if ec2_state(s.instance) not in ("terminated", "shutting-down")]
    wp = group.warm_pool
    target = (
        0
        if wp is None
        else warm_pool_target_size(
            wp.min_size, wp.max_group_prepared_capacity, group.max_size or 0,
            group.desired_capacity or 0,
        )
    )
    if len(warm) > target:
        extra = warm[target:]
        del warm[target:]
        terminate(backend, [s.instance.id for s in extra])
    elif len(warm) < target:
        missing = target - len(warm)
        if len(launch_warm(group, missing, group_version(group))) < missing:
            activities.note_shortfall(group)
    for state in warm:
        if state.lifecycle_state in _WARM_SETTLED.values():
            settle_warm(backend, group, state)


def launch_warm(group: Any, count: int, version: Any | None,
                cause: str | None = None) -> list[Any]:
    """Launch up to `count` instances into the group's warm pool from `version`, one after
    the other (fewer when capacity runs out: a warm instance runs until it settles, or its
    launch hook completes, and then stops)."""
    from moto.autoscaling.models import InstanceState

    backend = group.autoscaling_backend
    hooks = launch_hooks(backend, group)
    pool = len(warm_states(group))
    cause = cause or activities.launch_cause(pool, pool + count, warm=True)
    states: list[Any] = []
    for _ in range(count):
        launched = run_instances(group, 1, version, warm="into", cause=cause)
        if not launched:
            break
        instance = launched[0]
        state = InstanceState(
            instance,
            lifecycle_state="Warmed:Pending:Wait" if hooks else "Warmed:Pending",
            autoscaling_group=group,
        )
        warm_states(group).append(state)
        if hooks:
            open_actions(backend, group, state, hooks)
        else:
            settle_warm(backend, group, state)
        states.append(state)
    return states


def _take_from_warm_pool(group: Any, count: int) -> list[Any]:
    """Scale-out: move up to `count` warm instances into the group (settled ones first).
    A stopped one that cannot start (no capacity in its zone: a stopped instance holds
    none) stays in the pool, the failure recorded."""
    warm = warm_states(group)
    if count <= 0 or not warm:
        return []
    backend = group.autoscaling_backend
    ordered = sorted(warm, key=lambda s: s.lifecycle_state not in _WARM_SETTLED.values())
    moved: list[Any] = []
    for state in ordered:
        if len(moved) == count:
            break
        kind = "warm_stopped" if ec2_state(state.instance) == "stopped" else "warm_running"
        if kind == "warm_stopped":
            try:
                backend.ec2_backend.start_instances([state.instance.id])
            except capacity.CapacityError as exc:
                _start_failed(group, state, exc, "from")
                continue
        warm.remove(state)
        hooks = launch_hooks(backend, group)
        state.lifecycle_state = "Pending:Wait" if hooks else "InService"
        state.protected_from_scale_in = group.new_instances_protected_from_scale_in
        clear_actions(state)
        if hooks:
            open_actions(backend, group, state, hooks, kind)
        group.instance_states.append(state)
        moved.append(state)
    return moved


def _instance_dict(state: Any) -> dict[str, Any]:
    out = {
        "InstanceId": state.instance.id,
        "InstanceType": state.instance.instance_type,
        "AvailabilityZone": state.instance.placement.zone,
        "LifecycleState": state.lifecycle_state,
        "HealthStatus": state.health_status,
        "ProtectedFromScaleIn": bool(state.protected_from_scale_in),
    }
    lt = state.launch_template
    if lt:
        out["LaunchTemplate"] = lt
    elif state.launch_configuration_name:
        out["LaunchConfigurationName"] = state.launch_configuration_name
    return out


def _describe_warm_pool(self: Any) -> Any:
    from moto.core.responses import ActionResult

    group = find_group(self.autoscaling_backend, self._get_param("AutoScalingGroupName"))
    reconcile_warm_pool(group)
    instances = [_instance_dict(s) for s in warm_states(group)]
    start = int(self._get_param("NextToken") or 0)
    limit = int(self._get_param("MaxRecords") or 50)
    page = instances[start : start + limit]
    result: dict[str, Any] = {"WarmPoolConfiguration": group.warm_pool, "Instances": page}
    if start + limit < len(instances):
        result["NextToken"] = str(start + limit)
    return ActionResult(result)


def install() -> None:
    from moto.autoscaling.models import AutoScalingBackend, FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse

    AutoScalingResponse.describe_warm_pool = _describe_warm_pool  # type: ignore[method-assign]  # moto extension: real warm instances

    def replace_instances(self: Any, count_needed: int, propagated_tags: dict[str, str]) -> None:
        with LOCK:
            current = len(self.active_instances())
            remaining = count_needed - len(_take_from_warm_pool(self, count_needed))
            if remaining <= 0:
                return
            backend = self.autoscaling_backend
            cause = activities.launch_cause(current, current + count_needed)
            launched = run_instances(self, remaining, group_version(self), propagated_tags,
                                     cause=cause)
            for instance in launched:
                self.instance_states.append(new_group_state(backend, self, instance))
            if len(launched) < remaining:
                activities.note_shortfall(self)

    FakeAutoScalingGroup.replace_autoscaling_group_instances = replace_instances  # type: ignore[method-assign]  # moto extension: warm pool first
    FakeAutoScalingGroup.warm_pool_size = property(  # type: ignore[attr-defined]  # moto extension: new attribute
        lambda self: len(warm_states(self)) if self.__dict__.get("warm_pool") is not None
        else None
    )

    orig_set_desired = FakeAutoScalingGroup.set_desired_capacity

    def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
        with LOCK:
            orig_set_desired(self, new_capacity)
            if self.__dict__.get("warm_pool") is not None or warm_states(self):
                reconcile_warm_pool(self)

    FakeAutoScalingGroup.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]  # moto extension: warm pool kept

    def after(method: str, fn: Callable[..., None]) -> None:
        orig = getattr(AutoScalingBackend, method)

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            with LOCK:
                out = orig(self, *args, **kwargs)
                fn(self, *args, **kwargs)
                return out

        setattr(AutoScalingBackend, method, wrapped)

    def reconcile_named(self: Any, *args: Any, **kwargs: Any) -> None:
        name = kwargs.get("group_name") or kwargs.get("name") or (args[0] if args else None)
        group = self.autoscaling_groups.get(name)
        if group is not None:
            reconcile_warm_pool(group)

    after("put_warm_pool", reconcile_named)
    after("delete_warm_pool", reconcile_named)
    after("update_auto_scaling_group", reconcile_named)

    orig_delete = AutoScalingBackend.delete_auto_scaling_group

    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        with LOCK:
            group = self.autoscaling_groups.get(group_name)
            if group is not None:
                group.warm_pool = None
                reconcile_warm_pool(group)
            orig_delete(self, group_name)

    AutoScalingBackend.delete_auto_scaling_group = delete_auto_scaling_group  # type: ignore[method-assign]  # moto extension: warm instances too


def reset() -> None:
    """Nothing kept outside moto's backends."""
