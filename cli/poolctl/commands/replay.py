"""replay: send a trace's requests to a pool through its load balancer, at their arrival times,
and report what a client saw (a trace-driven benchmark; on the sandbox, a rehearsal)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from poolctl.capacity import run_pool
from poolctl.commands.bounds import bounded
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    endpoints_of,
    load,
    one_target,
)
from poolctl.commands.traffic import (
    InputOpt,
    LengthsOpt,
    OutputOpt,
    RateOpt,
    SeedOpt,
    traffic,
)
from poolctl.errors import UsageError, shown
from poolctl.replay import (
    ReplayReport,
    as_sent,
    report,
    run_replay,
    served_model,
    stderr_progress,
    write_requests_csv,
)
from poolctl.sandbox.serving import NodesTimeline, sandbox_endpoint
from poolctl.simulate import json_safe, summary
from poolctl.traces import MAX_REPLICAS
from poolctl.windows import parse_span

DEFAULT_SYNTHETIC_S = 600.0  # --rate without --duration
MAX_SPEED = 1000.0
MAX_CONCURRENCY = 1_000_000
MAX_TIMEOUT_S = 86_400.0
# Past this share of TTFT p90, the magnified overhead distorts what replay reports (docs).
OVERHEAD_WARN = 0.05


def replay(
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="The requests to send: an Azure LLM inference trace (CSV) or a "
        "Mooncake trace (JSONL); or --rate.", show_default=False)] = None,
    rate: RateOpt = None, seed: SeedOpt = 0, input_tokens: InputOpt = 1000.0,
    output_tokens: OutputOpt = 200.0, lengths: LengthsOpt = "exponential",
    url: Annotated[str | None, typer.Option(
        "--url", help="The pool's endpoint, http(s)://HOST[:PORT] (its load balancer); or "
        "--sandbox.", show_default=False)] = None,
    sandbox: SandboxOpt = False,
    file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", metavar="VAR", help="Read the API key from this environment "
        "variable (never from the command line).", show_default=False)] = None,
    speed: Annotated[float | None, typer.Option(
        "--speed", parser=bounded("--speed", 0, MAX_SPEED, "a speed", above=True),
        help="Send S times faster and report times x S: the sandbox's speed "
        "(its own by default with --sandbox); 1 against a real pool.",
        show_default=False)] = None,
    start: Annotated[str, typer.Option(
        "--from", help="Start this far into the trace: 600, 10m, 1h.")] = "0",
    duration: Annotated[str | None, typer.Option(
        "--duration", help="Send this much of the trace (default: to its end; with --rate, "
        "10m).",
        show_default=False)] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        "--max-concurrency", parser=bounded("--max-concurrency", 1, MAX_CONCURRENCY,
                                            "requests in flight", integer=True),
        help="At most N requests in flight (default: "
        "unbounded, an open loop).", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", parser=bounded("--timeout", 1, MAX_TIMEOUT_S, "seconds"),
        help="Give up on a request after this many wall seconds.")] = 600.0,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Also run `simulate` on the same slice and file (the requests as "
        "the client sent them), and print measured beside predicted.")] = False,
    replicas: Annotated[int | None, typer.Option(
        "--replicas", parser=bounded("--replicas", 1, MAX_REPLICAS, "a count of replicas",
                                     integer=True),
        help="With --compare: the replicas serving (default: the "
        "pool's min_replicas).", show_default=False)] = None,
    requests_out: Annotated[Path | None, typer.Option(
        "--requests-out", help="Write one CSV row per request here (times in pool seconds).",
        show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Send a trace through a pool's endpoint and report TTFT, TPOT, errors and goodput."""

    if (url is None) == (not sandbox):
        raise UsageError("--url URL or --sandbox: give one")
    if url is not None and not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {shown(url)}: give http://HOST[:PORT] or https://...")
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env {shown(api_key_env)}: that variable is empty or "
                             "unset; export the key in it")
    t0 = parse_span("--from", start)
    span = None if duration is None else parse_span("--duration", duration)
    if span is not None and span <= 0:
        raise UsageError("--duration: give a length above 0, e.g. 10m")
    if rate is not None and span is None:
        span = DEFAULT_SYNTHETIC_S
    tr = traffic(trace, rate, (span or 0.0) + t0, seed, input_tokens, output_tokens, lengths,
                 1.0)
    end = math.inf if span is None else t0 + span
    tr = tr.window(tr.arrivals[0] + t0 if tr.arrivals else t0,
                   tr.arrivals[0] + end if tr.arrivals else end)
    if not len(tr):
        raise UsageError(f"--from/--duration: no request of {tr.source} arrives in "
                         "that slice; pick one inside the trace")
    cfg = tgt = None
    if compare or file is not None or pool is not None:
        cfg = load(file)
        tgt = one_target(cfg, pool, cloud)
    pool_ep = None
    if sandbox:
        eps = endpoints_of(True)
        if tgt is None:
            cfg = load(file)
            tgt = one_target(cfg, pool, cloud)
        assert eps.aws is not None and cfg is not None
        pool_ep = sandbox_endpoint(eps.aws, cfg, tgt.pool)
        url, speed = pool_ep.url, speed or pool_ep.speed
    assert url is not None
    ca_file = pool_ep.ca_file if pool_ep is not None else None
    speed = speed or 1.0
    try:
        model = asyncio.run(served_model(url, api_key, ca_file))
    except ValueError as e:
        raise UsageError(f"--url {shown(url)}: {e}") from None
    # On the sandbox, the nodes behind the load balancer are sampled while the trace runs.
    with (NodesTimeline(pool_ep) if pool_ep is not None else contextlib.nullcontext()) as tl:
        run = asyncio.run(run_replay(tr, url, model, api_key=api_key, speed=speed,
                                     max_concurrency=max_concurrency, timeout_s=timeout,
                                     progress=None if json_out else stderr_progress,
                                     ca_file=ca_file))
    if requests_out is not None:
        try:
            write_requests_csv(run, str(requests_out))
        except OSError as e:
            raise UsageError(f"--requests-out: cannot write {requests_out} ({e.strerror}); "
                             "give a writable path") from None
    slo = tgt.pool.slo if tgt is not None else None
    rep = report(run, slo.ttft_p90_s if slo else None, slo.tpot_p90_s if slo else None)
    out: dict[str, Any] = {"url": url, "model": model, "trace": tr.source, **rep.to_json()}
    if tl is not None:
        out["nodes_in_service"] = [{"pool_s": p.pool_s, "nodes": p.nodes} for p in tl.points]
    if compare:
        assert tgt is not None
        n = replicas or tgt.pool.scaling.min_replicas
        # the requests as the client sent them (a busy client sends late, in bursts)
        res = run_pool(tgt.pool, tgt.cloud, as_sent(tr, run), replicas=n)
        predicted = summary(res, tgt.pool.slo.ttft_p90_s, tgt.pool.slo.tpot_p90_s).to_json()
        out["predicted"] = {"replicas": n, "ttft_s": predicted["ttft_s"],
                            "tpot_s": predicted["tpot_s"], "e2e_s": predicted["e2e_s"]}
    if json_out:
        emit_json(json_safe(out))
    else:
        render(rep, out)
    if rep.interrupted:
        raise typer.Exit(130)  # what was measured is printed; the shell sees the Ctrl-C


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(rep: ReplayReport, out: dict[str, Any]) -> None:
    console().print(f"{out['model']} at {out['url']}: {rep.requests} requests of {out['trace']}"
                  f", {rep.completed} completed"
                  + (f", interrupted ({rep.not_sent} not sent)" if rep.interrupted else ""))
    t = Table(show_edge=False, pad_edge=False)
    t.add_column("")
    for h in ("p50 s", "p90 s", "p99 s"):
        t.add_column(h, justify="right")
    pred = out.get("predicted")
    for name, q in (("TTFT", rep.ttft_s), ("TPOT", rep.tpot_s), ("end-to-end", rep.e2e_s)):
        t.add_row(name, _s(q.p50), _s(q.p90), _s(q.p99))
        if name == "TTFT" and rep.server_ttft_s is not None:
            n = rep.server_ttft_s  # the pool's part: what status reads from the engines
            t.add_row("  less its round trip", _s(n.p50), _s(n.p90), _s(n.p99))
        if pred is not None:
            key = {"TTFT": "ttft_s", "TPOT": "tpot_s", "end-to-end": "e2e_s"}[name]
            p = pred[key]
            t.add_row(f"  simulate ({pred['replicas']} replicas)", _s(p.get("p50")),
                      _s(p.get("p90")), _s(p.get("p99")))
    console().print(t)
    errs = ", ".join(f"{k}: {v}" for k, v in rep.errors.items()) or "none"
    console().print(f"errors: {errs}")
    if rep.slo is not None:
        slo = rep.slo
        judged = [f"TTFT p90 {_s(rep.ttft_s.p90)} s {'<=' if slo.ttft_met else '>'} "
                  f"{slo.ttft_p90_s:g} s"]
        if slo.tpot_p90_s is not None:
            judged.append(f"TPOT p90 {_s(rep.tpot_s.p90)} s {'<=' if slo.tpot_met else '>'} "
                          f"{slo.tpot_p90_s:g} s")
        console().print(f"SLO {'met' if slo.met else 'missed'} ({'; '.join(judged)}); goodput: "
                        f"{slo.goodput:.1%} of requests met the pool's SLOs")
    console().print(f"output: {rep.output_tokens_per_s:.0f} tokens/s; wall time "
                  f"{rep.wall_s:.1f} s at speed x{rep.speed:g} (times are pool time: measured "
                  "x speed)")
    if rep.overhead_s is not None and rep.overhead_share is not None:
        console().print(f"overhead: {rep.overhead_s:.3f} s per request (the round trip to the "
                        f"response headers, x{rep.speed:g}), {rep.overhead_share:.1%} of TTFT "
                        "p90")
        if rep.overhead_share > OVERHEAD_WARN and rep.speed > 1:
            console().print(f"  over {OVERHEAD_WARN:.0%}: this TTFT is this machine's more than "
                            "the pool's; rehearse at a lower speed (`poolctl sandbox start "
                            "--serve --speed S`) or with fewer nodes", soft_wrap=True)
    # Said only when it matters: over OVERHEAD_WARN of the TTFT p90, as the overhead.
    if rep.send_lag_s and rep.ttft_s.p90 and rep.send_lag_s > OVERHEAD_WARN * rep.ttft_s.p90:
        console().print(f"sent late: p90 {rep.send_lag_s:.2f} s after the trace's arrival (a "
                        "busy client; --compare gives the model the same send times)",
                        soft_wrap=True)
    nodes = out.get("nodes_in_service")
    if nodes:
        console().print("nodes in service: " + " -> ".join(
            f"{p['nodes']} ({p['pool_s']:.0f} s)" for p in nodes))
