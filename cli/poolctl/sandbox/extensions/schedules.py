"""Scheduled actions of Auto Scaling groups, run by the sandbox's clock (`warm --from`).

moto 5.2 stores PutScheduledUpdateGroupAction and answers DescribeScheduledActions, but it
never runs an action, checks nothing (an unknown group, a start time in the past, the 125
actions a group may have) and keys actions by name alone across groups. Here the five calls
(Put, BatchPut, Describe, Delete, BatchDelete) keep actions per (group, name) in AWS's shape
(ScheduledActionARN, Time = StartTime) with its errors:
  - ValidationError for an unknown group, an action setting none of MinSize, MaxSize and
    DesiredCapacity, a StartTime in the past ("Given start time is in the past"), a batch of
    more than 50, and an unknown name on Delete;
  - LimitExceeded beyond 125 actions per group (a quota AWS does not raise);
  - BatchPut/BatchDelete report each failed action in Failed...[ErrorCode, ErrorMessage].
A one-time action (no Recurrence) runs when the sandbox clock reaches its StartTime, as AWS
runs it: MinSize/MaxSize/DesiredCapacity set, the desired size clamped into the new bounds
when not given, the warm pool (warm_pool.py) resized with it; then it is gone from Describe
(AWS lists only actions still to run). Due actions run before every Auto Scaling call and
when the clock moves.

THE CLOCK: the sandbox's time is the machine's plus an offset, which POST /_poolctl/clock
{"offset_seconds": S} or {"advance_seconds": S} sets (admin.py), so a test moves past a
window's start in a second. A sandbox that serves at speed S (`sandbox start --serve
--speed S`) paces it: from the start, the clock runs S times faster than the machine's (the
machine's time at the start + S x the wall seconds since + the offset), the one clock the
nodes, the alarms and policies (autoscaler.py) run on, so a scheduled action 10 minutes
ahead runs after a minute at speed 10; the serving loop runs due actions on every tick.
The clock applies to scheduled actions and Capacity Blocks (capacity.py); boot times,
refreshes and activities keep the machine's time stamps. moto's reset puts the offset back
to 0.
Not emulated: Recurrence and TimeZone (stored and listed, never run); EndTime.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl.sandbox.extensions.common import (
    LOCK,
    all_backends,
    autoscaling_error,
    before_each_call,
    find_group,
    now,
    on_group_delete,
    stored,
    validation_error,
)

NAMES = ("autoscaling.scheduled-actions", "sandbox-clock")

MAX_ACTIONS_PER_GROUP = 125  # Auto Scaling quotas: "Scheduled actions per Auto Scaling group"
MAX_BATCH = 50  # BatchPut/BatchDelete: "The maximum number allowed is 50"
_SIZES = ("MinSize", "MaxSize", "DesiredCapacity")

_offset_s = 0.0
# (the machine's time when pacing began, time.monotonic() then, speed); None: not paced
_paced: tuple[datetime, float, float] | None = None
# What else runs on the clock's tick (after the due actions): Capacity Blocks ending.
ON_TICK: list[Callable[[], None]] = []


def pace(speed: float) -> None:
    """From now on the clock runs `speed` times faster than the machine's."""
    global _paced
    _paced = (now(), time.monotonic(), float(speed))


def clock_now() -> datetime:
    if _paced is None:
        return now() + timedelta(seconds=_offset_s)
    start, mono0, speed = _paced
    return start + timedelta(seconds=(time.monotonic() - mono0) * speed + _offset_s)


def clock_report() -> dict[str, Any]:
    return {"now": clock_now().isoformat(timespec="seconds"), "offset_seconds": _offset_s,
            "speed": 1.0 if _paced is None else _paced[2]}


def set_clock(body: dict[str, Any]) -> dict[str, Any]:
    """{"offset_seconds": S} (absolute) or {"advance_seconds": S}; then the due actions run."""
    global _offset_s
    if "offset_seconds" in body:
        _offset_s = float(body["offset_seconds"])
    elif "advance_seconds" in body:
        _offset_s += float(body["advance_seconds"])
    else:
        raise ValueError('the body needs "offset_seconds" or "advance_seconds"')
    run_due_everywhere()
    return clock_report()


