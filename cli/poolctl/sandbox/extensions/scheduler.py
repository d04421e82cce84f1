"""EventBridge Scheduler one-time schedules, run by the sandbox's clock (launch windows of
warm nodes: `warm --from --until` without `--running`).

moto 5.2 stores schedules and schedule groups (CreateSchedule, GetSchedule, ListSchedules,
UpdateSchedule, DeleteSchedule; deleting a group deletes its schedules) but never runs one.
Here a one-time schedule (`at(yyyy-mm-ddThh:mm:ss)` in its ScheduleExpressionTimezone, UTC
only) whose State is ENABLED runs when the sandbox clock (schedules.py) reaches it, on the
same ticks as scheduled actions: its target is invoked once and, with ActionAfterCompletion
DELETE, the schedule is deleted, as EventBridge Scheduler does after the last invocation.
The one target emulated is the universal target the windows use,
`arn:aws:scheduler:::aws-sdk:autoscaling:putWarmPool`, whose Input is the PutWarmPool
request (AutoScalingGroupName, MinSize, MaxGroupPreparedCapacity, PoolState,
InstanceReusePolicy) applied to the group of the schedule's account and region; the
execution role must exist (IAM) or the invocation fails, as it would in AWS.
Not emulated: rate() and cron() schedules, other targets (their schedules never run), time
zones other than UTC, FlexibleTimeWindow (OFF is what the windows use), retries and
dead-letter queues (a failed invocation is recorded in FAILED and dropped).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from poolctl.sandbox.extensions import schedules
from poolctl.sandbox.extensions.common import all_backends

NAMES = ("scheduler.one-time-schedules",)

PUT_WARM_POOL = "arn:aws:scheduler:::aws-sdk:autoscaling:putWarmPool"
_AT = re.compile(r"at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)")
# (schedule ARN, reason) of invocations that failed; cleared by moto's reset.
FAILED: list[tuple[str, str]] = []


def due_at(schedule: Any) -> datetime | None:
    m = _AT.fullmatch(schedule.schedule_expression or "")
    if m is None or (schedule.schedule_expression_timezone or "UTC") != "UTC":
        return None
    return datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC)


def _invoke(backend: Any, schedule: Any) -> None:
    from moto.autoscaling.models import autoscaling_backends
    from moto.iam.models import iam_backends

    target = schedule.target
    if target.get("Arn") != PUT_WARM_POOL:
        return
    role = str(target.get("RoleArn", "")).rsplit("/", 1)[-1]
    iam = iam_backends[backend.account_id]["global"]
    if not any(r.name == role for r in iam.roles.values()):
        FAILED.append((schedule.arn, f"execution role {role!r} does not exist"))
        return
    body = json.loads(target.get("Input") or "{}")
    asg = autoscaling_backends[backend.account_id][backend.region_name]
    name = body.get("AutoScalingGroupName", "")
    if name not in asg.autoscaling_groups:
        FAILED.append((schedule.arn, f"AutoScalingGroup name not found - {name}"))
        return
    reuse = body.get("InstanceReusePolicy")
    asg.put_warm_pool(
        group_name=name, max_group_prepared_capacity=body.get("MaxGroupPreparedCapacity"),
        min_size=body.get("MinSize"), pool_state=body.get("PoolState"),
        instance_reuse_policy=reuse)


def run_due() -> None:
    """Invoke (and, with ActionAfterCompletion DELETE, delete) every enabled one-time
    schedule whose time the sandbox clock has reached, earliest first."""
    from moto.scheduler.models import scheduler_backends

    moment = schedules.clock_now()
    for backend in all_backends(scheduler_backends):
        due = sorted((at, group.name, s.name) for group in list(backend.schedule_groups.values())
                      for s in list(group.schedules.values())
                      if s.state == "ENABLED" and (at := due_at(s)) is not None
                      and at <= moment)
        for _, group_name, name in due:
            group = backend.schedule_groups[group_name]
            schedule = group.schedules[name]
            _invoke(backend, schedule)
            if schedule.action_after_completion == "DELETE":
                del group.schedules[name]
            else:
                schedule.state = "DISABLED"  # ran once; never again


def install() -> None:
    if run_due not in schedules.ON_TICK:
        schedules.ON_TICK.append(run_due)


def reset() -> None:
    FAILED.clear()
