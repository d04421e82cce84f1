"""synth, deploy, destroy: the commands that generate Terraform and apply it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from poolctl.cloud import Cloud
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
from poolctl.deploy import synth_targets
from poolctl.errors import OperationFailed, UsageError
from poolctl.workflow.deploy import Deploy

if TYPE_CHECKING:
    from poolctl.cloud import Cloud
    from poolctl.terraform import PlanSummary

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


def _act(destroy: bool, file: Path | None, pool: str | None, cloud: Cloud | None,
         auto_approve: bool, plan_only: bool, sandbox: bool, out: Path, mirror: str | None,
         json_out: bool, skip_quota_check: bool = False, verbose: bool = False,
         detailed_exitcode: bool = False) -> None:
    """The deploy workflow's steps in order (`poolctl.workflow.deploy`), rendered."""
    if detailed_exitcode and not plan_only:
        raise UsageError("--detailed-exitcode: only with --plan-only (Terraform's meaning: "
                         "exit 2 when the plan holds changes); add --plan-only")
    check_out(out)
    ctx = resolve_targets(file, pool, cloud, sandbox)
    cfg, tgts = ctx.cfg, list(ctx.targets)
    if not destroy:
        require_valid(cfg, tgts)
    run = Deploy(cfg, tgts, ctx.endpoints, destroy=destroy, plan_only=plan_only,
                 outdir=make_out_parent(out), mirror=mirror,
                 skip_quota_check=skip_quota_check, verbose=verbose)
    checked = run.preflight()
    for c in checked:
        if c.certificate_note:
            sys.stderr.write(f"poolctl: {c.certificate_note}\n")
    for c in checked:
        for line in c.shortfalls:
            sys.stderr.write(f"poolctl: {line}\n")
    if (refused := run.refusal(checked)) is not None:
        raise refused
    results = []
    for stack in run.stacks(checked):
        stack.prepare()
        summary = stack.plan()
        if not json_out:  # with --json the summary is in the JSON; stdout carries no more
            render_plan_summary(stack.name, summary)
            if plan_only:  # what a CI job reads: one line per resource that would change
                for rc in summary.resources:
                    sys.stdout.write(f"{stack.name}: {rc.action} {rc.address}\n")
        if stack.needs_answer(plan_only):
            if not confirm(stack.question(), auto_approve):
                raise stack.refused()
            run.apply(stack)
        results.append(stack.finish())
    after = run.finish(results)
    if json_out:
        emit_json({"stacks": [r.to_json() for r in results],
                   **({"windows_rebased": list(after.windows_rebased)}
                      if after.windows_rebased else {}),
                   **({"deleted_templates": {k: v.to_json()
                                             for k, v in after.deleted_templates.items()}}
                      if after.deleted_templates else {}),
                   **({"launches_failing": list(after.launches_failing)}
                      if after.launches_failing else {})})
    else:
        for r in results:
            for k, v in r.outputs.items():
                sys.stdout.write(f"{r.stack}: {k} = {v}\n")
    if after.launches_failing:
        for line in after.launches_failing[:-1]:
            sys.stderr.write(f"poolctl: {line}\n")
        raise OperationFailed(after.launches_failing[-1])
    if detailed_exitcode and any(r.changes for r in results):
        raise typer.Exit(CHANGES_PRESENT)


# `--detailed-exitcode`: Terraform's `plan -detailed-exitcode` codes, which CI pipelines test.
CHANGES_PRESENT = 2
DetailedOpt = Annotated[bool, typer.Option(
    "--detailed-exitcode",
    help="With --plan-only, exit as `terraform plan -detailed-exitcode` does: 0 no changes, "
    "2 changes present, 1 any error (bad input included). This changes what exit 2 means.")]


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
    detailed_exitcode: DetailedOpt = False,
) -> None:
    """Synth, then Terraform/OpenTofu init, plan and apply.

    Before anything is applied: the pool's peak needs are checked against the quotas, and
    the sizes `poolctl warm` set are kept (until `warm --reset`). In CI,
    `--plan-only --detailed-exitcode` exits 2 when the deployed pool differs from the file
    (drift), 0 when it matches, 1 on any error."""
    _act(False, file, pool, cloud, auto_approve, plan_only, sandbox, out, provider_mirror,
         json_out, skip_quota_check, verbose, detailed_exitcode)


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
    detailed_exitcode: DetailedOpt = False,
) -> None:
    """Destroy what deploy created (plan -destroy, confirm, apply)."""
    _act(True, file, pool, cloud, auto_approve, plan_only, sandbox, out, provider_mirror,
         json_out, verbose=verbose, detailed_exitcode=detailed_exitcode)
