"""EC2's running On-Demand vCPU quotas, through Service Quotas: what a pool needs against
what is granted and what runs in the region (the pool's own share apart), and increase
requests (one open request per quota: an earlier one is found, not filed again)."""

from __future__ import annotations

from typing import Any

from poolctl import naming
from poolctl.adaptors.aws import botocore_exceptions
from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.clouds.aws.api import AwsApi, error_code
from poolctl.clouds.base import QuotaLine, QuotaRequest, RequestsQuota
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed
from poolctl.sizing import QuotaNeed

# EC2 running On-Demand quotas by instance family (vCPUs of running instances).
QUOTA_P = "L-417A185B"
QUOTA_G = "L-DB2E81BA"
QUOTA_STANDARD = "L-1216C47A"
STANDARD_FAMILIES = set("acdhimrtz")
OPEN_REQUEST = ("PENDING", "CASE_OPENED")
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


class ServiceQuotas(AwsApi, RequestsQuota):
    """`quota check` and `quota request` on AWS (part of `AwsOps`)."""

    def _vcpus(self, region: str, types: set[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in types:
            row = load_catalog().get(Cloud.aws, t)
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

    def quota_lines(self, cfg: Config, pool: Pool, needs: list[QuotaNeed]
                    ) -> list[QuotaLine]:
        out = []
        used_by_region: dict[str, dict[str, tuple[int, int]]] = {}
        for need in needs:
            assert pool.aws is not None  # asked for the pool's aws placement (Config.targets)
            region = need.scope or pool.aws.region
            sq = self.client("service-quotas", region)
            code = need.name
            quota = self._quota(sq, code)
            if region not in used_by_region:
                used_by_region[region] = self._in_use(cfg, pool, region)
            used, mine = used_by_region[region].get(code, (0, 0))
            out.append(QuotaLine(
                name=code, unit=need.unit or "vCPU", scope=region,
                needed=need.needed, granted=float(quota["Value"]), in_use=used,
                pool_in_use=mine, description=quota.get("QuotaName", ""),
            ))
        return out

    def _quota(self, sq: Any, code: str) -> dict[str, Any]:
        """The applied value; AWS's default where no value was ever applied here."""
        quota: dict[str, Any]
        with self.call(f"service-quotas:GetServiceQuota ec2/{code}"):
            try:
                quota = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
                return quota
            except botocore_exceptions.ClientError as e:
                if error_code(e) not in ("NoSuchResourceException", "IllegalArgumentException"):
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
                except botocore_exceptions.ClientError as e:
                    if error_code(e) != "ResourceAlreadyExistsException":
                        raise
            found = self._open_request(sq, line.name)  # filed meanwhile by someone else
            if found is None:
                raise OperationFailed(f"aws {what}: an open request exists but is not "
                                      "listed; check the Service Quotas console")
        return QuotaRequest(name=line.name, scope=line.scope,
                            desired=float(found["DesiredValue"]), id=found["Id"],
                            state=found["Status"], already_open=True)
