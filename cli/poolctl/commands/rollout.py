"""poolctl rollout start / status / rollback / cancel: roll a new image or model version
through the pool, checkpoint by checkpoint, with automatic rollback on failed health."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from poolctl import images, runtime
from poolctl.clouds.base import RolloutState, RolloutStatus
from poolctl.commands.build import VerboseOpt, check_out, make_out, render_plan_summary
from poolctl.commands.common import (
    WEEK_S,
    AutoApproveOpt,
    CloudOpt,
    FileOpt,
    JsonOpt,
    MirrorOpt,
    OutOpt,
    PoolOpt,
    SandboxOpt,
    confirm,
    console,
    emit_json,
    load,
    real,
    resolve_target,
)
from poolctl.errors import OperationFailed, UsageError
from poolctl.formats import image_reference
from poolctl.workflow.rollout import (
    Change,
    RollbackResult,
    RolloutResult,
    RolloutRollback,
    RolloutStart,
)

if TYPE_CHECKING:
    from poolctl.clouds.base import RolloutState

app = typer.Typer(help="Roll a new image or model version through the pool.",
                  no_args_is_help=True)

WaitOpt = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Watch it to the end (per checkpoint).")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", parser=real(0, WEEK_S, "seconds"), metavar="SECONDS",
                        help="Seconds --wait watches at most.")
]


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """The plan summary prints to stdout; with --json stdout carries only the JSON. Python's
    stdout is enough: Terraform's output comes through pipes, never this process's fd 1."""
    if not active:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _finish(state: RolloutState | None, what: str) -> None:
    """Exit 1 unless the rollout ended as the command intended."""

    if state is None or state.status == RolloutStatus.successful:
        return
    if what == "rollback" and state.status == RolloutStatus.rolled_back:
        return
    if what == "cancel" and state.status == RolloutStatus.cancelled:
        return
    if state.status == RolloutStatus.rolled_back:
        raise OperationFailed(f"rollout {state.id} rolled back automatically ({state.reason}); "
                              "the pool and the file are on the previous version again")
    raise OperationFailed(f"rollout {state.id} ended {state.status.words}"
                          + (f": {state.reason}" if state.reason else ""))


def run_start(start: RolloutStart, ask: Callable[[str], bool]) -> RolloutResult:
    """Drive a rollout's start: the checks and the record, Terraform's plan and its summary,
    the answer (`ask`), the apply, the rollout started."""
    run = start.begin()
    if run is not None:
        render_plan_summary(run.name, start.plan(run))
        if run.needs_answer(False):
            if not ask(start.question(run)):
                raise start.refused()
            start.apply(run)
    return start.finish(run)


def run_rollback(back: RolloutRollback, ask: Callable[[str], bool]) -> RollbackResult:
    """Drive a rollback: the file only, the cloud reversing a rollout in progress (after
    the answer), or a new rollout back to the previous version."""
    how = back.decide()
    if how == "cloud_rollback":
        if not ask(back.question()):
            raise back.refused()
        return back.cloud_rollback()
    if how == "new_rollout":
        return back.started(run_start(back.new_rollout(), ask))
    return back.result


@app.command("start")
def start(
    cloud: CloudOpt = None,
    image: Annotated[str | None, typer.Option("--image", help="New serving image.")] = None,
    model_version: Annotated[
        str | None, typer.Option("--model-version", help="New model.version label.")] = None,
    node_image: Annotated[
        str | None, typer.Option("--node-image", help="Roll nodes to this node image (an AMI "
                                 "id / GCE image), or `latest`: the newest built for the pool "
                                 "that carries its serving image.")] = None,
    build_image: Annotated[
        bool, typer.Option("--build-image", help="With --image: first build the node image "
                           "for it (`poolctl image build`), then roll.")] = False,
    no_surge: Annotated[
        bool, typer.Option("--no-surge", help="Replace without extra nodes: one node at a "
                           "time out of service (when quota has no room for the surge).")
    ] = False,
    file: FileOpt = None,
    pool: PoolOpt = None,
    auto_approve: AutoApproveOpt = False,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 14400.0,
    sandbox: SandboxOpt = False,
    out: OutOpt = Path("cdktf.out"),
    provider_mirror: MirrorOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Record the new version in the file, apply it, and roll it through the pool."""

    if image is not None:  # the same grammar as serving.image, before the file is edited
        try:
            image_reference(image)
        except ValueError as e:
            raise UsageError(f"--image: {e}; got {image[:80]!r}") from None
    if build_image and (image is None or node_image is not None):
        raise UsageError("--build-image: builds the node image for the new serving image; "
                         "give --image IMAGE (and no --node-image)")
    check_out(out)
    ctx = resolve_target(file, pool, cloud, sandbox)
    cfg, path, p, c, ops = ctx.cfg, ctx.path, ctx.pool, ctx.cloud, ctx.ops
    with _stdout_to_stderr(json_out):
        if node_image == "latest":

            node_image = images.latest_image(cfg, p, c, ctx.endpoints)
        if build_image:

            built = images.build(cfg, path, p, c, endpoints=ctx.endpoints, dry_run=False,
                                 serving_image=image)
            sys.stderr.write(f"{p.name}: node image {built.image_id} carries {image}; the next "
                             "apply launches nodes from it\n")
            cfg = load(path)
            p = cfg.select(p.name)[0]
        change = Change.from_flags(c, image=image, model_version=model_version,
                                   node_image=node_image)
        res = run_start(RolloutStart(cfg, path, p, c, ops, change, no_surge=no_surge,
                                     outdir=make_out(out), mirror=provider_mirror,
                                     verbose=verbose),
                        lambda q: confirm(q, auto_approve))
    data = res.to_json()
    final = None
    try:
        if wait and res.rollout is not None:
            final, res.progress = runtime.wait_rollout(load(path), p, c, ops, timeout,
                                                       ctx.hint("rollout status"))
            data = res.to_json()
            data["final"] = asdict(final) if final else None
    finally:
        if json_out:
            emit_json(data)
    if not json_out and final is None:  # after a wait, the last line says how it finished
        sys.stderr.write(res.message + "\n")
    _finish(final, "start")


