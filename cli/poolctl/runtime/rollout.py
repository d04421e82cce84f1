"""Rollouts (`poolctl rollout start|status|cancel|rollback`): the new version written by
Terraform, rolled out checkpoint by checkpoint by the cloud (or stepped by poolctl), and the
way back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from poolctl import deploy, naming
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
    RollsBackRollouts,
    StepsRollouts,
    failures_line,
)
from poolctl.clouds.registry import get_ops
from poolctl.config import Config, Pool, Target, load_config, parse_config
from poolctl.errors import NotConfirmed, OperationFailed, UsageError
from poolctl.files import replace_file
from poolctl.home import write_private
from poolctl.progress import Progress, log
from poolctl.runtime.common import ROLLOUT_DONE_OK, poll_interval, stalled_launches
from poolctl.runtime.fileedit import (
    NODE_IMAGE_KEYS,
    ROLLOUT_KEYS,
    ROLLOUT_LABELS,
    record_in_file,
    rollout_key,
    value_at,
    write_key,
)
from poolctl.runtime.quota import scaled_needs, shared_quota_lines, shortfall_line
from poolctl.runtime.records import (
    RolloutRecord,
    annotate_rollout,
    load_record,
    record_path,
    save_record,
)
from poolctl.runtime.warm import running_nodes
from poolctl.sizing import PoolPlan, plan_pool
from poolctl.terraform import Terraform, forget_dead_synth_kernel

# ---------------------------------------------------------------------------------------
# Rollout


@dataclass
class RolloutResult:
    pool: str
    cloud: Cloud
    stack: str
    key: str
    from_value: str | None  # None: a node image the file did not name (the default image)
    to_value: str | None  # None: back to the default node image, its line removed
    file: str
    file_changed: bool
    applied: bool
    rollout: RolloutState | None
    message: str = ""
    no_surge: bool = False
    progress: list[dict[str, Any]] = field(default_factory=list)
    quota: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["from"], d["to"] = d.pop("from_value"), d.pop("to_value")
        return d


def rollout_quota(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan,
                  group: Group, no_surge: bool) -> list[QuotaLine]:
    """Quota for the rollout: the group's running nodes + the surge (0 with --no-surge)."""
    surge = 0 if no_surge else plan.nodes.surge
    warm_running = plan.warm_state == "running"
    nodes = running_nodes(group.min_nodes, group.desired_nodes, group.warm_min_nodes,
                          warm_running) + surge
    return shared_quota_lines(cfg, pool, cloud, ops, scaled_needs(plan, nodes))


