"""poolctl sandbox start / stop / status: the local AWS emulator on loopback."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from poolctl import naming
from poolctl.commands.common import JsonOpt, console, emit_json, real, region_name, whole
from poolctl.errors import OperationFailed, UsageError
from poolctl.sandbox import manager
from poolctl.sandbox.admin_api import admin
from poolctl.sandbox.extensions import EC2_QUOTAS
from poolctl.sandbox.manager import BOOT_SPEEDUP_ENV, DEFAULT_BOOT_SPEEDUP

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    help="A local AWS emulator (moto + poolctl's extensions) on loopback: the target of "
    "--sandbox.",
    no_args_is_help=True,
)

# Past this, every node boots within a tick of the sandbox's clock anyway.
MAX_SPEEDUP = 1e6
PortOpt = Annotated[
    int | None,
    typer.Option(
        "--port", parser=whole(0, 65535, "a port"), metavar="PORT",
        help="Port on 127.0.0.1 (default 4600, or $POOLCTL_SANDBOX_PORT; 0 picks a free one).",
        show_default=False,
    ),
]
QuotaOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--quota",
        help="Applied ec2 quota in the sandbox, CODE=VCPUS (repeatable), "
        "e.g. --quota L-417A185B=384.",
        show_default=False,
    ),
]
CapacityOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--capacity",
        help="The zone launches at most N instances of the type On-Demand, TYPE@ZONE=N "
        "(repeatable), e.g. --capacity p5.48xlarge@us-east-1a=1; beyond it launches fail "
        "with InsufficientInstanceCapacity. On a running sandbox: sets it.",
        show_default=False,
    ),
]
SpeedupOpt = Annotated[
    float | None,
    typer.Option(
        "--boot-speedup", parser=real(0, MAX_SPEEDUP, "a speedup"), metavar="X",
        help="Nodes finish booting by themselves after the plan's start time divided by this "
        "(default 100, or $POOLCTL_SANDBOX_BOOT_SPEEDUP; 0 = --manual-boot). On a running "
        "sandbox: changes it.",
        show_default=False,
    ),
]
ManualOpt = Annotated[
    bool,
    typer.Option("--manual-boot", help="Nodes wait until `poolctl sandbox boot-nodes`."),
]
ServeOpt = Annotated[
    bool,
    typer.Option("--serve", help="Nodes run their boot script and serve (the stand-in "
                 "engine), HAProxy routes their load balancers (docs/sandbox.md)."),
]
ServeSpeedOpt = Annotated[
    float | None,
    typer.Option(
        "--speed", parser=real(0.01, 1000, "a speed"), metavar="S",
        help="With --serve: everything runs S times faster than real time (default 10).",
        show_default=False,
    ),
]
DEFAULT_SERVE_SPEED = 10.0
SlowdownOpt = Annotated[
    float | None,
    typer.Option(
        "--engine-slowdown", parser=real(0.1, 100, "a slowdown"), metavar="X",
        help="With --serve: every engine step takes X times what the serving model says "
        "(a GPU slower than the pool's model believes; status's drift line and `perf fit "
        "--pool` see it). Default 1.", show_default=False,
    ),
]
RegionOpt = Annotated[
    str | None,
    typer.Option("--region", parser=region_name, show_default=False,
                 help="Region to inventory (default $AWS_REGION or us-east-1)."),
]


def _parse_quotas(items: list[str] | None) -> dict[str, float]:

    out: dict[str, float] = {}
    for item in items or []:
        code, sep, value = item.partition("=")
        try:
            if not sep or code not in EC2_QUOTAS:
                raise ValueError
            out[code] = real(0, 1e9)(value)
        except (ValueError, typer.BadParameter):
            raise UsageError(
                f"--quota {item}: write CODE=VCPUS with CODE one of {', '.join(EC2_QUOTAS)} "
                "and VCPUS a number >= 0"
            ) from None
    return out


def _boot_speedup(speedup: float | None, manual: bool) -> tuple[float, bool]:
    """The speedup asked for (flag, else $POOLCTL_SANDBOX_BOOT_SPEEDUP, else 100) and
    whether a flag named it."""

    if manual and speedup not in (None, 0):
        raise UsageError(f"--boot-speedup {speedup:g} and --manual-boot: give one of them")
    if manual:
        return 0.0, True
    if speedup is not None:  # a finite number >= 0: its parser saw to it
        return speedup, True
    # envcheck has refused a bad value before the command ran.
    return float(os.environ.get(BOOT_SPEEDUP_ENV) or DEFAULT_BOOT_SPEEDUP), False


def _boot_words(speedup: float | None) -> str:
    if speedup is None:
        return "nodes: boot mode unknown (a sandbox from an older poolctl)"
    if speedup > 0:
        return f"nodes boot by themselves in their planned start time / {speedup:g}"
    return "nodes boot when told: `poolctl sandbox boot-nodes`"


@app.command()
def start(port: PortOpt = None, quota: QuotaOpt = None, capacity: CapacityOpt = None,
          boot_speedup: SpeedupOpt = None, manual_boot: ManualOpt = False,
          serve: ServeOpt = False, speed: ServeSpeedOpt = None,
          engine_slowdown: SlowdownOpt = None, json: JsonOpt = False) -> None:
    """Start the sandbox in the background (a running one is reported, not restarted)."""

    for flag, given in (("--speed", speed), ("--engine-slowdown", engine_slowdown)):
        if given is not None and not serve:
            raise UsageError(f"{flag}: applies with --serve (nodes that serve); add --serve")

    quotas = _parse_quotas(quota)
    try:
        limits = manager.parse_capacity(capacity)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    speedup, named = _boot_speedup(boot_speedup, manual_boot)
    info = manager.start(port=port, quotas=quotas or None, boot_speedup=speedup,
                         capacity=limits or None,
                         serve_speed=(speed or DEFAULT_SERVE_SPEED) if serve else None,
                         engine_slowdown=engine_slowdown or 1.0)
    if info.already_running:
        # How nodes boot, and the capacity limits, are what a running sandbox can change.
        info.boot_speedup = (manager.set_boot_speedup(str(info.endpoint), speedup)["speedup"]
                             if named else (manager.health(str(info.endpoint)) or {}
                                            ).get("boot_speedup"))
        if limits:
            manager.set_capacity(str(info.endpoint), limits)
    if json:
        emit_json({**info.to_dict(), "capacity": limits})
        return
    out = console()
    if info.already_running:
        out.print(f"sandbox already running at [bold]{info.endpoint}[/] (pid {info.pid})")
        if port not in (None, 0, info.port):
            out.print(f"[yellow]--port {port} ignored: stop the sandbox first to move it[/]")
        if quotas:
            out.print("[yellow]--quota ignored: stop the sandbox first to change its quotas[/]")
    else:
        out.print(f"sandbox started at [bold]{info.endpoint}[/] (pid {info.pid})")
        _print_removed(out, info.removed_state, "a previous sandbox")
    out.print(f"nodes run their boot script and serve at speed x{speed or DEFAULT_SERVE_SPEED:g}"
              + (f", engine steps x{engine_slowdown:g} the serving model's"
                 if engine_slowdown not in (None, 1.0) else "")
              if serve else _boot_words(info.boot_speedup))
    if limits:
        out.print("capacity limits (On-Demand instances per zone): "
                  + ", ".join(f"{k}={v}" for k, v in limits.items()), soft_wrap=True)
    out.print(f"log: {info.log}")
    out.print("use it with --sandbox; stop it with `poolctl sandbox stop`")


@app.command()
def stop(json: JsonOpt = False) -> None:
    """Stop the sandbox; everything it held is gone."""

    info, removed = manager.shutdown()
    if json:
        emit_json({"stopped": info is not None, **(info.to_dict() if info else {}),
                   "removed_state": removed})
        return
    out = console()
    if info is None:
        out.print("no sandbox running")
    else:
        out.print(f"sandbox at {info.endpoint} stopped (pid {info.pid})")
    _print_removed(out, removed, "the sandbox")


def _print_removed(out: Console, removed: list[str], whose: str) -> None:
    if removed:
        out.print(
            f"removed the Terraform workdirs and state of {whose} (its resources are gone): "
            + ", ".join(removed),
            soft_wrap=True,  # paths stay whole for copy and paste
        )


@app.command()
def status(region: RegionOpt = None, json: JsonOpt = False) -> None:
    """Endpoint, running or not, and what the sandbox holds."""

    info = manager.status(region=region)
    if json:
        emit_json(info.to_dict())
        return
    out = console()
    if not info.running:
        out.print("sandbox: not running (start it with `poolctl sandbox start`)")
        return
    up = time.time() - (info.started_at or time.time())
    out.print(f"sandbox: running at [bold]{info.endpoint}[/] (pid {info.pid}, up {up:.0f} s)")
    out.print(_boot_words(info.boot_speedup))
    out.print(f"log: {info.log}")
    _render_holdings(out, info.holds)


def _render_holdings(out: Console, holds: dict[str, Any]) -> None:

    region = holds.get("region")
    groups = holds.get("auto_scaling_groups") or []
    if groups:
        table = Table(title=f"poolctl Auto Scaling groups ({region})", title_justify="left")
        for col in ("group", "pool", "desired", "min-max", "instances", "warm"):
            table.add_column(col)
        for g in groups:
            states = ", ".join(f"{n} {s}" for s, n in sorted(g["instances"].items())) or "none"
            warm = "-" if g.get("warm_pool_size") is None else str(g["warm_pool_size"])
            table.add_row(g["name"], g.get("pool") or "", str(g["desired"]),
                          f"{g['min']}-{g['max']}", states, warm)
        out.print(table)
    else:
        out.print(f"no Auto Scaling group tagged poolctl:pool in {region}")
    instances = holds.get("instances") or {}
    out.print(
        "EC2 instances: "
        + (", ".join(f"{n} {state}" for state, n in instances.items()) or "none")
    )
    lbs = holds.get("load_balancers") or []
    out.print("load balancers: " + (", ".join(lb["name"] for lb in lbs) or "none"))


PoolOpt = Annotated[
    str | None,
    typer.Option("--pool", help="Only the groups tagged poolctl:pool=NAME.", show_default=False),
]


PoolRegionOpt = Annotated[
    str | None,
    typer.Option("--region", parser=region_name, show_default=False,
                 help="Region where --pool's groups are (default $AWS_REGION or us-east-1)."),
]


@app.command("boot-nodes")
def boot_nodes(pool: PoolOpt = None, region: PoolRegionOpt = None, json: JsonOpt = False) -> None:
    """Play the nodes' boot scripts: complete every open launch lifecycle action.

    No boot script runs in the sandbox, so launched nodes wait in Pending:Wait (warm ones in
    Warmed:Pending:Wait) until something completes the poolctl-node-ready hook: the sandbox
    itself after their scaled start time (see `sandbox start --boot-speedup`), or this, at
    once, with CONTINUE: they go InService, or to their warm state.
    """

    endpoint = manager.endpoint()
    groups: list[str | None] = [None]
    if pool is not None:
        where = manager.region_or_default(region)
        asg = manager.client("autoscaling", where)
        groups = [
            g["AutoScalingGroupName"]
            for page in asg.get_paginator("describe_auto_scaling_groups").paginate(
                Filters=[{"Name": f"tag:{naming.TAG_POOL}", "Values": [pool]}]
            )
            for g in page["AutoScalingGroups"]
        ]
        if not groups:
            raise UsageError(
                f"--pool {pool}: no Auto Scaling group tagged {naming.TAG_POOL}={pool} in the "
                f"sandbox ({where}); deploy it with `poolctl deploy --cloud aws --sandbox`"
            )
    completed = []
    for name in groups:
        completed += manager.complete_lifecycle_actions(endpoint, name)
    # An instance held by several hooks shows once per hook; its last entry is where it went.
    final = {(c["AutoScalingGroupName"], c["InstanceId"]): c for c in completed}
    nodes = [
        {"group": g, "instance": i, "state": c["LifecycleState"],
         "warm": c["LifecycleState"].startswith("Warmed:")}
        for (g, i), c in final.items()
    ]
    if json:
        emit_json({"nodes": nodes})
        return
    out = console()
    if not nodes:
        out.print("no node is waiting on a launch lifecycle hook")
        return
    for n in nodes:
        out.print(f"{n['group']}: {n['instance']} -> {n['state']}")
    live = sum(1 for n in nodes if n["state"] == "InService")
    warm = sum(1 for n in nodes if n["warm"])
    out.print(f"booted {len(nodes)} node(s): {live} InService, {warm} warm")


@app.command("approve-quota")
def approve_quota(
    request_id: Annotated[str, typer.Argument(
        metavar="ID", help="The increase request's id (`poolctl quota request` prints it).")],
    json: JsonOpt = False,
) -> None:
    """Approve a pending quota increase request, as AWS support would: its value applies.

    Through the sandbox's admin endpoint POST /_poolctl/quota-requests/ID."""

    endpoint = manager.endpoint()
    # The id is data: quoted into the path, never able to name another endpoint.
    path = f"/_poolctl/quota-requests/{urllib.parse.quote(request_id, safe='')}"
    try:
        request = admin(endpoint, "POST", path, {"status": "APPROVED"},
                        "answer the approval")["RequestedQuota"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise UsageError(f"approve-quota {request_id}: no quota increase request with this "
                             "id in the sandbox; `poolctl quota request --cloud aws --sandbox` "
                             "prints the ids") from None
        raise OperationFailed(f"the sandbox at {endpoint} refused the approval: {exc}") from None
    except KeyError as exc:
        raise OperationFailed(f"the sandbox at {endpoint} did not answer the approval: {exc}"
                              ) from None
    if json:
        emit_json({"request": request})
        return
    region = str(request.get("QuotaArn", "")).split(":")[3:4] or ["?"]
    console().print(f"approved {request['Id']}: {request['QuotaCode']} "
                    f"({request.get('QuotaName', '')}) in {region[0]} is now "
                    f"{request['DesiredValue']:g}")
