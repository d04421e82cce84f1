"""GCP runtime operations on a deployed pool: its regional MIG, standby pool, autoscaler and
quotas, through the Compute Engine REST API (`google-cloud-compute`) and the Cloud Quotas API
(`google-cloud-quotas`).

What the GCP stack leaves behind (stacks/gcp): a global instance template carrying the
contract's labels, a regional MIG using it (standby policy SCALE_OUT_POOL with
`target_stopped_size` for a stopped warm pool, PROACTIVE updates with surge) and a regional
autoscaler on the queue metric. MIGs carry no labels of their own, so the pool's MIG is the
one whose versions point at the pool's labelled templates.

Capabilities (poolctl.clouds.base): quota requests, cancel, rollback, the queue metric, and
StepsRollouts (below). Not HibernatesWarmNodes: a standby pool can hold suspended VMs, but
suspending GPU VMs is unsupported (cloud-facts.md), and poolctl's rules refuse `hibernated`
for GPU nodes.

Rollouts with checkpoints. A regional MIG cannot pause an update, but it runs a canary: two
versions, the new template at a percentage of the group. The stack creates the MIG's one
version and then ignores `version` (poolctl_stacks/gcp/pool.py), so the apply of `rollout
start` only writes the new template, and a later `deploy` never undoes a rollout in
progress. poolctl then owns the versions (`_set_versions`), named after what it is doing
(poolctl.contract.gcp.VERSION_*, readable by any poolctl): the new template at the pool's
first checkpoint beside the old one (`rollout_begin`); `wait_rollout` moves it on to the
next checkpoint once the canary's VMs are healthy and the checkpoint delay has passed
(`rollout_advance`), and at 100 % the new template alone finishes the update; a canary VM
found unhealthy rolls back. `rollout cancel` holds the split (a version no driver moves on),
`rollout rollback` points the MIG back at the old template alone, at any step. Nothing
moves a canary while no poolctl watches (`--no-wait`, Ctrl-C): it holds at its step until
`rollout start` with the same version drives it on.

Rollback target (the previous instance template). The stack names templates by content
version (`name_prefix`, `create_before_destroy`), so the apply that writes a new one would
then delete the old one: the template every VM still runs mid-update, and the one
`rollout rollback` points the MIG back at. The google provider keeps no earlier templates
(its MIG resource only follows the one version in the configuration). So before the apply of
`rollout start` (`rollout_before_apply`), a template the plan replaces is removed from
Terraform's state: Terraform forgets it instead of deleting it, creates the new one and
points the MIG at it; the old one stays, labelled, as the rollback target. After the apply
and after a successful update, `rollout_cleanup` deletes the pool's templates that are
neither the MIG's target nor the previous one nor run by any VM, so two remain once the
update ends. A plain `deploy` keeps Terraform's replace-and-delete. The kept template is
outside Terraform's state: `destroy` leaves it behind (labelled with the pool).

The calls themselves (clients, retries, operation waits, OS Login, Monitoring) are
`poolctl.clouds.gcp.api.GceApi`, which `GcpOps` builds on; this module is the policy.
Endpoints: `client_options` (e.g. {"api_endpoint": "http://127.0.0.1:PORT"}; `make_ops`
passes `CloudEndpoints.gce_url`, which the CLI's edge reads from POOLCTL_GCE_ENDPOINT) point
the APIs (and OS Login's, for `nodes check --access iap`, and Cloud Monitoring's, for the
queue in `status`) elsewhere. Plain-http
endpoints get anonymous credentials: a token must never travel unencrypted, and only a local
fake speaks plain http. Every mutation waits for its Operation through a
Region/GlobalOperationsClient built with the same options: the clients' own polling builds a
default client that would miss the endpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poolctl import naming
from poolctl.clouds import Cloud
from poolctl.clouds.base import (
    CancelsRollouts,
    CloudOps,
    Group,
    NodePhase,
    NodeState,
    PublishesQueueMetric,
    QuotaLine,
    QuotaRequest,
    RequestsQuota,
    RolloutState,
    RolloutStatus,
    RollsBackRollouts,
    StepsRollouts,
    address_order,
)
from poolctl.clouds.gcp.api import (
    _MIG_REF,
    GceApi,
    _created,
    _last,
    _one_line,
    _zone,
)
from poolctl.config import Config, Pool
from poolctl.contract import gcp as contract
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import PoolPlan

if TYPE_CHECKING:
    from poolctl.terraform import Terraform

QUEUE_WINDOW_S = 600  # how far back `status` looks for the queue metric, as on AWS
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

_PENDING_ACTIONS = {
    "CREATING", "CREATING_WITHOUT_RETRIES", "VERIFYING", "RECREATING", "REFRESHING",
    "RESTARTING", "STARTING", "RESUMING", "STOPPING", "SUSPENDING",
}
_STOPPED = {"STOPPED", "TERMINATED", "SUSPENDED"}  # GCE reports a stopped VM as TERMINATED
_GONE_ACTIONS = {"DELETING", "ABANDONING"}


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


TEMPLATE_TYPE = "google_compute_instance_template"


def replaced_templates(plan: dict[str, Any]) -> list[dict[str, str]]:
    """Instance templates a Terraform plan (`terraform show -json`) replaces:
    [{address, name}]. A replacement plans both a create and a delete of the same address
    (["create", "delete"] with create_before_destroy); a plain create or delete is not one."""
    out = []
    for rc in plan.get("resource_changes", []):
        actions = set((rc.get("change") or {}).get("actions") or [])
        if rc.get("type") == TEMPLATE_TYPE and {"create", "delete"} <= actions:
            before = (rc.get("change") or {}).get("before") or {}
            out.append({"address": rc["address"], "name": before.get("name") or ""})
    return out


def running_filter(cfg: Config, pool: Pool) -> str:
    """The aggregated-list filter of the pool's running VMs (the contract's labels)."""
    return (f'labels.{naming.LABEL_PROJECT} = "{cfg.project}" AND '
            f'labels.{naming.LABEL_POOL} = "{pool.name}" AND status = "RUNNING"')


def running_nodes(pages: Any, region: str) -> list[tuple[str, str, str | None]]:
    """(zone key, InstancesScopedList) pairs of an aggregated list -> (internal IP, instance
    name, zone) of the region's running nodes, by IP."""
    found = {}
    for zone_key, scoped in pages:
        zone = zone_key.rsplit("/", 1)[-1]
        if not zone.startswith(f"{region}-"):
            continue
        for inst in getattr(scoped, "instances", None) or []:
            if getattr(inst, "status", "RUNNING") != "RUNNING":
                continue
            for nic in inst.network_interfaces[:1]:
                if nic.network_i_p:
                    found[nic.network_i_p] = (inst.name, zone)
    return [(ip, *found[ip]) for ip in sorted(found, key=address_order)]


