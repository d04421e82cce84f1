"""simulate: replay a trace (or synthetic traffic) through a pool's serving model and scaling."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from poolctl.capacity import run_pool
from poolctl.commands.bounds import bounded
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    MeasuredOpt,
    PoolOpt,
    console,
    emit_json,
    load,
    one_target,
    require_valid,
    start_times,
    start_words,
    whole,
)
from poolctl.commands.traffic import (
    DurationOpt,
    InputOpt,
    LengthsOpt,
    OutputOpt,
    RateOpt,
    ReplicasOpt,
    SeedOpt,
    TimeScaleOpt,
    TraceOpt,
    WarmOpt,
    traffic,
)
from poolctl.errors import UsageError, shown
from poolctl.predictive import compare_scaling
from poolctl.progress import log
from poolctl.servingmodel import figures, replica_model
from poolctl.servingmodel import topology as split_topology
from poolctl.simulate import (
    BALANCERS,
    SimResult,
    SimWindow,
    json_safe,
    percentile,
    summary,
    write_requests_csv,
)
from poolctl.sizing import nodes_for, plan_pool
from poolctl.traces import DAILY_PEAK_HOUR, DAILY_TROUGH, MAX_DAYS, Trace, daily
from poolctl.windows import parse_warm_window

if TYPE_CHECKING:
    from poolctl.cloud import Cloud
    from poolctl.config import Pool

def simulate(
    file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
    trace: TraceOpt = None, rate: RateOpt = None, duration: DurationOpt = 3600.0,
    seed: SeedOpt = 0, input_tokens: InputOpt = 1000.0, output_tokens: OutputOpt = 200.0,
    lengths: LengthsOpt = "exponential", time_scale: TimeScaleOpt = 1.0,
    replicas: ReplicasOpt = None,
    autoscale: Annotated[bool, typer.Option(
        "--autoscale", help="The pool's own autoscaling, warm pool and start times.")] = False,
    warm: WarmOpt = None,
    balancer: Annotated[str | None, typer.Option(
        "--balancer", help="lor: least outstanding requests at arrival (the clouds' load "
        "balancers); sticky: session affinity (a conversation's turns to one node); queue: a "
        "central queue dispatching to free replicas. Default: the file's serving.balancer.",
        show_default=False)] = None,
    topology: Annotated[str, typer.Option(
        "--topology", help="aggregated: prefill and decode share each replica's GPUs; "
        "disagg-node: on different GPUs of one node (KV over NVLink); disagg-cross: on "
        "different nodes (KV over the VPC network, no EFA). Simulation only: poolctl does not "
        "deploy a disaggregated pool.")] = "aggregated",
    split: Annotated[str | None, typer.Option(
        "--split", help="With a disagg topology: prefill:decode GPUs of one replica, each a "
        "TP degree (default 4:4 on an 8-GPU node).", show_default=False)] = None,
    json_out: JsonOpt = False,
    requests_out: Annotated[Path | None, typer.Option(
        "--requests-out", help="Write one CSV row per request here.")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw traffic, replicas and TTFT over time (PNG; needs [plot]).")] = None,
    warm_window: Annotated[str | None, typer.Option(
        "--warm-window", metavar="FROM,UNTIL,N[,running|stopped]",
        help="A launch window: N more replicas from FROM to UNTIL (from the trace's start: "
        "600, 10m, 1h; FROM -10m: begun before the trace, ready at its start), in service "
        "(running, what `warm --from --running` schedules) or in the warm pool (stopped); "
        "the replay is compared with the same one without it.",
        show_default=False)] = None,
    measured: MeasuredOpt = False,
    days: Annotated[int | None, typer.Option(
        "--days", parser=whole(1, MAX_DAYS, "days"), metavar="N",
        help="Replay N days: the traffic's arrivals repeated hour after hour, thinned along a "
        "daily curve (--trough, --peak-hour), from midnight UTC.", show_default=False)] = None,
    trough: Annotated[float, typer.Option(
        "--trough", parser=bounded("--trough", 0, 1, "a share of the peak rate", above=True),
        help="With --days: the quietest hour's share of the peak rate.")] = DAILY_TROUGH,
    peak_hour: Annotated[float, typer.Option(
        "--peak-hour", parser=bounded("--peak-hour", 0, 23.99, "an hour of the day, UTC"),
        help="With --days: the busiest hour of the day, UTC.")] = DAILY_PEAK_HOUR,
    predictive: Annotated[bool, typer.Option(
        "--predictive", help="Compare the pool's scaling three ways over the replay: "
        "reactive (the queue policy alone), with its warm pool, and predictive (the minimum "
        "raised ahead of each hour's forecast, scaling.predictive_target per replica): SLO "
        "minutes lost and cost of each. Best with --days 2 or more: the forecast needs a "
        "day of history.")] = False,
) -> None:
    """Replay traffic through the pool's serving model and scaling policy."""

    if replicas is not None and autoscale:
        raise UsageError("--replicas N or --autoscale: give one (the default is --autoscale)")
    if warm is not None and replicas is not None:
        raise UsageError("--warm N: with --autoscale (not with --replicas)")
    if balancer is not None and balancer not in BALANCERS:
        raise UsageError(f"--balancer: {balancer!r} is not one of {', '.join(BALANCERS)}")
    if warm_window is not None and replicas is not None:
        raise UsageError("--warm-window: with --autoscale (not with --replicas)")
    spec = parse_warm_window(warm_window) if warm_window is not None else None
    gpus = _split(split if split is not None else "4:4")
    if split is not None and topology == "aggregated":
        raise UsageError(f"--split {shown(split)}: applies to a disaggregated topology only; "
                         "add --topology disagg-node or disagg-cross, or drop --split")
    if plot is not None:
        _need_matplotlib()
    cfg = load(file)
    tgt = one_target(cfg, pool, cloud)
    p, c = tgt.pool, tgt.cloud
    require_valid(cfg, [tgt])
    windows = _window_nodes(p, c, spec) if spec is not None else ()
    topo = None
    if topology != "aggregated":
        topo = split_topology(p, c, topology, *gpus)
    if days is None and (trough != DAILY_TROUGH or peak_hour != DAILY_PEAK_HOUR):
        raise UsageError("--trough/--peak-hour: shape the daily curve of --days N; add --days")
    if predictive and (replicas is not None or spec is not None or topology != "aggregated"):
        raise UsageError("--predictive: compares the pool's own autoscaling; drop --replicas, "
                         "--warm-window and --topology")
    tr = traffic(trace, rate, duration, seed, input_tokens, output_tokens, lengths, time_scale)
    if days is not None:
        tr = daily(tr, days, trough, peak_hour, seed)
    times, start_info = start_times(cfg, p, c, measured)
    if predictive:
        _predictive(p, c, tr, warm, times, start_info, json_out)
        return
    # With a window both replays run to its end at least: the same span, billed alike.
    until = max((w.end_s for w in windows), default=0.0)
    if replicas is None:
        log(start_words(f"{p.name}/{c}", start_info))
    res = run_pool(p, c, tr, replicas=replicas, autoscale=replicas is None,
                   warm_replicas=warm, balancer=balancer, topology=topo, windows=windows,
                   run_until_s=until, starts=times)

    s = {"pool": p.name, "cloud": c, "trace": tr.source,
         **summary(res, p.slo.ttft_p90_s, p.slo.tpot_p90_s).to_json(),
         "model": figures(replica_model(p, c)), "start_times": start_info}
    if spec is not None:
        base = run_pool(p, c, tr, autoscale=True, warm_replicas=warm, balancer=balancer,
                        topology=topo, run_until_s=until, starts=times)
        s["warm_window"] = window_comparison(spec, windows[0], res, base, p.slo.ttft_p90_s,
                                             p.slo.tpot_p90_s)
    try:
        if requests_out is not None:
            write_requests_csv(res, requests_out)
        if plot is not None:
            draw(res, s, plot)
    except OSError as e:
        flag = "--plot" if plot is not None and Path(e.filename or "") == plot else "--requests-out"
        raise UsageError(f"{flag}: cannot write {e.filename} ({e.strerror}); give a writable "
                         "path") from None
    if json_out:
        emit_json(json_safe(s))  # a step time of 1e305 s is a number, but not JSON's
    else:
        render(s)


