"""The pool's regional MIG: how poolctl finds it and reads it.

MIGs carry no labels of their own, so the pool's MIG is the one whose versions point at the
pool's labelled instance templates (or, failing that, whose instances' config carries the
labels). A MIG with two versions is a canary: the one with a target size is where the group
is heading. The functions read compute_v1 objects and make no call; `MigReader` makes the
calls, on `GceApi`'s plumbing.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from poolctl import naming
from poolctl.adaptors.gcp import api_exceptions, compute_v1
from poolctl.cloud import Cloud
from poolctl.clouds.base import Group, NodePhase
from poolctl.clouds.gcp.api import GceApi, created_at, link_name
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import plan_pool

MIG_REF = re.compile(r"projects/([^/]+)/regions/([^/]+)/instanceGroupManagers/([^/?]+)")

PENDING_ACTIONS = {
    "CREATING", "CREATING_WITHOUT_RETRIES", "VERIFYING", "RECREATING", "REFRESHING",
    "RESTARTING", "STARTING", "RESUMING", "STOPPING", "SUSPENDING",
}
# GCE reports a stopped VM as TERMINATED.
STOPPED_STATUSES = {"STOPPED", "TERMINATED", "SUSPENDED"}
GONE_ACTIONS = {"DELETING", "ABANDONING"}


def mig_ref(group: Group) -> tuple[str, str, str]:
    """(project, region, name) of the group's MIG, from its self link."""
    m = MIG_REF.search(group.raw_id or "")
    if not m:
        raise OperationFailed(f"GCP group {group.name}: {group.raw_id!r} is not a regional "
                              "MIG link; find the group with find_group first")
    return m.group(1), m.group(2), m.group(3)


def node_phase(instance_status: str, current_action: str, target_status: str,
               health: list[str]) -> NodePhase:
    """A managed instance's phase for `status` and `warm --wait`.

    Standby VMs are created, run their first boot for the standby initial delay, then stop:
    until stopped they are pending, not warm. A VM being started out of the standby pool is
    pending too. Health comes from the autohealing check (UNKNOWN during its initial delay).
    """
    status, action, target = instance_status or "", current_action or "NONE", target_status or ""
    if action in GONE_ACTIONS or target in ("DELETED", "ABANDONED") or "DRAINING" in health:
        return "terminating"
    if action in PENDING_ACTIONS:
        return "pending"
    if status in STOPPED_STATUSES:
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


def target_version(mig: Any) -> tuple[str, list[str]]:
    """(target template link, other version links). With two versions (a canary), the one
    with a target size is where the group is heading."""
    versions = list(mig.versions)
    if not versions:
        return mig.instance_template, []
    sized = [v for v in versions if v.target_size.fixed or v.target_size.percent]
    target = (sized or versions)[-1]
    others = [v.instance_template for v in versions if v is not target]
    return target.instance_template, others


def canary_version(mig: Any) -> Any:
    """Of two versions, the one with a target size (the canary); else None."""
    versions = list(mig.versions)
    if len(versions) != 2:
        return None
    return next((v for v in versions if v.target_size.fixed or v.target_size.percent), None)


def stable_version(mig: Any) -> Any:
    """Of a canary's two versions, the other one (the template the group came from)."""
    canary = canary_version(mig)
    return next(v for v in mig.versions if v is not canary)