def node_phase(instance_status: str, current_action: str, target_status: str,
               health: list[str]) -> NodePhase:
    """A managed instance's phase for `status` and `warm --wait`.

    Standby VMs are created, run their first boot for the standby initial delay, then stop:
    until stopped they are pending, not warm. A VM being started out of the standby pool is
    pending too. Health comes from the autohealing check (UNKNOWN during its initial delay).
    """
    status, action, target = instance_status or "", current_action or "NONE", target_status or ""
    if action in _GONE_ACTIONS or target in ("DELETED", "ABANDONED") or "DRAINING" in health:
        return "terminating"
    if action in _PENDING_ACTIONS:
        return "pending"
    if status in _STOPPED:
        return "warm" if target in ("", "STOPPED", "SUSPENDED") else "pending"
    if status == "RUNNING":
        if target in ("STOPPED", "SUSPENDED"):
            return "pending"
        if any(h in ("UNHEALTHY", "TIMEOUT") for h in health):
            return "unhealthy"
        if not health or all(h == "HEALTHY" for h in health):
            return "in_service"
        return "pending"
    return "pending"  # PROVISIONING, STAGING, REPAIRING, STOPPING ...


@dataclass
class RolloutView:
    """The pool's MIG as a rollout sees it (GcpOps._rollout_view)."""

    project: str
    region: str
    name: str  # the MIG's
    mig: Any  # compute_v1.InstanceGroupManager
    target: str  # the template the MIG's target version names
    previous: str  # the template it came from (the rollback target), "" if none
    live: list[Any] = field(default_factory=list)  # managed VMs not being deleted
    on_old: Counter[str] = field(default_factory=Counter)  # VMs per template other than target
    links: dict[str, str] = field(default_factory=dict)  # pool template name -> self link


