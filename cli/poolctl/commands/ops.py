"""warm and status: runtime operations on a deployed pool."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BlockOffering,
    PublishesQueueMetric,
    ReportsServing,
    failures_line,
)
from poolctl.commands.common import (
    WEEK_S,
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    now_of,
    real,
    resolve_target,
    resolve_targets,
    whole,
)
from poolctl.errors import UsageError
from poolctl.inventory import API_KEY_VAR
from poolctl.predictive import MAX_BUFFER_S
from poolctl.runtime.common import watch_hint
from poolctl.runtime.purchases import pending_line, pool_lock, unused_line
from poolctl.runtime.suggest import suggest
from poolctl.sizing import nodes_for, plan_pool
from poolctl.starts import KindStarts
from poolctl.windows import parse_time

if TYPE_CHECKING:
    from pathlib import Path

    from poolctl.clouds.base import PoolStatus
    from poolctl.config import Pool
    from poolctl.inventory import Endpoint

TimeoutOpt = Annotated[
    float, typer.Option("--timeout", parser=real(0, WEEK_S, "seconds"), metavar="SECONDS",
                        help="Seconds --wait waits at most.")
]
# Far above any pool (scaling.max_replicas bounds the useful count: `_refuse_useless_warm`).
MAX_REPLICAS = 100_000
MAX_WINDOW_MIN = 24 * 60  # status --window


def warm(
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", parser=whole(0, MAX_REPLICAS, "a number of replicas"),
                     metavar="N", help="Replicas of spare capacity (rounded up to whole "
                     "nodes); at most what the pool can put into service."),
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
    start: Annotated[
        str | None, typer.Option("--from", metavar="TIME", help="Schedule instead of applying "
                                 "now: the window's start, RFC 3339 with a zone "
                                 "(2026-12-05T09:00:00Z) or an offset (+2h, +10m). Needs "
                                 "--until and --running.")] = None,
    until: Annotated[
        str | None, typer.Option("--until", metavar="TIME", help="The window's end (same "
                                 "forms); the sizes kept before it return then.")] = None,
    list_: Annotated[bool, typer.Option("--list", help="The scheduled windows.")] = False,
    cancel: Annotated[
        str | None, typer.Option("--cancel", metavar="ID", help="Remove a scheduled window "
                                 "(ids: `warm --list`).")] = None,
    reserve: Annotated[
        bool, typer.Option("--reserve", help="With --from/--until: the Capacity Blocks (AWS) "
                           "or calendar-mode future reservations (GCP) that hold the window's "
                           "nodes; buys or requests the first only with --yes (or a yes at "
                           "the prompt on a terminal).")] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="With --reserve: buy it, then schedule the "
                           "window.")] = False,
    suggest: Annotated[
        bool, typer.Option("--suggest", help="Launch windows from the pool's own history: the "
                           "hours of the day whose load needs more than the minimum, as "
                           "`warm --from/--until` commands; schedules nothing.")] = False,
    days: Annotated[int, typer.Option(
        "--days", parser=whole(1, 14, "days"), metavar="N",
        help="With --suggest: the days of history to read (1 to 14).")] = 7,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Prepare N replicas of spare capacity before a launch, now or for a window."""

    if suggest:
        given = [f for f, v in (("--replicas", replicas is not None), ("--running", running),
                                ("--wait", wait), ("--reset", reset), ("--exact", exact),
                                ("--from", start is not None), ("--until", until is not None),
                                ("--list", list_), ("--cancel", cancel is not None),
                                ("--reserve", reserve), ("--yes", yes)) if v]
        if given:
            raise UsageError(f"--suggest: reads the pool's history and changes nothing; "
                             f"drop {', '.join(given)}")
        _suggest(cloud, file, pool, days, sandbox, json_out)
        return
    if reserve and (start is None or until is None):
        raise UsageError("--reserve: capacity is bought for a window; give --from and --until")
    if yes and not reserve:
        raise UsageError("--yes: it confirms a purchase; give it with --reserve")
    if list_ or cancel is not None or start is not None or until is not None:
        _windows(replicas, cloud, file, pool, running, wait, reset, exact, start, until,
                 list_, cancel, reserve, yes, sandbox, json_out)
        return
    if replicas is None and not reset:
        raise UsageError("--replicas: give the number of replicas to prepare, or --reset")
    ctx = resolve_target(file, pool, cloud, sandbox)
    cfg, p, c = ctx.cfg, ctx.pool, ctx.cloud
    if replicas is not None:
        _refuse_useless_warm(p, c, replicas)
    with pool_lock(cfg, p, c, "warm"):
        result = runtime.warm(cfg, p, c, ctx.ops, replicas, running=running, reset=reset,
                              exact=exact)
    sys.stderr.write(result.message + "\n")
    if result.capacity_line:
        sys.stderr.write(result.capacity_line + "\n")
    if wait and result.mode != "reset":
        result.wait = runtime.wait_warm(cfg, p, c, ctx.ops, result, timeout, ctx.hint())
    if json_out:
        emit_json(result.to_json())