def rollout_start(
    cfg: Config,
    file_path: Path,
    pool: Pool,
    cloud: Cloud,
    ops: CloudOps,
    *,
    image: str | None = None,
    model_version: str | None = None,
    node_image: str | None = None,
    unset_node_image: bool = False,
    no_surge: bool = False,
    confirm: Callable[[str], bool],
    outdir: Path,
    mirror: str | None = None,
    render_summary: Callable[[str, Any], None] = lambda name, summary: None,
    action: str = "start",
    verbose: bool = False,
) -> RolloutResult:
    """Record the new version in the file, apply it through Terraform (a new launch template
    version / instance template), then start the rollout with the pool's checkpoints.
    `unset_node_image`: back to the placement's default image, its line removed (the
    rollback of a node image rollout whose file had no line)."""

    given = {"image": image, "model_version": model_version, NODE_IMAGE_KEYS[cloud]: node_image}
    given = {k: v for k, v in given.items() if v is not None}
    if unset_node_image:
        given = given or {NODE_IMAGE_KEYS[cloud]: None}
    if len(given) != 1 or (unset_node_image and None not in given.values()):
        raise UsageError("rollout start: give exactly one of --image IMAGE, "
                         "--model-version VERSION or --node-image IMAGE")
    [(key, value)] = given.items()
    value = None if value is None else str(value).strip()
    # The record outlives this working directory: `rollout rollback` run from another one
    # (or by a scheduler) must edit this file, not a poolctl.yaml where it happens to run.
    file_path = Path(file_path).resolve()
    if value == "":
        raise UsageError(f"--{key.replace('_', '-')}: empty; give the new value")
    # Refuse before any cloud call when the key is not literally in the file (exit 2).
    idx = [p.name for p in cfg.pools].index(pool.name)
    write_key(key, file_path.read_text(), ("pools", idx, *ROLLOUT_KEYS[key]), value,
              str(file_path))
    stack = naming.stack_name(cfg, pool, cloud)
    group = ops.find_group(cfg, pool)
    active = ops.rollout_state(group)
    last = load_record(cfg, pool, cloud)
    # A rollout poolctl steps itself (GCP) holds at its step while nobody watches it: the
    # same version again drives it on.
    resume = (active is not None and isinstance(ops, StepsRollouts)
              and last is not None and last.rollout_id == active.id
              and last.to_value == value)
    if active is not None and not active.done and not resume:
        raise OperationFailed(
            f"{pool.name}: rollout {active.id} is {active.status.words}; wait for it "
            f"(`poolctl rollout status --cloud {cloud}`), or stop it with `poolctl rollout "
            f"cancel` / `rollback`")
    plan = plan_pool(pool, cloud)
    lines = rollout_quota(cfg, pool, cloud, ops, plan, group, no_surge)
    short = [ln for ln in lines if ln.shortfall > 0]
    if short:
        surge = plan.nodes.surge
        offer = ("; or roll without surge with --no-surge (one node at a time out of "
                 "service, no extra node)" if surge and not no_surge else "")
        raise OperationFailed(
            f"{pool.name}: not enough quota for the rollout"
            f"{f' with its surge of {surge} node(s)' if surge and not no_surge else ''}: "
            + "; ".join(shortfall_line(ln) for ln in short)
            + f"; nothing was changed. File an increase with `poolctl quota request --cloud "
              f"{cloud}`{offer}")
    section, name = ROLLOUT_KEYS[key]
    current = getattr(getattr(pool, section), name)
    label = ROLLOUT_LABELS[key]
    to = "the default image (its line removed)" if value is None else value

    cps = ", ".join(f"{c}%" for c in pool.rollout.checkpoints)
    how = "one node at a time, no surge" if no_surge or not plan.nodes.surge else (
        f"surge {plan.nodes.surge} node(s)")
    what = (f"{action} rollout of {stack}: {label} {current} -> {to} (checkpoints {cps}; "
            f"{how})")
    if current != value:
        log(what)
    # The question comes after Terraform's plan and its summary (run_stacks asks it): the file
    # records the value first, and a "no" puts the file and the rollout record back.

    text_before = file_path.read_text()
    rec_path = record_path(cfg, pool, cloud)
    rec_before = rec_path.read_text() if rec_path.is_file() else None

    def undo_and_refuse() -> OperationFailed:
        replace_file(file_path, text_before)
        if rec_before is None:
            rec_path.unlink(missing_ok=True)
        else:
            write_private(rec_path, rec_before)
        return OperationFailed(f"{stack}: not confirmed; nothing was changed")

    def confirm_rollout(question: str) -> bool:
        return confirm(f"{what}, recorded in {file_path}: {question}")

    new_cfg, old, changed, line = record_in_file(file_path, cfg, pool, key, value)
    new_pool = new_cfg.select(pool.name)[0]
    prev = load_record(cfg, pool, cloud) if not changed else None
    rec = RolloutRecord(
        stack=stack, pool=pool.name, cloud=cloud, file=str(file_path), key=label,
        from_value=old, to_value=value, line=line, group_version_from=group.version,
        no_surge=no_surge, action=action,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if not changed and prev and prev.to_value == value:
        # The file already records the value: resume the earlier attempt, keep its origin.
        rec = replace(rec, from_value=prev.from_value or rec.from_value,
                      group_version_from=prev.group_version_from or rec.group_version_from)
    save_record(cfg, pool, cloud, rec, new=changed)
    if changed:
        log(f"{file_path}:{line}: {label}: {old} -> {to} (recorded)")
    else:
        log(f"{file_path}:{line}: {label} is already {value}"
            + ("" if resume else "; applying it"))
    result = RolloutResult(
        pool=pool.name, cloud=cloud, stack=stack, key=label, from_value=rec.from_value,
        to_value=value, file=str(file_path), file_changed=changed, applied=False, rollout=None,
        no_surge=no_surge, quota=[ln.to_json() for ln in lines],
    )
    workdir = None
    if resume and not changed:
        assert active is not None  # resume: the rollout found active above
        # Its apply is done (the rollout started after it): drive it on where it stands.
        log(f"{stack}: rollout {active.id} is {active.status.words} at its {active.step}% step; "
            "driving it on (its apply is done)")
    else:
        env = ops.rollout_apply_env(group, plan_pool(new_pool, cloud), no_surge=no_surge)
        try:
            res = deploy.run_stacks(
                new_cfg, [Target(new_pool, cloud)], outdir=outdir, endpoints=ops.endpoints,
                destroy=False, plan_only=False, confirm=confirm_rollout, mirror=mirror,
                render_summary=render_summary, extra_env=env,
                before_apply=_keep_previous_version(ops, pool), verbose=verbose,
            )[0]
        except NotConfirmed:
            raise undo_and_refuse() from None
        except OperationFailed as e:
            raise OperationFailed(
                f"{e}\n{stack}: {file_path} records {label}={value} but the apply did not "
                f"finish; the pool still runs {rec.from_value}. Run the same command again "
                f"to resume, or `poolctl rollout rollback --cloud {cloud}` to restore "
                f"{rec.from_value} in the file") from None
        result.applied = res.applied
        workdir = Path(res.workdir)
    rec = replace(rec, status="applied")
    save_record(cfg, pool, cloud, rec)
    state = ops.rollout_begin(group, new_cfg, new_pool, plan_pool(new_pool, cloud),
                              no_surge=no_surge, stack_dir=workdir)
    if state is None:
        return_surge(cfg, new_pool, cloud, ops, ops.find_group(cfg, new_pool), None)
        save_record(cfg, pool, cloud, replace(rec, status="nothing_to_roll"))
        result.message = (f"{stack}: the nodes' launch configuration did not change; "
                          "nothing to roll")
        return result
    rec = replace(rec, status="started", rollout_id=state.id, group_version_to=state.to_version)
    save_record(cfg, pool, cloud, rec)
    cleanup_versions(ops, group, pool)
    annotate_rollout(state, rec)
    result.rollout = state
    result.message = (f"{stack}: rollout {state.id} started: {label} {rec.from_value} -> "
                      f"{value}, checkpoints {cps}")
    log(result.message)
    return result


# Optional CloudOps steps, GCP's only (AWS keeps launch template versions by itself): keep the
# previous instance template through the apply of a new one, and delete older ones.


def _keep_previous_version(ops: CloudOps, pool: Pool) -> Callable[[Terraform], bool] | None:
    """The `before_apply` step of a rollout's Terraform run, when the cloud has one."""
    if not isinstance(ops, StepsRollouts):
        return None
    step = ops.rollout_before_apply

    def before_apply(tf: Terraform) -> bool:
        forgotten = step(tf)
        for t in forgotten:
            log(f"{pool.name}: instance template {t['name'] or t['address']} stays as the "
                "rollback target: removed from Terraform's state, not deleted")
        return bool(forgotten)

    return before_apply


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
            log(f"instance template {t['name'] or t['address']} stays: the pool's MIG runs it "
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
    for name in out["deleted"]:
        log(f"{pool.name}: deleted instance template {name} (neither current nor previous)")
    for line in out["failed"]:
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


def wait_rollout(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, timeout: float,
                 hint: str, sleep: Callable[[float], None] = time.sleep
                 ) -> tuple[RolloutState | None, list[dict[str, Any]]]:
    """Poll the newest rollout until it ends; one line per change of status, percentage or
    checkpoint. Returns the final state and the progress seen."""
    group = ops.find_group(cfg, pool)
    rec = load_record(cfg, pool, cloud)
    t0 = time.monotonic()
    # The rollout's apply launched just before the wait: its failures count from earlier.
    wall0 = time.time() - 30
    seen: list[dict[str, Any]] = []
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
                seen.append({"status": s.status, "percentage_complete": s.percentage_complete,
                             "checkpoint_reached": s.checkpoint_reached,
                             "instances_to_update": s.instances_to_update,
                             "seconds": round(time.monotonic() - t0, 1)})
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
        # Ctrl-C reached the synth's Node process too (rollout start synthesized): no
        # traceback of jsii's exit hook writing to it.
        forget_dead_synth_kernel(1.0)
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
        rec = _restore_file(cfg, pool, rec)
    save_record(cfg, pool, cloud, rec)


def _restore_file(cfg: Config, pool: Pool, rec: RolloutRecord) -> RolloutRecord:
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


def rollout_status(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps
                   ) -> dict[str, Any]:
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    return_surge(cfg, pool, cloud, ops, group, s)
    rec = load_record(cfg, pool, cloud)
    if s is not None:
        annotate_rollout(s, rec)
    checkpoints = []
    if s is not None:
        for c in s.checkpoints or []:
            checkpoints.append({"percentage": c, "reached": bool(
                s.checkpoint_reached and c <= s.checkpoint_reached)
                or s.status == RolloutStatus.successful})
    # A rollout in flight whose replacements cannot launch holds where it stands: say why.
    failed = (stalled_launches(ops, group, pool, cloud, time.time() - 3600)
              if s is not None and not s.done else [])
    return {"pool": pool.name, "cloud": cloud, "group": group.name,
            "group_version": group.version,
            "rollout": asdict(s) if s else None, "checkpoints": checkpoints,
            "record": rec.to_json() if rec else None,
            "paused": (f"a replacement cannot launch: {failures_line(failed)}" if failed
                       else None),
            "capacity_failures": [asdict(f) for f in failed]}


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


def rollout_rollback(
    cfg: Config, file_path: Path, pool: Pool, cloud: Cloud, ops: CloudOps, *,
    confirm: Callable[[str], bool], outdir: Path, mirror: str | None = None,
    render_summary: Callable[[str, Any], None] = lambda name, summary: None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Return to the recorded previous version.

    A rollout still in progress is rolled back by the cloud (AWS RollbackInstanceRefresh:
    replaced nodes go back to the previous launch template version); one that ended is rolled
    out again to the previous version (a new rollout). Either way the file records the
    previous version again, so the next deploy does not roll forward."""
    rec = load_record(cfg, pool, cloud)
    node_image = rec is not None and rec.key in tuple(
        ROLLOUT_LABELS[k] for k in NODE_IMAGE_KEYS.values())
    if not rec or not (rec.from_value or node_image):
        raise OperationFailed(
            f"{pool.name}: no rollout recorded in {record_path(cfg, pool, cloud)}; nothing to "
            "roll back to")
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    mine = s is not None and s.id == rec.rollout_id
    out: dict[str, Any] = {"pool": pool.name, "cloud": cloud, "key": rec.key,
                           "from": rec.to_value, "to": rec.from_value, "how": None,
                           "rollout": None}
    if rec.status in ("recorded", "applied") and not mine:
        # The new version never started rolling: only the file needs restoring.
        save_record(cfg, pool, cloud, replace(_restore_file(cfg, pool, rec), status="rolled_back"))
        out["how"] = "file"
        return out
    if (mine and s is not None and s.done and rec.action == "rollback"
            and s.status == RolloutStatus.successful):
        raise OperationFailed(
            f"{pool.name}: the last rollout was already a rollback (to {rec.key}="
            f"{rec.to_value}); to go to {rec.from_value} again, use `poolctl rollout start`")
    if mine and s is not None and s.status == RolloutStatus.rolled_back:
        save_record(cfg, pool, cloud, _restore_file(cfg, pool, rec))
        out.update(how="already_rolled_back", rollout=asdict(s))
        return out
    held = (mine and s is not None and s.status == RolloutStatus.cancelled
            and isinstance(ops, StepsRollouts))
    if mine and s is not None and (not s.done or held):
        if not isinstance(ops, RollsBackRollouts):
            raise OperationFailed(f"rollout rollback: {cloud} cannot reverse a rollout in "
                                  f"progress; cancel it, then roll back once it stopped")
        if not confirm(f"roll back {rec.stack} to {rec.key}={rec.from_value} (replaced "
                       f"nodes return to the previous version)?"):
            raise OperationFailed(f"{rec.stack}: not confirmed; nothing was changed")
        state = ops.rollout_rollback(group)
        save_record(cfg, pool, cloud,
                    replace(_restore_file(cfg, pool, rec), status="rollback_requested"))
        out.update(how="cloud_rollback", rollout=asdict(state))
        return out
    # Ended (successful, cancelled or failed): roll the previous version out again, in the
    # file the rollout recorded (wherever this command runs from).
    key = rollout_key(rec.key)
    key = "node_image" if key in NODE_IMAGE_KEYS.values() else key
    # A node image the file did not name before: back to the default, its line removed.
    back = {"unset_node_image": True} if rec.from_value is None else {key: rec.from_value}
    recorded = Path(rec.file)
    if recorded.is_absolute() and recorded != Path(file_path).resolve():

        file_path, cfg = recorded, load_config(recorded)
        pool = cfg.select(pool.name)[0]
    res = rollout_start(cfg, file_path, pool, cloud, ops, **back,
                        no_surge=rec.no_surge, confirm=confirm, outdir=outdir,
                        mirror=mirror, render_summary=render_summary, action="rollback",
                        verbose=verbose)
    out.update(how="new_rollout", rollout=asdict(res.rollout) if res.rollout else None,
               message=res.message)
    return out
