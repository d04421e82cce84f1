"""CloudOps on AWS: the Auto Scaling group, its warm pool, nodes and queue metric.

The pool's group is found by the contract's tags only (`poolctl:project`, `poolctl:pool`,
`poolctl:role`), never by its name. `AwsOps` is the whole of it: the operations here, with
quotas (`quota.py`: Service Quotas), rollouts (`rollout.py`: instance refresh) and what
`status`, `ls` and `logs` read (`inventory.py`), all on the clients and one-line errors of
`api.py`.

Capabilities (poolctl.clouds.base): quota requests, cancel, rollback, the queue metric, the
warm sizes a deploy keeps, and the group maximum a rollout's surge raises. A GPU warm pool is
Stopped or Running: 8-GPU instances have far more than the 150 GB of RAM EC2 hibernation
allows.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl import naming
from poolctl.bootlog import BootRecord, parse_boots
from poolctl.bootscript import failed_line
from poolctl.cloud import Cloud
from poolctl.clouds.aws.blocks import BlockGroups
from poolctl.clouds.aws.capacity import Ec2Capacity
from poolctl.clouds.aws.deploys import AwsDeployChecks
from poolctl.clouds.aws.forecasts import PredictiveForecasts
from poolctl.clouds.aws.images import AwsImages
from poolctl.clouds.aws.inventory import AwsInventory
from poolctl.clouds.aws.quota import ServiceQuotas
from poolctl.clouds.aws.rollout import InstanceRefreshes
from poolctl.clouds.aws.windows import CapacityBlocks, ScheduledActions, WarmPoolSchedules
from poolctl.clouds.base import (
    BoundsGroupMaximum,
    CloudOps,
    Group,
    KeepsWarmSizes,
    NodePhase,
    NodeState,
    PublishesQueueMetric,
    ReportsBootFailures,
    ReportsBootPhases,
    ReportsServing,
    ServingWindow,
    address_order,
)
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import PoolPlan


def make_ops(endpoints: CloudEndpoints = REAL_CLOUDS) -> AwsOps:
    return AwsOps(endpoints)


BOOT_LOOKS = 3  # ended nodes whose console `status` reads

class AwsOps(ServiceQuotas, InstanceRefreshes, AwsInventory, Ec2Capacity, ScheduledActions,
             WarmPoolSchedules, CapacityBlocks, BlockGroups, AwsDeployChecks, AwsImages,
             CloudOps,
             PublishesQueueMetric, ReportsBootFailures, ReportsBootPhases, ReportsServing,
             PredictiveForecasts, KeepsWarmSizes,
             BoundsGroupMaximum):
    """The pool's Auto Scaling group at runtime (quotas, rollouts and inventory from the
    classes it builds on)."""

    cloud = Cloud.aws

    # -- the nodes `nodes check` reaches --------------------------------------------

    def node_addresses(self, cfg: Config, pool: Pool, page_size: int | None = None
                       ) -> list[tuple[str, str, str | None]]:
        if pool.aws is None:
            raise UsageError(f"--cloud aws: pool {pool.name!r} has no `aws:` placement")
        region = pool.aws.region
        filters = [
            {"Name": f"tag:{naming.TAG_PROJECT}", "Values": [cfg.project]},
            {"Name": f"tag:{naming.TAG_POOL}", "Values": [pool.name]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
        paging = {"PageSize": page_size} if page_size else {}
        found: dict[str, str] = {}
        for page in self.pages(self.client("ec2", region), "describe_instances",
                               f"ec2 DescribeInstances in {region}", Filters=filters,
                               PaginationConfig=paging):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    ip = inst.get("PrivateIpAddress")
                    if ip and inst.get("State", {}).get("Name") == "running":
                        found[ip] = inst["InstanceId"]
        return [(ip, found[ip], None) for ip in sorted(found, key=address_order)]

    # -- the group ------------------------------------------------------------------

    def _describe_group(self, cfg_project: str, pool_name: str, region: str
                        ) -> dict[str, Any]:
        asg = self.client("autoscaling", region)
        filters = [
            {"Name": f"tag:{naming.TAG_PROJECT}", "Values": [cfg_project]},
            {"Name": f"tag:{naming.TAG_POOL}", "Values": [pool_name]},
            {"Name": f"tag:{naming.TAG_ROLE}", "Values": [naming.ROLE]},
        ]
        groups: list[dict[str, Any]] = [
            g for page in self.pages(asg, "describe_auto_scaling_groups",
                                     "autoscaling:DescribeAutoScalingGroups", Filters=filters)
            for g in page["AutoScalingGroups"]
            # A launch window's own group (clouds/aws/blocks.py) carries the pool's tags too.
            if not any(t["Key"] == naming.TAG_WINDOW for t in g.get("Tags", []))]
        tags = (f"{naming.TAG_PROJECT}={cfg_project}, {naming.TAG_POOL}={pool_name}, "
                f"{naming.TAG_ROLE}={naming.ROLE}")
        if not groups:
            raise OperationFailed(
                f"pool {pool_name}: no Auto Scaling group tagged {tags} in {region}; deploy "
                f"it first with `poolctl deploy --cloud aws`")
        if len(groups) > 1:
            names = ", ".join(g["AutoScalingGroupName"] for g in groups)
            raise OperationFailed(
                f"pool {pool_name}: {len(groups)} Auto Scaling groups are tagged {tags} in "
                f"{region} ({names}); remove the tags from all but the pool's own")
        return groups[0]

    def find_group(self, cfg: Config, pool: Pool) -> Group:
        assert pool.aws is not None  # asked for the pool's aws placement (Config.targets)
        region = pool.aws.region
        g = self._describe_group(cfg.project, pool.name, region)
        wp = g.get("WarmPoolConfiguration") or {}
        lt = g.get("LaunchTemplate") or {}
        if not lt and g.get("MixedInstancesPolicy"):
            lt = g["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
        return Group(
            cloud=Cloud.aws, name=g["AutoScalingGroupName"], region=region,
            min_nodes=g["MinSize"], max_nodes=g["MaxSize"], desired_nodes=g["DesiredCapacity"],
            warm_min_nodes=int(wp.get("MinSize") or 0) if wp else 0,
            warm_state=str(wp.get("PoolState", "")).lower() if wp else "",
            version=str(lt.get("Version", "")), raw_id=g.get("AutoScalingGroupARN", ""),
            template=lt.get("LaunchTemplateId", ""),
        )

    # -- nodes ----------------------------------------------------------------------

    @staticmethod
    def phase(state: str, health: str) -> NodePhase:
        if state.startswith("Warmed:"):
            if state in ("Warmed:Stopped", "Warmed:Running", "Warmed:Hibernated"):
                return "warm"
            if "Terminat" in state:
                return "terminating"
            return "pending"  # Warmed:Pending, Warmed:Pending:Wait/Proceed
        if state == "InService":
            return "unhealthy" if health == "Unhealthy" else "in_service"
        if state.startswith("Terminat"):
            return "terminating"
        # Pending*, and Standby / Detaching: not serving, not failed.
        return "pending"

    def nodes(self, group: Group) -> list[NodeState]:
        asg = self.client("autoscaling", group.region)
        g = None
        for page in self.pages(asg, "describe_auto_scaling_groups",
                               "autoscaling:DescribeAutoScalingGroups",
                               AutoScalingGroupNames=[group.name]):
            for found in page["AutoScalingGroups"]:
                g = found
        rows = list((g or {}).get("Instances", []))
        if group.warm_state or group.warm_min_nodes:
            for page in self.pages(asg, "describe_warm_pool", "autoscaling:DescribeWarmPool",
                                   AutoScalingGroupName=group.name):
                rows += page.get("Instances", [])
        launched = self._launch_times(group.region, [r["InstanceId"] for r in rows])
        now = datetime.now(UTC)
        out = []
        for r in rows:
            t = launched.get(r["InstanceId"])
            out.append(NodeState(
                id=r["InstanceId"], state=r["LifecycleState"],
                phase=self.phase(r["LifecycleState"], r.get("HealthStatus", "Healthy")),
                version=str((r.get("LaunchTemplate") or {}).get("Version", "")),
                zone=r.get("AvailabilityZone", ""),
                since_s=round((now - t).total_seconds(), 1) if t else None,
            ))
        return out

    def _launch_times(self, region: str, ids: list[str]) -> dict[str, datetime]:
        if not ids:
            return {}
        ec2 = self.client("ec2", region)
        out = {}
        for page in self.pages(ec2, "describe_instances", "ec2:DescribeInstances",
                               InstanceIds=ids):
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    t = inst.get("LaunchTime")
                    if t is not None:
                        out[inst["InstanceId"]] = t if t.tzinfo else t.replace(tzinfo=UTC)
        return out

    # -- capacity -------------------------------------------------------------------

    def set_capacity(self, group: Group, *, min_nodes: int, warm_nodes: int,
                     warm_running: bool, desired_nodes: int | None = None) -> None:
        asg = self.client("autoscaling", group.region)
        kw: dict[str, Any] = {"AutoScalingGroupName": group.name, "MinSize": min_nodes}
        if desired_nodes is not None:
            kw["DesiredCapacity"] = desired_nodes
        elif min_nodes > group.desired_nodes:
            kw["DesiredCapacity"] = min_nodes  # AWS raises it too; said explicitly
        with self.call(f"autoscaling:UpdateAutoScalingGroup {group.name}"):
            asg.update_auto_scaling_group(**kw)
        if warm_nodes == 0 and not group.warm_state:
            return  # no warm pool, none wanted
        try:
            with self.call(f"autoscaling:DescribeWarmPool {group.name}"):
                cfg = asg.describe_warm_pool(AutoScalingGroupName=group.name, MaxRecords=1
                                             ).get("WarmPoolConfiguration") or {}
            with self.call(f"autoscaling:PutWarmPool {group.name}"):
                asg.put_warm_pool(**contract.put_warm_pool_request(
                    group.name, min_nodes=min_nodes, warm_nodes=warm_nodes,
                    running=warm_running, reuse=cfg.get("InstanceReusePolicy")))
        except OperationFailed as e:
            raise OperationFailed(
                f"{e}; partly done: the group's minimum is now {min_nodes} "
                f"(was {group.min_nodes}), the warm pool is unchanged at {group.warm_min_nodes}"
            ) from None

    def kept_sizes_env(self, group: Group, plan: PoolPlan) -> dict[str, str]:
        """TF_VAR_... of a `deploy` that keeps the group's minimum and warm sizes as `warm`
        left them (unlike a rollout's apply, the launch template is not pinned)."""
        return contract.kept_sizes_env(plan, min_nodes=group.min_nodes,
                                       warm_min_nodes=group.warm_min_nodes)

    def set_max_nodes(self, group: Group, max_nodes: int) -> None:
        """The group's maximum only (a rollout's end gives its surge room back)."""
        asg = self.client("autoscaling", group.region)
        with self.call(f"autoscaling:UpdateAutoScalingGroup {group.name}"):
            asg.update_auto_scaling_group(AutoScalingGroupName=group.name, MaxSize=max_nodes)

    # -- queue ----------------------------------------------------------------------

    def boot_failure(self, group: Group) -> str | None:
        ec2 = self.client("ec2", group.region)
        ended = [i for page in self.pages(
                     ec2, "describe_instances", "ec2:DescribeInstances",
                     Filters=[{"Name": "tag:aws:autoscaling:groupName", "Values": [group.name]},
                              {"Name": "instance-state-name",
                               "Values": ["shutting-down", "terminated"]}])
                 for r in page["Reservations"] for i in r["Instances"]]
        # The newest few: a group that keeps failing replaces its nodes one after another.
        for inst in sorted(ended, key=lambda i: i["LaunchTime"], reverse=True)[:BOOT_LOOKS]:
            with self.call("ec2:GetConsoleOutput"):
                out = ec2.get_console_output(InstanceId=inst["InstanceId"], Latest=True)
            line = failed_line(out.get("Output") or "")
            if line is not None:
                return f"{inst['InstanceId']}: {line}"
        return None

    def boot_ledger(self, group: Group, nodes: list[NodeState]) -> dict[str, list[BootRecord]]:
        """Each node's console (GetConsoleOutput, the newest 64 KB), its boots parsed."""
        ec2 = self.client("ec2", group.region)
        out: dict[str, list[BootRecord]] = {}
        for n in nodes:
            with self.call("ec2:GetConsoleOutput"):
                got = ec2.get_console_output(InstanceId=n.id, Latest=True)
            out[n.id] = parse_boots(got.get("Output") or "")
        return out

    def queue_per_replica(self, group: Group) -> float | None:
        cw = self.client("cloudwatch", group.region)
        end = datetime.now(UTC)
        query = [{
            "Id": "queue",
            "MetricStat": {
                "Metric": {"Namespace": naming.METRIC_NAMESPACE,
                           "MetricName": naming.METRIC_NAME,
                           "Dimensions": [{"Name": "AutoScalingGroupName",
                                           "Value": group.name}]},
                "Period": 60, "Stat": "Average",
            },
        }]
        # The window reaches a minute past now: this machine's clock may lag CloudWatch's,
        # and a datapoint of the current second would fall outside an end of "now".
        for page in self.pages(cw, "get_metric_data", "cloudwatch:GetMetricData",
                               MetricDataQueries=query, StartTime=end - timedelta(minutes=10),
                               EndTime=end + timedelta(minutes=1),
                               ScanBy="TimestampDescending"):
            for res in page.get("MetricDataResults", []):
                if res.get("Values"):
                    return float(res["Values"][0])
        return None

    def serving_window(self, group: Group, window_s: float, ttft_slo_s: float,
                       tpot_slo_s: float | None) -> ServingWindow | None:
        """One GetMetricData call with one period covering the window: percentiles and the
        share within each SLO (percentile rank, PR(:SLO)) of the latency arrays, the
        counters' sums, the gauges' means."""
        cw = self.client("cloudwatch", group.region)
        end = datetime.now(UTC)
        # A period of whole minutes covering the window (pool time: a serving sandbox's
        # runs faster than the machine's clock, which stamps the datapoints), ending a
        # minute past now (this machine's clock may lag CloudWatch's).
        wall_s = window_s / self.endpoints.time_scale
        period = 60 * (math.ceil(wall_s / 60) + 1)
        start = end + timedelta(seconds=60 - period)
        asked = {
            "ttft50": (naming.TTFT_METRIC, "p50"), "ttft90": (naming.TTFT_METRIC, "p90"),
            "ttftin": (naming.TTFT_METRIC, f"PR(:{ttft_slo_s:g})"),
            "tpot50": (naming.TPOT_METRIC, "p50"), "tpot90": (naming.TPOT_METRIC, "p90"),
            "ttftavg": (naming.TTFT_METRIC, "Average"),
            "tpotavg": (naming.TPOT_METRIC, "Average"),
            "req": (naming.REQUESTS_METRIC, "Sum"),
            "prompt": (naming.PROMPT_TOKENS_METRIC, "Sum"),
            "output": (naming.OUTPUT_TOKENS_METRIC, "Sum"),
            "kv": (naming.KV_USAGE_METRIC, "Average"),
            "running": (naming.RUNNING_METRIC, "Average"),
            "queue": (naming.METRIC_NAME, "Average"),
        }
        if tpot_slo_s is not None:
            asked["tpotin"] = (naming.TPOT_METRIC, f"PR(:{tpot_slo_s:g})")
        query = [{"Id": key, "MetricStat": {
            "Metric": {"Namespace": naming.METRIC_NAMESPACE, "MetricName": name,
                       "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group.name}]},
            "Period": period, "Stat": stat}} for key, (name, stat) in asked.items()]
        got: dict[str, float] = {}
        for page in self.pages(cw, "get_metric_data", "cloudwatch:GetMetricData",
                               MetricDataQueries=query, StartTime=start,
                               EndTime=end + timedelta(seconds=60)):
            for res in page.get("MetricDataResults", []):
                values = [v for v in res.get("Values") or [] if v is not None]
                if values and res.get("Id") in asked:
                    got[str(res["Id"])] = float(values[0])
        if not got:
            return None

        def share(key: str) -> float | None:
            return got[key] / 100 if key in got else None

        return ServingWindow(
            window_s=float(window_s), requests=got.get("req", 0.0),
            prompt_tokens=got.get("prompt", 0.0), output_tokens=got.get("output", 0.0),
            ttft_p50_s=got.get("ttft50"), ttft_p90_s=got.get("ttft90"),
            tpot_p50_s=got.get("tpot50"), tpot_p90_s=got.get("tpot90"),
            ttft_mean_s=got.get("ttftavg"), tpot_mean_s=got.get("tpotavg"),
            ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s,
            ttft_within=share("ttftin"), tpot_within=share("tpotin"),
            kv_usage=got.get("kv"), running=got.get("running"),
            queue_per_replica=got.get("queue"))
