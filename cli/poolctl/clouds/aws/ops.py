"""CloudOps on AWS: Auto Scaling group, warm pool, instance refresh, Service Quotas.

Every client retries throttling and 5xx with adaptive backoff (10 attempts); every list call
goes through its paginator. The pool's group is found by the contract's tags only
(`poolctl:project`, `poolctl:pool`, `poolctl:role`), never by its name. Its clients go where
the `CloudEndpoints` it is made with say: AWS itself, or one endpoint (the sandbox) with that
endpoint's credentials.

Capabilities (poolctl.clouds.base): quota requests, cancel, rollback, the queue metric, the
warm sizes a deploy keeps, and the group maximum a rollout's surge raises. Not
HibernatesWarmNodes: 8-GPU instances have far more than the 150 GB of RAM EC2 hibernation
allows, so a GPU warm pool is Stopped or Running.

Rollouts: `rollout start` applies the new launch template version through Terraform with the
group pinned to its running version, then starts the instance refresh itself with a
DesiredConfiguration. The AWS provider would start one too, but only after it has already
moved the group to the new version (hashicorp/terraform-provider-aws#34189), so an automatic
or manual rollback would "return" to the new version. Started this way, AWS keeps the old
version as the group's until the refresh succeeds, and a rollback really goes back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.catalog import load_catalog
from poolctl.clouds import Cloud
from poolctl.clouds.base import (
    BoundsGroupMaximum,
    CancelsRollouts,
    CloudOps,
    Group,
    KeepsWarmSizes,
    NodePhase,
    NodeState,
    PublishesQueueMetric,
    QuotaLine,
    QuotaRequest,
    RequestsQuota,
    RolloutState,
    RolloutStatus,
    RollsBackRollouts,
    address_order,
)
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import PoolPlan

# EC2 running On-Demand quotas by instance family (vCPUs of running instances).
QUOTA_P = "L-417A185B"
QUOTA_G = "L-DB2E81BA"
QUOTA_STANDARD = "L-1216C47A"
STANDARD_FAMILIES = set("acdhimrtz")
OPEN_REQUEST = ("PENDING", "CASE_OPENED")
REFRESH_DONE = {"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"}
# An instance refresh's Status in poolctl's words (Baking: the refresh waits out its bake time
# after the last replacement, still in progress). A word AWS adds later reads as in progress
# until it is done.
REFRESH_STATUS = {
    "Pending": RolloutStatus.pending, "InProgress": RolloutStatus.in_progress,
    "Baking": RolloutStatus.in_progress, "Successful": RolloutStatus.successful,
    "Failed": RolloutStatus.failed, "Cancelling": RolloutStatus.cancelling,
    "Cancelled": RolloutStatus.cancelled, "RollbackInProgress": RolloutStatus.rolling_back,
    "RollbackSuccessful": RolloutStatus.rolled_back,
    "RollbackFailed": RolloutStatus.rollback_failed,
}
# Instances that hold vCPU quota: AWS counts running ones; pending ones are about to.
QUOTA_STATES = ["pending", "running"]


def quota_code(instance_type: str) -> str | None:
    """The running On-Demand quota an instance type counts against (None: another one)."""
    family = instance_type.split(".")[0].lower()
    if family.startswith("vt") or family.startswith("g"):
        return QUOTA_G
    if family.startswith("p"):
        return QUOTA_P
    if family[:1] in STANDARD_FAMILIES and not family.startswith(("trn", "inf", "dl")):
        return QUOTA_STANDARD
    return None


def retry_config() -> Any:
    from botocore.config import Config as BotoConfig

    return BotoConfig(retries={"mode": "adaptive", "max_attempts": 10})


def make_ops(endpoints: CloudEndpoints = REAL_CLOUDS) -> AwsOps:
    return AwsOps(endpoints)


class AwsOps(CloudOps, RequestsQuota, CancelsRollouts, RollsBackRollouts, PublishesQueueMetric,
             KeepsWarmSizes, BoundsGroupMaximum):
    cloud = "aws"

    def __init__(self, endpoints: CloudEndpoints = REAL_CLOUDS) -> None:
        endpoints.require(Cloud.aws)
        self.endpoints = endpoints
        self._clients: dict[tuple[str, str], Any] = {}
        self._session: Any = None  # a boto3 Session, made on first use

    # -- plumbing -------------------------------------------------------------------

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            import boto3

            if self.endpoints.aws is not None:
                self._clients[key] = boto3.client(
                    service, config=retry_config(), **self.endpoints.aws.client_kwargs(region))
            else:
                if self._session is None:
                    self._session = boto3.session.Session()
                self._clients[key] = self._session.client(
                    service, region_name=region, config=retry_config())
        return self._clients[key]

    @contextlib.contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Turn botocore failures into one line naming the call and the fix."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            NoRegionError,
        )
        from botocore.parsers import ResponseParserError

        try:
            yield
        except ClientError as e:
            err = e.response.get("Error", {})
            code, msg = err.get("Code", "Error"), err.get("Message", str(e))
            if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
                        "UnrecognizedClientException", "AuthFailure"):
                fix = f"grant the caller permission for {what}, or use other credentials"
            elif code in ("Throttling", "ThrottlingException", "RequestLimitExceeded",
                          "TooManyRequestsException"):
                fix = "still throttled after 10 attempts with backoff; try again in a minute"
            elif code in ("ExpiredToken", "ExpiredTokenException", "RequestExpired"):
                fix = "refresh the credentials (e.g. `aws sso login`)"
            else:
                fix = "see the message; nothing else was changed by this call"
            raise OperationFailed(f"aws {what}: {code}: {msg} ({fix})") from None
        except EndpointConnectionError as e:
            fix = (self.endpoints.unreachable_fix
                   or "check the network, the region and any proxy settings")
            raise OperationFailed(f"aws {what}: cannot reach {e.kwargs.get('endpoint_url')} "
                                  f"({fix})") from None
        except NoCredentialsError:
            raise UsageError(f"aws {what}: no AWS credentials; set AWS_PROFILE or "
                             "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or use --sandbox"
                             ) from None
        except NoRegionError:
            raise UsageError(f"aws {what}: no region; set aws.region in the file") from None
        except BotoCoreError as e:
            raise OperationFailed(f"aws {what}: {e}") from None
        except ResponseParserError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise OperationFailed(f"aws {what}: the endpoint answered something that is not "
                                  f"an AWS response ({first}); check the endpoint and retry"
                                  ) from None

    def pages(self, client: Any, op: str, what: str, **kw: Any) -> Iterator[dict[str, Any]]:
        with self.call(what):
            yield from client.get_paginator(op).paginate(**kw)

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
            for g in page["AutoScalingGroups"]]
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
            cloud="aws", name=g["AutoScalingGroupName"], region=region,
            min_nodes=g["MinSize"], max_nodes=g["MaxSize"], desired_nodes=g["DesiredCapacity"],
            warm_min_nodes=int(wp.get("MinSize") or 0) if wp else 0,
            warm_state=str(wp.get("PoolState", "")).lower() if wp else "",
            version=str(lt.get("Version", "")), raw_id=g.get("AutoScalingGroupARN", ""),
            template=lt.get("LaunchTemplateId", ""),
        )

    def _resolved_version(self, group: Group) -> tuple[str, int]:
        """(group's version as a number, the template's newest version)."""
        if not group.template:
            raise OperationFailed(
                f"group {group.name}: it launches from no launch template; poolctl rollouts "
                "need the stack's launch template (redeploy with `poolctl deploy`)")
        ec2 = self.client("ec2", group.region)
        with self.call("ec2:DescribeLaunchTemplates"):
            lt = ec2.describe_launch_templates(LaunchTemplateIds=[group.template]
                                               )["LaunchTemplates"][0]
        latest = int(lt["LatestVersionNumber"])
        v = group.version
        if v in ("", "$Latest"):
            v = str(latest)
        elif v == "$Default":
            v = str(lt["DefaultVersionNumber"])
        return v, latest

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

    # -- quotas ---------------------------------------------------------------------

    def _vcpus(self, region: str, types: set[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in types:
            row = load_catalog().get("aws", t)
            if row is not None:
                out[t] = row.vcpus
        unknown = sorted(types - set(out))
        if unknown:
            ec2 = self.client("ec2", region)
            for page in self.pages(ec2, "describe_instance_types", "ec2:DescribeInstanceTypes",
                                   InstanceTypes=unknown):
                for it in page["InstanceTypes"]:
                    out[it["InstanceType"]] = int(it["VCpuInfo"]["DefaultVCpus"])
        return out

    def _in_use(self, cfg: Config, pool: Pool, region: str) -> dict[str, tuple[int, int]]:
        """{quota code: (vCPUs running in the region, of which the pool's own)}."""
        ec2 = self.client("ec2", region)
        rows = []
        for page in self.pages(ec2, "describe_instances", "ec2:DescribeInstances",
                               Filters=[{"Name": "instance-state-name",
                                         "Values": QUOTA_STATES}]):
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    mine = (tags.get(naming.TAG_PROJECT) == cfg.project
                            and tags.get(naming.TAG_POOL) == pool.name)
                    rows.append((inst["InstanceType"], mine, inst.get("CpuOptions")))
        vcpus = self._vcpus(region, {t for t, _, _ in rows})
        out: dict[str, list[int]] = {}
        for itype, mine, cpu in rows:
            code = quota_code(itype)
            if code is None:
                continue
            n = vcpus.get(itype)
            if n is None and cpu:
                n = int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1))
            acc = out.setdefault(code, [0, 0])
            acc[0] += n or 0
            acc[1] += (n or 0) if mine else 0
        return {k: (v[0], v[1]) for k, v in out.items()}

    def quota_lines(self, cfg: Config, pool: Pool, needs: list[dict[str, Any]]
                    ) -> list[QuotaLine]:
        out = []
        used_by_region: dict[str, dict[str, tuple[int, int]]] = {}
        for need in needs:
            assert pool.aws is not None  # asked for the pool's aws placement (Config.targets)
            region = need.get("scope") or pool.aws.region
            sq = self.client("service-quotas", region)
            code = need["name"]
            quota = self._quota(sq, code)
            if region not in used_by_region:
                used_by_region[region] = self._in_use(cfg, pool, region)
            used, mine = used_by_region[region].get(code, (0, 0))
            out.append(QuotaLine(
                name=code, unit=need.get("unit", "vCPU"), scope=region,
                needed=int(need["needed"]), granted=float(quota["Value"]), in_use=used,
                pool_in_use=mine, description=quota.get("QuotaName", ""),
            ))
        return out

    def _quota(self, sq: Any, code: str) -> dict[str, Any]:
        """The applied value; AWS's default where no value was ever applied here."""
        from botocore.exceptions import ClientError

        quota: dict[str, Any]
        with self.call(f"service-quotas:GetServiceQuota ec2/{code}"):
            try:
                quota = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
                return quota
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in (
                        "NoSuchResourceException", "IllegalArgumentException"):
                    raise
        with self.call(f"service-quotas:GetAWSDefaultServiceQuota ec2/{code}"):
            quota = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
            return quota

    def _open_request(self, sq: Any, code: str) -> dict[str, Any] | None:
        for page in self.pages(sq, "list_requested_service_quota_change_history_by_quota",
                               "service-quotas:ListRequestedServiceQuotaChangeHistoryByQuota",
                               ServiceCode="ec2", QuotaCode=code):
            requested: list[dict[str, Any]] = page.get("RequestedQuotas", [])
            for r in requested:
                if r.get("Status") in OPEN_REQUEST:
                    return r
        return None

    def request_quota(self, line: QuotaLine, desired: float) -> QuotaRequest:
        from botocore.exceptions import ClientError

        sq = self.client("service-quotas", line.scope)
        what = f"service-quotas:RequestServiceQuotaIncrease ec2/{line.name}"
        found = self._open_request(sq, line.name)
        if found is None:
            with self.call(what):
                try:
                    r = sq.request_service_quota_increase(
                        ServiceCode="ec2", QuotaCode=line.name, DesiredValue=float(desired)
                    )["RequestedQuota"]
                    return QuotaRequest(name=line.name, scope=line.scope,
                                        desired=float(r["DesiredValue"]), id=r["Id"],
                                        state=r["Status"])
                except ClientError as e:
                    if e.response.get("Error", {}).get("Code") != (
                            "ResourceAlreadyExistsException"):
                        raise
            found = self._open_request(sq, line.name)  # filed meanwhile by someone else
            if found is None:
                raise OperationFailed(f"aws {what}: an open request exists but is not "
                                      "listed; check the Service Quotas console")
        return QuotaRequest(name=line.name, scope=line.scope,
                            desired=float(found["DesiredValue"]), id=found["Id"],
                            state=found["Status"], already_open=True)

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
        reuse = {"ReuseOnScaleIn": True}
        try:
            with self.call(f"autoscaling:DescribeWarmPool {group.name}"):
                cfg = asg.describe_warm_pool(AutoScalingGroupName=group.name, MaxRecords=1
                                             ).get("WarmPoolConfiguration") or {}
            reuse = cfg.get("InstanceReusePolicy") or reuse
            with self.call(f"autoscaling:PutWarmPool {group.name}"):
                asg.put_warm_pool(
                    AutoScalingGroupName=group.name, MinSize=warm_nodes,
                    # As the stack sets it: room for the minimum plus the warm nodes.
                    MaxGroupPreparedCapacity=min_nodes + warm_nodes,
                    PoolState="Running" if warm_running else "Stopped",
                    InstanceReusePolicy=reuse,
                )
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

    # -- rollouts -------------------------------------------------------------------

    def rollout_apply_env(self, group: Group, plan: PoolPlan, *, no_surge: bool
                          ) -> dict[str, str]:
        running, _ = self._resolved_version(group)
        return contract.rollout_env(
            plan, running_version=running, min_nodes=group.min_nodes,
            desired_nodes=group.desired_nodes, warm_min_nodes=group.warm_min_nodes,
            no_surge=no_surge)

    def rollout_begin(self, group: Group, cfg: Config, pool: Pool, plan: PoolPlan, *,
                      no_surge: bool, stack_dir: Path | None) -> RolloutState | None:
        running, latest = self._resolved_version(group)
        if str(latest) == running:
            # No new version: nothing to roll, unless a refresh is already on its way (the
            # provider starts one itself when the group was not pinned, e.g. on $Latest).
            state = self.rollout_state(group)
            return state if state is not None and not state.done else None
        # The stack's own preferences (the same function wrote them), sized for now.
        prefs = contract.refresh_api_preferences(pool, plan, desired=group.desired_nodes,
                                                 no_surge=no_surge)
        asg = self.client("autoscaling", group.region)
        desired = {"LaunchTemplate": {"LaunchTemplateId": group.template,
                                      "Version": str(latest)}}
        with self.call(f"autoscaling:StartInstanceRefresh {group.name}"):
            rid = asg.start_instance_refresh(
                AutoScalingGroupName=group.name, Strategy="Rolling",
                DesiredConfiguration=desired, Preferences=prefs,
            )["InstanceRefreshId"]
        return RolloutState(
            id=rid, status=RolloutStatus.pending, cloud_status="Pending", done=False,
            percentage_complete=0,
            checkpoints=list(prefs.get("CheckpointPercentages") or [100]),
            from_version=running, to_version=str(latest),
        )

    def _state(self, r: dict[str, Any], group_version: str = "") -> RolloutState:
        prefs = r.get("Preferences") or {}
        cps = list(prefs.get("CheckpointPercentages") or [100])
        live = ((r.get("ProgressDetails") or {}).get("LivePoolProgress") or {})
        live_pct = live.get("PercentageComplete", r.get("PercentageComplete", 0))
        status = r.get("Status", "")
        # Reached only on the way forward: a rollback or cancel keeps the old live progress.
        forward = not status.startswith(("Rollback", "Cancel"))
        reached = [c for c in cps if c <= live_pct] if forward else []
        rb = r.get("RollbackDetails") or {}
        to = str(((r.get("DesiredConfiguration") or {}).get("LaunchTemplate") or {}
                  ).get("Version", group_version))
        return RolloutState(
            id=r["InstanceRefreshId"], cloud_status=status, done=status in REFRESH_DONE,
            status=REFRESH_STATUS.get(status, RolloutStatus.failed if status in REFRESH_DONE
                                      else RolloutStatus.in_progress),
            percentage_complete=float(r.get("PercentageComplete") or 0),
            checkpoints=cps, checkpoint_reached=max(reached) if reached else None,
            instances_to_update=r.get("InstancesToUpdate"),
            from_version=group_version if group_version != to else "", to_version=to,
            reason=r.get("StatusReason") or rb.get("RollbackReason") or "",
        )

    def rollout_state(self, group: Group) -> RolloutState | None:
        asg = self.client("autoscaling", group.region)
        # The newest refresh comes first; one record is all that is needed (no paging).
        with self.call(f"autoscaling:DescribeInstanceRefreshes {group.name}"):
            refreshes = asg.describe_instance_refreshes(
                AutoScalingGroupName=group.name, MaxRecords=1)["InstanceRefreshes"]
        return self._state(refreshes[0], group.version) if refreshes else None

    def _refresh_action(self, group: Group, api: str, method: str) -> RolloutState:
        """Cancel/Rollback InstanceRefresh, then the refresh as it now stands."""
        asg = self.client("autoscaling", group.region)
        with self.call(f"autoscaling:{api} {group.name}"):
            getattr(asg, method)(AutoScalingGroupName=group.name)
        state = self.rollout_state(group)
        assert state is not None  # the call above just acted on one
        return state

    def rollout_cancel(self, group: Group) -> RolloutState:
        return self._refresh_action(group, "CancelInstanceRefresh", "cancel_instance_refresh")

    def rollout_rollback(self, group: Group) -> RolloutState:
        return self._refresh_action(group, "RollbackInstanceRefresh",
                                    "rollback_instance_refresh")

    # -- queue ----------------------------------------------------------------------

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
