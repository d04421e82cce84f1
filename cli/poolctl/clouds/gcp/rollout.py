"""Rollouts on GCP: the canary state machine poolctl drives on the pool's regional MIG.

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
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.adaptors.gcp import api_exceptions, compute_v1
from poolctl.clouds.base import (
    CancelsRollouts,
    Group,
    RolloutState,
    RolloutStatus,
    RollsBackRollouts,
    StepsRollouts,
    VersionRow,
)
from poolctl.clouds.gcp.api import link_name
from poolctl.clouds.gcp.mig import (
    GONE_ACTIONS,
    MigReader,
    canary_version,
    mig_ref,
    node_phase,
    stable_version,
    target_version,
)
from poolctl.clouds.records import ForgottenTemplate, TemplatesDeleted
from poolctl.config import Config, Pool
from poolctl.contract import gcp as contract
from poolctl.errors import OperationFailed
from poolctl.sizing import PoolPlan
from poolctl.terraform import Terraform

TEMPLATE_TYPE = "google_compute_instance_template"


def replaced_templates(plan: dict[str, Any]) -> list[ForgottenTemplate]:
    """Instance templates a Terraform plan (`terraform show -json`) replaces. A replacement
    plans both a create and a delete of the same address (["create", "delete"] with
    create_before_destroy); a plain create or delete is not one."""
    out = []
    for rc in plan.get("resource_changes", []):
        actions = set((rc.get("change") or {}).get("actions") or [])
        if rc.get("type") == TEMPLATE_TYPE and {"create", "delete"} <= actions:
            before = (rc.get("change") or {}).get("before") or {}
            out.append(ForgottenTemplate(rc["address"], before.get("name") or ""))
    return out


@dataclass
class RolloutView:
    """The pool's MIG as a rollout sees it (CanaryRollouts._rollout_view)."""

    project: str
    region: str
    name: str  # the MIG's
    mig: Any  # compute_v1.InstanceGroupManager
    target: str  # the template the MIG's target version names
    previous: str  # the template it came from (the rollback target), "" if none
    live: list[Any] = field(default_factory=list)  # managed VMs not being deleted
    on_old: Counter[str] = field(default_factory=Counter)  # VMs per template other than target
    links: dict[str, str] = field(default_factory=dict)  # pool template name -> self link



