"""Auto Scaling instance refresh (`rollout start/status/cancel/rollback`).

StartInstanceRefresh, DescribeInstanceRefreshes, CancelInstanceRefresh and
RollbackInstanceRefresh, added to moto's `AutoScalingResponse`. Preferences honoured:
MinHealthyPercentage / MaxHealthyPercentage (batch size), CheckpointPercentages and
CheckpointDelay (pause at each checkpoint; a last checkpoint below 100 is a partial refresh),
SkipMatching, AutoRollback, ScaleInProtectedInstances, StandbyInstances, BakeTime. Instances
are really replaced, in AWS's order: with MaxHealthyPercentage above 100 a batch's replacements
are launched first and the instances they replace terminated once the replacements are
InService (so a one-node pool never has none); at 100, terminated first, then launched. New
ones come from the desired (or the group's current) launch template version; the warm pool
is refreshed after the live pool; on success the DesiredConfiguration becomes the group's.

CLOCK: time does not pass on its own. Every DescribeInstanceRefreshes call for a group
reports the refreshes as they are, then advances the group's active refresh by ONE step:
Pending -> InProgress; one batch replaced; a checkpoint's CheckpointDelay elapsed; the warm
pool replaced; Baking -> Successful; Cancelling -> Cancelled; one rollback batch. So a caller
polling Describe sees every state, and tests need no sleep.

A replacement counts in PercentageComplete once it is InService. One that cannot launch (no
capacity, capacity.py) holds the refresh: each step tries it again, StatusReason "Waiting to
launch N replacement instance(s): <the failed launch's StatusMessage>". A refresh waits while its
replacements are in Pending:Wait (lifecycle hooks), and fails (or auto-rolls back) when one of
them is marked Unhealthy (SetInstanceHealth), the sandbox's stand-in for failed health checks,
or ends before it was InService (its launch hook ABANDONed: an EC2 launch failure).
"Wait" for protected or standby instances lasts WAIT_STEPS steps (AWS: one hour), then the
refresh fails.
Not emulated: InstanceWarmup (no warm-up time), AlarmSpecification (accepted, never fires).
"""

from __future__ import annotations

import copy
import math
import uuid
from datetime import datetime
from typing import Any

from poolctl.sandbox.extensions import activities
from poolctl.sandbox.extensions.common import (
    autoscaling_error,
    find_group,
    group_version,
    now,
    on_group_delete,
    refresh_load_balancers,
    resolve_template,
    stored,
    template_version,
    validation_error,
    warm_states,
)
from poolctl.sandbox.extensions.launches import (
    launched_from,
    new_group_state,
    run_instances,
    terminate,
)
from poolctl.sandbox.extensions.warm_pool import launch_warm, reconcile_warm_pool

NAMES = ("autoscaling.instance-refresh",)

_ACTIVE_REFRESH = {"Pending", "InProgress", "Baking", "Cancelling", "RollbackInProgress"}
_REVERSIBLE = {"Pending", "InProgress", "Baking"}
# How many Describe steps a refresh waits for protected / standby instances ("Wait"
# preference; AWS waits one hour) before it fails.
WAIT_STEPS = 3


def _refreshes(backend: Any) -> list[_Refresh]:
    return stored(backend, "_poolctl_refreshes", list)


def _config_key(instance: Any) -> tuple[Any, ...] | None:
    """What an instance was launched from (SkipMatching compares it with `_target_key`)."""
    source = launched_from(instance)
    if source is not None and source[0] == "lt":
        return ("lt", source[1].id, source[2])
    return source


def _target_key(group: Any, version: Any | None) -> tuple[Any, ...] | None:
    if version is not None:
        return ("lt", version.template.id, version.number)
    if group.launch_config is not None:
        return ("lc", group.launch_config.name)
    return None


