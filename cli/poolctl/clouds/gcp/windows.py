"""Launch windows on GCP: scaling schedules of the MIG's regional autoscaler.

One schedule per window, `poolctl-window-<id>` in `autoscalingPolicy.scalingSchedules`:
`minRequiredReplicas` the autoscaler's minimum kept before the window plus its nodes,
`schedule` a cron with its year (so it runs once) in `timeZone` UTC, `durationSec` to the
window's end, and a `description` that carries the window's nodes and the kept minimum. The
autoscaler recommends the largest of its schedules and its other signals, so overlapping
windows take the larger size by themselves, and at a schedule's end the minimum returns
with nobody watching. GCP schedules the autoscaler's minimum, not the standby pool
(`targetStoppedSize`): the standby pool keeps its size, and at the window's start scale-out
takes its stopped VMs first (SCALE_OUT_POOL) while the MIG refills it.

Writes replace the whole autoscaler (`regionAutoscalers.update`): a PATCH merges maps and
cannot remove a schedule. The stack ignores `autoscaling_policy[0].scaling_schedules`, so a
`deploy` leaves them alone.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl.adaptors.gcp import compute_v1
from poolctl.clouds.base import Group, SchedulesWindows
from poolctl.clouds.gcp.mig import MigReader, mig_ref
from poolctl.errors import OperationFailed
from poolctl.windows import WINDOW_PREFIX, Window

_NAME = re.compile(re.escape(WINDOW_PREFIX) + r"(w[0-9a-f]+)")
_DESCRIPTION = re.compile(r"poolctl window: \+(\d+) node\(s\) over a minimum of (\d+)")
_CRON = re.compile(r"(\d+) (\d+) (\d+) (\d+) \* (\d{4})")


def schedule_of(window: Window, base_min: int) -> dict[str, Any]:
    """The window as the autoscaler's scaling schedule (the API's field names)."""
    assert window.start is not None  # GCP keeps every window's start
    start = window.start.astimezone(UTC).replace(second=0, microsecond=0)  # cron: minutes
    return {
        "minRequiredReplicas": base_min + window.nodes,
        "schedule": f"{start.minute} {start.hour} {start.day} {start.month} * {start.year}",
        "timeZone": "UTC",
        "durationSec": math.ceil((window.end - start).total_seconds()),
        "disabled": False,
        "description": f"poolctl window: +{window.nodes} node(s) over a minimum of {base_min}",
    }


def window_of(name: str, sched: Any) -> tuple[Window, int] | None:
    """A schedule poolctl wrote, read back: (window, the minimum kept before it)."""
    m, d = _NAME.fullmatch(name), _DESCRIPTION.fullmatch(sched.description or "")
    c = _CRON.fullmatch(sched.schedule or "")
    if m is None or d is None or c is None or (sched.time_zone or "UTC") != "UTC":
        return None
    mi, h, day, mon, year = (int(x) for x in c.groups())
    start = datetime(year, mon, day, h, mi, tzinfo=UTC)
    return (Window(id=m.group(1), nodes=int(d.group(1)), start=start,
                   end=start + timedelta(seconds=int(sched.duration_sec))), int(d.group(2)))


class ScalingSchedules(MigReader, SchedulesWindows):
    """The autoscaler's scaling schedules that are poolctl's windows."""

    # "You can have up to 128 scaling schedules per MIG."
    max_windows = 128
    raises_group_minimum = False

    def _autoscaler(self, group: Group) -> Any:
        project, region, name = mig_ref(group)
        a = self.autoscaler_of(self.get_mig(project, region, name))
        if a is None:
            raise OperationFailed(f"pool group {name}: no autoscaler; scaling schedules need "
                                  "the stack's autoscaler (`poolctl deploy --cloud gcp`)")
        return a

    def scheduled_windows(self, group: Group) -> tuple[list[Window], int | None]:
        a = self._autoscaler(group)
        found = [w for name, s in a.autoscaling_policy.scaling_schedules.items()
                 if (w := window_of(name, s)) is not None]
        windows = sorted((w for w, _ in found), key=lambda w: (w.end, w.id))
        # The minimum each schedule was written over (its minRequiredReplicas is absolute);
        # without one, the autoscaler's own.
        bases = [b for _, b in found]
        return windows, max(bases) if bases else int(a.autoscaling_policy.min_num_replicas)

    def write_windows(self, group: Group, windows: list[Window], base_min: int,
                      removed: list[Window]) -> None:
        project, region, _ = mig_ref(group)
        a = self._autoscaler(group)
        schedules = a.autoscaling_policy.scaling_schedules
        for w in removed:
            schedules.pop(f"{WINDOW_PREFIX}{w.id}", None)
        for w in windows:
            schedules[f"{WINDOW_PREFIX}{w.id}"] = compute_v1.AutoscalingPolicyScalingSchedule(
                **_snake(schedule_of(w, base_min)))
        self.write_autoscaler(project, region, a, replace=True,
                              what=f"update autoscaler {a.name} ({len(windows)} scaling "
                                   "schedule(s))")


def _snake(fields: dict[str, Any]) -> dict[str, Any]:
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in fields.items()}