def _window_nodes(p: Pool, c: Cloud, spec: tuple[float, float, int, bool]
                  ) -> tuple[SimWindow, ...]:
    start, end, n, running = spec
    plan = plan_pool(p, c)
    nodes, room = nodes_for(n, plan.replicas_per_node), plan.nodes.max - plan.nodes.min
    if nodes > room:
        raise UsageError(f"--warm-window: {n} replicas = {nodes} node(s); pool {p.name!r} "
                         f"has room for {room} above its minimum (scaling.max_replicas)")
    return (SimWindow(start_s=start, end_s=end, nodes=nodes, running=running),)


def window_comparison(spec: tuple[float, float, int, bool], w: SimWindow, with_w: SimResult,
                      without: SimResult, ttft_slo_s: float, tpot_slo_s: float | None
                      ) -> dict[str, Any]:
    """The replay with the window against the same replay without it: TTFT p90 of the
    requests arriving inside the window and over all, and the cost."""

    def side(r: SimResult) -> dict[str, Any]:
        q = r.req
        inside = sorted(q.first[i] - q.arrival[i] for i in range(len(q.arrival))
                        if q.first[i] == q.first[i] and w.open_at(q.arrival[i]))
        s = summary(r, ttft_slo_s, tpot_slo_s).to_json()
        p90 = percentile(inside, 0.9)
        return {"ttft_p90_s_in_window": None if p90 is None else round(p90, 4),
                "ttft_p90_s": s["ttft_s"]["p90"], "slo_met": s["slo"]["met"],
                "usd": s["cost"]["usd"], "node_hours": s["cost"]["node_hours"]}

    return {"from_s": w.start_s, "until_s": w.end_s, "replicas": spec[2], "nodes": w.nodes,
            "state": "running" if w.running else "stopped",
            "with": side(with_w), "without": side(without)}


