"""Rollouts (`poolctl rollout start|status|cancel|rollback`): the new version written by
Terraform, rolled out checkpoint by checkpoint by the cloud (or stepped by poolctl), and the
way back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BoundsGroupMaximum,
    CancelsRollouts,
    CloudOps,
    Group,
    LaunchFailure,
    QuotaLine,
    RolloutState,
    RolloutStatus,
    StepsRollouts,
    failures_line,
)
from poolctl.clouds.registry import get_ops
from poolctl.config import Config, Pool, Target, parse_config
from poolctl.errors import OperationFailed, UsageError
from poolctl.files import replace_file
from poolctl.progress import Progress, log
from poolctl.runtime.common import ROLLOUT_DONE_OK, poll_interval, stalled_launches
from poolctl.runtime.fileedit import (
    ROLLOUT_KEYS,
    rollout_key,
    value_at,
    write_key,
)
from poolctl.runtime.quota import scaled_needs, shared_quota_lines
from poolctl.runtime.records import (
    RolloutRecord,
    annotate_rollout,
    load_record,
    save_record,
)
from poolctl.runtime.warm import running_nodes
from poolctl.sizing import PoolPlan, plan_pool
from poolctl.terraform import Terraform

# ---------------------------------------------------------------------------------------
# Rollout


def rollout_quota(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan,
                  group: Group, no_surge: bool) -> list[QuotaLine]:
    """Quota for the rollout: the group's running nodes + the surge (0 with --no-surge)."""
    surge = 0 if no_surge else plan.nodes.surge
    warm_running = plan.warm_state == "running"
    nodes = running_nodes(group.min_nodes, group.desired_nodes, group.warm_min_nodes,
                          warm_running) + surge
    return shared_quota_lines(cfg, pool, cloud, ops, scaled_needs(plan, nodes))


# Optional CloudOps steps, GCP's only (AWS keeps launch template versions by itself): keep the
# previous instance template through a deploy's apply of a new one, and delete older ones.


def deploy_before_apply(targets: list[Target]
                        ) -> Callable[[Terraform], bool] | None:
    """`deploy`'s `before_apply` step: on GCP the MIG's versions are poolctl's (a rollout
    steps them), so an apply that replaces the instance template must not delete the one the
    MIG runs (GCE refuses while it is in use): Terraform forgets it, and `rollout start`
    rolls the new one checkpoint by checkpoint."""
    if not any(t.cloud == Cloud.gcp for t in targets):
        return None
    ops = get_ops(Cloud.gcp)
    assert isinstance(ops, StepsRollouts)  # GCP canaries: the versions are poolctl's

    def before_apply(tf: Terraform) -> bool:
        forgotten = ops.rollout_before_apply(tf)
        for t in forgotten:
            log(f"instance template {t.name or t.address} stays: the pool's MIG runs it "
                "until `poolctl rollout start --cloud gcp` rolls the new one (deploy does not "
                "roll GCP nodes); removed from Terraform's state, not deleted")
        return bool(forgotten)

    return before_apply


def cleanup_versions(ops: CloudOps, group: Group, pool: Pool) -> None:
    """Delete versions that are neither current nor previous, when the cloud needs it; a
    failure is reported and never fails the command."""
    if not isinstance(ops, StepsRollouts):
        return
    try:
        out = ops.rollout_cleanup(group)
    except OperationFailed as e:
        log(f"{pool.name}: old instance templates not cleaned up: {e}")
        return
    for name in out.deleted:
        log(f"{pool.name}: deleted instance template {name} (neither current nor previous)")
    for line in out.failed:
        log(f"{pool.name}: {line}")


def rollout_words(s: RolloutState) -> str:
    """Status, percentage, checkpoint, nodes to update, reason: as `status` commands say it."""
    why = f" ({s.reason})" if s.reason else ""
    if s.status.turned_back:
        # The forward percentage means nothing once the rollout turns back or stops.
        return f"{s.status.words}{why}"
    # A checkpoint of 100% is the end, said by the final line.
    cp = (f", checkpoint {s.checkpoint_reached}% reached"
          if s.checkpoint_reached and s.checkpoint_reached < 100 and not s.done else "")
    todo = "" if s.instances_to_update is None else f", {s.instances_to_update} to update"
    return f"{s.status.words} {s.percentage_complete:g}%{cp}{todo}{why}"


def rollout_progress_line(pool: Pool, s: RolloutState) -> str:
    return f"{pool.name}: rollout {rollout_words(s)}"


def paused_line(pool: Pool, s: RolloutState, failed: list[LaunchFailure], keeps: str,
                hint: str) -> str:
    """A rollout whose replacement cannot launch: it holds where it stands (the nodes not
    replaced yet keep serving) and goes on when capacity returns."""
    return (f"{pool.name}: rollout {s.id} paused at {s.percentage_complete:g}%: a replacement "
            f"cannot launch: {failures_line(failed)}; the nodes not replaced yet keep serving; "
            f"it {keeps} and goes on when capacity returns: free or reserve capacity "
            f"(`poolctl capacity check`), or stop it with "
            f"`{hint.replace(' status ', ' cancel ', 1)}`")


