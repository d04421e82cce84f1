"""poolctl capacity check: per zone of the placement, the type offered and the reservations
the pool launches into, against what its peak needs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from poolctl.clouds.base import ChecksCapacity, capacity_needs
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    resolve_targets,
)
from poolctl.contract.aws import CAPACITY_BLOCK
from poolctl.errors import OperationFailed, UsageError
from poolctl.runtime.purchases import pending_line, purchase_view, unused_line
from poolctl.sizing import plan_pool

if TYPE_CHECKING:
    from poolctl.clouds.base import CapacityReport, ReservationRow

app = typer.Typer(help="Capacity: zones offering the type, reservations, the peak beyond them.",
                  no_args_is_help=True)


def _render(reports: list[CapacityReport]) -> None:

    t = Table(title="capacity", title_justify="left")
    for col in ("pool", "zone", "offered", "reservation", "match", "total", "available",
                "in use", "starts", "ends"):
        t.add_column(col, justify="right" if col in ("total", "available", "in use") else "left")
    for r in reports:
        for z in r.zones:
            rows: list[ReservationRow | None] = [*z.reservations] or [None]
            for res in rows:
                t.add_row(f"{r.pool}/{r.cloud}", z.zone, "yes" if z.offered else "no",
                          *(("-",) * 7 if res is None else (
                              f"{res.id} ({res.state}"
                              f"{', block' if res.kind == CAPACITY_BLOCK else ''})",
                              res.match_criteria, str(res.total), str(res.available),
                              str(res.in_use), res.start or "-", res.end or "unlimited")),
                          style=None if z.offered else "dim")
    console().print(t)
    for r in reports:
        need = ", ".join(f"{k} {v}" for k, v in r.needs.items())
        beyond = ", ".join(f"{k} {v}" for k, v in r.beyond.items())
        console().print(f"{r.pool}/{r.cloud}: {r.instance_type}, preference {r.preference}; "
                        f"nodes needed: {need}; held by reservations: {r.held}; "
                        f"beyond them: {beyond}")


def capacity_problem(r: CapacityReport) -> str | None:
    offered = [z.zone for z in r.zones if z.offered]
    if not offered:
        zones = ", ".join(z.zone for z in r.zones)
        where = "aws.network" if r.cloud == "aws" else "gcp.zones"
        return (f"{r.pool}/{r.cloud}: no zone of the placement ({zones}) offers "
                f"{r.instance_type}; choose zones that do ({where})")
    if r.ok:
        return None
    if r.preference == CAPACITY_BLOCK:
        blocks = [res for z in r.zones for res in z.reservations]
        when = "; ".join(f"{b.id} is {b.state}" + (f" from {b.start}" if b.state == "scheduled"
                                                    and b.start else "") + f" until {b.end}"
                         for b in blocks) or "the block was not found"
        return (f"{r.pool}/{r.cloud}: every launch targets the Capacity Block ({when}): the "
                f"peak of {r.needs['peak']} node(s) needs {r.beyond['peak']} beyond the "
                f"{r.held} it holds now; lower scaling.max_replicas and rollout."
                "max_surge_replicas to fit the block, or schedule the extra nodes with `poolctl "
                "warm --from/--until --reserve` instead of aws.capacity.capacity_block")
    return (f"{r.pool}/{r.cloud}: reservations-only: the peak of {r.needs['peak']} node(s) "
            f"needs {r.beyond['peak']} beyond the {r.held} the reservations hold in "
            f"{', '.join(offered)}; reserve {r.beyond['peak']} more {r.instance_type} there, or "
            + ("set aws.capacity.preference: reservations-first" if r.cloud == "aws" else
               "set gcp.capacity.reservations: any (specific reservations create no VM "
               "beyond them)"))


@app.command("check")
def check(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Per zone of the placement: whether the type is offered, the reservations that match
    the pool (total, available, in use, end, match criteria), and what its peak (min, warm,
    surge, max) needs beyond them; exit 1 when reservations-only (or the pool's Capacity Block)
    cannot cover the peak."""

    ctx = resolve_targets(file, pool, cloud, sandbox)
    ops, c = ctx.ops, ctx.cloud
    if not isinstance(ops, ChecksCapacity):
        raise UsageError(f"--cloud {c}: capacity check is not supported on {c} yet; use "
                         "--cloud aws")
    reports = [ops.capacity_report(ctx.cfg, t.pool, capacity_needs(plan_pool(t.pool, t.cloud)))
               for t in ctx.targets]
    problems = [m for r in reports if (m := capacity_problem(r))]
    bought = [purchase_view(ctx.cfg, t.pool, t.cloud, ops) for t in ctx.targets]
    if json_out:
        emit_json({"ok": not problems, "pools": [
            {**r.to_json(), "unused_blocks": [b.to_json() for b in unused],
             "pending_purchases": [p.to_json() for p in pending]}
            for r, (unused, pending) in zip(reports, bought, strict=True)]})
    else:
        _render(reports)
    for t, (unused, pending) in zip(ctx.targets, bought, strict=True):
        for b in unused:
            sys.stderr.write(unused_line(t.pool.name, t.cloud, b) + "\n")
        for p in pending:
            sys.stderr.write(pending_line(t.pool.name, p) + "\n")
    if problems:
        raise OperationFailed("; ".join(problems))
