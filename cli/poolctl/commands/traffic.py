"""Traffic options shared by `simulate` and `plan --traffic`, and the trace they load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from poolctl.commands.bounds import bounded
from poolctl.errors import UsageError
from poolctl.traces import MAX_REPLICAS, MAX_SPAN_S, MAX_TOKENS, Trace, load_trace, synthetic

TraceOpt = Annotated[Path | None, typer.Option(
    "--trace", help="Azure CSV or Mooncake JSONL request trace (detected by content).")]
TrafficOpt = Annotated[Path | None, typer.Option(
    "--traffic", help="Request trace to size the pool for (Azure CSV or Mooncake JSONL).")]
# Every number is bounded (commands/bounds.py) so that a run takes bounded time and memory:
# the simulator replays at most traces.MAX_REQUESTS requests over traces.MAX_SPAN_S.
MAX_RATE = 100_000.0  # requests/s: ten seconds of it reach MAX_REQUESTS
MAX_TIME_SCALE = 1000.0
RateOpt = Annotated[float | None, typer.Option(
    "--rate", help="Synthetic Poisson traffic, requests per second (instead of --trace).",
    parser=bounded("--rate", 0, MAX_RATE, "requests per second", above=True))]
DurationOpt = Annotated[float, typer.Option(
    "--duration", help="Seconds of synthetic traffic.",
    parser=bounded("--duration", 0, MAX_SPAN_S, "seconds of traffic (31 days at most)",
                   above=True))]
SeedOpt = Annotated[int, typer.Option(
    "--seed", help="Seed of synthetic traffic.",
    parser=bounded("--seed", 0, 2**63 - 1, "a seed", integer=True))]
InputOpt = Annotated[float, typer.Option(
    "--input-tokens", help="Mean prompt tokens of synthetic traffic.",
    parser=bounded("--input-tokens", 1, MAX_TOKENS, "a mean in tokens"))]
OutputOpt = Annotated[float, typer.Option(
    "--output-tokens", help="Mean output tokens of synthetic traffic.",
    parser=bounded("--output-tokens", 1, MAX_TOKENS, "a mean in tokens"))]
LengthsOpt = Annotated[str, typer.Option(
    "--lengths", help="Token lengths of synthetic traffic: exponential or fixed.")]
TimeScaleOpt = Annotated[float, typer.Option(
    "--time-scale", help="Replay the trace K times faster.",
    parser=bounded("--time-scale", 1 / MAX_TIME_SCALE, MAX_TIME_SCALE,
                   "a speed-up (2 replays twice as fast)"))]
ReplicasOpt = Annotated[int | None, typer.Option(
    "--replicas", help="A fixed count of replicas (default: the pool's autoscaling).",
    parser=bounded("--replicas", 1, MAX_REPLICAS, "a count of replicas", integer=True))]
WarmOpt = Annotated[int | None, typer.Option(
    "--warm", help="Warm replicas instead of the file's (as after `poolctl warm`).",
    parser=bounded("--warm", 0, MAX_REPLICAS, "a count of replicas", integer=True))]


def traffic(trace: Path | None, rate: float | None, duration: float, seed: int,
            input_tokens: float, output_tokens: float, lengths: str, time_scale: float,
            flag: str = "--trace") -> Trace:

    if (trace is None) == (rate is None):
        raise UsageError(f"{flag} FILE or --rate R: give exactly one")
    if lengths not in ("exponential", "fixed"):
        raise UsageError(f"--lengths: {lengths!r} is not exponential or fixed")
    # (the numbers are bounded by their options' parsers)
    if trace is not None:
        tr = load_trace(trace)
    else:
        assert rate is not None  # exactly one of them is given (checked above)
        tr = synthetic(rate, duration, seed, input_tokens, output_tokens, lengths)
    if tr.span_s / time_scale > MAX_SPAN_S:
        raise UsageError(f"--time-scale {time_scale:g}: stretches the {tr.span_s:,.0f} s of "
                         f"traffic to {tr.span_s / time_scale / 86_400:,.0f} days; poolctl "
                         f"replays at most {MAX_SPAN_S // 86_400} days: raise --time-scale")
    return tr.scaled(time_scale) if time_scale != 1 else tr