class GcpOps(GceApi, CloudOps, RequestsQuota, CancelsRollouts, RollsBackRollouts,
             PublishesQueueMetric, StepsRollouts):
    # StepsRollouts: a cancelled (held) canary still has both versions, so `rollout rollback`
    # points the MIG back at the old one instead of rolling the old version out anew.
    cloud = "gcp"

    def __init__(self, *, client_options: dict[str, Any] | Any | None = None,
                 credentials: Any = None, contact_email: str | None = None,
                 retry_initial_s: float = 1.0,
                 retry_deadline_s: float = 300.0, call_timeout_s: float = 60.0,
                 operation_timeout_s: float = 900.0) -> None:
        super().__init__(client_options=client_options, credentials=credentials,
                         retry_initial_s=retry_initial_s, retry_deadline_s=retry_deadline_s,
                         call_timeout_s=call_timeout_s, operation_timeout_s=operation_timeout_s)
        self._contact_email = contact_email
        # quota line (name, scope) -> project, remembered by quota_lines for request_quota
        self._quota_project: dict[tuple[str, str], str] = {}
        # group self link -> its pool (checkpoints, delay), remembered by find_group
        self._pools: dict[str, Pool] = {}
        # (group, template, step) -> when the driver first saw that checkpoint reached
        self._reached_at: dict[tuple[str, str, int], float] = {}

    # ------------------------------------------------------------------ templates and groups

    def _labelled_templates(self, project: str, labels: dict[str, str]) -> list[Any]:
        """The project's global instance templates carrying `labels`, oldest first."""
        from google.api_core import exceptions as gexc

        client = self._client("InstanceTemplatesClient")
        try:
            items = self._lookup("list instance templates", client.list, project=project)
        except gexc.NotFound:
            raise OperationFailed(f"gcp.project: project {project!r} not found or the Compute "
                                  "Engine API is off in it; check gcp.project") from None
        found = [t for t in items
                 if all(t.properties.labels.get(k) == v for k, v in labels.items())]
        return sorted(found, key=_created)

    @staticmethod
    def _versions(mig: Any) -> tuple[str, list[str]]:
        """(target template link, other version links). With two versions (a canary), the
        one with a target size is where the group is heading."""
        versions = list(mig.versions)
        if not versions:
            return mig.instance_template, []
        sized = [v for v in versions if v.target_size.fixed or v.target_size.percent]
        target = (sized or versions)[-1]
        others = [v.instance_template for v in versions if v is not target]
        return target.instance_template, others

    def _autoscaler(self, mig: Any) -> Any:
        """The regional autoscaler targeting the MIG, or None."""
        from google.api_core import exceptions as gexc

        ref = _MIG_REF.search(mig.self_link)
        assert ref is not None  # the self link of a MIG found in a region's list
        project, region, name = ref.groups()
        client = self._client("RegionAutoscalersClient")
        link = mig.status.autoscaler
        if link:
            try:
                return self._lookup(f"get autoscaler of {name}", client.get, project=project,
                                    region=region, autoscaler=_last(link))
            except gexc.NotFound:
                pass
        for a in self._call("list autoscalers", client.list, project=project, region=region):
            if _last(a.target) == name and f"/regions/{region}/" in a.target:
                return a
        return None

    def node_addresses(self, cfg: Config, pool: Pool) -> list[tuple[str, str, str | None]]:
        """By label, through the Compute Engine endpoint poolctl uses (POOLCTL_GCE_ENDPOINT
        honoured)."""
        if pool.gcp is None:
            raise UsageError(f"--cloud gcp: pool {pool.name!r} has no `gcp:` placement")
        pages = self.running_instances(pool.gcp.project, running_filter(cfg, pool))
        return running_nodes(pages, pool.gcp.region)

    def find_group(self, cfg: Config, pool: Pool) -> Group:
        p = pool.gcp
        if p is None:
            raise UsageError(f"--cloud gcp: pool {pool.name!r} has no `gcp:` placement")
        from google.api_core import exceptions as gexc

        labels = naming.gcp_labels(cfg, pool)
        templates = self._labelled_templates(p.project, labels)
        names = {t.name for t in templates}
        try:
            migs = self._lookup("list MIGs",
                                self._client("RegionInstanceGroupManagersClient").list,
                                project=p.project, region=p.region)
        except gexc.NotFound:
            raise OperationFailed(f"gcp.region: region {p.region!r} not found in project "
                                  f"{p.project!r}; check gcp.region") from None
        found = []
        for m in migs:
            used = {_last(v.instance_template) for v in m.versions}
            used.add(_last(m.instance_template))
            own = m.all_instances_config.properties.labels
            if used & names or all(own.get(k) == v for k, v in labels.items()):
                found.append(m)
        label_text = ", ".join(f"{k}={v}" for k, v in labels.items() if k != naming.LABEL_ROLE)
        if not found:
            raise OperationFailed(
                f"pool {pool.name}: no regional MIG in project {p.project}, region {p.region} "
                f"uses an instance template labelled {label_text}; deploy it with "
                f"`poolctl deploy --cloud gcp --pool {pool.name}`")
        if len(found) > 1:
            raise OperationFailed(
                f"pool {pool.name}: {len(found)} MIGs in {p.project}/{p.region} use templates "
                f"labelled {label_text} ({', '.join(m.name for m in found)}); delete the "
                "stray group so that one remains")
        group = self._group(found[0], pool)
        self._remember(group, pool)
        return group

    def _group(self, mig: Any, pool: Pool) -> Group:
        """The group's sizes. A stopped warm pool is the standby pool. A running one cannot
        stand aside on GCE: the stack adds it to the autoscaler's minimum, so for a pool
        whose file says `running` the part of that minimum above the file's minimum is
        reported as the warm size (a `warm --running` raise reads the same way: the total
        is what matters to the cloud)."""
        from poolctl.sizing import plan_pool

        region = _last(mig.region)
        a = self._autoscaler(mig)
        target, _ = self._versions(mig)
        stopped, suspended = mig.target_stopped_size, mig.target_suspended_size
        if a is not None:
            lo, hi = a.autoscaling_policy.min_num_replicas, a.autoscaling_policy.max_num_replicas
        else:
            lo = hi = mig.target_size
        warm, state = stopped + suspended, ""
        if stopped:
            state = "stopped"
        elif suspended:
            state = "suspended"
        elif pool.warm_pool.state == "running":
            warm = max(0, lo - plan_pool(pool, "gcp").nodes["min"])
            lo, state = lo - warm, "running"
        return Group(
            cloud="gcp", name=mig.name, region=region, min_nodes=lo, max_nodes=hi,
            desired_nodes=mig.target_size, warm_min_nodes=warm, warm_state=state,
            version=_last(target), raw_id=mig.self_link, template=_last(target),
        )

    # ------------------------------------------------------------------ nodes

    def _managed(self, project: str, region: str, name: str) -> list[Any]:
        managed: list[Any] = self._call(
            f"list instances of {name}",
            self._client("RegionInstanceGroupManagersClient").list_managed_instances,
            project=project, region=region, instance_group_manager=name)
        return managed

    def nodes(self, group: Group) -> list[NodeState]:
        project, region, name = self._mig_ref(group)
        out = []
        for mi in self._managed(project, region, name):
            health = [h.detailed_health_state for h in mi.instance_health]
            state = "/".join(x for x in (mi.instance_status or "NONEXISTENT",
                                         mi.current_action or "NONE",
                                         *sorted(set(health))) if x)
            if mi.target_status and mi.target_status != mi.instance_status:
                state += f"->{mi.target_status}"
            out.append(NodeState(
                id=mi.name or _last(mi.instance), state=state,
                phase=node_phase(mi.instance_status, mi.current_action, mi.target_status,
                                 health),
                version=_last(mi.version.instance_template), zone=_zone(mi.instance),
            ))
        return out

    # ------------------------------------------------------------------ quotas

    def _pool_running_nodes(self, cfg: Config, pool: Pool) -> int:
        """VMs of the pool that count against running quotas (stopped standby VMs do not);
        0 when the pool is not deployed."""
        try:
            group = self.find_group(cfg, pool)
        except OperationFailed:
            return 0
        project, region, name = self._mig_ref(group)
        return sum(1 for mi in self._managed(project, region, name)
                   if mi.instance_status and mi.instance_status not in _STOPPED)

    def quota_lines(self, cfg: Config, pool: Pool, needs: list[dict[str, Any]]
                    ) -> list[QuotaLine]:
        from google.api_core import exceptions as gexc

        from poolctl.sizing import instance_row

        assert pool.gcp is not None  # asked for the pool's gcp placement (Config.targets)
        project = pool.gcp.project
        row = instance_row(pool, "gcp")
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
                        res = self._lookup(f"get project {project}",
                                           self._client("ProjectsClient").get, project=project)
                    else:
                        res = self._lookup(f"get region {scope}",
                                           self._client("RegionsClient").get,
                                           project=project, region=scope)
                except gexc.NotFound:
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
            name, scope = need["name"], need["scope"]
            q = quotas(scope).get(name)
            self._quota_project[(name, scope)] = project
            if q is None:
                # Compute lists every metric a region offers; an absent one grants nothing.
                lines.append(QuotaLine(
                    name=name, unit=need["unit"], scope=scope, needed=int(need["needed"]),
                    granted=0.0, in_use=0.0,
                    description=f"{project} lists no {name} quota in {scope}: the region "
                                "offers none; pick another gcp.region or machine type"))
                continue
            mine = float(running * per_node.get(name, 0))
            lines.append(QuotaLine(
                name=name, unit=need["unit"], scope=scope, needed=int(need["needed"]),
                granted=float(q.limit), in_use=float(q.usage),
                # The quota's usage includes the pool's own running VMs; never claim more
                # than the region reports.
                pool_in_use=min(mine, float(q.usage)),
                description=titles.get(name, "")))
        return lines

    def request_quota(self, line: QuotaLine, desired: float) -> QuotaRequest:
        from google.api_core import exceptions as gexc
        from google.cloud import cloudquotas_v1 as cq
        from google.protobuf import field_mask_pb2

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
        client = self._client("CloudQuotasClient")
        parent = f"projects/{project}/locations/global"
        prefs = self._call("list quota preferences", client.list_quota_preferences,
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
                pref = self._lookup(
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
                pref = self._lookup(
                    f"create quota preference for {line.name}",
                    client.create_quota_preference,
                    parent=parent, quota_preference_id=pid,
                    quota_preference=cq.QuotaPreference(
                        service=QUOTA_SERVICE, quota_id=qid, dimensions=dims,
                        quota_config=cq.QuotaConfig(preferred_value=want),
                        contact_email=contact, justification=justification),
                )
        except gexc.NotFound as e:
            raise OperationFailed(f"GCP quota request {line.name}: "
                                  f"{_one_line(e.message)}") from None
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

    # ------------------------------------------------------------------ capacity

    def set_capacity(self, group: Group, *, min_nodes: int, warm_nodes: int,
                     warm_running: bool, desired_nodes: int | None = None) -> None:
        """Stopped warm nodes are the MIG's standby pool (`target_stopped_size`). A running
        warm node cannot stand aside on GCE: it serves, so the autoscaler's minimum becomes
        `min_nodes + warm_nodes` (its maximum is raised to that if below) and the stopped
        pool is emptied.

        With an autoscaler the target size is the autoscaler's: nodes above a lowered minimum
        are given back by it, one per scale-in window, and `desired_nodes` is not forced.
        Without one, the group is resized to `desired_nodes`, or raised to the minimum.
        """
        compute_v1 = self._compute()
        project, region, name = self._mig_ref(group)
        mig = self._get_mig(project, region, name)
        stopped = 0 if warm_running else warm_nodes
        serving_min = min_nodes + (warm_nodes if warm_running else 0)

        # Serving size first, then the standby pool: a running warm pool takes its nodes out
        # of standby (SCALE_OUT_POOL starts stopped VMs) before the pool is emptied, rather
        # than deleting them and creating new ones.
        a = self._autoscaler(mig)
        if a is not None:
            pol = a.autoscaling_policy
            new_max = max(pol.max_num_replicas, serving_min)
            if (pol.min_num_replicas, pol.max_num_replicas) != (serving_min, new_max):
                body = compute_v1.Autoscaler(
                    name=a.name, autoscaling_policy=compute_v1.AutoscalingPolicy(
                        min_num_replicas=serving_min, max_num_replicas=new_max))
                op = self._call(f"patch autoscaler {a.name}",
                                self._client("RegionAutoscalersClient").patch_unary,
                                request=compute_v1.PatchRegionAutoscalerRequest(
                                    project=project, region=region, autoscaler=a.name,
                                    autoscaler_resource=body, request_id=str(uuid.uuid4())))
                self._wait(op, project, region,
                           f"patch autoscaler {a.name} (min {serving_min})")
        else:
            size = serving_min if desired_nodes is None else max(desired_nodes, serving_min)
            if mig.target_size < size or (desired_nodes is not None and mig.target_size != size):
                op = self._call(f"resize MIG {name}",
                                self._client("RegionInstanceGroupManagersClient").resize_unary,
                                request=compute_v1.ResizeRegionInstanceGroupManagerRequest(
                                    project=project, region=region, instance_group_manager=name,
                                    size=size, request_id=str(uuid.uuid4())))
                self._wait(op, project, region, f"resize MIG {name} to {size}")

        standby_mode = mig.standby_policy.mode
        if mig.target_stopped_size != stopped or (stopped and standby_mode != "SCALE_OUT_POOL"):
            patch = compute_v1.InstanceGroupManager(target_stopped_size=stopped)
            if stopped:
                # SCALE_OUT_POOL: scale-out starts standby VMs before creating new ones.
                patch.standby_policy = compute_v1.InstanceGroupManagerStandbyPolicy(
                    mode="SCALE_OUT_POOL")
            op = self._call(f"patch MIG {name}",
                            self._client("RegionInstanceGroupManagersClient").patch_unary,
                            request=compute_v1.PatchRegionInstanceGroupManagerRequest(
                                project=project, region=region, instance_group_manager=name,
                                instance_group_manager_resource=patch,
                                request_id=str(uuid.uuid4())))
            self._wait(op, project, region, f"patch MIG {name} (standby {stopped})")

    # ------------------------------------------------------------------ rollouts

    def _pool_templates(self, project: str, target_link: str) -> list[Any]:
        """The pool's labelled templates, found through the labels of the target template."""
        from google.api_core import exceptions as gexc

        try:
            t = self._lookup("get instance template",
                             self._client("InstanceTemplatesClient").get,
                             project=project, instance_template=_last(target_link))
        except gexc.NotFound:
            return []
        labels = {k: t.properties.labels[k] for k in (naming.LABEL_PROJECT, naming.LABEL_POOL)
                  if k in t.properties.labels}
        if len(labels) < 2:
            return [t]
        return self._labelled_templates(project, labels)

    def _rollout_view(self, group: Group) -> RolloutView:
        project, region, name = self._mig_ref(group)
        mig = self._get_mig(project, region, name)
        target_link, other_links = self._versions(mig)
        target = _last(target_link)
        live = [mi for mi in self._managed(project, region, name)
                if mi.current_action not in _GONE_ACTIONS]
        on_old = Counter(_last(mi.version.instance_template) for mi in live
                         if _last(mi.version.instance_template) != target)
        templates = self._pool_templates(project, target_link)
        if other_links:
            previous = _last(other_links[0])
        elif on_old:
            previous = on_old.most_common(1)[0][0]
        else:
            # Ended: where it came from is the newest template older than the target after a
            # rollout (a newer one may be a `deploy`'s, not rolled yet), the newest other
            # after a rollback.
            names = [t.name for t in templates]
            back = bool(mig.versions) and mig.versions[0].name == contract.VERSION_ROLLBACK
            older = names[:names.index(target)] if target in names and not back else names
            others = [n for n in older if n != target]
            previous = others[-1] if others else ""
        links = {t.name: t.self_link for t in templates}
        return RolloutView(project, region, name, mig, target, previous, live, on_old, links)

    def rollout_apply_env(self, group: Group, plan: PoolPlan, *, no_surge: bool
                          ) -> dict[str, str]:
        """TF_VAR_... keeping runtime changes through the apply that writes a new version:
        the autoscaler's bounds and the standby size as `warm` left them, and with
        `no_surge` an update that replaces one VM per zone at a time instead of surging (a
        regional MIG takes a fixed surge/unavailable of 0 or at least its zone count).
        Names and values: poolctl.contract.gcp, which the stack declares them from."""
        zones = None
        if no_surge:
            project, region, name = self._mig_ref(group)
            zones = len(self._get_mig(project, region, name).distribution_policy.zones) or 1
        return contract.rollout_env(min_nodes=group.min_nodes, max_nodes=group.max_nodes,
                                    warm_min_nodes=group.warm_min_nodes, no_surge_zones=zones)

    def rollout_begin(self, group: Group, cfg: Config, pool: Pool, plan: PoolPlan, *,
                      no_surge: bool, stack_dir: Path | None) -> RolloutState | None:
        """After the apply of `rollout start` (which wrote the new template and left the
        MIG's versions alone): the first canary step, the new template at the pool's first
        checkpoint beside the one the group runs. The new template is the pool's newest: the
        apply has just created it. A canary of it already there (held by `rollout cancel`,
        or left at its step when nobody watched) is driven on from where it stands."""
        self._remember(group, pool)
        v = self._rollout_view(group)
        mig, target, links = v.mig, v.target, v.links
        newest = next(reversed(links), "")
        versions = list(mig.versions)
        canary = self._canary_version(mig)
        if canary is not None and _last(canary.instance_template) == newest:
            if not canary.target_size.percent:
                # Held during the last step (a fixed split): the new template alone again.
                self._set_versions(group, canary.instance_template, None)
            elif canary.name == contract.VERSION_HELD:
                self._set_versions(group, self._stable_version(mig).instance_template,
                                   canary.instance_template, canary.target_size)
            return self.rollout_state(group)
        if not newest or (canary is None and target == newest):
            # The apply left the template as it was: nothing to roll, unless the last step
            # of an earlier rollout is still under way.
            state = self.rollout_state(group)
            return state if state is not None and not state.done else None
        stable = (self._stable_version(mig).instance_template if canary is not None
                  else versions[0].instance_template if versions else mig.instance_template)
        first = contract.canary_steps(pool)[0]
        self._set_versions(group, stable, links[newest], self._percent(first))
        state = self.rollout_state(group)
        if state is not None:
            state.from_version = group.version
        return state

    def rollout_before_apply(self, tf: Terraform) -> list[dict[str, str]]:
        """Before the apply of `rollout start` (`tf`: poolctl.terraform.Terraform, its plan
        saved as `tfplan`): remove every instance template the plan replaces from the
        state, so that Terraform forgets it rather than deletes it (see the module doc).
        Returns [{address, name}] of what was forgotten; the caller plans again when any."""
        shown = tf.run("plan", "show", "-json", "tfplan", capture=True)
        forgotten = replaced_templates(json.loads(shown.stdout or "{}"))
        for t in forgotten:
            tf.run("state", "state", "rm", t["address"])
        return forgotten

    def rollout_cleanup(self, group: Group) -> dict[str, list[str]]:
        """Delete the pool's instance templates that are neither the MIG's target nor the
        previous one (the rollback target) nor run by any VM of the group: {"deleted":
        names, "failed": one line each}. A refused delete (a template some other group
        uses) is reported, not raised: a template left behind does not affect the rollout."""
        from google.api_core import exceptions as gexc

        v = self._rollout_view(group)
        project, mig, target, previous, live = v.project, v.mig, v.target, v.previous, v.live
        links = v.links
        keep = {target, previous, _last(mig.instance_template)}
        keep |= {_last(v.instance_template) for v in mig.versions}
        keep |= {_last(mi.version.instance_template) for mi in live}
        compute_v1 = self._compute()
        client = self._client("InstanceTemplatesClient")
        out: dict[str, list[str]] = {"deleted": [], "failed": []}
        for tname in sorted(set(links) - keep - {""}):
            what = f"delete instance template {tname}"
            try:
                op = self._lookup(what, client.delete_unary,
                                  request=compute_v1.DeleteInstanceTemplateRequest(
                                      project=project, instance_template=tname,
                                      request_id=str(uuid.uuid4())))
                self._wait(op, project, None, what)
            except gexc.NotFound:
                continue  # already gone
            except OperationFailed as e:
                out["failed"].append(f"{e}; delete it by hand once unused")
                continue
            out["deleted"].append(tname)
        return out

    def delete_pool_templates(self, cfg: Config, pool: Pool) -> dict[str, list[str]]:
        """After `destroy`: delete the pool's labelled instance templates that Terraform no
        longer tracks (the rollback targets `rollout_before_apply` made it forget).
        {"deleted": names, "failed": one line each}; a template still in use stays."""
        from google.api_core import exceptions as gexc

        assert pool.gcp is not None  # after destroying the pool's gcp placement
        project = pool.gcp.project
        compute_v1 = self._compute()
        client = self._client("InstanceTemplatesClient")
        out: dict[str, list[str]] = {"deleted": [], "failed": []}
        for t in self._labelled_templates(project, naming.gcp_labels(cfg, pool)):
            what = f"delete instance template {t.name}"
            try:
                op = self._lookup(what, client.delete_unary,
                                  request=compute_v1.DeleteInstanceTemplateRequest(
                                      project=project, instance_template=t.name,
                                      request_id=str(uuid.uuid4())))
                self._wait(op, project, None, what)
            except gexc.NotFound:
                continue
            except OperationFailed as e:
                out["failed"].append(f"{e}; delete it by hand once unused")
                continue
            out["deleted"].append(t.name)
        return out

    # The rollout's state lives in the MIG (its versions: contract.VERSION_*) so that any
    # poolctl reading it knows where it stands; the checkpoints and delay come from the file,
    # remembered per group when `find_group` reads the pool.

    def _remember(self, group: Group, pool: Pool) -> None:
        self._pools[group.raw_id] = pool

    def _steps(self, group: Group) -> tuple[list[int], int]:
        pool = self._pools.get(group.raw_id)
        if pool is None:
            return [100], 0
        return contract.canary_steps(pool), pool.rollout.checkpoint_delay_s

    @staticmethod
    def _canary_version(mig: Any) -> Any:
        """Of two versions, the one with a target size (the canary); else None."""
        versions = list(mig.versions)
        if len(versions) != 2:
            return None
        return next((v for v in versions if v.target_size.fixed or v.target_size.percent),
                    None)

    @classmethod
    def _stable_version(cls, mig: Any) -> Any:
        canary = cls._canary_version(mig)
        return next(v for v in mig.versions if v is not canary)

    def _percent(self, pct: int) -> Any:
        return self._compute().FixedOrPercent(percent=pct)

    def _set_versions(self, group: Group, stable_link: str, new_link: str | None,
                      target_size: Any = None, *, name: str | None = None) -> None:
        """Patch the MIG's versions: `stable_link` alone (named `name`), or beside it
        `new_link` at `target_size` (a FixedOrPercent) named `name` or VERSION_CANARY."""
        compute_v1 = self._compute()
        project, region, mig = self._mig_ref(group)
        V = compute_v1.InstanceGroupManagerVersion
        if new_link is None:
            versions = [V(name=name or contract.VERSION_PRIMARY, instance_template=stable_link)]
        else:
            versions = [V(name=contract.VERSION_STABLE, instance_template=stable_link),
                        V(name=name or contract.VERSION_CANARY, instance_template=new_link,
                          target_size=target_size)]
        from google.api_core import exceptions as gexc

        try:
            op = self._lookup(f"patch MIG {mig}",
                              self._client("RegionInstanceGroupManagersClient").patch_unary,
                              request=compute_v1.PatchRegionInstanceGroupManagerRequest(
                                  project=project, region=region, instance_group_manager=mig,
                                  instance_group_manager_resource=compute_v1.
                                  InstanceGroupManager(versions=versions),
                                  request_id=str(uuid.uuid4())))
        except gexc.NotFound:
            gone = ", ".join(_last(v.instance_template) for v in versions)
            raise OperationFailed(f"GCP MIG {mig}: an instance template of {gone} no longer "
                                  f"exists in {project}; roll forward with `poolctl rollout "
                                  "start`") from None
        self._wait(op, project, region, f"set the versions of MIG {mig}")

    @staticmethod
    def _counts(live: list[Any], template: str, target: int | None, name: str
                ) -> dict[str, Any]:
        """One version's VMs: all, healthy (serving), unhealthy; warm (standby) VMs count
        in `nodes` only."""
        mine = [mi for mi in live if _last(mi.version.instance_template) == template]
        phases = [node_phase(mi.instance_status, mi.current_action, mi.target_status,
                             [h.detailed_health_state for h in mi.instance_health])
                  for mi in mine]
        return {"name": name, "template": template, "target": target, "nodes": len(mine),
                "healthy": phases.count("in_service"), "unhealthy": phases.count("unhealthy"),
                "pending": phases.count("pending")}

    def rollout_state(self, group: Group) -> RolloutState | None:
        """The MIG's versions and VMs as a rollout: a canary step (two versions), the last
        step or a rollback (one version) under way, or how the last one ended. None on a
        pool that has only ever run one template."""
        v = self._rollout_view(group)
        mig, target, previous, live, on_old = v.mig, v.target, v.previous, v.live, v.on_old
        steps, _ = self._steps(group)
        canary = self._canary_version(mig)
        acts = mig.current_actions
        busy = [f"{k} {getattr(acts, k)}" for k in (
            "creating", "creating_without_retries", "verifying", "recreating", "refreshing",
            "restarting", "starting", "stopping", "deleting") if getattr(acts, k)]
        if canary is not None:
            stable = _last(self._stable_version(mig).instance_template)
            size = canary.target_size
            k = size.calculated or (size.fixed if size.fixed else
                                    -(-size.percent * mig.target_size // 100))
            # A fixed size is a split `rollout cancel` held during the last step.
            step = size.percent or 100
            new = self._counts(live, target, k, canary.name)
            old = self._counts(live, stable, None, contract.VERSION_STABLE)
            reached = new["healthy"] >= k and not new["pending"]
            earlier = [c for c in steps if c < step]
            held = canary.name == contract.VERSION_HELD
            why = [f"canary {step}%: {new['healthy']} of {k} node(s) healthy"]
            if new["unhealthy"]:
                why.append(f"{new['unhealthy']} unhealthy")
            why += ["held by `rollout cancel`"] if held else busy
            return RolloutState(
                id=target, status=RolloutStatus.cancelled if held else RolloutStatus.in_progress,
                done=held,
                percentage_complete=round(100.0 * new["nodes"] / len(live), 1) if live else 0.0,
                checkpoints=steps,
                checkpoint_reached=step if reached else (max(earlier) if earlier else None),
                instances_to_update=max(0, k - new["nodes"]) + sum(
                    n for t, n in on_old.items() if t != stable),
                from_version=stable, to_version=target, reason=", ".join(why), step=step,
                versions=[old, new],
            )
        versions = list(mig.versions)
        vname = versions[0].name if versions else contract.VERSION_PRIMARY
        now = self._counts(live, target, None, vname)
        # Every VM on its version's template; health is watched at the canary steps (a VM
        # that the autohealer repairs later must not turn a finished rollout into a new one).
        reached = bool(mig.status.version_target.is_reached)
        if not previous:
            return None  # one template ever seen: nothing has been rolled
        stale = sum(on_old.values())
        pct = 100.0 if reached or not live else round(100.0 * (len(live) - stale) / len(live), 1)
        others = [self._counts(live, t, None, contract.VERSION_STABLE) for t in on_old]
        reason = ", ".join(busy) if busy else ("stable" if mig.status.is_stable else "")
        if vname == contract.VERSION_ROLLBACK:
            # Back to the template the rollout started from; its id stays the rolled-back one.
            return RolloutState(
                id=previous or target, done=reached,
                status=RolloutStatus.rolled_back if reached else RolloutStatus.rolling_back,
                percentage_complete=pct, checkpoints=steps, instances_to_update=stale,
                from_version=target, to_version=previous, reason=reason or "rolled back",
                step=None, versions=[now, *others])
        return RolloutState(
            # A MIG update has no status word of its own (versionTarget.isReached is a bool):
            # no cloud_status.
            id=target, status=RolloutStatus.successful if reached else RolloutStatus.in_progress,
            done=reached,
            percentage_complete=pct, checkpoints=steps,
            checkpoint_reached=100 if reached else (max(steps[:-1]) if steps[:-1] else None),
            instances_to_update=stale, from_version=previous, to_version=target,
            reason=reason, step=100, versions=[*others, now],
        )

    def rollout_advance(self, group: Group, state: RolloutState) -> str | None:
        """One step of the driver `wait_rollout` runs between polls: once the canary's VMs
        are healthy and the checkpoint delay has passed, the next checkpoint (the last one
        points the MIG at the new template alone); a canary VM found unhealthy rolls the
        pool back (as an instance refresh's auto rollback). Returns a line saying what it
        did, or None."""
        if state.status != RolloutStatus.in_progress or state.step is None or state.step >= 100:
            return None
        steps, delay = self._steps(group)
        new = state.versions[-1]
        if new["unhealthy"]:
            self.rollout_rollback(group)
            return (f"canary {state.step}%: {new['unhealthy']} node(s) of {new['template']} "
                    f"unhealthy; rolling back to {state.versions[0]['template']}")
        # The id is the new template (from/to may carry the file's words: `_annotate`).
        key = (group.raw_id, state.id, state.step)
        if state.checkpoint_reached != state.step:
            self._reached_at.pop(key, None)
            return None
        since = self._reached_at.setdefault(key, time.monotonic())
        if time.monotonic() - since < delay:
            return None
        nxt = next((c for c in steps if c > state.step), 100)
        project, region, name = self._mig_ref(group)
        mig = self._get_mig(project, region, name)
        canary = self._canary_version(mig)
        if canary is None or _last(canary.instance_template) != state.id:
            return None  # someone else moved the group meanwhile
        if nxt >= 100:
            self._set_versions(group, canary.instance_template, None)
        else:
            self._set_versions(group, self._stable_version(mig).instance_template,
                               canary.instance_template, self._percent(nxt))
        return (f"checkpoint {state.step}% reached ({new['healthy']} healthy node(s) on "
                f"{state.id}); next step {nxt}%")

    def rollout_cancel(self, group: Group) -> RolloutState:
        """Hold the split where it stands: a canary step keeps its percentage (renamed
        VERSION_HELD, which no driver moves on); during the last step the VMs already on
        the new template stay (a fixed canary of that many) and the rest stay on the old
        one. `rollout start` with the same version drives it on; `rollout rollback` returns
        to the old template."""
        v = self._rollout_view(group)
        project, name, mig, target, previous = v.project, v.name, v.mig, v.target, v.previous
        live, links = v.live, v.links
        canary = self._canary_version(mig)
        versions = list(mig.versions)
        if canary is not None:
            self._set_versions(group, self._stable_version(mig).instance_template,
                               canary.instance_template, canary.target_size,
                               name=contract.VERSION_HELD)
        elif versions and versions[0].name == contract.VERSION_ROLLBACK:
            raise OperationFailed(f"rollout cancel --cloud gcp: {name} is rolling back to "
                                  f"{target}; a rollback is not held, let it finish")
        else:
            on_new = sum(1 for mi in live if _last(mi.version.instance_template) == target)
            if not previous or on_new >= len(live):
                raise OperationFailed(f"{name}: no rollout in progress; nothing to cancel")
            old = links.get(previous) or (
                f"projects/{project}/global/instanceTemplates/{previous}")
            self._set_versions(group, old, versions[0].instance_template,
                               self._compute().FixedOrPercent(fixed=on_new),
                               name=contract.VERSION_HELD)
        state = self.rollout_state(group)
        assert state is not None  # two versions: a rollout
        return state

    def rollout_rollback(self, group: Group, to_version: str | None = None) -> RolloutState:
        """Point the MIG back at the template the rollout started from, at any step (the
        canary's stable version; else the one VMs still run, the pool's newest other
        template, or `to_version`), as one version named VERSION_ROLLBACK."""
        v = self._rollout_view(group)
        project, name, mig, target, previous = v.project, v.name, v.mig, v.target, v.previous
        links = v.links
        canary = self._canary_version(mig)
        versions = list(mig.versions)
        if canary is None and versions and versions[0].name == contract.VERSION_ROLLBACK:
            raise OperationFailed(f"rollout rollback --cloud gcp: {name} is already rolled "
                                  f"back to {target}; roll forward with `poolctl rollout start`")
        back = to_version or previous
        if not back:
            raise OperationFailed(
                f"rollout rollback --cloud gcp: {name} runs {target} and no earlier instance "
                "template of the pool remains; roll forward with `poolctl rollout start`")
        if back == target:
            raise OperationFailed(f"rollout rollback --cloud gcp: {name} already targets "
                                  f"{back}; nothing to roll back")
        link = (self._stable_version(mig).instance_template if canary is not None
                and not to_version else links.get(back)
                or f"projects/{project}/global/instanceTemplates/{back}")
        try:
            self._set_versions(group, link, None, name=contract.VERSION_ROLLBACK)
        except OperationFailed as e:
            if "no longer exists" not in str(e):
                raise
            raise OperationFailed(f"rollout rollback --cloud gcp: instance template {back} no "
                                  f"longer exists in {project}; roll forward with "
                                  "`poolctl rollout start`") from None
        state = self.rollout_state(group)
        assert state is not None  # two templates known: a rollback
        return state

    # ------------------------------------------------------------------ queue

    def queue_per_replica(self, group: Group) -> float | None:
        """The queue metric as the AWS side reads its CloudWatch one: the mean of the points
        in the newest minute that has any, over the pool's nodes. Each node writes its own
        series (resource gce_instance, its instance id; cli/poolctl/boot/node.sh.j2), so the
        series kept are those of the MIG's VMs. Cloud Monitoring's REST API
        (projects.timeSeries.list) through the session OS Login uses: no client library."""
        project, region, name = self._mig_ref(group)
        ids = {str(mi.id) for mi in self._managed(project, region, name) if mi.id}
        if not ids:
            return None
        now = datetime.now(UTC)

        def stamp(t: datetime) -> str:
            return t.isoformat(timespec="seconds").replace("+00:00", "Z")

        params = {
            "filter": f'metric.type = "{naming.GCP_METRIC_TYPE}" AND '
                      'resource.type = "gce_instance"',
            # A minute past now: this machine's clock may lag Google's.
            "interval.startTime": stamp(now - timedelta(seconds=QUEUE_WINDOW_S)),
            "interval.endTime": stamp(now + timedelta(minutes=1)),
            "view": "FULL",
        }
        by_minute: dict[str, list[float]] = {}
        while True:
            page = self._monitoring(f"projects/{project}/timeSeries", params,
                                    f"read {naming.GCP_METRIC_TYPE} of {name}")
            for ts in page.get("timeSeries", []):
                if ts.get("resource", {}).get("labels", {}).get("instance_id") not in ids:
                    continue
                for pt in ts.get("points", []):
                    value = pt.get("value", {}).get("doubleValue")
                    end = pt.get("interval", {}).get("endTime", "")
                    if value is not None and len(end) >= 16:
                        by_minute.setdefault(end[:16], []).append(float(value))
            if not page.get("nextPageToken"):
                break
            params["pageToken"] = page["nextPageToken"]
        if not by_minute:
            return None
        newest = by_minute[max(by_minute)]  # RFC 3339 in UTC: text order is time order
        return sum(newest) / len(newest)


def make_ops(endpoints: CloudEndpoints = REAL_CLOUDS, contact_email: str | None = None
             ) -> GcpOps:
    """The GCP runtime for commands, calling `endpoints.gce_url` (Google's when None). The
    sandbox emulates AWS only (refused here). `contact_email`: for Cloud Quotas increase
    requests (`quota request --contact-email`, else the POOLCTL_QUOTA_CONTACT_EMAIL
    environment variable)."""
    endpoints.require(Cloud.gcp)
    return GcpOps(client_options={"api_endpoint": endpoints.gce_url} if endpoints.gce_url
                  else None, contact_email=contact_email)