def _windows(replicas: int | None, cloud: Cloud | None, file: Path | None, pool: str | None,
             running: bool, wait: bool, reset: bool, exact: bool, start: str | None,
             until: str | None, list_: bool, cancel: str | None, reserve: bool, yes: bool,
             sandbox: bool, json_out: bool) -> None:
    """`warm --from/--until`, `--list`, `--cancel`: every flag checked before a cloud call."""
    others = {"--replicas": replicas is not None, "--running": running, "--wait": wait,
              "--reset": reset, "--exact": exact, "--from": start is not None,
              "--until": until is not None}
    if list_ or cancel is not None:
        flag = "--list" if list_ else "--cancel"
        extra = [k for k, v in {**others, "--cancel": cancel is not None and list_,
                                "--reserve": reserve}.items() if v]
        if extra:
            raise UsageError(f"{flag}: give it alone (with -f, --pool, --cloud, --sandbox, "
                             f"--json), without {', '.join(extra)}")
        if cancel is not None and not re.fullmatch(r"w[0-9a-f]{1,16}", cancel):
            raise UsageError(f"--cancel {cancel!r}: a window id is w and hex digits (e.g. "
                             "w3fa9c1); `poolctl warm --list` shows them")
    else:
        if start is None or until is None:
            raise UsageError("--from/--until: give both, the window's start and its end")
        extra = [k for k in ("--reset", "--exact", "--wait") if others[k]]
        if extra:
            raise UsageError(f"--from/--until: a window is scheduled, not applied now; "
                             f"drop {', '.join(extra)}")
        if replicas is None:
            raise UsageError("--from/--until: give --replicas N, the window's spare replicas")
    now = now_of(sandbox)  # after every flag: with --sandbox, a call to the sandbox
    if start is not None and until is not None:
        t_from, t_until = parse_time("--from", start, now), parse_time("--until", until, now)
    ctx = resolve_target(file, pool, cloud, sandbox)
    cfg, p, c = ctx.cfg, ctx.pool, ctx.cloud
    if list_:
        result = runtime.list_windows(cfg, p, c, ctx.ops, now)
    elif cancel is not None:
        with pool_lock(cfg, p, c, f"warm --cancel {cancel}"):
            result = runtime.cancel_window(cfg, p, c, ctx.ops, cancel, now)
    else:
        assert replicas is not None  # checked above
        if not running:
            runtime.check_warm_window(p, c, reserve)
        _refuse_useless_warm(p, c, replicas)
        with pool_lock(cfg, p, c, "warm --from/--until"):
            result = runtime.schedule_window(cfg, p, c, ctx.ops, replicas, t_from, t_until,
                                             running, now, reserve=reserve, yes=yes)
        if result.action == "offered" and sys.stdin.isatty() and not json_out:
            best = result.offerings[0]
            _print_offerings(result)
            # An interactive yes buys as --yes would (the offers are looked up again).
            if typer.confirm(f"buy or request {best.id} ({_price(result, best)}) and "
                             "schedule the window?", default=False):
                with pool_lock(cfg, p, c, "warm --from/--until --reserve"):
                    result = runtime.schedule_window(cfg, p, c, ctx.ops, replicas, t_from,
                                                     t_until, running, now, reserve=True,
                                                     yes=True)
            sys.stderr.write(result.message + "\n")
            return
    if json_out:
        emit_json(result.to_json())
        return
    if list_:
        out = [runtime.window_line(w) for w in result.windows] or [
            f"{p.name}: no scheduled windows"]
        sys.stdout.write("\n".join([*out, *result.notes()]) + "\n")
    else:
        _print_offerings(result)
        sys.stderr.write(result.message + "\n")


def _price(result: runtime.WindowsResult, o: BlockOffering) -> str:
    # AWS sells a block upfront; GCP bills a calendar-mode reservation while it runs.
    return (f"${o.upfront_usd:,.2f} upfront" if result.cloud == Cloud.aws
            else f"billed by {result.cloud} while it runs")