class CanaryRollouts(MigReader, CancelsRollouts, RollsBackRollouts, StepsRollouts):
    """The rollout operations of `GcpOps`. StepsRollouts: a cancelled (held) canary still has
    both versions, so `rollout rollback` points the MIG back at the old one instead of
    rolling the old version out anew."""

    def __init__(self, **api: Any) -> None:
        super().__init__(**api)
        # (group, template, step) -> when the driver first saw that checkpoint reached
        self._reached_at: dict[tuple[str, str, int], float] = {}

    def _pool_templates(self, project: str, target_link: str) -> list[Any]:
        """The pool's labelled templates, found through the labels of the target template."""
        try:
            t = self.lookup("get instance template",
                            self.client("InstanceTemplatesClient").get,
                            project=project, instance_template=link_name(target_link))
        except api_exceptions.NotFound:
            return []
        labels = {k: t.properties.labels[k] for k in (naming.LABEL_PROJECT, naming.LABEL_POOL)
                  if k in t.properties.labels}
        if len(labels) < 2:
            return [t]
        return self.labelled_templates(project, labels)

    def _rollout_view(self, group: Group) -> RolloutView:
        project, region, name = mig_ref(group)
        mig = self.get_mig(project, region, name)
        target_link, other_links = target_version(mig)
        target = link_name(target_link)
        live = [mi for mi in self.managed_instances(project, region, name)
                if mi.current_action not in GONE_ACTIONS]
        on_old = Counter(link_name(mi.version.instance_template) for mi in live
                         if link_name(mi.version.instance_template) != target)
        templates = self._pool_templates(project, target_link)
        if other_links:
            previous = link_name(other_links[0])
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
            project, region, name = mig_ref(group)
            zones = len(self.get_mig(project, region, name).distribution_policy.zones) or 1
        return contract.rollout_env(min_nodes=group.min_nodes, max_nodes=group.max_nodes,
                                    warm_min_nodes=group.warm_min_nodes, no_surge_zones=zones)

    def rollout_begin(self, group: Group, cfg: Config, pool: Pool, plan: PoolPlan, *,
                      no_surge: bool, stack_dir: Path | None) -> RolloutState | None:
        """After the apply of `rollout start` (which wrote the new template and left the
        MIG's versions alone): the first canary step, the new template at the pool's first
        checkpoint beside the one the group runs. The new template is the pool's newest: the
        apply has just created it. A canary of it already there (held by `rollout cancel`,
        or left at its step when nobody watched) is driven on from where it stands."""
        self.remember(group, pool)
        v = self._rollout_view(group)
        mig, target, links = v.mig, v.target, v.links
        newest = next(reversed(links), "")
        versions = list(mig.versions)
        canary = canary_version(mig)
        if canary is not None and link_name(canary.instance_template) == newest:
            if not canary.target_size.percent:
                # Held during the last step (a fixed split): the new template alone again.
                self._set_versions(group, canary.instance_template, None)
            elif canary.name == contract.VERSION_HELD:
                self._set_versions(group, stable_version(mig).instance_template,
                                   canary.instance_template, canary.target_size)
            return self.rollout_state(group)
        if not newest or (canary is None and target == newest):
            # The apply left the template as it was: nothing to roll, unless the last step
            # of an earlier rollout is still under way.
            state = self.rollout_state(group)
            return state if state is not None and not state.done else None
        stable = (stable_version(mig).instance_template if canary is not None
                  else versions[0].instance_template if versions else mig.instance_template)
        first = contract.canary_steps(pool)[0]
        self._set_versions(group, stable, links[newest], self._percent(first))
        state = self.rollout_state(group)
        if state is not None:
            state.from_version = group.version
        return state

    def rollout_before_apply(self, tf: Terraform) -> list[ForgottenTemplate]:
        """Before the apply of `rollout start` (`tf`: poolctl.terraform.Terraform, its plan
        saved as `tfplan`): remove every instance template the plan replaces from the
        state, so that Terraform forgets it rather than deletes it (see the module doc).
        Returns what was forgotten; the caller plans again when any."""
        shown = tf.run("plan", "show", "-json", "tfplan", capture=True)
        forgotten = replaced_templates(json.loads(shown.stdout or "{}"))
        for t in forgotten:
            tf.run("state", "state", "rm", t.address)
        return forgotten

    def rollout_cleanup(self, group: Group) -> TemplatesDeleted:
        """Delete the pool's instance templates that are neither the MIG's target nor the
        previous one (the rollback target) nor run by any VM of the group. A refused delete
        (a template some other group uses) is reported, not raised: a template left behind
        does not affect the rollout."""
        v = self._rollout_view(group)
        project, mig, target, previous, live = v.project, v.mig, v.target, v.previous, v.live
        links = v.links
        keep = {target, previous, link_name(mig.instance_template)}
        keep |= {link_name(v.instance_template) for v in mig.versions}
        keep |= {link_name(mi.version.instance_template) for mi in live}
        return self._delete_templates(project, sorted(set(links) - keep - {""}))

    def delete_pool_templates(self, cfg: Config, pool: Pool) -> TemplatesDeleted:
        """After `destroy`: delete the pool's labelled instance templates that Terraform no
        longer tracks (the rollback targets `rollout_before_apply` made it forget).
        A template still in use stays."""
        assert pool.gcp is not None  # after destroying the pool's gcp placement
        project = pool.gcp.project
        templates = self.labelled_templates(project, naming.gcp_labels(cfg, pool))
        return self._delete_templates(project, [t.name for t in templates])

    def _delete_templates(self, project: str, names: list[str]) -> TemplatesDeleted:
        """A template already gone is neither deleted nor failed;
        a refused delete (in use) is reported, not raised."""
        client = self.client("InstanceTemplatesClient")
        out = TemplatesDeleted()
        for name in names:
            what = f"delete instance template {name}"
            try:
                op = self.lookup(what, client.delete_unary,
                                 request=compute_v1.DeleteInstanceTemplateRequest(
                                     project=project, instance_template=name,
                                     request_id=str(uuid.uuid4())))
                self.wait(op, project, None, what)
            except api_exceptions.NotFound:
                continue  # already gone
            except OperationFailed as e:
                out.failed.append(f"{e}; delete it by hand once unused")
                continue
            out.deleted.append(name)
        return out

    # The rollout's state lives in the MIG (its versions: contract.VERSION_*) so that any
    # poolctl reading it knows where it stands; the checkpoints and delay come from the file,
    # remembered per group when `find_group` reads the pool.

    def _steps(self, group: Group) -> tuple[list[int], int]:
        """The pool's checkpoints and delay; [100] and 0 for a group found for no pool."""
        pool = self.pool_of(group)
        if pool is None:
            return [100], 0
        return contract.canary_steps(pool), pool.rollout.checkpoint_delay_s

    def _percent(self, pct: int) -> Any:
        return compute_v1.FixedOrPercent(percent=pct)

    def _set_versions(self, group: Group, stable_link: str, new_link: str | None,
                      target_size: Any = None, *, name: str | None = None) -> None:
        """Patch the MIG's versions: `stable_link` alone (named `name`), or beside it
        `new_link` at `target_size` (a FixedOrPercent) named `name` or VERSION_CANARY."""
        project, region, mig = mig_ref(group)
        V = compute_v1.InstanceGroupManagerVersion
        if new_link is None:
            versions = [V(name=name or contract.VERSION_PRIMARY, instance_template=stable_link)]
        else:
            versions = [V(name=contract.VERSION_STABLE, instance_template=stable_link),
                        V(name=name or contract.VERSION_CANARY, instance_template=new_link,
                          target_size=target_size)]
        try:
            op = self.lookup(f"patch MIG {mig}",
                             self.client("RegionInstanceGroupManagersClient").patch_unary,
                             request=compute_v1.PatchRegionInstanceGroupManagerRequest(
                                 project=project, region=region, instance_group_manager=mig,
                                 instance_group_manager_resource=compute_v1.
                                 InstanceGroupManager(versions=versions),
                                 request_id=str(uuid.uuid4())))
        except api_exceptions.NotFound:
            gone = ", ".join(link_name(v.instance_template) for v in versions)
            raise OperationFailed(f"GCP MIG {mig}: an instance template of {gone} no longer "
                                  f"exists in {project}; roll forward with `poolctl rollout "
                                  "start`") from None
        self.wait(op, project, region, f"set the versions of MIG {mig}")

    @staticmethod
    def _counts(live: list[Any], template: str, target: int | None, name: str
                ) -> VersionRow:
        """One version's VMs: all, healthy (serving), unhealthy; warm (standby) VMs count
        in `nodes` only."""
        mine = [mi for mi in live if link_name(mi.version.instance_template) == template]
        phases = [node_phase(mi.instance_status, mi.current_action, mi.target_status,
                             [h.detailed_health_state for h in mi.instance_health])
                  for mi in mine]
        return VersionRow(name=name, template=template, target=target, nodes=len(mine),
                          healthy=phases.count("in_service"),
                          unhealthy=phases.count("unhealthy"), pending=phases.count("pending"))

    def rollout_state(self, group: Group) -> RolloutState | None:
        """The MIG's versions and VMs as a rollout: a canary step (two versions), the last
        step or a rollback (one version) under way, or how the last one ended. None on a
        pool that has only ever run one template."""
        v = self._rollout_view(group)
        mig, target, previous, live, on_old = v.mig, v.target, v.previous, v.live, v.on_old
        steps, _ = self._steps(group)
        canary = canary_version(mig)
        acts = mig.current_actions
        busy = [f"{k} {getattr(acts, k)}" for k in (
            "creating", "creating_without_retries", "verifying", "recreating", "refreshing",
            "restarting", "starting", "stopping", "deleting") if getattr(acts, k)]
        if canary is not None:
            stable = link_name(stable_version(mig).instance_template)
            size = canary.target_size
            k = size.calculated or (size.fixed if size.fixed else
                                    -(-size.percent * mig.target_size // 100))
            # A fixed size is a split `rollout cancel` held during the last step.
            step = size.percent or 100
            new = self._counts(live, target, k, canary.name)
            old = self._counts(live, stable, None, contract.VERSION_STABLE)
            reached = new.healthy >= k and not new.pending
            earlier = [c for c in steps if c < step]
            held = canary.name == contract.VERSION_HELD
            why = [f"canary {step}%: {new.healthy} of {k} node(s) healthy"]
            if new.unhealthy:
                why.append(f"{new.unhealthy} unhealthy")
            why += ["held by `rollout cancel`"] if held else busy
            return RolloutState(
                id=target, status=RolloutStatus.cancelled if held else RolloutStatus.in_progress,
                done=held,
                percentage_complete=round(100.0 * new.nodes / len(live), 1) if live else 0.0,
                checkpoints=steps,
                checkpoint_reached=step if reached else (max(earlier) if earlier else None),
                instances_to_update=max(0, k - new.nodes) + sum(
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
        if new.unhealthy:
            self.rollout_rollback(group)
            return (f"canary {state.step}%: {new.unhealthy} node(s) of {new.template} "
                    f"unhealthy; rolling back to {state.versions[0].template}")
        # The id is the new template (from/to may carry the file's words: `annotate_rollout`).
        key = (group.raw_id, state.id, state.step)
        if state.checkpoint_reached != state.step:
            self._reached_at.pop(key, None)
            return None
        since = self._reached_at.setdefault(key, time.monotonic())
        if time.monotonic() - since < delay:
            return None
        nxt = next((c for c in steps if c > state.step), 100)
        project, region, name = mig_ref(group)
        mig = self.get_mig(project, region, name)
        canary = canary_version(mig)
        if canary is None or link_name(canary.instance_template) != state.id:
            return None  # someone else moved the group meanwhile
        if nxt >= 100:
            self._set_versions(group, canary.instance_template, None)
        else:
            self._set_versions(group, stable_version(mig).instance_template,
                               canary.instance_template, self._percent(nxt))
        return (f"checkpoint {state.step}% reached ({new.healthy} healthy node(s) on "
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
        canary = canary_version(mig)
        versions = list(mig.versions)
        if canary is not None:
            self._set_versions(group, stable_version(mig).instance_template,
                               canary.instance_template, canary.target_size,
                               name=contract.VERSION_HELD)
        elif versions and versions[0].name == contract.VERSION_ROLLBACK:
            raise OperationFailed(f"rollout cancel --cloud gcp: {name} is rolling back to "
                                  f"{target}; a rollback is not held, let it finish")
        else:
            on_new = sum(1 for mi in live if link_name(mi.version.instance_template) == target)
            if not previous or on_new >= len(live):
                raise OperationFailed(f"{name}: no rollout in progress; nothing to cancel")
            old = links.get(previous) or (
                f"projects/{project}/global/instanceTemplates/{previous}")
            self._set_versions(group, old, versions[0].instance_template,
                               compute_v1.FixedOrPercent(fixed=on_new),
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
        canary = canary_version(mig)
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
        link = (stable_version(mig).instance_template if canary is not None
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
