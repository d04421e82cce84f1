"""AWS, read-only: the pool's endpoint (`status`), the pools deployed in a region (`ls`) and
the pool's log group (`logs`). Everything is found by the contract's tags, through the
clients, retries and one-line errors of `AwsApi`."""

from __future__ import annotations

from typing import Any

from poolctl import naming
from poolctl.adaptors.aws import botocore_exceptions
from poolctl.cloud import Cloud
from poolctl.clouds.aws.api import AwsApi, error_code
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract
from poolctl.errors import OperationFailed
from poolctl.inventory import Endpoint, LogEvent, PoolRow


def _tag_filters(cfg: Config, pool: Pool) -> list[dict[str, Any]]:
    return [{"Key": k, "Values": [v]} for k, v in naming.aws_tags(cfg, pool).items()]


class AwsInventory(AwsApi):
    """What `status`, `ls` and `logs` read on AWS (part of `AwsOps`)."""

    def endpoint(self, cfg: Config, pool: Pool) -> Endpoint | None:
        """The pool's load balancer (tagged like everything poolctl creates) and the listener
        clients use: HTTPS when there is one (a certificate is set), else HTTP. None when no
        load balancer carries the pool's tags."""
        assert pool.aws is not None  # called for the pool's aws placement
        region = pool.aws.region
        tagging = self.client("resourcegroupstaggingapi", region)
        arns = [m["ResourceARN"]
                for page in self.pages(
                    tagging, "get_resources", "tag:GetResources",
                    TagFilters=_tag_filters(cfg, pool),
                    ResourceTypeFilters=["elasticloadbalancing:loadbalancer"])
                for m in page["ResourceTagMappingList"]]
        if not arns:
            return None
        if len(arns) > 1:
            raise OperationFailed(f"pool {pool.name}: {len(arns)} load balancers carry its tags "
                                  f"in {region} ({', '.join(arns)}); remove the tags from all "
                                  "but the pool's own")
        elbv2 = self.client("elbv2", region)
        with self.call("elasticloadbalancing:DescribeLoadBalancers"):
            lb = elbv2.describe_load_balancers(LoadBalancerArns=arns)["LoadBalancers"][0]
        listeners = [(li["Protocol"], li["Port"])
                     for page in self.pages(elbv2, "describe_listeners",
                                            "elasticloadbalancing:DescribeListeners",
                                            LoadBalancerArn=arns[0])
                     for li in page["Listeners"]]
        if not listeners:
            return None
        # With a certificate the stack listens on 443 and redirects 80 there.
        proto, port = min(listeners, key=lambda lp: (lp[0] != "HTTPS", lp[1]))
        return Endpoint(scheme=proto.lower(), host=lb["DNSName"], port=int(port),
                        internal=lb.get("Scheme") == "internal",
                        api_key_secret=pool.api_key_secret(Cloud.aws))

    def list_pools(self, region: str, project: str | None = None) -> list[PoolRow]:
        """The Auto Scaling groups tagged `poolctl:role=inference` in `region`, as pools
        (`project`: the GCP project; an AWS region needs none)."""
        asg = self.client("autoscaling", region)
        filters = [{"Name": f"tag:{naming.TAG_ROLE}", "Values": [naming.ROLE]}]
        rows = []
        for page in self.pages(asg, "describe_auto_scaling_groups",
                               "autoscaling:DescribeAutoScalingGroups", Filters=filters):
            for g in page["AutoScalingGroups"]:
                tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
                if naming.TAG_WINDOW in tags:
                    continue  # a launch window's own group: `status` shows it with its pool
                in_service = sum(i["LifecycleState"] == "InService"
                                 for i in g.get("Instances", []))
                rows.append(PoolRow(
                    project=tags.get(naming.TAG_PROJECT, ""),
                    pool=tags.get(naming.TAG_POOL, ""),
                    cloud=Cloud.aws, region=region, group=g["AutoScalingGroupName"],
                    nodes={"min": g["MinSize"], "desired": g["DesiredCapacity"],
                           "max": g["MaxSize"], "in_service": in_service},
                    model=tags.get(naming.TAG_MODEL), image=tags.get(naming.TAG_IMAGE)))
        return sorted(rows, key=lambda r: (r.project, r.pool))

    def log_events(self, cfg: Config, pool: Pool, start_ms: int) -> list[LogEvent]:
        """The events of the pool's log group from `start_ms` on, oldest first."""
        assert pool.aws is not None  # called for the pool's aws placement
        region, group = pool.aws.region, contract.log_group_name(cfg, pool)
        logs = self.client("logs", region)
        out = []
        with self.call("logs:FilterLogEvents"):
            try:
                for page in logs.get_paginator("filter_log_events").paginate(
                        logGroupName=group, startTime=start_ms):
                    out += [LogEvent(timestamp_ms=e["timestamp"],
                                     source=e.get("logStreamName", ""),
                                     message=e.get("message", ""), id=e.get("eventId", ""))
                            for e in page.get("events", [])]
            except botocore_exceptions.ClientError as e:
                if error_code(e) != "ResourceNotFoundException":
                    raise
                raise OperationFailed(f"pool {pool.name}: no log group {group} in {region}; "
                                      "deploy the pool first with `poolctl deploy --cloud aws`"
                                      ) from None
        return sorted(out, key=lambda e: e.timestamp_ms)