def rollout_final_line(pool: Pool, s: RolloutState) -> str:
    outcome = {
        RolloutStatus.successful: f"every node runs {s.to_version or 'the new version'}",
        RolloutStatus.rolled_back: "rolled back, every node runs "
                                   + (s.from_version or "the previous version"),
        RolloutStatus.cancelled: f"cancelled at {s.percentage_complete:g}%; replaced nodes "
                                 "keep the new version",
    }.get(s.status, s.status.words + (f": {s.reason}" if s.reason else ""))
    return f"{pool.name}: rollout {s.id} finished: {outcome}"


def return_surge(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, group: Group,
                 state: RolloutState | None) -> None:
    """Outside a rollout the group's maximum is the pool's max nodes: a rollout's start raised
    it by the surge (its apply), its end (finished, rolled back, cancelled) gives that back.
    Clouds whose update surge sits outside the autoscaler's maximum (GCE) have no step."""
    if not isinstance(ops, BoundsGroupMaximum) or (state is not None and not state.done):
        return
    n = plan_pool(pool, cloud).nodes
    top = max(n.max, group.min_nodes)
    # Only the rollout's own raise: a maximum the file no longer gives is `deploy`'s business.
    if n.surge and group.max_nodes == n.max + n.surge > top:
        ops.set_max_nodes(group, top)
        log(f"{pool.name}: group maximum {group.max_nodes} -> {top} node(s): the rollout's "
            "surge room given back")
        group.max_nodes = top


@dataclass(frozen=True)
class RolloutStep:
    """One change of a watched rollout: status, percentage, checkpoint, nodes to update,
    seconds since the watch began."""

    status: RolloutStatus
    percentage_complete: float
    checkpoint_reached: int | None
    instances_to_update: int | None
    seconds: float


def wait_rollout(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, timeout: float,
                 hint: str, sleep: Callable[[float], None] = time.sleep
                 ) -> tuple[RolloutState | None, list[RolloutStep]]:
    """Poll the newest rollout until it ends; one line per change of status, percentage or
    checkpoint. Returns the final state and the progress seen."""
    group = ops.find_group(cfg, pool)
    rec = load_record(cfg, pool, cloud)
    t0 = time.monotonic()
    # The rollout's apply launched just before the wait: its failures count from earlier.
    wall0 = time.time() - 30
    seen: list[RolloutStep] = []
    last = None
    interval = poll_interval(ops.endpoints)
    # Clouds whose rollout cannot pause by itself (GCP canaries) are stepped from here; such
    # a rollout holds at its step while nobody watches.
    advance = ops.rollout_advance if isinstance(ops, StepsRollouts) else None
    keeps = ("holds at its step until `poolctl rollout start` with the same version drives "
             "it on" if advance else f"keeps going in {cloud}")
    progress = Progress().start()  # a live line on a terminal, else one line per change
    try:
        while True:
            s = ops.rollout_state(group)
            if s is None:
                return None, seen
            annotate_rollout(s, rec)
            key = (s.status, s.percentage_complete, s.checkpoint_reached)
            if key != last:
                progress.update(rollout_progress_line(pool, s))
                seen.append(RolloutStep(s.status, s.percentage_complete, s.checkpoint_reached,
                                        s.instances_to_update,
                                        round(time.monotonic() - t0, 1)))
                last = key
            if s.done:
                progress.stop()
                _after_end(cfg, pool, cloud, s)
                return_surge(cfg, pool, cloud, ops, ops.find_group(cfg, pool), s)
                if s.status in ROLLOUT_DONE_OK:
                    cleanup_versions(ops, group, pool)
                log(rollout_final_line(pool, s))
                return s, seen
            if failed := stalled_launches(ops, group, pool, cloud, wall0):
                progress.stop()
                raise OperationFailed(paused_line(pool, s, failed, keeps, hint))
            if time.monotonic() - t0 >= timeout:
                raise OperationFailed(
                    f"{pool.name}: --timeout {timeout:g} s: rollout {s.id} is still "
                    f"{s.status.words} at {s.percentage_complete:g}%; it {keeps}; "
                    f"watch with `{hint}`")
            if advance is not None and (said := advance(group, s)):
                log(f"{pool.name}: {said}")
            sleep(interval)
    except KeyboardInterrupt:
        progress.stop()
        log(f"{pool.name}: interrupted; the rollout {keeps}; watch it with "
            f"`{hint}`, stop it with `{hint.replace(' status ', ' cancel ', 1)}`")
        raise
    finally:
        progress.stop()