def _print_offerings(result: runtime.WindowsResult) -> None:
    for o in result.offerings:
        sys.stdout.write(f"{o.id}: {o.count} x {o.instance_type} in {o.zone}, "
                         f"{o.start.isoformat(timespec='minutes')} to "
                         f"{o.end.isoformat(timespec='minutes')} ({o.duration}): "
                         f"{_price(result, o)}\n")


def _ms_or_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def serving_line(s: PoolStatus, window: int) -> str:
    """What the engines served over the window, against the pool's SLOs, in one line."""
    w = s.serving
    head = f"served (last {window} min): "
    if w is None or w.requests <= 0:
        return head + "no request finished (nothing published, or no traffic)"
    parts = [f"{w.requests_per_s:.2f} req/s, {w.output_tokens_per_s:,.0f} output tokens/s"]
    within = (f" ({w.ttft_within:.1%} within {_ms_or_s(w.ttft_slo_s)})"
              if w.ttft_within is not None else "")
    parts.append(f"TTFT p50 {_ms_or_s(w.ttft_p50_s)}, p90 {_ms_or_s(w.ttft_p90_s)}{within}")
    within = (f" ({w.tpot_within:.1%} within {_ms_or_s(w.tpot_slo_s)})"
              if w.tpot_within is not None else "")
    parts.append(f"TPOT p50 {_ms_or_s(w.tpot_p50_s)}, p90 {_ms_or_s(w.tpot_p90_s)}{within}")
    if w.kv_usage is not None:
        parts.append(f"KV cache {w.kv_usage:.0%}")
    cost = w.usd_per_million_output_tokens(s.cost_per_hour_usd())
    if cost is not None:
        parts.append(f"${cost:,.2f} per 1M output tokens")
    return head + "; ".join(parts)


def _suggest(cloud: Cloud | None, file: Path | None, pool: str | None, days: int,
             sandbox: bool, json_out: bool) -> None:
    ctx = resolve_target(file, pool, cloud, sandbox)
    got = suggest(ctx.cfg, ctx.pool, ctx.cloud, ctx.ops, days)
    if json_out:
        emit_json(got.to_json())
        return
    con = console()
    head = (f"{got.pool}/{got.cloud}: {got.hours} hour(s) of load over {got.days} day(s), "
            f"{got.per_node:g} requests in flight per node (scaling.predictive_target), "
            f"minimum {got.min_nodes} node(s)")
    con.print(head, markup=False, soft_wrap=True)
    if not got.suggestions:
        con.print("  no hour of the day needs more than the minimum: no window to schedule",
                  markup=False, soft_wrap=True)
        return
    con.print(f"  windows start {got.lead_s:.0f} s ahead ({got.lead_source}):", markup=False,
              soft_wrap=True)
    where = " --sandbox" if sandbox else ""
    for sg in got.suggestions:
        hours = f"{sg.hours_utc[0]:02d}:00-{(sg.hours_utc[-1] + 1) % 24:02d}:00 UTC"
        con.print(f"  {hours}: up to {sg.peak_in_flight:,.0f} in flight, +{sg.nodes} node(s)",
                  markup=False, soft_wrap=True)
        con.print(f"    poolctl warm --cloud {got.cloud} --pool {got.pool}{where} --replicas "
                  f"{sg.replicas} --running --from {sg.start.isoformat(timespec='seconds')} "
                  f"--until {sg.end.isoformat(timespec='seconds')}".replace("+00:00", "Z"),
                  markup=False, soft_wrap=True)


def starts_line(starts: dict[str, KindStarts]) -> str:
    """The pool's measured start times by kind (the phase ledger; `poolctl nodes` per node)."""
    return "starts (measured, power-on to serving): " + "; ".join(
        f"{k.replace('_', ' ')} p50 {v.p50_s:g} s, p90 {v.p90_s:g} s ({v.n} boot"
        f"{'s' if v.n > 1 else ''})" for k, v in starts.items())