class MigReader(GceApi):
    """Finds the pool's MIG and reads it (part of `GcpOps`). It remembers the pool each group
    it found belongs to: a rollout's checkpoints and delay come from the file."""

    def __init__(self, **api: Any) -> None:
        super().__init__(**api)
        # group self link -> its pool, remembered by find_group
        self._pools: dict[str, Pool] = {}

    def remember(self, group: Group, pool: Pool) -> None:
        self._pools[group.raw_id] = pool

    def pool_of(self, group: Group) -> Pool | None:
        """The pool the group was found for, None if it was not found here."""
        return self._pools.get(group.raw_id)

    def find_group(self, cfg: Config, pool: Pool) -> Group:
        p = pool.gcp
        if p is None:
            raise UsageError(f"--cloud gcp: pool {pool.name!r} has no `gcp:` placement")
        labels = naming.gcp_labels(cfg, pool)
        templates = self.labelled_templates(p.project, labels)
        names = {t.name for t in templates}
        try:
            migs = self.lookup("list MIGs",
                               self.client("RegionInstanceGroupManagersClient").list,
                               project=p.project, region=p.region)
        except api_exceptions.NotFound:
            raise OperationFailed(f"gcp.region: region {p.region!r} not found in project "
                                  f"{p.project!r}; check gcp.region") from None
        found = []
        for m in migs:
            used = {link_name(v.instance_template) for v in m.versions}
            used.add(link_name(m.instance_template))
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
        self.remember(group, pool)
        return group

    def _group(self, mig: Any, pool: Pool) -> Group:
        """The group's sizes. A stopped warm pool is the standby pool. A running one cannot
        stand aside on GCE: the stack adds it to the autoscaler's minimum, so for a pool
        whose file says `running` the part of that minimum above the file's minimum is
        reported as the warm size (a `warm --running` raise reads the same way: the total
        is what matters to the cloud)."""
        region = link_name(mig.region)
        a = self.autoscaler_of(mig)
        target, _ = target_version(mig)
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
            warm = max(0, lo - plan_pool(pool, Cloud.gcp).nodes.min)
            lo, state = lo - warm, "running"
        return Group(
            cloud=Cloud.gcp, name=mig.name, region=region, min_nodes=lo, max_nodes=hi,
            desired_nodes=mig.target_size, warm_min_nodes=warm, warm_state=state,
            version=link_name(target), raw_id=mig.self_link, template=link_name(target),
        )

    def labelled_templates(self, project: str, labels: dict[str, str]) -> list[Any]:
        """The project's global instance templates carrying `labels`, oldest first."""
        client = self.client("InstanceTemplatesClient")
        try:
            items = self.lookup("list instance templates", client.list, project=project)
        except api_exceptions.NotFound:
            raise OperationFailed(f"gcp.project: project {project!r} not found or the Compute "
                                  "Engine API is off in it; check gcp.project") from None
        found = [t for t in items
                 if all(t.properties.labels.get(k) == v for k, v in labels.items())]
        return sorted(found, key=created_at)

    def get_mig(self, project: str, region: str, name: str) -> Any:
        try:
            return self.lookup(f"get MIG {name}",
                               self.client("RegionInstanceGroupManagersClient").get,
                               project=project, region=region, instance_group_manager=name)
        except api_exceptions.NotFound:
            raise OperationFailed(f"GCP MIG {name}: not found in {project}/{region}; was the "
                                  "pool destroyed? run `poolctl deploy --cloud gcp`") from None

    def managed_instances(self, project: str, region: str, name: str) -> list[Any]:
        managed: list[Any] = self.call(
            f"list instances of {name}",
            self.client("RegionInstanceGroupManagersClient").list_managed_instances,
            project=project, region=region, instance_group_manager=name)
        return managed

    def write_autoscaler(self, project: str, region: str, body: Any, *, replace: bool,
                         what: str) -> None:
        """PATCH (merged into the autoscaler) or, with `replace`, update (the whole
        resource: the only way to remove a map entry such as a scaling schedule); waits."""
        verb = "update" if replace else "patch"
        request = (compute_v1.UpdateRegionAutoscalerRequest if replace
                   else compute_v1.PatchRegionAutoscalerRequest)
        op = self.call(f"{verb} autoscaler {body.name}",
                       getattr(self.client("RegionAutoscalersClient"), f"{verb}_unary"),
                       request=request(project=project, region=region, autoscaler=body.name,
                                       autoscaler_resource=body,
                                       request_id=str(uuid.uuid4())))
        self.wait(op, project, region, what)

    def autoscaler_of(self, mig: Any) -> Any:
        """The regional autoscaler targeting the MIG, or None."""
        ref = MIG_REF.search(mig.self_link)
        assert ref is not None  # the self link of a MIG found in a region's list
        project, region, name = ref.groups()
        client = self.client("RegionAutoscalersClient")
        link = mig.status.autoscaler
        if link:
            try:
                return self.lookup(f"get autoscaler of {name}", client.get, project=project,
                                   region=region, autoscaler=link_name(link))
            except api_exceptions.NotFound:
                pass
        for a in self.call("list autoscalers", client.list, project=project, region=region):
            if link_name(a.target) == name and f"/regions/{region}/" in a.target:
                return a
        return None