class _Refresh:
    def __init__(self, group: Any, prefs: dict[str, Any], desired: dict[str, Any] | None,
                 strategy: str, target: Any | None, previous: dict[str, Any] | None) -> None:
        self.id = str(uuid.uuid4())
        self.group_name = group.name
        self.status = "Pending"
        self.status_reason = ""
        self.start_time = now()
        self.end_time: datetime | None = None
        self.prefs = prefs
        self.desired = desired
        self.strategy = strategy
        self.target = target  # LaunchTemplateVersion, or None: the group's launch config
        self.previous = previous  # the group's LaunchTemplate spec at the start
        self.live_todo: list[str] = []
        self.warm_todo: list[str] = []
        self.live_total = 0
        self.warm_total = 0
        self.live_done = 0
        self.warm_done = 0
        self.launched: list[str] = []
        self.warm_launched: list[str] = []
        self.checkpoints: list[int] = list(prefs.get("CheckpointPercentages") or [])
        self.next_checkpoint = 0
        self.checkpoint_wait = False
        self.blocked_steps = 0
        self.partial_done = False
        self.rollback: dict[str, Any] | None = None
        self.unlaunched = 0  # replacements that found no capacity yet
        # Launch before terminate (MaxHealthyPercentage > 100): the old instances of the
        # batch in flight, terminated once its replacements are InService.
        self.retiring: list[str] = []
        self.served: set[str] = set()  # replacements seen InService

    # -- reporting --
    def _pct(self, done: int, total: int) -> int:
        return 100 if total == 0 else int(math.floor(100 * done / total))

    def to_dict(self, group: Any) -> dict[str, Any]:
        # A replacement counts as updated once it is InService (AWS: healthy and warmed up).
        launched = set(self.launched)
        pending = sum(
            1 for s in group.instance_states
            if s.instance.id in launched and s.lifecycle_state != "InService"
        ) if self.status in ("InProgress", "Baking") else 0
        live_done = self.live_done - pending
        total = self.live_total + self.warm_total
        updated = live_done + self.warm_done
        rolled = self.rollback["done"] if self.rollback else 0
        out: dict[str, Any] = {
            "InstanceRefreshId": self.id,
            "AutoScalingGroupName": self.group_name,
            "Status": self.status,
            "StartTime": self.start_time,
            "PercentageComplete": (
                self._pct(max(updated - rolled, 0), total) if total else
                (100 if self.status == "Successful" else 0)
            ),
            "InstancesToUpdate": total - updated,
            "ProgressDetails": {
                "LivePoolProgress": {
                    "PercentageComplete": self._pct(live_done, self.live_total),
                    "InstancesToUpdate": self.live_total - live_done,
                },
                "WarmPoolProgress": {
                    "PercentageComplete": self._pct(self.warm_done, self.warm_total),
                    "InstancesToUpdate": self.warm_total - self.warm_done,
                },
            },
            "Preferences": copy.deepcopy(self.prefs),
            "Strategy": self.strategy,
        }
        if self.status_reason:
            out["StatusReason"] = self.status_reason
        if self.end_time:
            out["EndTime"] = self.end_time
        if self.desired is not None:
            out["DesiredConfiguration"] = copy.deepcopy(self.desired)
        if self.rollback is not None:
            rb = self.rollback
            out["RollbackDetails"] = {
                "RollbackReason": rb["reason"],
                "RollbackStartTime": rb["start"],
                "PercentageCompleteOnRollback": self._pct(rb["done"], rb["total"]),
                "InstancesToUpdateOnRollback": rb["total"] - rb["done"],
            }
        return out


_PREF_DEFAULTS: dict[str, Any] = {
    "MinHealthyPercentage": 90,
    "SkipMatching": False,
    "AutoRollback": False,
    "ScaleInProtectedInstances": "Wait",
    "StandbyInstances": "Wait",
}


