"""synth, deploy, destroy: the commands that generate Terraform and apply it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import DeployChecks, StepsRollouts
from poolctl.commands.common import (
    AutoApproveOpt,
    CloudAllOpt,
    CloudOpt,
    FileOpt,
    JsonOpt,
    MirrorOpt,
    OutOpt,
    PoolOpt,
    SandboxOpt,
    check_creatable,
    confirm,
    console,
    emit_json,
    load,
    make_folder,
    require_valid,
    resolve_targets,
    targets,
)
from poolctl.deploy import run_stacks, synth_targets
from poolctl.endpoints import CloudEndpoints
from poolctl.errors import OperationFailed, PoolctlError, UsageError
from poolctl.runtime import deploy_before_apply, get_ops

if TYPE_CHECKING:
    from poolctl.cloud import Cloud
    from poolctl.config import Config, Pool, Target
    from poolctl.deploy import StackResult
    from poolctl.terraform import PlanSummary

# What a deploy's preflight returns per target: TF_VAR_... to add, and lines saying why.
Keeps = list[tuple[dict[str, str], list[str]]]


def check_out(out: Path) -> None:
    """--out must be (or become) a folder poolctl can write in: refuse a file there, or a
    place no folder can be made (/proc, a read-only mount), before anything is written."""
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():

        raise UsageError(f"--out: {existing} is a file, not a folder; give a folder for the "
                         "synthesized stacks (default cdktf.out)")
    check_creatable(out, "--out", OUT_FIX)


def make_out(out: Path) -> Path:
    """The --out folder, made (with its parents: the synthesizer makes only the last one)
    once the command is about to write into it."""
    return make_folder(out, "--out", OUT_FIX)


def make_out_parent(out: Path) -> Path:
    """The folders above --out, made now; --out itself the synthesizer makes when it writes,
    after a deploy's preflight: a refused deploy leaves no empty cdktf.out behind."""
    make_folder(out.parent, "--out", OUT_FIX)
    return out


OUT_FIX = "give a folder you can write in for the synthesized stacks (default cdktf.out)"


def synth(file: FileOpt = None, pool: PoolOpt = None, cloud: CloudAllOpt = None,
          out: OutOpt = Path("cdktf.out"), json_out: JsonOpt = False) -> None:
    """Write DIR/stacks/<stack>/cdk.tf.json for each pool and cloud."""

    check_out(out)
    cfg = load(file)
    tgts = targets(cfg, pool, cloud)
    require_valid(cfg, tgts)
    dirs = synth_targets(cfg, tgts, make_out(out))
    files = [str(d / "cdk.tf.json") for d in dirs]
    if json_out:
        emit_json({"stacks": [{"stack": d.name, "file": f} for d, f in zip(dirs, files,
                                                                            strict=True)]})
    else:
        for f in files:
            sys.stdout.write(f + "\n")


VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="Show Terraform's own output too (it always goes to a log file "
    "under $POOLCTL_HOME/logs).")]


def _size(value: int | str | None, rpn: int | None) -> str:
    if value is None:
        return "(none)"
    return f"{value}" if rpn is None or not isinstance(value, int) else (
        f"{value} ({value * rpn} replicas)")


def render_plan_summary(name: str, summary: PlanSummary) -> None:
    """Before the confirmation: what the plan adds, changes and destroys per resource type,
    the node counts it changes and what the pool costs per hour."""

    if summary.empty:
        return
    t = Table(title=f"{name}: plan", title_justify="left")
    for col in ("resource type", "add", "change", "destroy"):
        t.add_column(col, justify="left" if col == "resource type" else "right")
    for rtype, n in summary.to_json().items():
        t.add_row(rtype, str(n["add"] or ""), str(n["change"] or ""), str(n["destroy"] or ""))
    add, change, gone = summary.totals()
    t.add_row("total", str(add), str(change), str(gone), style="bold")
    con = console()
    con.print(t)
    cost = summary.cost
    rpn = cost.get("replicas_per_node")
    if summary.sizes:
        sizes = Table(title=f"{name}: sizes in nodes", title_justify="left")
        for col in ("setting", "now", "after"):
            sizes.add_column(col, justify="left" if col == "setting" else "right")
        for c in summary.sizes:  # attribute names: one group (and autoscaler) per stack
            unit = None if c.field.endswith("pool_state") else rpn
            sizes.add_row(c.field, "" if c.before is None else _size(c.before, unit),
                          _size(c.after, unit))
        con.print(sizes)
    if cost:
        nodes, warm = cost["nodes"], cost["warm_running_nodes"]
        warm_s = f" + {warm} warm running" if warm else ""
        verb = "stops" if gone and not add else "costs"
        con.print(f"the pool {verb} ${cost['min']:,.2f}/h at its minimum ({nodes['min']} "
                  f"node(s){warm_s}) to ${cost['max']:,.2f}/h at its maximum ({nodes['max']} "
                  f"node(s){warm_s}): {cost['instance_type']} at "
                  f"${cost['price_per_node_hour_usd']:,.2f} per node-hour",
                  markup=False, soft_wrap=True)


