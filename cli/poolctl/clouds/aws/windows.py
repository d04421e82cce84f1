"""Launch windows on AWS: one-time scheduled actions of the pool's Auto Scaling group.

Each window is two actions, `poolctl-window-<id>-<nodes>n-from` and `...-until`, whose
absolute sizes (`poolctl.windows.edges`) already take overlapping windows into account, so
Auto Scaling needs nobody at the window's times. The name carries what poolctl needs to read
a window back (its id and nodes); the `until` action of the last edge carries the minimum
kept before the windows. AWS deletes a one-time action once it has run, so a window whose
`from` action is gone has begun. Terraform manages no scheduled action (the stack has no
`aws_autoscaling_schedule`), so a `deploy` leaves them alone.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from poolctl.clouds.aws.api import AwsApi
from poolctl.clouds.base import BlockOffering, BuysCapacityBlocks, Group, SchedulesWindows
from poolctl.errors import OperationFailed
from poolctl.windows import WINDOW_PREFIX, Window, edges, raise_at

_NAME = re.compile(re.escape(WINDOW_PREFIX) + r"(w[0-9a-f]+)-(\d+)n-(from|until)")
_BATCH = 50  # BatchPut/BatchDeleteScheduledAction take at most 50


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
        found: dict[str, dict[str, Any]] = {}
        last: tuple[datetime, int] | None = None
        for a in self._window_actions(group):
            m = _NAME.fullmatch(a["ScheduledActionName"])
            assert m is not None  # kept by _window_actions
            wid, nodes, kind = m.group(1), int(m.group(2)), m.group(3)
            at = _utc(a["StartTime"])
            found.setdefault(wid, {"nodes": nodes})[kind] = at
            if kind == "until" and (last is None or at > last[0]):
                last = (at, int(a.get("MinSize", 0)))
        windows = [Window(id=wid, nodes=w["nodes"], start=w.get("from"), end=w["until"])
                   for wid, w in found.items() if "until" in w]
        windows.sort(key=lambda w: (w.end, w.id))
        return windows, None if last is None else last[1]

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