def _after_end(cfg: Config, pool: Pool, cloud: Cloud, s: RolloutState) -> None:
    """An automatic rollback returned the pool to the old version: record that in the file
    too, so that the next deploy does not roll forward again."""
    rec = load_record(cfg, pool, cloud)
    if not rec or rec.rollout_id != s.id:
        return
    rec = replace(rec, status=str(s.status))
    if s.status == RolloutStatus.rolled_back and rec.restored is None:
        rec = restore_file(cfg, pool, rec)
    save_record(cfg, pool, cloud, rec)


def restore_file(cfg: Config, pool: Pool, rec: RolloutRecord) -> RolloutRecord:
    """Put the record's `from` value back in its file; the record says whether that was done."""
    return replace(rec, restored=_restored(pool, rec))


def _restored(pool: Pool, rec: RolloutRecord) -> bool:
    path = Path(rec.file)
    key = rollout_key(rec.key)
    back = f"{rec.key}={rec.from_value}"
    if not path.is_absolute():
        # Written by a poolctl that kept the path as typed: its directory is unknown.
        log(f"{path}: the rollout record names this file relative to a directory it does not "
            f"keep; set {back} in it by hand")
        return False
    try:
        text = path.read_text()
        idx = [p.name for p in parse_config(text, str(path)).pools].index(pool.name)
    except (OSError, ValueError):
        log(f"{path}: cannot read it to restore {back}; set it by hand")
        return False
    where = ("pools", idx, *ROLLOUT_KEYS[key])
    node = value_at(text, where, str(path))
    # Absent (None) matches a node image rollout whose file had no line (`from` None).
    if getattr(node, "value", None) not in (rec.to_value, rec.from_value):
        log(f"{path}: {rec.key} is now {getattr(node, 'value', None)!r}, neither "
            f"{rec.to_value} nor {rec.from_value}; left as is")
        return False
    try:
        new_text, old, line = write_key(key, text, where, rec.from_value, str(path))
    except UsageError as e:
        log(f"{e}; restore {back} by hand")
        return False
    if new_text != text:
        replace_file(path, new_text)
        gone = "(line removed: the placement's default image)"
        log(f"{path}:{line}: {rec.key}: {old} -> {rec.from_value or gone} (restored)")
    return True


@dataclass(frozen=True)
class Checkpoint:
    percentage: int
    reached: bool


@dataclass(frozen=True)
class RolloutView:
    """What `rollout status` shows: the newest rollout (None before the first), its
    checkpoints, the record poolctl keeps of it, and why it holds when a replacement cannot
    launch."""

    pool: str
    cloud: Cloud
    group: str
    group_version: str
    rollout: RolloutState | None
    checkpoints: tuple[Checkpoint, ...]
    record: RolloutRecord | None
    capacity_failures: tuple[LaunchFailure, ...]

    @property
    def paused(self) -> str | None:
        if not self.capacity_failures:
            return None
        return f"a replacement cannot launch: {failures_line(list(self.capacity_failures))}"

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "cloud": self.cloud, "group": self.group,
                "group_version": self.group_version,
                "rollout": asdict(self.rollout) if self.rollout else None,
                "checkpoints": [asdict(c) for c in self.checkpoints],
                "record": self.record.to_json() if self.record else None,
                "paused": self.paused,
                "capacity_failures": [asdict(f) for f in self.capacity_failures]}


def rollout_status(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps) -> RolloutView:
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    return_surge(cfg, pool, cloud, ops, group, s)
    rec = load_record(cfg, pool, cloud)
    if s is not None:
        annotate_rollout(s, rec)
    checkpoints: tuple[Checkpoint, ...] = ()
    if s is not None:
        checkpoints = tuple(
            Checkpoint(c, bool(s.checkpoint_reached and c <= s.checkpoint_reached)
                       or s.status == RolloutStatus.successful)
            for c in s.checkpoints or [])
    # A rollout in flight whose replacements cannot launch holds where it stands: say why.
    failed = (stalled_launches(ops, group, pool, cloud, time.time() - 3600)
              if s is not None and not s.done else [])
    return RolloutView(pool=pool.name, cloud=cloud, group=group.name,
                       group_version=group.version, rollout=s, checkpoints=checkpoints,
                       record=rec, capacity_failures=tuple(failed))


def rollout_cancel(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps) -> RolloutState:
    if not isinstance(ops, CancelsRollouts):
        raise OperationFailed(f"rollout cancel: {cloud} cannot stop a rollout where it stands; "
                              f"use `poolctl rollout rollback --cloud {cloud}`")
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    if s is None or s.done:
        raise OperationFailed(f"{pool.name}: no rollout in progress; nothing to cancel")
    out = ops.rollout_cancel(group)
    return_surge(cfg, pool, cloud, ops, group, out)
    rec = load_record(cfg, pool, cloud)
    if rec and rec.rollout_id == out.id:
        save_record(cfg, pool, cloud, replace(rec, status="cancel_requested"))
    return out