def forecast_lines(s: PoolStatus) -> list[str]:
    """The predictive policy: its forecast for this hour and the next beside the nodes in
    service, how far its forecast of the last hours was from what happened, and whether
    the pool's measured starts fit in the lead time it launches with."""
    if s.forecast_buffer_s is None:
        return []
    fc = s.forecast
    if fc is None:
        return ["forecast: no predictive policy on the group yet (scaling.predictive is set: "
                "deploy it)"]
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    cap = {h.start: h.capacity for h in fc.hours}
    this, nxt = cap.get(now), cap.get(now + timedelta(hours=1))
    if this is None and nxt is None:
        head = (f"forecast ({fc.mode}): none yet: AWS forecasts once the load metric has 24 "
                "hours of history")
    else:
        def n(v: float | None) -> str:
            return "-" if v is None else f"{v:g}"
        head = (f"forecast ({fc.mode}): {n(this)} node(s) this hour, {n(nxt)} next; "
                f"{s.counts()['in_service']} in service")
        err = runtime.forecast_error(fc)
        if err is not None:
            head += (f"; its load forecast of the last {err[1]} hour(s) was off by "
                     f"{err[0]:.0%} of what happened (mean absolute error)")
    out = [head]
    cold = s.starts.get("cold")
    if cold is not None and cold.p90_s > s.forecast_buffer_s:
        out.append(f"forecast: nodes launch {s.forecast_buffer_s} s ahead, but a cold start "
                   f"measured p90 {cold.p90_s:g} s: set scaling.predictive_buffer_s: "
                   f"{min(MAX_BUFFER_S, math.ceil(cold.p90_s))} and deploy")
    return out


def model_lines(s: PoolStatus, fit_hint: str = "poolctl perf fit") -> list[str]:
    """The serving model's p90s for the load served, beside the measured ones; and a line
    when the measured ones are past it by more than runtime.DRIFT_WARN, naming the command
    that fits the model to the pool (`fit_hint`)."""
    p = s.predicted
    if p is None:
        return []
    drift = s.drift()
    words = [f"{k.upper()} p90 {_ms_or_s(v)}" for k, v in
             (("ttft", p.ttft_p90_s), ("tpot", p.tpot_p90_s)) if v is not None]
    seen = ", ".join(f"{k.upper()} {v:+.0%}" for k, v in drift.items())
    out = [f"model (this load on {p.replicas} replicas): {', '.join(words)}"
           + (f"; measured {seen}" if seen else "")]
    over = [f"{k.upper()} p90 {v:.0%}" for k, v in drift.items() if v > runtime.DRIFT_WARN]
    q = s.serving.queue_per_replica if s.serving else None
    if over and q is not None and q > runtime.DRIFT_QUEUE_MAX:
        out.append(f"drift: not judged: requests waited ({q:.1f} per replica on average), "
                   "so this latency measures the pool's capacity and scaling, not the model")
    elif over:
        out.append(f"drift: measured {' and '.join(over)} over the serving model's for this "
                   f"load: plan and simulate size this pool too small; fit the model to the "
                   f"pool: `{fit_hint}` (docs/metrics.md#fitting-the-model-to-the-pool)")
    return out


def _refuse_useless_warm(p: Pool, c: Cloud, replicas: int) -> None:
    """Warm nodes serve only when the group scales out onto them, which it does up to its
    maximum: spare capacity beyond (max - min) nodes would run (or wait) and never serve.
    Checked against the file's sizes (what deploy gives the group) before any cloud call."""

    plan = plan_pool(p, c)
    rpn, room = plan.replicas_per_node, plan.nodes.max - plan.nodes.min
    if nodes_for(replicas, rpn) > room:
        raise UsageError(
            f"--replicas {replicas}: pool {p.name!r} grows to at most {plan.nodes.max} "
            f"node(s) and keeps {plan.nodes.min} in service, so at most {room} spare "
            f"node(s) ({room * rpn} replicas) can ever serve; ask for at most {room * rpn}, "
            "or raise scaling.max_replicas and deploy")