def _deploy_preflight(cfg: Config, endpoints: CloudEndpoints, skip_quota: bool, plan_only: bool
                      ) -> Callable[[list[Target]], Keeps]:
    """Before a deploy synthesizes anything: the certificate an HTTPS listener names (a
    missing, unissued or other region's one stops it; --plan-only only reports), the quota
    its peak needs (a shortfall stops it, one line each, unless --skip-quota-check;
    --plan-only only reports), and the sizes `poolctl warm` set, which the apply keeps
    until `warm --reset`."""

    def check(tgts: list[Target]) -> Keeps:

        for t in tgts:
            p, c = t.pool, t.cloud
            try:
                note = _certificate(cfg, p, c, endpoints)
            except PoolctlError as e:
                if not plan_only:
                    raise
                note = str(e)
            if note:
                sys.stderr.write(f"poolctl: {note}\n")
        out: Keeps = []
        short: list[str] = []
        for t in tgts:
            p, c = t.pool, t.cloud
            ops = runtime.get_ops(c, endpoints)
            if not skip_quota:
                try:
                    short += [f"{p.name}/{c}: {line}"
                              for line in runtime.deploy_quota(cfg, p, c, ops)]
                except OperationFailed as e:
                    raise OperationFailed(f"{e}; or deploy with --skip-quota-check") from None
            out.append(runtime.deploy_keeps(cfg, p, c, ops))
        for line in short:
            sys.stderr.write(f"poolctl: {line}\n")
        if short and not plan_only:
            raise OperationFailed(
                f"deploy: not enough quota for the pools' peak ({len(short)} shortfall(s) "
                "above); nothing was applied. File an increase with `poolctl quota request`, "
                "or deploy anyway with --skip-quota-check")
        return out

    return check


def _certificate(cfg: Config, pool: Pool, cloud: Cloud, endpoints: CloudEndpoints
                 ) -> str | None:
    """The AWS placement's certificate exists, is issued and is in its region; else the
    apply would point port 80 at an HTTPS listener that never comes."""

    placement = pool.aws
    if cloud != Cloud.aws or placement is None or not placement.certificate_arn:
        return None

    idx = [p.name for p in cfg.pools].index(pool.name)
    ops = get_ops(cloud, endpoints)
    assert isinstance(ops, DeployChecks)  # AWS's ops check what a deploy needs
    return ops.certificate_note(f"pools[{idx}].aws.certificate_arn",
                                placement.certificate_arn, placement.region)


def _act(destroy: bool, file: Path | None, pool: str | None, cloud: Cloud | None,
         auto_approve: bool, plan_only: bool, sandbox: bool, out: Path, mirror: str | None,
         json_out: bool, skip_quota_check: bool = False, verbose: bool = False) -> None:

    started = time.time()
    check_out(out)
    ctx = resolve_targets(file, pool, cloud, sandbox)
    cfg, endpoints, tgts = ctx.cfg, ctx.endpoints, list(ctx.targets)
    if not destroy:
        require_valid(cfg, tgts)

    results = run_stacks(
        cfg, tgts, outdir=make_out_parent(out), endpoints=endpoints, destroy=destroy,
        plan_only=plan_only,
        confirm=lambda q: confirm(q, auto_approve), mirror=mirror,
        # With --json the summary is in the JSON; stdout carries nothing else.
        render_summary=(lambda name, summary: None) if json_out else render_plan_summary,
        preflight=None if destroy else _deploy_preflight(cfg, endpoints, skip_quota_check,
                                                         plan_only),
        verbose=verbose,
        before_apply=(runtime.destroy_before_apply(cfg, tgts, endpoints) if destroy
                      else deploy_before_apply(tgts)),
    )
    leftovers = _kept_versions(cfg, tgts, results, endpoints) if destroy else {}
    failing = [] if destroy else _launches_failing(cfg, tgts, results, endpoints, started)
    rebased = [] if destroy else _windows_rebased(cfg, tgts, results, endpoints)
    if json_out:
        emit_json({"stacks": [r.__dict__ for r in results],
                   **({"windows_rebased": rebased} if rebased else {}),
                   **({"deleted_templates": leftovers} if leftovers else {}),
                   **({"launches_failing": failing} if failing else {})})
    else:
        for r in results:
            if r.outputs:
                for k, v in r.outputs.items():
                    sys.stdout.write(f"{r.stack}: {k} = {v}\n")
    if failing:
        for line in failing[:-1]:
            sys.stderr.write(f"poolctl: {line}\n")
        raise OperationFailed(failing[-1])