def _validate_prefs(prefs: dict[str, Any]) -> dict[str, Any]:
    p = dict(_PREF_DEFAULTS)
    p.update({k: v for k, v in prefs.items() if v is not None})
    minh = int(p["MinHealthyPercentage"])
    if not 0 <= minh <= 100:
        raise validation_error("MinHealthyPercentage must be between 0 and 100")
    if "MaxHealthyPercentage" in p:
        if "MinHealthyPercentage" not in prefs:
            raise validation_error(
                "MaxHealthyPercentage needs MinHealthyPercentage to be specified as well"
            )
        maxh = int(p["MaxHealthyPercentage"])
        if not 100 <= maxh <= 200:
            raise validation_error("MaxHealthyPercentage must be between 100 and 200")
        if maxh - minh > 100:
            raise validation_error(
                "The difference between MaxHealthyPercentage and MinHealthyPercentage "
                "cannot be greater than 100"
            )
    cps = p.get("CheckpointPercentages")
    if cps:
        cps = [int(c) for c in cps]
        if any(not 1 <= c <= 100 for c in cps) or cps != sorted(set(cps)):
            raise validation_error(
                "CheckpointPercentages must be unique values between 1 and 100 in ascending order"
            )
        p["CheckpointPercentages"] = cps
        p.setdefault("CheckpointDelay", 3600)
    elif "CheckpointDelay" in p:
        raise validation_error("CheckpointDelay needs CheckpointPercentages")
    for key, allowed in (
        ("ScaleInProtectedInstances", ("Refresh", "Ignore", "Wait")),
        ("StandbyInstances", ("Terminate", "Ignore", "Wait")),
    ):
        if p[key] not in allowed:
            raise validation_error(f"{key} must be one of {', '.join(allowed)}")
    return p


def _is_floating(version: str | None) -> bool:
    return version is None or str(version).lower() in ("$latest", "$default")


def _reversible(r: _Refresh) -> str | None:
    """Why a rollback is impossible (the RollbackInstanceRefresh reference), or None."""
    if r.desired is None:
        return "there is no desired configuration specified for the instance refresh"
    lt = (r.desired or {}).get("LaunchTemplate") or {}
    if _is_floating(lt.get("Version")) or r.previous is None or _is_floating(
        r.previous.get("Version")
    ):
        return "the Auto Scaling group uses the launch template's $Latest or $Default version"
    return None


