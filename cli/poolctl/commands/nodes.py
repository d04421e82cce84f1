"""poolctl nodes: each node's start-up phases as its boot script logged them (the phase
ledger, `runtime.ledger`); poolctl nodes check: SSH into pool nodes and verify GPUs, NVLink,
no EFA, NVMe cache, image, health (`poolctl.nodecheck`). This module parses options and
renders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from poolctl import nodecheck
from poolctl.cloud import Cloud
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    real,
    resolve_targets,
    whole,
)
from poolctl.commands.ops import starts_line
from poolctl.errors import OperationFailed, UsageError
from poolctl.nodecheck import CHECK_NAMES
from poolctl.runtime import ledger as runtime_ledger

if TYPE_CHECKING:
    from poolctl.nodecheck import Check, NodeResult

app = typer.Typer(help="The nodes of a pool: start-up phases; checks over SSH.",
                  invoke_without_command=True)

HostOpt = Annotated[
    list[str] | None,
    typer.Option("--host", help="Node to check, HOST or HOST:PORT (repeatable); default: the "
                 "pool's running nodes, found through the cloud by tag.", show_default=False),
]
UserOpt = Annotated[
    str | None,
    typer.Option("--user", "-u", help="SSH user on the nodes (default ubuntu; with iap: your "
                 "OS Login user).", show_default=False),
]
IdentityOpt = Annotated[
    Path | None,
    typer.Option("--identity", "-i", help="Private key to log in with (only this key); "
                 "default: ssh-agent and ~/.ssh keys.", show_default=False),
]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts); an "
                 "unknown or changed host key is refused.", show_default=False),
]
PortOpt = Annotated[
    int, typer.Option("--port", "-p", parser=whole(1, 65535, "a port"), metavar="PORT",
                      help="SSH port of hosts without :PORT.")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", parser=real(0, 3600, "seconds", above=True),
                        metavar="SECONDS",
                        help="Seconds for connecting and for each remote command.")
]
AccessOpt = Annotated[
    str | None,
    typer.Option("--access", help="ssh: your keys, straight to each node's address (from "
                 "inside the VPC or a VPN). instance-connect (AWS): a key made and pushed for "
                 "this check only (EC2 Instance Connect), through the AWS CLI's tunnel to the "
                 "pool's EC2 Instance Connect Endpoint. iap (GCP): a key made for this check "
                 "and imported into your OS Login profile, through gcloud's IAP TCP tunnel. "
                 "Default: the pool's aws.node_access / gcp.node_access.",
                 show_default=False),
]
ProxyOpt = Annotated[
    str | None,
    typer.Option("--proxy-command", help="Like ssh's ProxyCommand: a command whose stdin/"
                 "stdout reach the node's sshd; %i instance id (GCP: name), %h address, "
                 "%p port, %r region, %z zone, %P project (default with instance-connect: aws "
                 "ec2-instance-connect open-tunnel; with iap: gcloud compute "
                 "start-iap-tunnel).", show_default=False),
]


@app.callback()
def phases(
    ctx: typer.Context,
    file: FileOpt = None,
    pool: PoolOpt = None,
    cloud: CloudOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Each node's start-up phases, read from its own console (the boot script's log), and
    the pool's start times by kind. `poolctl nodes check` checks the nodes over SSH."""
    if ctx.invoked_subcommand is not None:
        return
    tc = resolve_targets(file, pool, cloud, sandbox)
    out = []
    for t in tc.targets:
        lg = runtime_ledger.pool_ledger(tc.cfg, t.pool, t.cloud, tc.ops)
        if lg is None:
            raise UsageError(f"--cloud {t.cloud}: poolctl does not read {t.cloud} nodes' "
                             "consoles yet; `poolctl logs` shows their boot logs")
        out.append(lg)
    if json_out:
        emit_json({"pools": [lg.to_json() for lg in out]})
        return
    for lg in out:
        render_ledger(lg)


COLUMNS = ("boot", "image", "gpus", "nvme", "weights", "serving", "readiness")


def render_ledger(lg: runtime_ledger.PoolLedger) -> None:
    """A row a node (its newest boot), then the pool's start times by kind."""
    out = console()
    table = Table(title=f"{lg.pool}/{lg.cloud}: start-up phases (s, the newest boot of each "
                  "node)", title_justify="left")
    for name in ("node", "state", "kind", *COLUMNS, "start", "notes"):
        table.add_column(name, no_wrap=name not in ("notes",),
                         justify="right" if name in (*COLUMNS, "start") else "left")
    for nb in lg.nodes:
        b = nb.last
        if b is None:
            table.add_row(escape(nb.node.id), escape(nb.node.state), "-", *["-"] * 8,
                          "nothing logged yet")
            continue
        cells = [_secs(b.boot_s), *(_secs(b.phases.get(k, b.phases.get("hydrate")))
                                    if k == "image" else _secs(b.phases.get(k))
                                    for k in COLUMNS[1:])]
        notes = [w for w, on in (("image on disk", b.image_on_disk),
                                 ("weights cached", b.weights_cached),
                                 ("weights streamed", b.weights_streamed)) if on]
        if b.compile_cache is not None:
            notes.append(f"compile cache {b.compile_cache}")
        if b.failed_in:
            notes.insert(0, f"failed in {b.failed_in}" + (f": {b.failure}" if b.failure
                                                           else ""))
        table.add_row(escape(nb.node.id), escape(nb.node.state), b.kind.replace("_", " "),
                      *cells, _secs(b.uptime_s), escape("; ".join(notes)))
    out.print(table)
    if not lg.starts:
        out.print("starts: no boot has served yet", markup=False)
        return
    out.print(starts_line(lg.starts), markup=False, soft_wrap=True)


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