def status(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    window: Annotated[int, typer.Option(
        "--window", parser=whole(1, MAX_WINDOW_MIN, "minutes"), metavar="MIN",
        help="What the engines served over the last MIN minutes: TTFT and TPOT against the "
        "SLOs, requests and tokens per second, KV cache, cost per 1M output tokens.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Nodes in service / warm / pending, rollout progress, queue, and the SLO as served."""

    ctx = resolve_targets(file, pool, cloud, sandbox)
    out: list[PoolStatus] = []
    unread: set[str] = set()
    # Each pool's load balancer (None: none carries its tags/labels).
    lbs: list[Endpoint | None] = []
    for t in ctx.targets:
        if not isinstance(ctx.ops, PublishesQueueMetric):
            unread.add(t.cloud)
        out.append(runtime.status(ctx.cfg, t.pool, t.cloud, ctx.ops, window_s=60.0 * window))
        ep = ctx.ops.endpoint(ctx.cfg, t.pool)
        local = (ctx.endpoints.lb_address(ep.host)
                 if ep is not None and ctx.endpoints.lb_address is not None else None)
        if ep is not None and local is not None:  # the sandbox's HAProxy on loopback
            ep = replace(ep, scheme=local.scheme, host=local.host, port=local.port,
                         internal=False, ca_file=local.ca_file)
        lbs.append(ep)
    if json_out:
        emit_json({"pools": [{**s.to_json(), "endpoint": ep.to_json() if ep else None}
                             for s, ep in zip(out, lbs, strict=True)]})
        return
    con = console()
    for t, s, ep in zip(ctx.targets, out, lbs, strict=True):
        n = s.counts()
        rpn = s.replicas_per_node
        g = s.group
        con.print(f"[bold]{s.pool}/{s.cloud}[/bold] {g.name} ({g.region}): "
                  f"min {g.min_nodes}, desired {g.desired_nodes}, max {g.max_nodes} nodes; "
                  f"warm pool {g.warm_min_nodes} ({g.warm_state or 'none'}); version {g.version}",
                  soft_wrap=True)
        con.print("  " + ", ".join(f"{k.replace('_', ' ')} {v} ({v * rpn} replicas)"
                                   for k, v in n.items() if v or k in ("in_service", "warm")))
        if s.rollout:
            con.print(f"  rollout {s.rollout.id}: {runtime.rollout_words(s.rollout)}")
        con.print(f"  capacity: {s.held().words()}", soft_wrap=True)
        con.print(f"  cost: ${s.cost_per_hour_usd():,.2f}/h now", soft_wrap=True)
        if s.capacity_failures:
            con.print(f"  launches failing: {failures_line(s.capacity_failures)}", soft_wrap=True)
        if s.boot_failure:
            con.print(f"  boot failed: {s.boot_failure}", markup=False, soft_wrap=True)
        if s.starts:
            con.print("  " + starts_line(s.starts), markup=False, soft_wrap=True)
        for line in forecast_lines(s):
            con.print("  " + line, markup=False, soft_wrap=True)
        for w in s.windows:
            when = f"from {w.start.isoformat(timespec='seconds')} " if w.start else "begun, "
            con.print(f"  window {w.id}: +{w.nodes} node(s) ({w.nodes * rpn} replicas) {when}"
                      f"until {w.end.isoformat(timespec='seconds')} (then minimum "
                      f"{s.windows_kept_min})", markup=False, soft_wrap=True)
        for w in s.warm_windows:
            when = f"from {w.start.isoformat(timespec='seconds')} " if w.start else "begun, "
            con.print(f"  window {w.id}: +{w.nodes} warm node(s) ({w.nodes * rpn} replicas) "
                      f"{when}until {w.end.isoformat(timespec='seconds')} (then warm pool "
                      f"{s.warm_windows_kept})", markup=False, soft_wrap=True)
        for bw in s.block_windows:
            w = bw.window
            when = f"from {w.start.isoformat(timespec='seconds')} " if w.start else "begun, "
            con.print(f"  window {w.id}: {w.nodes} node(s) ({w.nodes * rpn} replicas) in "
                      f"Capacity Block {bw.block} ({bw.block_state}, {bw.zone}) {when}until "
                      f"{w.end.isoformat(timespec='seconds')}: group {bw.group}, "
                      f"{bw.in_service} in service", markup=False, soft_wrap=True)
        for b in s.unused_blocks:
            con.print("  " + unused_line(s.pool, s.cloud, b), markup=False, soft_wrap=True)
        for pp in s.pending_purchases:
            con.print("  " + pending_line(s.pool, pp), markup=False, soft_wrap=True)
        q = s.queue_per_replica
        if s.cloud in unread:
            con.print(f"  queue: queue metric not read on {s.cloud}")
        else:
            con.print("  queue: " + ("no datapoints in the last 10 min" if q is None
                                     else f"{q:g} waiting per replica"))
        if isinstance(ctx.ops, ReportsServing):
            con.print("  " + serving_line(s, window), markup=False, soft_wrap=True)
            hint = watch_hint(s.cloud, file, t.pool, ctx.endpoints, "perf fit")
            for line in model_lines(s, hint):
                con.print("  " + line, markup=False, soft_wrap=True)
        else:
            con.print(f"  served: latency and tokens not read on {s.cloud} yet")
        if ep is None:
            con.print("  endpoint: no load balancer carries the pool's tags/labels")
            continue
        where = " (internal: from inside the pool's network)" if ep.internal else ""
        con.print(f"  endpoint: {ep.url}{where}", markup=False, soft_wrap=True)
        con.print(f"  try: {ep.curl()}", markup=False, soft_wrap=True)
        if ep.api_key_secret:
            con.print(f"  (set ${API_KEY_VAR} to the API key in {ep.api_key_secret})",
                      markup=False, soft_wrap=True)
