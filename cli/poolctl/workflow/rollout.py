"""A rollout's start or rollback, start to end, in one place:

1. `RolloutStart.begin`: the checks (one value, the key literally in the file, no other
   rollout in progress, quota for the surge), the value recorded in the file and in the
   rollout record, and the stack synthesized from the recorded file (none when the same
   value resumes a rollout whose apply is done);
2. the stack's Terraform steps (`deploy.StackRun`), driven by the command: `plan`, the
   answer (`question`; a no puts the file and the record back: `refused`), `apply` (GCP keeps
   the template the group runs as the rollback target first);
3. `finish`: the rollout started with the pool's checkpoints, older versions cleaned up.

`RolloutRollback` decides how to return to the recorded previous version: restore the file
only, let the cloud reverse a rollout in progress (after the answer), or start a new rollout
back to it (a `RolloutStart`, driven as above).

Typed records at every seam (`Change`, `RolloutResult`, `RollbackResult`); no callback up to
the command: it calls the steps in order, asks, and renders what they return.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from poolctl import deploy, naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    QuotaLine,
    RolloutState,
    RolloutStatus,
    RollsBackRollouts,
    StepsRollouts,
)
from poolctl.config import Config, Pool, Target, load_config
from poolctl.errors import OperationFailed, UsageError
from poolctl.files import replace_file
from poolctl.home import write_private
from poolctl.progress import log
from poolctl.runtime import (
    NODE_IMAGE_KEYS,
    ROLLOUT_KEYS,
    ROLLOUT_LABELS,
    RolloutRecord,
    RolloutStep,
    annotate_rollout,
    cleanup_versions,
    load_record,
    record_in_file,
    record_path,
    restore_file,
    return_surge,
    rollout_key,
    rollout_quota,
    save_record,
    shortfall_line,
    write_key,
)
from poolctl.sizing import plan_pool
from poolctl.terraform import PlanSummary


@dataclass(frozen=True)
class Change:
    """What a rollout changes: one rollout key of the file (`image`, `model_version` or the
    cloud's node image key) and its new value (None: the node image line removed, back to the
    placement's default image)."""

    key: str
    value: str | None

    @classmethod
    def from_flags(cls, cloud: Cloud, *, image: str | None = None,
                   model_version: str | None = None, node_image: str | None = None
                   ) -> Change:
        """Exactly one of the flags."""
        given = {"image": image, "model_version": model_version,
                 NODE_IMAGE_KEYS[cloud]: node_image}
        given = {k: v for k, v in given.items() if v is not None}
        if len(given) != 1:
            raise UsageError("rollout start: give exactly one of --image IMAGE, "
                             "--model-version VERSION or --node-image IMAGE")
        [(key, value)] = given.items()
        value = str(value).strip()
        if value == "":
            raise UsageError(f"--{key.replace('_', '-')}: empty; give the new value")
        return cls(key, value)


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
    progress: list[RolloutStep] = field(default_factory=list)
    quota: list[QuotaLine] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["from"], d["to"] = d.pop("from_value"), d.pop("to_value")
        d["quota"] = [ln.to_json() for ln in self.quota]
        return d


class RolloutStart:
    """One `poolctl rollout start` (or the new rollout a rollback starts): record the new
    version in the file, apply it through Terraform (a new launch template version /
    instance template), then start the rollout with the pool's checkpoints."""

    def __init__(self, cfg: Config, file_path: Path, pool: Pool, cloud: Cloud, ops: CloudOps,
                 change: Change, *, no_surge: bool, outdir: Path, mirror: str | None,
                 action: str = "start", verbose: bool = False) -> None:
        self.cfg, self.pool, self.cloud, self.ops, self.change = cfg, pool, cloud, ops, change
        # The record outlives this working directory: `rollout rollback` run from another one
        # (or by a scheduler) must edit this file, not a poolctl.yaml where it happens to run.
        self.file_path = Path(file_path).resolve()
        self.no_surge, self.outdir, self.mirror = no_surge, outdir, mirror
        self.action, self.verbose = action, verbose
        self.stack = naming.stack_name(cfg, pool, cloud)
        self.label = ROLLOUT_LABELS[change.key]
        self.what = ""
        self.result: RolloutResult | None = None
        self.record: RolloutRecord | None = None
        self.new_cfg, self.new_pool, self.new_plan = cfg, pool, plan_pool(pool, cloud)
        self._before: tuple[str, str | None] = ("", None)  # file and record text, for a no

    # -- 1. checks, the record, the stack -----------------------------------------------

    def begin(self) -> deploy.StackRun | None:
        """The checks, the value recorded; the stack to apply, or None when the same value
        resumes a rollout whose apply is done."""
        cfg, pool, cloud, ops, key, value = (self.cfg, self.pool, self.cloud, self.ops,
                                             self.change.key, self.change.value)
        # Refuse before any cloud call when the key is not literally in the file (exit 2).
        idx = [p.name for p in cfg.pools].index(pool.name)
        write_key(key, self.file_path.read_text(), ("pools", idx, *ROLLOUT_KEYS[key]), value,
                  str(self.file_path))
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
        plan = self.new_plan  # the file's, until the value is recorded
        lines = rollout_quota(cfg, pool, cloud, ops, plan, group, self.no_surge)
        short = [ln for ln in lines if ln.shortfall > 0]
        surge = plan.nodes.surge if not self.no_surge else 0
        if short:
            offer = ("; or roll without surge with --no-surge (one node at a time out of "
                     "service, no extra node)" if surge else "")
            raise OperationFailed(
                f"{pool.name}: not enough quota for the rollout"
                f"{f' with its surge of {surge} node(s)' if surge else ''}: "
                + "; ".join(shortfall_line(ln) for ln in short)
                + f"; nothing was changed. File an increase with `poolctl quota request "
                  f"--cloud {cloud}`{offer}")
        current = getattr(getattr(pool, ROLLOUT_KEYS[key][0]), ROLLOUT_KEYS[key][1])
        to = "the default image (its line removed)" if value is None else value
        cps = ", ".join(f"{c}%" for c in pool.rollout.checkpoints)
        how = f"surge {surge} node(s)" if surge else "one node at a time, no surge"
        self.what = (f"{self.action} rollout of {self.stack}: {self.label} {current} -> {to} "
                     f"(checkpoints {cps}; {how})")
        if current != value:
            log(self.what)
        # The question comes after Terraform's plan and its summary: the file records the
        # value first, and a "no" puts the file and the rollout record back.
        rec_path = record_path(cfg, pool, cloud)
        self._before = (self.file_path.read_text(),
                        rec_path.read_text() if rec_path.is_file() else None)
        self.new_cfg, old, changed, line = record_in_file(self.file_path, cfg, pool, key,
                                                          value)
        self.new_pool = self.new_cfg.select(pool.name)[0]
        # The recorded file's plan, once: the apply's sizes, the stack, the rollout's steps.
        self.new_plan = plan_pool(self.new_pool, cloud)
        prev = load_record(cfg, pool, cloud) if not changed else None
        rec = RolloutRecord(
            stack=self.stack, pool=pool.name, cloud=cloud, file=str(self.file_path),
            key=self.label, from_value=old, to_value=value, line=line,
            group_version_from=group.version, no_surge=self.no_surge, action=self.action,
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        if not changed and prev and prev.to_value == value:
            # The file already records the value: resume the earlier attempt, keep its origin.
            rec = replace(rec, from_value=prev.from_value or rec.from_value,
                          group_version_from=prev.group_version_from or rec.group_version_from)
        save_record(cfg, pool, cloud, rec, new=changed)
        self.record = rec
        if changed:
            log(f"{self.file_path}:{line}: {self.label}: {old} -> {to} (recorded)")
        else:
            log(f"{self.file_path}:{line}: {self.label} is already {value}"
                + ("" if resume else "; applying it"))
        self.result = RolloutResult(
            pool=pool.name, cloud=cloud, stack=self.stack, key=self.label,
            from_value=rec.from_value, to_value=value, file=str(self.file_path),
            file_changed=changed, applied=False, rollout=None, no_surge=self.no_surge,
            quota=list(lines),
        )
        if resume and not changed:
            assert active is not None  # resume: the rollout found active above
            # Its apply is done (the rollout started after it): drive it on where it stands.
            log(f"{self.stack}: rollout {active.id} is {active.status.words} at its "
                f"{active.step}% step; driving it on (its apply is done)")
            return None
        env = ops.rollout_apply_env(group, self.new_plan, no_surge=self.no_surge)
        with self._applying():
            [run] = deploy.stack_runs(
                self.new_cfg, [Target(self.new_pool, cloud)], [self.new_plan],
                outdir=self.outdir, endpoints=ops.endpoints, destroy=False, mirror=self.mirror,
                extra_env=env, verbose=self.verbose)
        return run

    # -- 2. the stack's Terraform ---------------------------------------------------------

    def plan(self, run: deploy.StackRun) -> PlanSummary:
        with self._applying():
            run.prepare()
            return run.plan()

    def question(self, run: deploy.StackRun) -> str:
        return f"{self.what}, recorded in {self.file_path}: {run.question()}"

    def refused(self) -> OperationFailed:
        """A no: the file and the rollout record as they were."""
        text, rec = self._before
        replace_file(self.file_path, text)
        rec_path = record_path(self.cfg, self.pool, self.cloud)
        if rec is None:
            rec_path.unlink(missing_ok=True)
        else:
            write_private(rec_path, rec)
        return OperationFailed(f"{self.stack}: not confirmed; nothing was changed")

    def apply(self, run: deploy.StackRun) -> None:
        """After the answer: a cloud whose rollouts poolctl steps (GCP) keeps the template
        the group runs (Terraform forgets it; plan again), then the apply."""
        with self._applying():
            if isinstance(self.ops, StepsRollouts):
                forgotten = self.ops.rollout_before_apply(run.tf)
                for t in forgotten:
                    log(f"{self.pool.name}: instance template {t.name or t.address} stays as "
                        "the rollback target: removed from Terraform's state, not deleted")
                if forgotten:
                    run.replan()
            run.apply()

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        """A failure between the record and the rollout's start: say what the file holds."""
        try:
            yield
        except OperationFailed as e:
            rec = self.record
            raise OperationFailed(
                f"{e}\n{self.stack}: {self.file_path} records {self.label}="
                f"{self.change.value} but the apply did not finish; the pool still runs "
                f"{rec.from_value if rec else '?'}. Run the same command again to resume, or "
                f"`poolctl rollout rollback --cloud {self.cloud}` to restore it in the "
                "file") from None

    # -- 3. the rollout -------------------------------------------------------------------

    def finish(self, run: deploy.StackRun | None) -> RolloutResult:
        """After the apply (or none, resuming): the rollout started and recorded."""
        assert self.result is not None and self.record is not None  # after begin
        result, cfg, pool, cloud, ops = self.result, self.cfg, self.pool, self.cloud, self.ops
        workdir = None
        if run is not None:
            with self._applying():
                res = run.finish()
            result.applied, workdir = res.applied, Path(res.workdir)
        rec = replace(self.record, status="applied")
        save_record(cfg, pool, cloud, rec)
        state = ops.rollout_begin(ops.find_group(cfg, pool), self.new_cfg, self.new_pool,
                                  self.new_plan, no_surge=self.no_surge, stack_dir=workdir)
        if state is None:
            return_surge(cfg, self.new_pool, cloud, ops, ops.find_group(cfg, self.new_pool),
                         None)
            save_record(cfg, pool, cloud, replace(rec, status="nothing_to_roll"))
            result.message = (f"{self.stack}: the nodes' launch configuration did not change; "
                              "nothing to roll")
            return result
        rec = replace(rec, status="started", rollout_id=state.id,
                      group_version_to=state.to_version)
        save_record(cfg, pool, cloud, rec)
        cleanup_versions(ops, ops.find_group(cfg, pool), pool)
        annotate_rollout(state, rec)
        result.rollout = state
        cps = ", ".join(f"{c}%" for c in pool.rollout.checkpoints)
        result.message = (f"{self.stack}: rollout {state.id} started: {self.label} "
                          f"{rec.from_value} -> {self.change.value}, checkpoints {cps}")
        log(result.message)
        return result


@dataclass
class RollbackResult:
    pool: str
    cloud: Cloud
    key: str
    from_value: str | None  # the version rolled back from (the record's new one)
    to_value: str | None
    how: str | None = None  # file | already_rolled_back | cloud_rollback | new_rollout
    rollout: RolloutState | None = None
    message: str | None = None  # a new rollout's line

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pool": self.pool, "cloud": self.cloud, "key": self.key,
                             "from": self.from_value, "to": self.to_value, "how": self.how,
                             "rollout": asdict(self.rollout) if self.rollout else None}
        if self.message is not None:
            d["message"] = self.message
        return d


class RolloutRollback:
    """One `poolctl rollout rollback`: back to the recorded previous version.

    A rollout still in progress is rolled back by the cloud (AWS RollbackInstanceRefresh:
    replaced nodes go back to the previous launch template version); one that ended is rolled
    out again to the previous version (a new rollout). Either way the file records the
    previous version again, so the next deploy does not roll forward."""

    def __init__(self, cfg: Config, file_path: Path, pool: Pool, cloud: Cloud, ops: CloudOps,
                 *, outdir: Path, mirror: str | None, verbose: bool = False) -> None:
        self.cfg, self.file_path, self.pool, self.cloud, self.ops = (cfg, file_path, pool,
                                                                     cloud, ops)
        self.outdir, self.mirror, self.verbose = outdir, mirror, verbose
        rec = load_record(cfg, pool, cloud)
        node_image = rec is not None and rec.key in tuple(
            ROLLOUT_LABELS[k] for k in NODE_IMAGE_KEYS.values())
        if not rec or not (rec.from_value or node_image):
            raise OperationFailed(
                f"{pool.name}: no rollout recorded in {record_path(cfg, pool, cloud)}; "
                "nothing to roll back to")
        self.record = rec
        self.result = RollbackResult(pool=pool.name, cloud=cloud, key=rec.key,
                                     from_value=rec.to_value, to_value=rec.from_value)

    def decide(self) -> str:
        """How to go back (`RollbackResult.how`). `file` and `already_rolled_back` are done
        here; `cloud_rollback` waits for the answer to `question` (then `cloud_rollback`);
        `new_rollout` is the `RolloutStart` of `new_rollout()`."""
        cfg, pool, cloud, ops, rec = self.cfg, self.pool, self.cloud, self.ops, self.record
        group = ops.find_group(cfg, pool)
        s = ops.rollout_state(group)
        mine = s is not None and s.id == rec.rollout_id
        out = self.result
        if rec.status in ("recorded", "applied") and not mine:
            # The new version never started rolling: only the file needs restoring.
            save_record(cfg, pool, cloud,
                        replace(restore_file(cfg, pool, rec), status="rolled_back"))
            out.how = "file"
        elif (mine and s is not None and s.done and rec.action == "rollback"
              and s.status == RolloutStatus.successful):
            raise OperationFailed(
                f"{pool.name}: the last rollout was already a rollback (to {rec.key}="
                f"{rec.to_value}); to go to {rec.from_value} again, use `poolctl rollout "
                "start`")
        elif mine and s is not None and s.status == RolloutStatus.rolled_back:
            save_record(cfg, pool, cloud, restore_file(cfg, pool, rec))
            out.how, out.rollout = "already_rolled_back", s
        elif mine and s is not None and (not s.done or (
                s.status == RolloutStatus.cancelled and isinstance(ops, StepsRollouts))):
            if not isinstance(ops, RollsBackRollouts):
                raise OperationFailed(f"rollout rollback: {cloud} cannot reverse a rollout "
                                      "in progress; cancel it, then roll back once it stopped")
            out.how = "cloud_rollback"
        else:
            # Ended (successful, cancelled or failed): roll the previous version out again.
            out.how = "new_rollout"
        assert out.how is not None
        return out.how

    def question(self) -> str:
        rec = self.record
        return (f"roll back {rec.stack} to {rec.key}={rec.from_value} (replaced nodes return "
                "to the previous version)?")

    def refused(self) -> OperationFailed:
        return OperationFailed(f"{self.record.stack}: not confirmed; nothing was changed")

    def cloud_rollback(self) -> RollbackResult:
        """After a yes: the cloud reverses the rollout in progress; the file goes back."""
        assert isinstance(self.ops, RollsBackRollouts)  # decide() said cloud_rollback
        state = self.ops.rollout_rollback(self.ops.find_group(self.cfg, self.pool))
        save_record(self.cfg, self.pool, self.cloud,
                    replace(restore_file(self.cfg, self.pool, self.record),
                            status="rollback_requested"))
        self.result.rollout = state
        return self.result

    def new_rollout(self) -> RolloutStart:
        """The rollout back to the previous version, in the file the rollout recorded
        (wherever this command runs from)."""
        rec, cfg, pool, file_path = self.record, self.cfg, self.pool, self.file_path
        key = rollout_key(rec.key)
        # A node image the file did not name before: back to the default, its line removed.
        change = Change(key, rec.from_value)
        recorded = Path(rec.file)
        if recorded.is_absolute() and recorded != Path(file_path).resolve():
            file_path, cfg = recorded, load_config(recorded)
            pool = cfg.select(pool.name)[0]
        return RolloutStart(cfg, file_path, pool, self.cloud, self.ops, change,
                            no_surge=rec.no_surge, outdir=self.outdir, mirror=self.mirror,
                            action="rollback", verbose=self.verbose)

    def started(self, res: RolloutResult) -> RollbackResult:
        self.result.rollout, self.result.message = res.rollout, res.message
        return self.result
