"""poolctl quota check / request: the quota a pool needs against what is granted and used."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from poolctl import runtime
from poolctl.commands.common import (
    AutoApproveOpt,
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    confirm,
    console,
    emit_json,
    resolve_targets,
)
from poolctl.errors import OperationFailed, UsageError

if TYPE_CHECKING:
    from poolctl.cloud import Cloud
    from poolctl.clouds.base import CloudOps, QuotaLine
    from poolctl.config import Config, Pool

app = typer.Typer(help="Quota needed vs. granted; file an increase.", no_args_is_help=True)

ContactOpt = Annotated[
    str | None,
    typer.Option(
        "--contact-email", envvar="POOLCTL_QUOTA_CONTACT_EMAIL", show_default=False,
        help="GCP: the address Google contacts about the request (Cloud Quotas requires one; "
             "AWS takes none).",
    ),
]
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _lines(file: Path | None, pool: str | None, cloud: Cloud | None, sandbox: bool,
           contact_email: str | None = None
           ) -> tuple[Config, CloudOps, list[tuple[Pool, Cloud, list[QuotaLine]]]]:

    ctx = resolve_targets(file, pool, cloud, sandbox, contact_email=contact_email)
    # A quota pools share is one line (with every sharing pool's need), shown and requested
    # once even when several of them are selected.
    seen: set[tuple[str, str, str, tuple[str, ...]]] = set()
    found: list[tuple[Pool, Cloud, list[QuotaLine]]] = []
    for t in ctx.targets:
        p, c = t.pool, t.cloud
        lines: list[QuotaLine] = []
        for ln in runtime.quota_check(ctx.cfg, p, c, ctx.ops):
            key = (c, ln.scope, ln.name, tuple(ln.pools))
            if key not in seen:
                seen.add(key)
                lines.append(ln)
        found.append((p, c, lines))
    return ctx.cfg, ctx.ops, found


def _render(rows: list[tuple[Pool, Cloud, QuotaLine]]) -> None:

    t = Table(title="quota", title_justify="left")
    for col in ("pool", "quota", "scope", "needed", "in use (pool)", "granted", "short"):
        t.add_column(col, justify="left" if col in ("pool", "quota", "scope") else "right")
    for p, c, ln in rows:
        granted = "?" if ln.granted is None else f"{ln.granted:g}"
        needed = f"{ln.needed:g} {ln.unit}"
        if len(ln.needed_by_pool) > 1:
            needed += " (" + " + ".join(f"{n:g}" for n in ln.needed_by_pool.values()) + ")"
        what = f"{ln.name} {ln.description}".strip() + (
            f" (fallback {ln.fallback})" if ln.fallback else "")
        t.add_row(f"{', '.join(ln.pools) or p.name}/{c}", what,
                  ln.scope, needed, f"{ln.in_use:g} ({ln.pool_in_use:g})", granted,
                  f"{ln.shortfall:g}" if ln.shortfall else "ok",
                  style=None if not ln.shortfall else "yellow" if ln.fallback else "bold red")
    console().print(t)


@app.command("check")
def check(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Quota needed at peak (max nodes + surge + running warm nodes) vs. granted and in use;
    exit 1 when short."""

    cfg, ops, found = _lines(file, pool, cloud, sandbox)
    rows = [(p, c, ln) for p, c, lines in found for ln in lines]
    short = [ln for _, _, ln in rows if ln.shortfall > 0]
    fallbacks = [(p, c, ln) for p, c, _ in found
                 for ln in runtime.fallback_quota_lines(cfg, p, c, ops)]
    if json_out:
        emit_json({"ok": not short,
                   "quotas": [{"pool": p.name, "cloud": c, **ln.to_json()}
                              for p, c, ln in [*rows, *fallbacks]]})
    else:
        _render([*rows, *fallbacks])
    for p, c, ln in fallbacks:
        if ln.shortfall > 0:
            sys.stderr.write(runtime.fallback_line(p, c, ln) + "\n")
    if short:
        raise OperationFailed("; ".join(runtime.shortfall_line(ln) for ln in short)
                              + f"; file an increase with `poolctl quota request --cloud "
                                f"{rows[0][1]}`")


@app.command("request")
def request(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    auto_approve: AutoApproveOpt = False,
    json_out: JsonOpt = False,
    contact_email: ContactOpt = None,
) -> None:
    """File an increase for each short quota (to granted + shortfall); an open request is
    reported, never filed twice."""

    if contact_email and not _EMAIL.fullmatch(contact_email.strip()):
        raise UsageError(f"--contact-email {contact_email!r}: not an email address; give one "
                         "Google can reach about the request (or POOLCTL_QUOTA_CONTACT_EMAIL)")
    contact_email = contact_email.strip() if contact_email else None
    cfg, ops, found = _lines(file, pool, cloud, sandbox, contact_email)
    out = []
    for p, c, lines in found:
        short = [ln for ln in lines if ln.shortfall > 0 and ln.granted is not None]
        if not short:
            continue
        shared = {(ln.name, ln.scope): f" (shared by {', '.join(ln.pools)})"
                  if len(ln.pools) > 1 else "" for ln in short}
        # Every line in `short` has a grant; the repeated test only narrows its type.
        asks = ", ".join(f"{ln.name} in {ln.scope} from {ln.granted:g} to "
                         f"{ln.granted + ln.shortfall:g} {ln.unit}{shared[(ln.name, ln.scope)]}"
                         for ln in short if ln.granted is not None)
        if not confirm(f"{p.name}/{c}: request {asks}?", auto_approve):
            sys.stderr.write(f"{p.name}/{c}: not confirmed; nothing requested\n")
            continue
        wanted = {(ln.name, ln.scope): ln.granted + ln.shortfall for ln in short
                  if ln.granted is not None}
        for req in runtime.quota_request(cfg, p, c, ops, short):
            out.append({"pool": p.name, "cloud": c, **req.to_json()})
            verb = "already open" if req.already_open else "filed"
            sys.stderr.write(f"{p.name}/{c}: {req.name} in {req.scope}: request {req.id} to "
                             f"{req.desired:g} {verb} ({req.state})"
                             f"{shared.get((req.name, req.scope), '')}\n")
            need = wanted.get((req.name, req.scope), 0)
            if req.already_open and req.desired < need:
                sys.stderr.write(f"{p.name}/{c}: the open request asks for less than the "
                                 f"{need:g} needed; once it is settled, request again\n")
    if not any(ln.shortfall > 0 for _, _, lines in found for ln in lines):
        sys.stderr.write("nothing requested: no quota is short\n")
    if json_out:
        emit_json({"requests": out})