@app.command("status")
def status(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """The newest rollout: status, percentage, each checkpoint, what rolls from and to."""

    ctx = resolve_target(file, pool, cloud, sandbox)
    p, c = ctx.pool, ctx.cloud
    view = runtime.rollout_status(ctx.cfg, p, c, ctx.ops)
    if json_out:
        emit_json(view.to_json())
        return
    r = view.rollout
    con = console()
    if r is None:
        con.print(f"{p.name}/{c}: no rollout yet (group version {view.group_version})")
        return

    con.print(f"{p.name}/{c}: rollout {r.id}: {runtime.rollout_words(r)}")
    if r.from_version or r.to_version:
        con.print(f"  {r.from_version or '?'} -> {r.to_version or '?'}")
    con.print("  checkpoints: " + ", ".join(
        f"{cp.percentage}% {'reached' if cp.reached else 'pending'}"
        for cp in view.checkpoints))
    if r.step is not None:
        con.print(f"  step: {r.step}%")
    if view.paused:
        con.print(f"  paused: {view.paused}; the nodes not replaced yet keep serving",
                  markup=False, soft_wrap=True)
    for v in r.versions:  # rollouts poolctl steps itself (GCP canaries)
        target = "" if v.target is None else f" of {v.target} wanted"
        con.print(f"  {v.name} {v.template}: {v.nodes} node(s){target}, {v.healthy} healthy, "
                  f"{v.unhealthy} unhealthy, {v.pending} pending", markup=False)


@app.command("rollback")
def rollback(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    auto_approve: AutoApproveOpt = False,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 14400.0,
    sandbox: SandboxOpt = False,
    out: OutOpt = Path("cdktf.out"),
    provider_mirror: MirrorOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Back to the recorded previous version (in the pool and in the file)."""

    check_out(out)
    ctx = resolve_target(file, pool, cloud, sandbox)
    path, p, c, ops = ctx.path, ctx.pool, ctx.cloud, ctx.ops
    with _stdout_to_stderr(json_out):
        data = run_rollback(RolloutRollback(ctx.cfg, path, p, c, ops, outdir=make_out(out),
                                            mirror=provider_mirror, verbose=verbose),
                            lambda q: confirm(q, auto_approve)).to_json()
    sys.stderr.write(f"{p.name}/{c}: rollback to {data['key']}={data['to']} ({data['how']})\n")
    final = None
    try:
        if wait and data["how"] in ("cloud_rollback", "new_rollout"):
            final, steps = runtime.wait_rollout(load(path), p, c, ops, timeout,
                                                ctx.hint("rollout status"))
            data["progress"] = [asdict(step) for step in steps]
            data["final"] = asdict(final) if final else None
    finally:
        if json_out:
            emit_json(data)
    _finish(final, "rollback" if data["how"] == "cloud_rollback" else "start")


@app.command("cancel")
def cancel(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 3600.0,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Stop the rollout where it stands (nodes already replaced stay on the new version)."""

    ctx = resolve_target(file, pool, cloud, sandbox)
    cfg, p, c, ops = ctx.cfg, ctx.pool, ctx.cloud, ctx.ops
    state = runtime.rollout_cancel(cfg, p, c, ops)
    data: dict[str, Any] = {"pool": p.name, "cloud": c, "rollout": asdict(state)}
    sys.stderr.write(f"{p.name}/{c}: rollout {state.id} cancel requested; the file still "
                     "records the new version: `poolctl rollout start` again resumes it, "
                     "`poolctl rollout rollback` returns to the previous one\n")
    final = None
    try:
        if wait and not state.done:
            final, steps = runtime.wait_rollout(cfg, p, c, ops, timeout,
                                                ctx.hint("rollout status"))
            data["progress"] = [asdict(step) for step in steps]
            data["final"] = asdict(final) if final else None
    finally:
        if json_out:
            emit_json(data)
    _finish(final, "cancel")