def _launches_failing(cfg: Config, tgts: list[Target], results: list[StackResult],
                      endpoints: CloudEndpoints, started: float) -> list[str]:
    """Applied pools whose group could not launch since the deploy began: the apply does not
    wait for nodes, so this one look says it instead of a pool that silently never grows."""
    out = []
    for t, r in zip(tgts, results, strict=True):
        if r.applied and (line := runtime.deploy_launches(cfg, t.pool, t.cloud, runtime.get_ops(
                t.cloud, endpoints), started)):
            out.append(line)
    return out


def _windows_rebased(cfg: Config, tgts: list[Target], results: list[StackResult],
                     endpoints: CloudEndpoints) -> list[str]:
    """Applied pools whose launch windows were written over another minimum than the one
    the deploy left: they rise over the new one (said on stderr)."""
    out = []
    for t, r in zip(tgts, results, strict=True):
        if r.applied and (line := runtime.deploy_windows(cfg, t.pool, t.cloud, runtime.get_ops(
                t.cloud, endpoints))):
            sys.stderr.write(f"== {r.stack}: {line}\n")
            out.append(line)
    return out


def _kept_versions(cfg: Config, tgts: list[Target], results: list[StackResult],
                   endpoints: CloudEndpoints) -> dict[str, dict[str, list[str]]]:
    """A cloud whose rollouts poolctl steps (GCP) keeps each rollout's previous version
    outside Terraform's state (the rollback target); once the pool is destroyed, delete
    those too."""

    out: dict[str, dict[str, list[str]]] = {}
    for t, r in zip(tgts, results, strict=True):
        if not r.applied or not isinstance(ops := get_ops(t.cloud, endpoints), StepsRollouts):
            continue
        done = ops.delete_pool_templates(cfg, t.pool)
        for line in done["failed"]:
            sys.stderr.write(f"poolctl: {r.stack}: {line}\n")
        if done["deleted"]:
            sys.stderr.write(f"{r.stack}: deleted kept instance templates: "
                             f"{', '.join(done['deleted'])}\n")
        out[r.stack] = done
    return out


def deploy(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    auto_approve: AutoApproveOpt = False,
    plan_only: Annotated[bool, typer.Option("--plan-only", help="Stop after the plan.")] = False,
    sandbox: SandboxOpt = False,
    out: OutOpt = Path("cdktf.out"),
    provider_mirror: MirrorOpt = None,
    json_out: JsonOpt = False,
    skip_quota_check: Annotated[bool, typer.Option(
        "--skip-quota-check", help="Apply even when the quota check finds a shortfall (or "
        "cannot read the quotas).")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Synth, then Terraform/OpenTofu init, plan and apply.

    Before anything is applied: the pool's peak needs are checked against the quotas, and
    the sizes `poolctl warm` set are kept (until `warm --reset`)."""
    _act(False, file, pool, cloud, auto_approve, plan_only, sandbox, out, provider_mirror,
         json_out, skip_quota_check, verbose)


def destroy(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    auto_approve: AutoApproveOpt = False,
    plan_only: Annotated[bool, typer.Option("--plan-only", help="Stop after the plan.")] = False,
    sandbox: SandboxOpt = False,
    out: OutOpt = Path("cdktf.out"),
    provider_mirror: MirrorOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Destroy what deploy created (plan -destroy, confirm, apply)."""
    _act(True, file, pool, cloud, auto_approve, plan_only, sandbox, out, provider_mirror,
         json_out, verbose=verbose)