def _predictive(p: Pool, c: Cloud, tr: Trace, warm: int | None, starts: dict[str, float],
                start_info: dict[str, Any], json_out: bool) -> None:
    log(start_words(f"{p.name}/{c}", start_info))
    warm_r = p.warm_pool.replicas if warm is None else warm
    log(f"{p.name}/{c}: {len(tr):,} requests over {tr.span_s / 3600:,.1f} h, replayed 2-3 "
        "times (about 40 s per million requests each)")
    runs = compare_scaling(p, c, tr, warm_r, starts,
                           progress=lambda name: log(f"  replaying: {name}"))
    plan = plan_pool(p, c)
    hours = tr.span_s / 3600
    warm_nodes = nodes_for(warm_r, plan.replicas_per_node)
    running_usd = round(warm_nodes * plan.price_per_node_hour_usd * hours, 2)
    out = {"pool": p.name, "cloud": c, "trace": tr.source, "requests": len(tr),
           "hours": round(hours, 2), "slo": {"ttft_p90_s": p.slo.ttft_p90_s,
                                             "tpot_p90_s": p.slo.tpot_p90_s},
           "scaling": [r.to_json() for r in runs],
           "warm_pool_running_usd": running_usd, "start_times": start_info}
    if json_out:
        emit_json(json_safe(out))
        return
    t = Table(title=f"{p.name} on {c}: {tr.source}, {len(tr):,} requests", title_justify="left")
    for col in ("scaling", "SLO minutes lost", "after day 1", "cost", "node-hours", "goodput",
                "TTFT p90"):
        t.add_column(col, justify="left" if col == "scaling" else "right")
    for r in runs:
        t.add_row(r.name + (f" ({r.windows} forecast hours)" if r.windows else ""),
                  f"{r.slo_minutes_lost:,} of {r.minutes:,}", f"{r.lost_after_day_1:,}",
                  f"${r.cost_usd:,.2f}",
                  f"{r.node_hours:,.1f}", f"{r.goodput:.1%}",
                  "-" if r.ttft_p90_s is None else f"{r.ttft_p90_s:.2f} s")
    con = console()
    con.print(t)
    con.print("a minute is lost when its requests' p90 TTFT (or TPOT) misses the SLO, or one "
              "was refused; the forecast starts after a day of history; keeping the warm "
              f"pool's {warm_nodes} node(s) running instead of stopped would add "
              f"${running_usd:,.2f} over the {hours:,.0f} h", markup=False, soft_wrap=True)


