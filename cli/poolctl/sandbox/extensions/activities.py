"""Auto Scaling scaling activities, and launches retried after a capacity failure.

moto records no scaling activity (DescribeScalingActivities answers an empty list). Here
every launch for a group (launches.py) records one, as the Auto Scaling API reference's
Activity has it: ActivityId, AutoScalingGroupName, AutoScalingGroupARN, Description, Cause,
StartTime, EndTime, StatusCode, StatusMessage, Progress, Details (a JSON string with "Subnet
ID" and "Availability Zone"). A launch that failed reads as AWS writes it (examples in
github.com/kubernetes/autoscaler#1263 and aws/aws-parallelcluster#1944):

    Description   "Launching a new EC2 instance.  Status Reason: <EC2's message> Launching EC2
                  instance failed."
    StatusCode    Failed
    StatusMessage "<EC2's message> Launching EC2 instance failed."
    Cause         "At 2026-...Z an instance was started in response to a difference between
                  desired and actual capacity, increasing the capacity from 5 to 6."

A successful one is "Launching a new EC2 instance: i-..." with StatusCode Successful, or
MidLifecycleAction while a launch hook holds the instance. Warm pool launches say "into warm
pool" / "from warm pool" (the sandbox's wording; the API reference does not show them).
DescribeScalingActivities: newest first, by group (deleted groups' with
IncludeDeletedGroups), by ActivityIds, MaxRecords (100) and NextToken; the newest
ACTIVITY_MEMORY per region are kept.

Retries: like Auto Scaling, a group that could not launch what it wants tries again later:
on an Auto Scaling request RETRY_S seconds (real time) after the last try, and at once when
the sandbox's capacity changes (POST /_poolctl/capacity). Each failed try records its
activities again.
Not emulated: Filters, AutoScalingGroupState, termination and other non-launch activities,
rebalancing across zones once an exhausted zone recovers.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from typing import Any

from poolctl.sandbox.extensions.common import (
    LOCK,
    all_backends,
    before_each_call,
    now,
    stored,
    warm_states,
)

NAMES = ("autoscaling.scaling-activities", "autoscaling.capacity-retries")

ACTIVITY_MEMORY = 2000
RETRY_S = 10.0
_FAILED_SUFFIX = " Launching EC2 instance failed."


def _log(backend: Any) -> list[dict[str, Any]]:
    return stored(backend, "_poolctl_activities", list)


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def launch_cause(current: int, wanted: int, warm: bool = False) -> str:
    """The Cause of a launch that brings the group (or its warm pool) from `current` to
    `wanted` instances."""
    what = "warm pool capacity" if warm else "capacity"
    return (f"At {_stamp(now())} an instance was started in response to a difference between "
            f"desired and actual {what}, increasing the {what} from {current} to {wanted}.")


def warm_state_cause() -> str:
    return (f"At {_stamp(now())} a warm pool instance was started in response to the warm "
            "pool's state, Running.")


def refresh_cause() -> str:
    return f"At {_stamp(now())} an instance was started in response to an instance refresh."


def _where(warm: str) -> str:
    return {"into": " into warm pool", "from": " from warm pool"}.get(warm, "")


def _record(group: Any, entry: dict[str, Any]) -> dict[str, Any]:
    backend = group.autoscaling_backend
    log = _log(backend)
    log.append({"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": group.name,
                "AutoScalingGroupARN": group.arn, "Progress": 100, **entry})
    del log[:-ACTIVITY_MEMORY]
    return log[-1]


def _details(zone: str, subnet: str | None) -> str:
    details = {"Subnet ID": subnet, "Availability Zone": zone} if subnet else \
        {"Availability Zone": zone}
    return json.dumps(details, separators=(",", ":"))


def record_failure(group: Any, zone: str, subnet: str | None, message: str, cause: str,
                   warm: str = "") -> dict[str, Any]:
    """A launch that failed in `zone` with EC2's `message`; `warm` is "into" or "from" for
    the warm pool."""
    status = message.rstrip() + _FAILED_SUFFIX
    at = now()
    return _record(group, {
        "Description": f"Launching a new EC2 instance{_where(warm)}.  Status Reason: {status}",
        "Cause": cause, "StartTime": at, "EndTime": at, "StatusCode": "Failed",
        "StatusMessage": status, "Details": _details(zone, subnet)})


def record_success(group: Any, instance: Any, subnet: str | None, cause: str,
                   warm: str = "") -> dict[str, Any]:
    return _record(group, {
        "Description": f"Launching a new EC2 instance{_where(warm)}: {instance.id}",
        "Cause": cause, "StartTime": now(), "StatusCode": "Successful",
        "Details": _details(instance.placement.zone, subnet),
        "_instance": instance.id})


def last_failure(group: Any) -> str | None:
    """The StatusMessage of the group's newest failed launch."""
    for entry in reversed(_log(group.autoscaling_backend)):
        if entry["AutoScalingGroupName"] == group.name and entry["StatusCode"] == "Failed":
            message: str = entry["StatusMessage"]
            return message
    return None