def _actions(backend: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return stored(backend, "_poolctl_scheduled_actions", dict)


def _time(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        at = value if isinstance(value, datetime) else datetime.fromisoformat(
            str(value).replace("Z", "+00:00"))
    except ValueError:
        raise validation_error(f"Invalid timestamp: {value}") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)  # the API's times are UTC


def _int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def _put(backend: Any, group_name: str, spec: dict[str, Any]) -> None:
    group = find_group(backend, group_name)
    name = spec.get("ScheduledActionName") or ""
    if not name:
        raise validation_error("ScheduledActionName is required")
    sizes = {k: _int(spec.get(k)) for k in _SIZES}
    if all(v is None for v in sizes.values()):
        raise validation_error(
            "At least one of MinSize, MaxSize, or DesiredCapacity must be specified")
    start = _time(spec.get("StartTime") or spec.get("Time"))
    recurrence = spec.get("Recurrence") or None
    if start is None and recurrence is None:
        start = clock_now()  # neither: AWS runs the action right away
    elif start is not None and start < clock_now() - timedelta(seconds=1):
        raise validation_error("Given start time is in the past")
    actions = _actions(backend)
    key = (group.name, name)
    if key not in actions and sum(1 for g, _ in actions if g == group.name) \
            >= MAX_ACTIONS_PER_GROUP:
        raise autoscaling_error(
            "LimitExceeded", f"Maximum number of scheduled actions ({MAX_ACTIONS_PER_GROUP}) "
            f"reached for AutoScalingGroup {group.name}")
    arn = (f"arn:aws:autoscaling:{backend.region_name}:{backend.account_id}:scheduledUpdate"
           f"GroupAction:{uuid.uuid4()}:autoScalingGroupName/{group.name}:scheduledActionName"
           f"/{name}")
    actions[key] = {
        "AutoScalingGroupName": group.name, "ScheduledActionName": name,
        "ScheduledActionARN": actions.get(key, {}).get("ScheduledActionARN", arn),
        "Time": start, "StartTime": start, "EndTime": _time(spec.get("EndTime")),
        "Recurrence": recurrence, "TimeZone": spec.get("TimeZone") or None,
        **sizes,
    }


def _delete(backend: Any, group_name: str, name: str) -> None:
    find_group(backend, group_name)
    if _actions(backend).pop((group_name, name), None) is None:
        raise validation_error("Scheduled action name not found")


def _run(backend: Any, action: dict[str, Any]) -> None:
    group = backend.autoscaling_groups.get(action["AutoScalingGroupName"])
    if group is None:
        return
    lo = group.min_size if action["MinSize"] is None else action["MinSize"]
    hi = group.max_size if action["MaxSize"] is None else action["MaxSize"]
    desired = action["DesiredCapacity"]
    if desired is None:
        desired = min(max(group.desired_capacity, lo), hi)
    if not lo <= desired <= hi:
        return  # AWS records a failed activity; the group keeps its sizes
    group.min_size, group.max_size = lo, hi
    group.set_desired_capacity(desired)


def run_due(backend: Any) -> None:
    """Run (and forget) every one-time action whose StartTime the clock has reached."""
    moment = clock_now()
    actions = _actions(backend)
    due = sorted((a["StartTime"], k) for k, a in actions.items()
                 if a["Recurrence"] is None and a["StartTime"] is not None
                 and a["StartTime"] <= moment)
    for _, key in due:
        _run(backend, actions.pop(key))


def run_due_everywhere() -> None:
    from moto.autoscaling.models import autoscaling_backends

    with LOCK:
        for backend in all_backends(autoscaling_backends):
            run_due(backend)
        for tick in ON_TICK:
            tick()


def _rendered(action: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in action.items() if v is not None}


def _put_scheduled_update_group_action(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    _put(self.autoscaling_backend, self._get_param("AutoScalingGroupName"), {
        k: self._get_param(k) for k in ("ScheduledActionName", "StartTime", "Time", "EndTime",
                                        "Recurrence", "TimeZone", *_SIZES)})
    return EmptyResult()


def _batch(self: Any, items: list[Any], one: Any, name_of: Any) -> list[dict[str, str]]:
    """Each item through `one`; the failures as AWS reports them per action."""
    if len(items) > MAX_BATCH:
        raise validation_error(f"The maximum number of scheduled actions in a batch is "
                               f"{MAX_BATCH}")
    group = self._get_param("AutoScalingGroupName")
    find_group(self.autoscaling_backend, group)
    failed = []
    for item in items:
        try:
            one(self.autoscaling_backend, group, item)
        except Exception as exc:  # moto's AutoscalingClientError: reported per action
            failed.append({"ScheduledActionName": name_of(item),
                           "ErrorCode": getattr(exc, "code", "ValidationError"),
                           "ErrorMessage": getattr(exc, "message", str(exc))})
    return failed


def _batch_put_scheduled_update_group_action(self: Any) -> Any:
    from moto.core.responses import ActionResult

    failed = _batch(self, self._get_param("ScheduledUpdateGroupActions") or [], _put,
                    lambda spec: spec.get("ScheduledActionName", ""))
    return ActionResult({"FailedScheduledUpdateGroupActions": failed})


def _describe_scheduled_actions(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = self._get_param("AutoScalingGroupName")
    if group:
        find_group(backend, group)
    names = set(self._get_param("ScheduledActionNames") or [])
    listed = [a for (g, n), a in sorted(_actions(backend).items(),
                                        key=lambda kv: (kv[1]["StartTime"] or now(), kv[0]))
              if (not group or g == group) and (not names or n in names)]
    start = int(self._get_param("NextToken") or 0)
    size = min(int(self._get_param("MaxRecords") or 50), 100)
    result: dict[str, Any] = {
        "ScheduledUpdateGroupActions": [_rendered(a) for a in listed[start:start + size]]}
    if start + size < len(listed):
        result["NextToken"] = str(start + size)
    return ActionResult(result)


def _delete_scheduled_action(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    _delete(self.autoscaling_backend, self._get_param("AutoScalingGroupName"),
            self._get_param("ScheduledActionName"))
    return EmptyResult()


def _batch_delete_scheduled_action(self: Any) -> Any:
    from moto.core.responses import ActionResult

    failed = _batch(self, self._get_param("ScheduledActionNames") or [], _delete, str)
    return ActionResult({"FailedScheduledActions": failed})


def install() -> None:
    from moto.autoscaling.responses import AutoScalingResponse

    for name, fn in {
        "put_scheduled_update_group_action": _put_scheduled_update_group_action,
        "batch_put_scheduled_update_group_action": _batch_put_scheduled_update_group_action,
        "describe_scheduled_actions": _describe_scheduled_actions,
        "delete_scheduled_action": _delete_scheduled_action,
        "batch_delete_scheduled_action": _batch_delete_scheduled_action,
    }.items():
        setattr(AutoScalingResponse, name, fn)

    def due(backend: Any) -> None:
        run_due(backend)
        for tick in ON_TICK:
            tick()

    before_each_call(due)

    def forget(backend: Any, group_name: str) -> None:
        actions = _actions(backend)
        for key in [k for k in actions if k[0] == group_name]:
            del actions[key]  # AWS deletes a group's scheduled actions with it

    on_group_delete(forget)


def reset() -> None:
    global _offset_s
    _offset_s = 0.0
