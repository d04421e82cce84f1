"""A launch window on a bought Capacity Block, as AWS's guide for Auto Scaling has it: a
launch template that targets the block (market type `capacity-block`), a group in the
block's zone, and scheduled scaling out at the window's start and in more than 30 minutes
before the block ends (docs/cloud-facts.md, Capacity Blocks).

The window's group is poolctl's, not Terraform's: made at `warm --reserve --yes` from the
pool's group (its launch template version, subnets, target groups, health check), tagged as
the pool plus `poolctl:window` and `poolctl:capacity-block`, deleted by `warm --cancel` and
before `destroy`. The pool's own group, its launch template and its warm pool are untouched,
so nothing is left to undo when the block ends. The window's nodes join the pool's target
groups and serve behind its load balancer; their group has no launch hook (the boot script
completes the pool group's), so the target group's health check alone decides when they
take traffic, as for any node.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from poolctl import naming
from poolctl.clouds.aws.api import AwsApi
from poolctl.clouds.base import BlockWindow, BoughtBlock, Group, RunsBlockWindows
from poolctl.config import Config, Pool
from poolctl.contract.aws import CAPACITY_BLOCK
from poolctl.errors import OperationFailed
from poolctl.windows import WINDOW_PREFIX, Window


def block_group_name(group: str, window_id: str) -> str:
    return f"{group}-{window_id}"


class BlockGroups(AwsApi, RunsBlockWindows):
    """The windows' own groups (part of `AwsOps`)."""

    def _group(self, region: str, name: str) -> dict[str, Any]:
        asg = self.client("autoscaling", region)
        with self.call(f"autoscaling:DescribeAutoScalingGroups {name}"):
            found = asg.describe_auto_scaling_groups(
                AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not found:
            raise OperationFailed(f"aws autoscaling group {name}: not found")
        return dict(found[0])

    def _subnets(self, region: str, g: dict[str, Any]) -> dict[str, str]:
        """{zone: subnet} of the group's subnets."""
        ids = [s for s in g.get("VPCZoneIdentifier", "").split(",") if s]
        if not ids:
            return {}
        with self.call("ec2:DescribeSubnets"):
            subnets = self.client("ec2", region).describe_subnets(SubnetIds=ids)["Subnets"]
        return {s["AvailabilityZone"]: s["SubnetId"] for s in sorted(
            subnets, key=lambda s: s["SubnetId"])}

    def block_zones(self, group: Group) -> list[str]:
        return sorted(self._subnets(group.region, self._group(group.region, group.name)))

    def pool_blocks(self, cfg: Config, pool: Pool) -> list[BoughtBlock]:
        assert pool.aws is not None  # asked for the pool's aws placement
        ec2 = self.client("ec2", pool.aws.region)
        found = [r for page in self.pages(
            ec2, "describe_capacity_reservations", "ec2:DescribeCapacityReservations",
            Filters=[{"Name": f"tag:{naming.TAG_PROJECT}", "Values": [cfg.project]},
                     {"Name": f"tag:{naming.TAG_POOL}", "Values": [pool.name]},
                     {"Name": "state", "Values": ["payment-pending", "scheduled",
                                                  "active"]}])
            for r in page["CapacityReservations"]]
        out = []
        for r in found:
            if r.get("ReservationType") != CAPACITY_BLOCK:
                continue
            tags = {t["Key"]: t["Value"] for t in r.get("Tags", [])}
            out.append(BoughtBlock(
                id=str(r["CapacityReservationId"]), instance_type=r["InstanceType"],
                zone=r["AvailabilityZone"], count=int(r["TotalInstanceCount"]),
                start=r["StartDate"].astimezone(UTC), end=r["EndDate"].astimezone(UTC),
                state=str(r["State"]), window=tags.get(naming.TAG_WINDOW),
                span=tags.get(naming.TAG_WINDOW_SPAN), bought_by=tags.get(naming.TAG_BOUGHT_BY),
                bought_at=tags.get(naming.TAG_BOUGHT_AT)))
        return sorted(out, key=lambda b: (b.start, b.id))

    def open_block_window(self, group: Group, window: Window, block: str, zone: str,
                          tags: dict[str, str]) -> BlockWindow:
        assert window.start is not None  # a window being made has its start
        region, name = group.region, block_group_name(group.name, window.id)
        g = self._group(region, group.name)
        subnet = self._subnets(region, g).get(zone)
        if subnet is None:
            raise OperationFailed(f"Capacity Block {block} is in {zone}, where the pool's "
                                  f"group {group.name} has no subnet")
        spec = g.get("LaunchTemplate") or g["MixedInstancesPolicy"]["LaunchTemplate"][
            "LaunchTemplateSpecification"]
        ec2, asg = self.client("ec2", region), self.client("autoscaling", region)
        with self.call(f"ec2:DescribeLaunchTemplateVersions {spec['LaunchTemplateId']}"):
            (version,) = ec2.describe_launch_template_versions(
                LaunchTemplateId=spec["LaunchTemplateId"],
                Versions=[str(spec.get("Version") or "$Default")])["LaunchTemplateVersions"]
        data = dict(version["LaunchTemplateData"])
        # The pool's node, launched into the block: its market and its one target.
        data["InstanceMarketOptions"] = {"MarketType": CAPACITY_BLOCK}
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": block}}
        mine = {**tags, naming.TAG_WINDOW: window.id, naming.TAG_BLOCK: block}
        data["TagSpecifications"] = [
            {**ts, "Tags": [t for t in ts.get("Tags", []) if t["Key"] not in mine]
             + [{"Key": k, "Value": v} for k, v in mine.items()]}
            for ts in data.get("TagSpecifications", [])]
        aws_tags = [{"Key": k, "Value": v} for k, v in mine.items()]
        # Each step may have been done by an interrupted earlier run (the window's id, hence
        # these names, is the same for the same window): made already is done.
        try:
            with self.call(f"ec2:CreateLaunchTemplate {name}"):
                lt_id = ec2.create_launch_template(
                    LaunchTemplateName=name, LaunchTemplateData=data,
                    VersionDescription=f"poolctl window {window.id} in {block}",
                    TagSpecifications=[{"ResourceType": "launch-template", "Tags": aws_tags}],
                )["LaunchTemplate"]["LaunchTemplateId"]
        except OperationFailed as e:
            if "AlreadyExists" not in str(e):
                raise
            with self.call(f"ec2:DescribeLaunchTemplates {name}"):
                (lt,) = ec2.describe_launch_templates(
                    LaunchTemplateNames=[name])["LaunchTemplates"]
            lt_id = lt["LaunchTemplateId"]
        try:
            self._create_group(asg, name, lt_id, subnet, g, aws_tags)
        except OperationFailed as e:
            if "AlreadyExists" not in str(e):
                raise
        # The one time AWS scales it: out at the window's start, in at its end.
        actions = [
            {"ScheduledActionName": f"{WINDOW_PREFIX}{window.id}-{window.nodes}n-from",
             "StartTime": window.start.astimezone(UTC), "MinSize": window.nodes,
             "MaxSize": window.nodes, "DesiredCapacity": window.nodes},
            {"ScheduledActionName": f"{WINDOW_PREFIX}{window.id}-{window.nodes}n-until",
             "StartTime": window.end.astimezone(UTC), "MinSize": 0, "MaxSize": 0,
             "DesiredCapacity": 0}]
        with self.call(f"autoscaling:BatchPutScheduledUpdateGroupAction {name}"):
            failed = asg.batch_put_scheduled_update_group_action(
                AutoScalingGroupName=name, ScheduledUpdateGroupActions=actions,
            )["FailedScheduledUpdateGroupActions"]
        if failed:
            raise OperationFailed(f"aws autoscaling scheduled actions of {name}: "
                                  f"{failed[0].get('ErrorCode')}: {failed[0].get('ErrorMessage')}")
        return BlockWindow(window=window, block=block, group=name, zone=zone, in_service=0)

    def _create_group(self, asg: Any, name: str, lt_id: str, subnet: str,
                      g: dict[str, Any], aws_tags: list[dict[str, str]]) -> None:
        with self.call(f"autoscaling:CreateAutoScalingGroup {name}"):
            asg.create_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0,
                LaunchTemplate={"LaunchTemplateId": lt_id, "Version": "1"},
                VPCZoneIdentifier=subnet, TargetGroupARNs=g.get("TargetGroupARNs", []),
                HealthCheckType=g.get("HealthCheckType", "EC2"),
                HealthCheckGracePeriod=int(g.get("HealthCheckGracePeriod", 0)),
                Tags=[{**t, "ResourceId": name, "ResourceType": "auto-scaling-group",
                       "PropagateAtLaunch": True} for t in aws_tags])

    def block_windows(self, cfg: Config, pool: Pool) -> list[BlockWindow]:
        assert pool.aws is not None  # asked for the pool's aws placement
        region = pool.aws.region
        asg, ec2 = self.client("autoscaling", region), self.client("ec2", region)
        groups = [g for page in self.pages(
            asg, "describe_auto_scaling_groups", "autoscaling:DescribeAutoScalingGroups",
            Filters=[{"Name": f"tag:{naming.TAG_PROJECT}", "Values": [cfg.project]},
                     {"Name": f"tag:{naming.TAG_POOL}", "Values": [pool.name]},
                     {"Name": "tag-key", "Values": [naming.TAG_WINDOW]}])
            for g in page["AutoScalingGroups"]]
        out = []
        for g in groups:
            name = g["AutoScalingGroupName"]
            tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
            wid, block = tags.get(naming.TAG_WINDOW, ""), tags.get(naming.TAG_BLOCK, "")
            with self.call(f"autoscaling:DescribeScheduledActions {name}"):
                acts = asg.describe_scheduled_actions(
                    AutoScalingGroupName=name)["ScheduledUpdateGroupActions"]
            # AWS deletes a one-time action once it ran: no `from`, begun; no `until`, ended.
            at = {a["ScheduledActionName"].rsplit("-", 1)[1]: a for a in acts
                  if a["ScheduledActionName"].startswith(f"{WINDOW_PREFIX}{wid}-")}
            state = ""
            if block:
                try:
                    with self.call(f"ec2:DescribeCapacityReservations {block}"):
                        rs = ec2.describe_capacity_reservations(
                            CapacityReservationIds=[block])["CapacityReservations"]
                    state = str(rs[0]["State"]) if rs else "not found"
                except OperationFailed as e:
                    if "InvalidCapacityReservationId" not in str(e):
                        raise
                    state = "not found"
            nodes = int(at["from"]["MaxSize"]) if "from" in at else int(g["MaxSize"])
            now = datetime.now(UTC)
            window = Window(
                id=wid, nodes=nodes,
                start=at["from"]["StartTime"].astimezone(UTC) if "from" in at else None,
                end=at["until"]["StartTime"].astimezone(UTC) if "until" in at else now)
            out.append(BlockWindow(
                window=window, block=block, group=name,
                zone=(g.get("AvailabilityZones") or [""])[0],
                in_service=sum(i["LifecycleState"] == "InService"
                               for i in g.get("Instances", [])), block_state=state))
        return sorted(out, key=lambda b: (b.window.end, b.window.id))

    def close_block_window(self, group: Group, bw: BlockWindow) -> None:
        asg, ec2 = self.client("autoscaling", group.region), self.client("ec2", group.region)
        # Each step may have been done by an interrupted earlier call: gone is done.
        try:
            with self.call(f"autoscaling:DeleteAutoScalingGroup {bw.group}"):
                asg.delete_auto_scaling_group(AutoScalingGroupName=bw.group, ForceDelete=True)
        except OperationFailed as e:
            if "not found" not in str(e).lower():
                raise
        try:
            with self.call(f"ec2:DeleteLaunchTemplate {bw.group}"):
                ec2.delete_launch_template(LaunchTemplateName=bw.group)
        except OperationFailed as e:
            if "NotFound" not in str(e):
                raise