def render(s: dict[str, Any]) -> None:

    t = Table(title=f"{s['pool']} on {s['cloud']}: {s['trace']}", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    r, cost = s["replicas"], s["cost"]

    def f(d: dict[str, float | None], *ks: str) -> str:
        return " / ".join(f"{d[k]:.3f}" if d[k] is not None else "-" for k in ks)

    rows = [
        ("requests", f"{s['requests']:,} ({s['requests_over_max_model_len']:,} refused: prompt + "
                     f"output longer than max_model_len {s['max_model_len']:,})"),
        ("span, arrival rate", f"{s['duration_s']:,.0f} s, {s['arrival_rate_per_s']:.2f}/s"),
        ("replicas min / max / mean", f"{r['min']} / {r['max']} / {r['mean']}"),
        ("TTFT p50 / p90 / p99", f(s["ttft_s"], "p50", "p90", "p99") + " s"),
        ("time per output token p50 / p90", f(s["tpot_s"], "p50", "p90") + " s"),
        ("end to end p50 / p90", f(s["e2e_s"], "p50", "p90") + " s"),
        ("queue wait mean", f"{s['queue_wait_s']['mean']:.3f} s"),
        ("in system (mean), time in system",
         f"{s['mean_in_system']:.1f}, {s['mean_time_in_system_s']:.2f} s"),
        ("utilization (capacity), busy", f"{s['utilization']:.2f}, {s['busy_fraction']:.2f}"),
        ("tokens/s in / out", f"{s['tokens_per_s']['input']:,.0f} / "
                              f"{s['tokens_per_s']['output']:,.0f}"),
        ("SLO TTFT p90", f"{s['slo']['ttft_p90_s']} s: "
                         f"{'met' if s['slo']['ttft_met'] else 'MISSED'}"),
        ("SLO TPOT p90", "none set (slo.tpot_p90_s)" if s["slo"]["tpot_p90_s"] is None else
         f"{s['slo']['tpot_p90_s']} s: {'met' if s['slo']['tpot_met'] else 'MISSED'}"),
        ("goodput", f"{s['slo']['goodput']:.1%} of requests meet every SLO"),
        ("node-hours, cost", f"{cost['node_hours']:.2f}, ${cost['usd']:,.2f} (fixed "
                             f"${cost['fixed_usd']:,.2f}, marginal ${cost['marginal_usd']:,.2f})"),
        ("cost per hour fixed / marginal",
         f"{_usd(cost['fixed_usd_per_hour'], 2)} / {_usd(cost['marginal_usd_per_hour'], 2)}"
         + (f" ({cost['reserved_nodes']} node(s) reserved)" if cost["reserved_nodes"] else "")),
        ("USD per 1M output tokens", f"{_usd(cost['usd_per_1m_output_tokens'])} (fixed "
         f"{_usd(cost['fixed_usd_per_1m_output_tokens'])}, marginal "
         f"{_usd(cost['marginal_usd_per_1m_output_tokens'])})"),
        ("USD per request", _usd(cost["usd_per_request"], 5)),
        ("energy, per 1M output tokens", _energy(s["energy"])),
        ("prefix cache hit rate", _prefix(s["prefix_cache"])),
        ("topology", _topology(s["topology"])),
        ("serving model", f"prefill {s['model']['prefill_tokens_per_s']:,.0f} tokens/s (2,048-token"
                          f" prompt); decode step {s['model']['decode_step_ms']['batch_1']:.1f} ms"
                          f" at batch 1, {s['model']['decode_step_ms']['batch_64']:.1f} ms at 64 "
                          "(1,024-token context)"),
    ]
    if "autoscale" in s:
        a = s["autoscale"]
        rows.append(("scale-outs, SLO misses", f"{a['scale_outs']}, {a['slo_misses']} "
                     f"({a['slo_misses_during_cold_starts']} during cold starts)"))
    if "warm_window" in s:
        ww = s["warm_window"]
        for label, k in (("with the window", "with"), ("without it", "without")):
            x = ww[k]
            inside = x["ttft_p90_s_in_window"]
            rows.append((f"{label} ({ww['replicas']} replicas {ww['state']}, "
                         f"{ww['from_s']:g}-{ww['until_s']:g} s)",
                         f"TTFT p90 {'-' if inside is None else f'{inside:.3f}'} s in the "
                         f"window, {x['ttft_p90_s']} s overall; ${x['usd']:,.2f}"))
    for k, v in rows:
        t.add_row(k, v)
    console().print(t)


def _split(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) != 2 or not all(x.isascii() and x.isdigit() and len(x) < 3 for x in parts):
        raise UsageError(f"--split: {text[:20]!r} is not PREFILL:DECODE GPUs, e.g. 4:4")
    return int(parts[0]), int(parts[1])


def _topology(t: dict[str, Any]) -> str:
    if t["kind"] == "aggregated":
        return "aggregated (prefill and decode on the same GPUs)"
    return (f"{t['kind']} {t['prefill_gpus']}:{t['decode_gpus']} GPUs, KV link "
            f"{t['kv_link_gbytes_per_s']:,.2f} GB/s, transfer mean "
            f"{t['kv_transfer_s_mean'] * 1000:,.1f} ms (not deployable by poolctl)")


def _energy(e: dict[str, float | None]) -> str:
    if e["kwh"] is None:
        return "- (no power figure for the type in the catalog)"
    per = e["kwh_per_1m_output_tokens"]
    return (f"{e['kwh']:,.1f} kWh at {e['power_kw_per_node']} kW per node (max draw), "
            + ("-" if per is None else f"{per:,.2f} kWh"))


def _prefix(pc: dict[str, Any]) -> str:
    if not pc["enabled"]:
        return "- (off, or the trace has no block ids)"
    return (f"{pc['hit_rate']:.1%} of {pc['prompt_tokens']:,} prompt tokens "
            f"({pc['evicted_blocks']:,} blocks evicted)")


def _usd(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"${x:,.{digits}f}"


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: PLC0415, F401 (the optional [plot] extra)
    except ImportError:
        raise UsageError("--plot: needs matplotlib; install it with "
                         "pip install 'poolctl[plot]' (or drop --plot)") from None


def draw(res: SimResult, s: dict[str, Any], path: Path) -> None:
    """Arrivals per minute, replicas in service and TTFT (p90 per minute) over time."""
    import matplotlib  # noqa: PLC0415 (the optional [plot] extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the optional [plot] extra)

    q = res.req
    bucket = 60.0
    nb = int(res.horizon_s // bucket) + 1
    arrivals = [0] * nb
    ttfts: list[list[float]] = [[] for _ in range(nb)]
    for a, f in zip(q.arrival, q.first, strict=True):
        b = int(a // bucket)
        arrivals[b] += 1
        if f == f:
            ttfts[b].append(f - a)
    xs = [i * bucket / 60 for i in range(nb)]
    fig, ax = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    ax[0].bar(xs, [n / bucket for n in arrivals], width=1.0, align="edge", color="#4c72b0")
    ax[0].set_ylabel("requests/s")
    if res.timeline:
        ts = [t / 60 for t, _, _ in res.timeline] + [res.horizon_s / 60]
        serving = [n * res.replicas_per_node for _, n, _ in res.timeline]
        ax[1].step(ts, serving + serving[-1:], where="post", label="serving")
        starting = [p * res.replicas_per_node for _, _, p in res.timeline]
        ax[1].step(ts, starting + starting[-1:], where="post", label="starting")
        ax[1].legend(loc="upper left")
    else:
        ax[1].axhline(res.replicas_fixed or 0)
    ax[1].set_ylabel("replicas")
    p90 = [percentile(sorted(v), 0.9) if v else float("nan") for v in ttfts]
    ax[2].plot([x + 0.5 for x in xs], p90, color="#c44e52", label="TTFT p90 (by arrival minute)")
    ax[2].axhline(s["slo"]["ttft_p90_s"], color="grey", linestyle="--", label="SLO")
    ax[2].set_yscale("log")
    ax[2].set_ylabel("seconds")
    ax[2].set_xlabel("minutes from the trace's start")
    ax[2].legend(loc="upper right")
    fig.suptitle(f"{s['pool']} on {s['cloud']}: {Path(s['trace']).name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