def _rendered(backend: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """An activity as DescribeScalingActivities shows it now: a launch whose instance a
    hook still holds is MidLifecycleAction, and ends when it leaves Pending:Wait."""
    out = {k: v for k, v in entry.items() if not k.startswith("_")}
    iid = entry.get("_instance")
    if iid is None:
        return out
    group = backend.autoscaling_groups.get(entry["AutoScalingGroupName"])
    states = [] if group is None else list(group.instance_states) + list(warm_states(group))
    state = next((s for s in states if s.instance.id == iid), None)
    if state is not None and state.lifecycle_state.endswith("Pending:Wait"):
        out.update(StatusCode="MidLifecycleAction", Progress=30)
        return out
    entry.setdefault("EndTime", now())
    out["EndTime"] = entry["EndTime"]
    return out


def _describe_scaling_activities(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    name = self._get_param("AutoScalingGroupName")
    ids = set(self._get_param("ActivityIds") or [])
    deleted = bool(self._get_param("IncludeDeletedGroups"))
    listed = [e for e in reversed(_log(backend))
              if (not name or e["AutoScalingGroupName"] == name)
              and (not ids or e["ActivityId"] in ids)
              and (deleted or e["AutoScalingGroupName"] in backend.autoscaling_groups)]
    start = int(self._get_param("NextToken") or 0)
    size = min(int(self._get_param("MaxRecords") or 100), 100)
    page = [_rendered(backend, e) for e in listed[start:start + size]]
    result: dict[str, Any] = {"Activities": page}
    if start + size < len(listed):
        result["NextToken"] = str(start + size)
    return ActionResult(result)


def note_shortfall(group: Any) -> None:
    """The group launched less than it wants: it tries again in RETRY_S seconds."""
    group.__dict__["_poolctl_retry_at"] = time.monotonic() + RETRY_S


def _retry(backend: Any, force: bool) -> None:
    moment = time.monotonic()
    for group in list(backend.autoscaling_groups.values()):
        due = group.__dict__.get("_poolctl_retry_at")
        if due is None or (due > moment and not force):
            continue
        del group.__dict__["_poolctl_retry_at"]
        # What Auto Scaling does on its own: bring the group (and its warm pool) back to
        # what it wants; a launch that fails again notes the shortfall again.
        group.set_desired_capacity(group.desired_capacity)


def retry_short_groups(force: bool = False) -> None:
    """Retry the launches of every group that fell short (due ones; all with `force`)."""
    from moto.autoscaling.models import autoscaling_backends

    with LOCK:
        for backend in all_backends(autoscaling_backends):
            _retry(backend, force)


def install() -> None:
    from moto.autoscaling.responses import AutoScalingResponse

    before_each_call(lambda backend: _retry(backend, force=False))  # retries first
    AutoScalingResponse.describe_scaling_activities = (  # type: ignore[method-assign]  # moto extension: real activities
        _describe_scaling_activities)


def reset() -> None:
    """Nothing kept outside moto's backends (the log and retry times live on them)."""