def _start_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    strategy = self._get_param("Strategy") or "Rolling"
    if strategy != "Rolling":
        raise validation_error(f"Strategy {strategy} is not supported by the sandbox; use Rolling")
    if any(r.group_name == group.name and r.status in _ACTIVE_REFRESH for r in _refreshes(backend)):
        raise autoscaling_error(
            "InstanceRefreshInProgress",
            "An Instance Refresh is already in progress and blocks the execution of this "
            "Instance Refresh.",
        )
    prefs = _validate_prefs(dict(self._get_param("Preferences") or {}))
    desired = self._get_param("DesiredConfiguration") or None
    target = group_version(group)
    if desired:
        spec = desired.get("LaunchTemplate")
        if not spec and desired.get("MixedInstancesPolicy"):
            spec = desired["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
        if not spec:
            raise validation_error("DesiredConfiguration needs a LaunchTemplate")
        template = resolve_template(backend.ec2_backend, spec)
        target = template_version(template, spec.get("Version"))
    previous = None
    if group.ec2_launch_template is not None:
        previous = {
            "LaunchTemplateId": group.ec2_launch_template.id,
            "LaunchTemplateName": group.ec2_launch_template.name,
            "Version": group.provided_launch_template_version,
        }
    r = _Refresh(group, prefs, desired, strategy, target, previous)
    if prefs.get("AutoRollback"):
        why = _reversible(r)
        if why:
            raise validation_error(f"AutoRollback is not supported because {why}")
    target_key = _target_key(group, target)
    for state in group.instance_states:
        if prefs["SkipMatching"] and _config_key(state.instance) == target_key:
            continue
        if state.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Ignore":
            continue
        if state.protected_from_scale_in and prefs["ScaleInProtectedInstances"] == "Ignore":
            continue
        r.live_todo.append(state.instance.id)
    for state in warm_states(group):
        if prefs["SkipMatching"] and _config_key(state.instance) == target_key:
            continue
        r.warm_todo.append(state.instance.id)
    r.live_total, r.warm_total = len(r.live_todo), len(r.warm_todo)
    _refreshes(backend).append(r)
    return ActionResult({"InstanceRefreshId": r.id})


def _batch_size(r: _Refresh, group: Any) -> int:
    desired = group.desired_capacity or len(group.instance_states) or 1
    minh = int(r.prefs["MinHealthyPercentage"])
    maxh = int(r.prefs.get("MaxHealthyPercentage", 100))
    return max(1, math.floor(desired * maxh / 100) - math.ceil(desired * minh / 100))


def _replace(backend: Any, group: Any, old: Any, version: Any | None) -> Any | None:
    """Terminate one group instance and launch its replacement; returns the new state, or
    None when the replacement could not launch (no capacity)."""
    group.instance_states.remove(old)
    terminate(backend, [old.instance.id])
    return _launch_replacement(backend, group, version)


def _launch_replacement(backend: Any, group: Any, version: Any | None) -> Any | None:
    launched = run_instances(group, 1, version, cause=activities.refresh_cause())
    if not launched:
        return None
    new = new_group_state(backend, group, launched[0])
    group.instance_states.append(new)
    return new


def _retry_unlaunched(backend: Any, group: Any, r: _Refresh) -> bool:
    """Launch the replacements that found no capacity; False while some still cannot."""
    version = r.target if r.target is not None else group_version(group)
    while r.unlaunched:
        new = _launch_replacement(backend, group, version)
        if new is None:
            _say_unlaunched(group, r)
            return False
        r.unlaunched -= 1
        r.launched.append(new.instance.id)
    return True


def _say_unlaunched(group: Any, r: _Refresh) -> None:
    r.status_reason = (f"Waiting to launch {r.unlaunched} replacement instance(s): "
                       f"{activities.last_failure(group) or 'no capacity'}")


def _fail(backend: Any, group: Any, r: _Refresh, reason: str) -> None:
    if r.prefs.get("AutoRollback") and not _reversible(r):
        _begin_rollback(group, r, f"Instance refresh failed: {reason}")
        return
    r.status, r.status_reason, r.end_time = "Failed", reason, now()


def _begin_rollback(group: Any, r: _Refresh, reason: str) -> None:
    live = {s.instance.id for s in group.instance_states}
    warm = {s.instance.id for s in warm_states(group)}
    todo = [i for i in r.launched if i in live] + [i for i in r.warm_launched if i in warm]
    # Old instances not yet retired stay: as many replacements go without a successor.
    kept = sum(1 for i in r.retiring if i in live)
    r.retiring = []
    r.rollback = {"reason": reason, "start": now(), "todo": todo, "total": len(todo), "done": 0,
                  "kept": kept}
    r.status, r.status_reason = "RollbackInProgress", reason
    r.checkpoint_wait = False


def _step_in_progress(backend: Any, group: Any, r: _Refresh) -> None:
    if not _retry_unlaunched(backend, group, r):
        return
    by_id = {s.instance.id: s for s in group.instance_states}
    launched = [by_id[i] for i in r.launched if i in by_id]
    r.served |= {s.instance.id for s in launched if s.lifecycle_state == "InService"}
    sick = [s.instance.id for s in launched if s.health_status == "Unhealthy"]
    if sick:
        _fail(backend, group, r, f"Replacement instance(s) failed health checks: {', '.join(sick)}")
        return
    # A replacement that ended before it was InService (its launch hook ABANDONed, a boot
    # that failed) is an EC2 launch failure: the refresh fails (AutoRollback: rolls back).
    lost = [i for i in r.launched if i not in by_id and i not in r.served]
    if lost:
        _fail(backend, group, r, "Replacement instance(s) ended before they were InService "
                                 f"(launch failed): {', '.join(lost)}")
        return
    waiting = [s.instance.id for s in launched if s.lifecycle_state != "InService"]
    if waiting:
        r.status_reason = (
            f"Waiting for replacement instance(s) to enter InService: {', '.join(waiting)}"
        )
        return
    if r.retiring:
        # The batch's replacements are InService: the instances they replace go (the load
        # balancer drains them first, serving_nodes.py).
        _retire(backend, group, r, by_id)
        return
    if r.checkpoint_wait:
        r.checkpoint_wait, r.status_reason = False, ""
        return
    if not r.partial_done:
        gone = [i for i in r.live_todo if i not in by_id]
        for i in gone:
            r.live_todo.remove(i)
            r.live_done += 1
        if r.live_todo:
            _replace_live_batch(backend, group, r, by_id)
            return
    if r.warm_todo and not r.partial_done:
        version = r.target if r.target is not None else group_version(group)
        warm = warm_states(group)
        ids = set(r.warm_todo)
        for state in [s for s in warm if s.instance.id in ids]:
            warm.remove(state)
            terminate(backend, [state.instance.id])
        r.warm_done += len(r.warm_todo)
        r.warm_todo = []
        for state in launch_warm(group, r.warm_total, version):
            r.warm_launched.append(state.instance.id)
        reconcile_warm_pool(group)
        r.status_reason = "Replaced the warm pool's instances"
        return
    if int(r.prefs.get("BakeTime") or 0) > 0 and r.status != "Baking":
        r.status, r.status_reason = "Baking", f"Waiting BakeTime of {r.prefs['BakeTime']} seconds"
        return
    _succeed(group, r)


def _replace_live_batch(backend: Any, group: Any, r: _Refresh, by_id: dict[str, Any]) -> None:
    prefs = r.prefs
    eligible, blocked = [], []
    for iid in r.live_todo:
        state = by_id[iid]
        if state.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Wait":
            blocked.append(iid)
        elif state.protected_from_scale_in and prefs["ScaleInProtectedInstances"] == "Wait":
            blocked.append(iid)
        else:
            eligible.append(iid)
    if not eligible:
        r.blocked_steps += 1
        reason = (
            f"Waiting for instance(s) {', '.join(blocked)} to lose scale-in protection or "
            "leave Standby"
        )
        if r.blocked_steps > WAIT_STEPS:
            _fail(backend, group, r, reason.replace("Waiting for", "Gave up waiting for"))
        else:
            r.status_reason = reason
        return
    r.blocked_steps = 0
    batch = _batch_size(r, group)
    if r.next_checkpoint < len(r.checkpoints):
        cp = r.checkpoints[r.next_checkpoint]
        room = math.ceil(r.live_total * cp / 100) - r.live_done
        batch = max(1, min(batch, room))
    version = r.target if r.target is not None else group_version(group)
    surge = int(prefs.get("MaxHealthyPercentage", 100)) > 100
    for iid in eligible[:batch]:
        old = by_id[iid]
        r.live_todo.remove(iid)
        r.live_done += 1
        if old.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Terminate":
            group.instance_states.remove(old)
            terminate(backend, [iid])
            continue
        if surge:
            r.retiring.append(iid)
            new = _launch_replacement(backend, group, version)
        else:
            new = _replace(backend, group, old, version)
        if new is None:
            r.unlaunched += 1
        else:
            r.launched.append(new.instance.id)
    refresh_load_balancers(backend, group)
    r.status_reason = ""
    if r.unlaunched:
        _say_unlaunched(group, r)
    reached = None
    while r.next_checkpoint < len(r.checkpoints) and r.live_done >= math.ceil(
        r.live_total * r.checkpoints[r.next_checkpoint] / 100
    ):
        reached = r.checkpoints[r.next_checkpoint]
        r.next_checkpoint += 1
    if reached is None:
        return
    if r.next_checkpoint == len(r.checkpoints) and reached < 100:
        r.partial_done = True
        r.status_reason = f"Reached the last checkpoint ({reached}%): a partial instance refresh"
    elif reached < 100:
        r.checkpoint_wait = True
        r.status_reason = (
            f"Checkpoint {reached}% reached: waiting CheckpointDelay of "
            f"{r.prefs['CheckpointDelay']} seconds (one Describe step in the sandbox)"
        )


def _retire(backend: Any, group: Any, r: _Refresh, by_id: dict[str, Any]) -> None:
    old = [by_id[i] for i in r.retiring if i in by_id]
    for state in old:
        group.instance_states.remove(state)
    terminate(backend, [s.instance.id for s in old])
    r.retiring = []
    refresh_load_balancers(backend, group)


def _succeed(group: Any, r: _Refresh) -> None:
    if r.desired and r.target is not None:
        spec = r.desired.get("LaunchTemplate") or {}
        group.ec2_launch_template = r.target.template
        group.launch_template_version = spec.get("Version") or "$Default"
        group.provided_launch_template_version = spec.get("Version")
    r.status, r.status_reason, r.end_time = "Successful", "", now()


def _step_rollback(backend: Any, group: Any, r: _Refresh) -> None:
    rb = r.rollback
    assert rb is not None
    by_id = {s.instance.id: s for s in group.instance_states}
    warm_ids = {s.instance.id for s in warm_states(group)}
    for i in [i for i in rb["todo"] if i not in by_id and i not in warm_ids]:
        rb["todo"].remove(i)
        rb["done"] += 1
    live = [i for i in rb["todo"] if i in by_id]
    previous = group_version(group)  # the desired configuration was never applied
    if live:
        for iid in live[: _batch_size(r, group)]:
            if rb["kept"]:
                rb["kept"] -= 1
                group.instance_states.remove(by_id[iid])
                terminate(backend, [iid])
            elif _replace(backend, group, by_id[iid], previous) is None:
                activities.note_shortfall(group)  # the group launches it when it can
            rb["todo"].remove(iid)
            rb["done"] += 1
        refresh_load_balancers(backend, group)
        return
    if rb["todo"]:
        warm = warm_states(group)
        for state in [s for s in warm if s.instance.id in set(rb["todo"])]:
            warm.remove(state)
            terminate(backend, [state.instance.id])
        rb["done"] += len(rb["todo"])
        rb["todo"] = []
        reconcile_warm_pool(group)
        return
    r.status, r.status_reason, r.end_time = "RollbackSuccessful", rb["reason"], now()


def _step(backend: Any, group: Any, r: _Refresh) -> None:
    if r.status == "Pending":
        r.status = "InProgress"
    elif r.status in ("InProgress", "Baking"):
        if r.status == "Baking":
            _succeed(group, r)
        else:
            _step_in_progress(backend, group, r)
    elif r.status == "Cancelling":
        # Replacements already launched stay (AWS does not undo a cancelled refresh's
        # work); the instances they were to replace go, leaving the group at its size.
        _retire(backend, group, r, {s.instance.id: s for s in group.instance_states})
        r.status, r.end_time = "Cancelled", now()
        r.status_reason = r.status_reason or "Cancelled by user"
    elif r.status == "RollbackInProgress":
        _step_rollback(backend, group, r)


def _describe_instance_refreshes(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    ids = self._get_param("InstanceRefreshIds") or []
    mine = [r for r in _refreshes(backend) if r.group_name == group.name]
    listed = [r for r in reversed(mine) if not ids or r.id in ids]
    start = int(self._get_param("NextToken") or 0)
    limit = int(self._get_param("MaxRecords") or 50)
    page = [r.to_dict(group) for r in listed[start : start + limit]]
    result: dict[str, Any] = {"InstanceRefreshes": page}
    if start + limit < len(listed):
        result["NextToken"] = str(start + limit)
    # The sandbox clock: the observation above, then one step of progress.
    for r in mine:
        if r.status in _ACTIVE_REFRESH:
            _step(backend, group, r)
    return ActionResult(result)


def _active(backend: Any, group: Any) -> _Refresh:
    for r in _refreshes(backend):
        if r.group_name == group.name and r.status in _ACTIVE_REFRESH:
            return r
    raise autoscaling_error(
        "ActiveInstanceRefreshNotFound",
        f"No in progress or pending Instance Refresh found for Auto Scaling group {group.name}",
    )


def _cancel_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    r = _active(backend, group)
    if r.status != "Cancelling":
        r.status, r.status_reason = "Cancelling", "Cancellation requested by user"
        r.checkpoint_wait = False
    return ActionResult({"InstanceRefreshId": r.id})


def _rollback_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    r = _active(backend, group)
    if r.status not in _REVERSIBLE:
        raise autoscaling_error(
            "ActiveInstanceRefreshNotFound",
            f"No in progress or pending Instance Refresh found for Auto Scaling group {group.name}",
        )
    why = _reversible(r)
    if why:
        raise autoscaling_error("IrreversibleInstanceRefresh",
                                f"Rollback is not supported because {why}")
    _begin_rollback(group, r, "Rollback requested by user")
    return ActionResult({"InstanceRefreshId": r.id})



def install() -> None:
    from moto.autoscaling.responses import AutoScalingResponse

    for name, fn in {
        "start_instance_refresh": _start_instance_refresh,
        "describe_instance_refreshes": _describe_instance_refreshes,
        "cancel_instance_refresh": _cancel_instance_refresh,
        "rollback_instance_refresh": _rollback_instance_refresh,
    }.items():
        setattr(AutoScalingResponse, name, fn)

    def forget(backend: Any, group_name: str) -> None:
        refreshes = _refreshes(backend)
        refreshes[:] = [r for r in refreshes if r.group_name != group_name]

    on_group_delete(forget)


def reset() -> None:
    """Nothing kept outside moto's backends."""
