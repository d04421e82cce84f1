"""warm and status: runtime operations on a deployed pool."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from poolctl.commands.common import (
    Cloud,
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    load,
    targets,
)

TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0, help="Seconds --wait waits at most.")
]


def one_target(cfg, pool, cloud, sandbox):
    """The single (pool, cloud) a command that changes a pool acts on."""
    from poolctl.errors import UsageError

    if sandbox and cloud is None:
        cloud = Cloud.aws  # the sandbox emulates AWS only
    tgts = targets(cfg, pool, cloud)
    if len(tgts) != 1:
        names = ", ".join(f"{p.name}/{c}" for p, c in tgts)
        flag = "--pool" if len({p.name for p, _ in tgts}) > 1 else "--cloud"
        raise UsageError(f"{flag}: this acts on one pool and cloud, the file gives {names}; "
                         f"pick one with {flag}")
    return tgts[0]


def warm(
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", min=0, help="Replicas of spare capacity (rounded up to "
                     "whole nodes)."),
    ] = None,
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    running: Annotated[
        bool, typer.Option("--running", help="Put them into service now: the group's minimum "
                           "becomes the file's minimum + these nodes.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the nodes are ready.")] = False,
    reset: Annotated[
        bool, typer.Option("--reset", help="Back to the file's minimum and warm sizes.")
    ] = False,
    exact: Annotated[
        bool, typer.Option("--exact", help="Exactly N replicas, lowering spare capacity if "
                           "needed (without it, warm never lowers it).")] = False,
    timeout: TimeoutOpt = 1800.0,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Prepare N replicas of spare capacity before a launch."""
    from poolctl import runtime
    from poolctl.errors import UsageError

    if replicas is None and not reset:
        raise UsageError("--replicas: give the number of replicas to prepare, or --reset")
    cfg = load(file)
    p, c = one_target(cfg, pool, cloud, sandbox)
    ops = runtime.get_ops(c, sandbox)
    result = runtime.warm(cfg, p, c, ops, replicas, running=running, reset=reset, exact=exact)
    sys.stderr.write(result.message + "\n")
    if wait and result.mode != "reset":
        hint = runtime.watch_hint(c, file, p, sandbox)
        result.wait = runtime.wait_warm(cfg, p, c, ops, result, timeout, hint)
    if json_out:
        emit_json(result.to_json())


def status(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Nodes in service / warm / pending, rollout progress, queue."""
    from poolctl import runtime

    cfg = load(file)
    if sandbox and cloud is None:
        cloud = Cloud.aws
    out, unread = [], set()
    for p, c in targets(cfg, pool, cloud):
        ops = runtime.get_ops(c, sandbox)
        if "queue_metric" in ops.unsupported:
            unread.add(c)
        out.append(runtime.status(cfg, p, c, ops))
    if json_out:
        emit_json({"pools": [s.to_json() for s in out]})
        return
    con = console()
    for s in out:
        n = s.counts()
        rpn = s.replicas_per_node
        g = s.group
        con.print(f"[bold]{s.pool}/{s.cloud}[/bold] {g.name} ({g.region}): "
                  f"min {g.min_nodes}, desired {g.desired_nodes}, max {g.max_nodes} nodes; "
                  f"warm pool {g.warm_min_nodes} ({g.warm_state or 'none'}); version {g.version}")
        con.print("  " + ", ".join(f"{k.replace('_', ' ')} {v} ({v * rpn} replicas)"
                                   for k, v in n.items() if v or k in ("in_service", "warm")))
        if s.rollout:
            con.print(f"  rollout {s.rollout.id}: {runtime.rollout_words(s.rollout)}")
        q = s.queue_per_replica
        if s.cloud in unread:
            con.print(f"  queue: queue metric not read on {s.cloud}")
        else:
            con.print("  queue: " + ("no datapoints in the last 10 min" if q is None
                                     else f"{q:g} waiting per replica"))