@app.command("check")
def check(
    file: FileOpt = None,
    pool: PoolOpt = None,
    cloud: CloudOpt = None,
    host: HostOpt = None,
    user: UserOpt = None,
    identity: IdentityOpt = None,
    known_hosts: KnownHostsOpt = None,
    port: PortOpt = 22,
    timeout: TimeoutOpt = 10.0,
    access: AccessOpt = None,
    proxy_command: ProxyOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """SSH into nodes and verify GPUs, NVLink, no EFA, the NVMe cache, the image and health."""

    ctx = resolve_targets(file, pool, cloud, sandbox)
    cfg, endpoints, tgts = ctx.cfg, ctx.endpoints, ctx.targets
    if access is None:
        # The pool's own way in, when every target has one (and no --host names nodes).
        own = {"aws": lambda p: p.aws.node_access, "gcp": lambda p: p.gcp.node_access}
        modes = {own[t.cloud](t.pool) for t in tgts}
        access = modes.pop() if len(modes) == 1 and not host else "ssh"
        access = "ssh" if access == "none" else access
    if access == "instance-connect" and ctx.cloud != Cloud.aws:
        raise UsageError("--access instance-connect: EC2 Instance Connect is AWS's; add "
                         "--cloud aws, or use --access iap for GCP")
    if access == "iap" and ctx.cloud != Cloud.gcp:
        raise UsageError("--access iap: IAP TCP forwarding with OS Login is GCP's; add "
                         "--cloud gcp, or use --access instance-connect for AWS")
    opts = nodecheck.SshOptions(user=user, identity=identity, known_hosts=known_hosts,
                                timeout=timeout, access=access, proxy_command=proxy_command,
                                endpoints=endpoints)
    work = nodecheck.plan_work(cfg, tgts, host, default_port=port, endpoints=endpoints,
                               direct=opts.proxy_command is None)
    who = opts.user
    if opts.os_login is not None:
        who = f"the OS Login user of {opts.os_login.prepare(endpoints)}"
    sys.stderr.write(f"checking {len(work)} node(s) over SSH as {who} ...\n")

    def progress(res: NodeResult) -> None:
        sys.stderr.write(nodecheck.progress_line(res) + "\n")
        sys.stderr.flush()

    results = nodecheck.check_nodes(work, opts, progress=progress)
    ok = all(r.ok for r in results)
    if json_out:
        emit_json({"nodes": [r.to_json() for r in results], "ok": ok})
    else:
        render(results)
    if not ok:
        bad = [r for r in results if not r.ok]
        names = "; ".join(f"{r.host}: {', '.join(c.name for c in r.failed)}" for r in bad)
        raise OperationFailed(f"{len(bad)} of {len(results)} node(s) failed a check ({names})")


def render(results: list[NodeResult]) -> None:
    """Node x check matrix when it fits the terminal, else one row per node and check."""

    out = console()

    def sym(c: Check) -> str:
        return "[green]✓[/]" if c.ok else "[red]✗[/]"

    cells = [{c.name: c for c in r.checks} for r in results]
    widths = [max(len("node"), *(len(r.host) for r in results))]
    for name in CHECK_NAMES:
        widths.append(max(len(name), *(len(cs[name].short) + 2 if name in cs else 1
                                       for cs in cells)))
    table = Table(title="nodes check", title_justify="left")
    table.add_column("node", style="bold", no_wrap=True)
    if sum(widths) + 3 * len(widths) + 1 > out.width:
        table.add_column("check", no_wrap=True)
        table.add_column("observed", overflow="fold")
        for r in results:
            for i, c in enumerate(r.checks):
                observed = escape(c.observed)
                if c.hint:
                    observed += f"\n[bold]fix:[/] {escape(c.hint)}"
                table.add_row(escape(r.host) if i == 0 else "", f"{sym(c)} {c.name}", observed,
                              end_section=i == len(r.checks) - 1)
        out.print(table)
        return
    for name in CHECK_NAMES:
        table.add_column(name, no_wrap=True)
    for r, cs in zip(results, cells, strict=True):
        table.add_row(escape(r.host), *(f"{sym(cs[n])} {escape(cs[n].short)}" if n in cs
                                        else "[dim]-[/]" for n in CHECK_NAMES))
    out.print(table)
    for r in results:
        for c in r.failed:
            out.print(f"[red]✗[/] {escape(r.host)} [bold]{c.name}[/]: {escape(c.observed)}",
                      soft_wrap=True)
            if c.hint:
                out.print(f"    fix: {escape(c.hint)}", soft_wrap=True)
