"""Launch windows on AWS: one-time scheduled actions of the pool's Auto Scaling group.

Each window is two actions, `poolctl-window-<id>-<nodes>n-from` and `...-until`, whose
absolute sizes (`poolctl.windows.edges`) already take overlapping windows into account, so
Auto Scaling needs nobody at the window's times. The name carries what poolctl needs to read
a window back (its id and nodes); the `until` action of the last edge carries the minimum
kept before the windows. AWS deletes a one-time action once it has run, so a window whose
`from` action is gone has begun. Terraform manages no scheduled action (the stack has no
`aws_autoscaling_schedule`), so a `deploy` leaves them alone. Windows of warm nodes are
EventBridge Scheduler schedules of the same names in the stack's schedule group
(`WarmPoolSchedules`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from poolctl import naming
from poolctl.clouds.aws.api import AwsApi
from poolctl.clouds.base import (
    BlockOffering,
    BuysCapacityBlocks,
    Group,
    SchedulesWarmWindows,
    SchedulesWindows,
)
from poolctl.contract.aws import put_warm_pool_request
from poolctl.errors import OperationFailed
from poolctl.windows import WINDOW_PREFIX, Window, edges, raise_at

_NAME = re.compile(re.escape(WINDOW_PREFIX) + r"(w[0-9a-f]+)-(\d+)n-(from|until)")
_BATCH = 50  # BatchPut/BatchDeleteScheduledAction take at most 50


def _read_back(edges: Iterable[tuple[str, datetime, int]]) -> tuple[list[Window], int | None]:
    """The windows behind (name, time, size) edges named `action_name`, and the size the last
    `until` returns to (None: no window). An edge already run is gone: its window has begun
    (start None), or ended (no `until`: not listed)."""
    found: dict[str, dict[str, Any]] = {}
    last: tuple[datetime, int] | None = None
    for name, at, size in edges:
        m = _NAME.fullmatch(name)
        if m is None:
            continue
        wid, nodes, kind = m.group(1), int(m.group(2)), m.group(3)
        found.setdefault(wid, {"nodes": nodes})[kind] = at
        if kind == "until" and (last is None or at > last[0]):
            last = (at, size)
    windows = [Window(id=wid, nodes=w["nodes"], start=w.get("from"), end=w["until"])
               for wid, w in found.items() if "until" in w]
    windows.sort(key=lambda w: (w.end, w.id))
    return windows, None if last is None else last[1]


def action_name(window: Window, kind: str) -> str:
    return f"{WINDOW_PREFIX}{window.id}-{window.nodes}n-{kind}"


def _utc(at: datetime) -> datetime:
    return at.astimezone(UTC)


class ScheduledActions(AwsApi, SchedulesWindows):
    """The group's scheduled actions that are poolctl's windows."""

    # Auto Scaling quotas: 125 scheduled actions per group, two per window.
    max_windows = 125 // 2
    raises_group_minimum = True

    def _window_actions(self, group: Group) -> list[dict[str, Any]]:
        asg = self.client("autoscaling", group.region)
        return [a for page in self.pages(
                    asg, "describe_scheduled_actions",
                    f"autoscaling:DescribeScheduledActions {group.name}",
                    AutoScalingGroupName=group.name)
                for a in page["ScheduledUpdateGroupActions"]
                if _NAME.fullmatch(a["ScheduledActionName"])]

    def scheduled_windows(self, group: Group) -> tuple[list[Window], int | None]:
        return _read_back((a["ScheduledActionName"], _utc(a["StartTime"]),
                           int(a.get("MinSize", 0))) for a in self._window_actions(group))

    def scheduled_edges(self, group: Group) -> dict[tuple[str, str], int] | None:
        out = {}
        for a in self._window_actions(group):
            m = _NAME.fullmatch(a["ScheduledActionName"])
            assert m is not None  # _window_actions keeps poolctl's names only
            out[(m.group(1), m.group(3))] = int(a.get("MinSize", 0))
        return out

    def write_windows(self, group: Group, windows: list[Window], base_min: int,
                      removed: list[Window]) -> None:
        asg = self.client("autoscaling", group.region)
        by_id = {w.id: w for w in windows}
        specs = []
        for e in edges(windows, base_min):
            spec: dict[str, Any] = {
                "ScheduledActionName": action_name(by_id[e.window], e.kind),
                "StartTime": _utc(e.at), "MinSize": e.min_nodes}
            if e.desired_nodes is not None:
                spec["DesiredCapacity"] = e.desired_nodes
            specs.append(spec)
        failed: list[dict[str, Any]] = []
        for i in range(0, len(specs), _BATCH):
            with self.call(f"autoscaling:BatchPutScheduledUpdateGroupAction {group.name}"):
                failed += asg.batch_put_scheduled_update_group_action(
                    AutoScalingGroupName=group.name,
                    ScheduledUpdateGroupActions=specs[i:i + _BATCH],
                )["FailedScheduledUpdateGroupActions"]
        existing = {a["ScheduledActionName"] for a in self._window_actions(group)}
        gone = [n for w in removed for n in (action_name(w, "from"), action_name(w, "until"))
                if n in existing]
        for i in range(0, len(gone), _BATCH):
            with self.call(f"autoscaling:BatchDeleteScheduledAction {group.name}"):
                failed += asg.batch_delete_scheduled_action(
                    AutoScalingGroupName=group.name, ScheduledActionNames=gone[i:i + _BATCH],
                )["FailedScheduledActions"]
        now = datetime.now(UTC)
        min_nodes = base_min + raise_at(windows, now)
        if not failed and min_nodes != group.min_nodes and any(
                w.active(now) for w in [*windows, *removed] if w.end > now):
            # A window open now already ran its `from` action: the minimum it set follows
            # (its `until` action is gone, or the kept minimum under it changed).
            kw: dict[str, Any] = {"MinSize": min_nodes}
            if min_nodes < group.min_nodes:
                kw["DesiredCapacity"] = max(min_nodes, group.desired_nodes
                                            - (group.min_nodes - min_nodes))
            with self.call(f"autoscaling:UpdateAutoScalingGroup {group.name}"):
                asg.update_auto_scaling_group(AutoScalingGroupName=group.name, **kw)
        if failed:
            first = failed[0]
            raise OperationFailed(
                f"aws autoscaling scheduled actions of {group.name}: "
                f"{first.get('ErrorCode')}: {first.get('ErrorMessage')} "
                f"({len(failed)} action(s) not written; `poolctl warm --list` shows what is)")


PUT_WARM_POOL = "arn:aws:scheduler:::aws-sdk:autoscaling:putWarmPool"
_AT = re.compile(r"at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)")


class WarmPoolSchedules(AwsApi, SchedulesWarmWindows):
    """Windows of warm nodes: two EventBridge Scheduler one-time schedules per window in the
    pool's schedule group (the stack's, named as the group), `poolctl-window-<id>-<n>n-from`
    and `-until`, each calling PutWarmPool (the universal target) with the warm pool's
    absolute size at that edge through the stack's role, then deleting itself. Auto Scaling
    scheduled actions cannot set a warm pool's size; this is the AWS way to have it set with
    nobody watching. A window whose `from` schedule is gone has begun."""

    # EventBridge Scheduler: 1,000,000 schedules per account; poolctl's own bound, as for
    # the scheduled actions (docs/cloud-facts.md).
    max_warm_windows = 125 // 2

    def _role_arn(self, group: Group) -> str:
        # The group's ARN: arn:<partition>:autoscaling:<region>:<account>:autoScalingGroup:...
        parts = group.raw_id.split(":")
        return f"arn:{parts[1]}:iam::{parts[4]}:role/{group.name}{naming.WINDOWS_ROLE_SUFFIX}"

    def _schedules(self, group: Group, must_exist: bool = False
                   ) -> dict[str, dict[str, Any]]:
        """The window schedules of the group's schedule group; none without the schedule
        group (a pool without a warm pool, or deployed before poolctl made one), unless
        `must_exist` (a window is being written)."""
        sched = self.client("scheduler", group.region)
        try:
            with self.call(f"scheduler:GetScheduleGroup {group.name}"):
                sched.get_schedule_group(Name=group.name)
        except OperationFailed as e:
            if "ResourceNotFoundException" in str(e):
                if not must_exist:
                    return {}
                raise OperationFailed(
                    f"{group.name}: no schedule group {group.name!r} for windows of warm nodes "
                    "(the stack makes it for a pool with a warm pool); deploy the pool again, "
                    "or use --running") from None
            raise
        names = [s["Name"] for page in self.pages(
                     sched, "list_schedules", f"scheduler:ListSchedules {group.name}",
                     GroupName=group.name, NamePrefix=WINDOW_PREFIX)
                 for s in page["Schedules"]
                 if s.get("GroupName", group.name) == group.name and _NAME.fullmatch(s["Name"])]
        out = {}
        for name in names:
            with self.call(f"scheduler:GetSchedule {group.name}/{name}"):
                out[name] = sched.get_schedule(GroupName=group.name, Name=name)
        return out

    def scheduled_warm_windows(self, group: Group) -> tuple[list[Window], int | None]:
        return _read_back(
            (name, datetime.fromisoformat(at.group(1)).replace(tzinfo=UTC),
             int(json.loads(s.get("Target", {}).get("Input") or "{}").get("MinSize", 0)))
            for name, s in self._schedules(group).items()
            if (at := _AT.fullmatch(s.get("ScheduleExpression", ""))) is not None)

    def write_warm_windows(self, group: Group, windows: list[Window], base_warm: int,
                           removed: list[Window], *, kept_min: int, running: bool) -> None:
        sched = self.client("scheduler", group.region)
        existing = self._schedules(group, must_exist=True)
        by_id = {w.id: w for w in windows}
        role = self._role_arn(group)
        for e in edges(windows, base_warm):
            name = action_name(by_id[e.window], e.kind)
            spec = {
                "GroupName": group.name, "Name": name,
                "ScheduleExpression": f"at({_utc(e.at):%Y-%m-%dT%H:%M:%S})",
                "ScheduleExpressionTimezone": "UTC", "FlexibleTimeWindow": {"Mode": "OFF"},
                "ActionAfterCompletion": "DELETE", "State": "ENABLED",
                "Description": f"poolctl window {e.window}: warm pool {e.min_nodes} node(s)",
                "Target": {"Arn": PUT_WARM_POOL, "RoleArn": role, "Input": json.dumps(
                    put_warm_pool_request(group.name, min_nodes=kept_min,
                                          warm_nodes=e.min_nodes, running=running))},
            }
            verb = "UpdateSchedule" if name in existing else "CreateSchedule"
            with self.call(f"scheduler:{verb} {group.name}/{name}"):
                (sched.update_schedule if name in existing else sched.create_schedule)(**spec)
        for w in removed:
            for kind in ("from", "until"):
                name = action_name(w, kind)
                if name in existing:
                    with self.call(f"scheduler:DeleteSchedule {group.name}/{name}"):
                        sched.delete_schedule(GroupName=group.name, Name=name)
        now = datetime.now(UTC)
        warm = base_warm + raise_at(windows, now)
        if warm != group.warm_min_nodes and any(
                w.active(now) for w in [*windows, *removed] if w.end > now):
            # An open window already ran its `from`: the warm pool follows now.
            asg = self.client("autoscaling", group.region)
            with self.call(f"autoscaling:PutWarmPool {group.name}"):
                asg.put_warm_pool(**put_warm_pool_request(
                    group.name, min_nodes=kept_min, warm_nodes=warm, running=running))


class CapacityBlocks(AwsApi, BuysCapacityBlocks):
    """Capacity Blocks for ML: the offerings for a window, and a purchase (only ever on an
    explicit yes: the runtime decides)."""

    def capacity_block_offerings(self, region: str, instance_type: str, count: int,
                                 hours: int, earliest: datetime, latest: datetime
                                 ) -> list[BlockOffering]:
        ec2 = self.client("ec2", region)
        with self.call(f"ec2:DescribeCapacityBlockOfferings in {region}"):
            offers = ec2.describe_capacity_block_offerings(
                InstanceType=instance_type, InstanceCount=count, CapacityDurationHours=hours,
                StartDateRange=_utc(earliest), EndDateRange=_utc(latest),
            )["CapacityBlockOfferings"]
        return [BlockOffering(
            id=o["CapacityBlockOfferingId"], instance_type=o["InstanceType"],
            zone=o["AvailabilityZone"], count=int(o["InstanceCount"]),
            start=_utc(o["StartDate"]), end=_utc(o["EndDate"]),
            hours=int(o["CapacityBlockDurationHours"]), upfront_usd=float(o["UpfrontFee"]),
            minutes=int(o.get("CapacityBlockDurationMinutes") or 0))
            for o in offers]

    def buy_capacity_block(self, region: str, offering: BlockOffering,
                           tags: dict[str, str]) -> str:
        ec2 = self.client("ec2", region)
        with self.call(f"ec2:PurchaseCapacityBlock {offering.id}"):
            r = ec2.purchase_capacity_block(
                CapacityBlockOfferingId=offering.id, InstancePlatform="Linux/UNIX",
                TagSpecifications=[{"ResourceType": "capacity-reservation",
                                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
            )["CapacityReservation"]
        rid: str = r["CapacityReservationId"]
        return rid
