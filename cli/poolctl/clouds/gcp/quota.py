"""Compute Engine quotas on GCP: the region's and the project's (RegionsClient /
ProjectsClient: granted and in use), and increase requests through the Cloud Quotas API as
quota preferences (one per quota and dimensions: an earlier one is raised, not added to).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from poolctl.adaptors.gcp import api_exceptions, cloudquotas_v1, field_mask_pb2
from poolctl.cloud import Cloud
from poolctl.clouds.base import QuotaLine, QuotaRequest, RequestsQuota
from poolctl.clouds.gcp.api import one_line
from poolctl.clouds.gcp.mig import STOPPED_STATUSES, MigReader, mig_ref
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import QuotaNeed, instance_row

CONTACT_ENV = "POOLCTL_QUOTA_CONTACT_EMAIL"
QUOTA_SERVICE = "compute.googleapis.com"
# GPU quotas are increased through the per-family quota, dimensioned by region and
# gpu_family (newer families such as H100, H200 and B200 have no other); the compute metric
# name minus `_GPUS` is the family (NVIDIA_H100_GPUS -> NVIDIA_H100).
GPU_FAMILY_QUOTA = "GPUS-PER-GPU-FAMILY-per-project-region"
# The other compute quota metrics (RegionsClient / ProjectsClient) poolctl needs, by their
# Cloud Quotas ids.
QUOTA_IDS = {
    "CPUS": "CPUS-per-project-region",
    "LOCAL_SSD_TOTAL_GB": "LOCAL-SSD-TOTAL-GB-per-project-region",
    "GPUS_ALL_REGIONS": "GPUS-ALL-REGIONS-per-project",
}


def cloud_quota(metric: str, scope: str) -> tuple[str, dict[str, str]] | None:
    """The Cloud Quotas (quota id, dimensions) of a compute quota metric in a scope."""
    dims = {} if scope == "global" else {"region": scope}
    if metric in QUOTA_IDS:
        qid = QUOTA_IDS[metric]
        return qid, (dims if qid.endswith("-region") else {})
    m = re.fullmatch(r"(NVIDIA_[A-Z0-9_]+)_GPUS", metric)
    if m and scope != "global":
        return GPU_FAMILY_QUOTA, {**dims, "gpu_family": m.group(1)}
    return None


class GcpQuotas(MigReader, RequestsQuota):
    """`quota check` and `quota request` on GCP (part of `GcpOps`). `contact_email`: for
    Cloud Quotas increase requests (else the POOLCTL_QUOTA_CONTACT_EMAIL environment
    variable)."""

    def __init__(self, *, contact_email: str | None = None, **api: Any) -> None:
        super().__init__(**api)
        self._contact_email = contact_email
        # quota line (name, scope) -> project, remembered by quota_lines for request_quota
        self._quota_project: dict[tuple[str, str], str] = {}

    def _pool_running_nodes(self, cfg: Config, pool: Pool) -> int:
        """VMs of the pool that count against running quotas (stopped standby VMs do not);
        0 when the pool is not deployed."""
        try:
            group = self.find_group(cfg, pool)
        except OperationFailed:
            return 0
        project, region, name = mig_ref(group)
        return sum(1 for mi in self.managed_instances(project, region, name)
                   if mi.instance_status and mi.instance_status not in STOPPED_STATUSES)

    def quota_lines(self, cfg: Config, pool: Pool, needs: list[QuotaNeed]
                    ) -> list[QuotaLine]:
        assert pool.gcp is not None  # asked for the pool's gcp placement (Config.targets)
        project = pool.gcp.project
        row = instance_row(pool, Cloud.gcp)
        per_node = {row.quota.name: row.quota_per_node, "CPUS": row.vcpus,
                    "LOCAL_SSD_TOTAL_GB": row.local_nvme.count * row.local_nvme.size_gb,
                    "GPUS_ALL_REGIONS": row.gpus}
        titles = {row.quota.name: row.quota.description or row.quota.name, "CPUS": "vCPUs",
                  "LOCAL_SSD_TOTAL_GB": "Local SSD", "GPUS_ALL_REGIONS": "GPUs, all regions"}
        scopes: dict[str, dict[str, Any]] = {}

        def quotas(scope: str) -> dict[str, Any]:
            if scope not in scopes:
                try:
                    if scope == "global":
                        res = self.lookup(f"get project {project}",
                                          self.client("ProjectsClient").get, project=project)
                    else:
                        res = self.lookup(f"get region {scope}",
                                          self.client("RegionsClient").get,
                                          project=project, region=scope)
                except api_exceptions.NotFound:
                    key = "gcp.project" if scope == "global" else "gcp.region"
                    what = project if scope == "global" else scope
                    raise OperationFailed(f"{key}: {what!r} not found in project {project} "
                                          f"(or the Compute Engine API is off); check {key}") \
                        from None
                scopes[scope] = {q.metric: q for q in res.quotas}
            return scopes[scope]

        running = self._pool_running_nodes(cfg, pool)
        lines = []
        for need in needs:
            name, scope = need.name, need.scope
            q = quotas(scope).get(name)
            self._quota_project[(name, scope)] = project
            if q is None:
                # Compute lists every metric a region offers; an absent one grants nothing.
                lines.append(QuotaLine(
                    name=name, unit=need.unit, scope=scope, needed=need.needed,
                    granted=0.0, in_use=0.0,
                    description=f"{project} lists no {name} quota in {scope}: the region "
                                "offers none; pick another gcp.region or machine type"))
                continue
            mine = float(running * per_node.get(name, 0))
            lines.append(QuotaLine(
                name=name, unit=need.unit, scope=scope, needed=need.needed,
                granted=float(q.limit), in_use=float(q.usage),
                # The quota's usage includes the pool's own running VMs; never claim more
                # than the region reports.
                pool_in_use=min(mine, float(q.usage)),
                description=titles.get(name, need.description)))
        return lines

    def request_quota(self, line: QuotaLine, desired: float) -> QuotaRequest:
        cq = cloudquotas_v1
        project = self._quota_project.get((line.name, line.scope))
        if project is None:
            raise OperationFailed(f"quota {line.name}: read it with quota check first "
                                  "(the project is taken from the pool's gcp.project)")
        mapped = cloud_quota(line.name, line.scope)
        if mapped is None:
            raise OperationFailed(f"quota {line.name} ({line.scope}): no Cloud Quotas id is "
                                  "known for it; request it in the console (IAM & Admin > "
                                  "Quotas)")
        qid, dims = mapped
        want = int(math.ceil(desired))
        client = self.client("CloudQuotasClient")
        parent = f"projects/{project}/locations/global"
        prefs = self.call("list quota preferences", client.list_quota_preferences,
                          parent=parent)
        existing = next((p for p in prefs if p.service == QUOTA_SERVICE and p.quota_id == qid
                         and dict(p.dimensions) == dims), None)
        if existing is not None and existing.quota_config.preferred_value >= want:
            return self._quota_request(line, existing, already_open=True)

        contact = self._contact_email or os.environ.get(CONTACT_ENV)
        if not contact:
            raise UsageError(f"--contact-email: Cloud Quotas requires a contact email for an "
                             f"increase; pass --contact-email ADDRESS (or set {CONTACT_ENV}) "
                             "with an address Google can reach about the request")
        justification = (f"poolctl inference pool: {line.name} needed {line.needed} "
                         f"({line.unit}), {line.in_use:g} in use")
        try:
            if existing is not None:
                # One preference per quota and dimensions: raise it rather than adding one.
                pref = self.lookup(
                    f"update quota preference {existing.name}",
                    client.update_quota_preference,
                    quota_preference=cq.QuotaPreference(
                        name=existing.name, quota_config=cq.QuotaConfig(preferred_value=want),
                        contact_email=contact, justification=justification),
                    update_mask=field_mask_pb2.FieldMask(
                        paths=["quota_config.preferred_value", "contact_email",
                               "justification"]),
                )
            else:
                # A readable, stable id: the next request for this quota finds it by
                # service, quota id and dimensions anyway.
                pid = f"poolctl-{line.name.lower().replace('_', '-')}-{line.scope}"[:63]
                pref = self.lookup(
                    f"create quota preference for {line.name}",
                    client.create_quota_preference,
                    parent=parent, quota_preference_id=pid,
                    quota_preference=cq.QuotaPreference(
                        service=QUOTA_SERVICE, quota_id=qid, dimensions=dims,
                        quota_config=cq.QuotaConfig(preferred_value=want),
                        contact_email=contact, justification=justification),
                )
        except api_exceptions.NotFound as e:
            raise OperationFailed(f"GCP quota request {line.name}: "
                                  f"{one_line(e.message)}") from None
        return self._quota_request(line, pref, already_open=False)

    @staticmethod
    def _quota_request(line: QuotaLine, pref: Any, *, already_open: bool) -> QuotaRequest:
        cfg = pref.quota_config
        granted = cfg.granted_value
        if pref.reconciling:
            state = "PENDING"
        elif granted is not None and granted >= cfg.preferred_value:
            state = "GRANTED"
        else:
            state = "DENIED" + (f": {cfg.state_detail}" if cfg.state_detail else "")
        return QuotaRequest(name=line.name, scope=line.scope, desired=cfg.preferred_value,
                            id=pref.name, state=state, already_open=already_open)
