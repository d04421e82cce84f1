"""Capacity ahead of demand: what a pool's predictive scaling forecasts on and sizes for.

A start takes minutes and the queue rises only after users already wait, so AWS predictive
scaling (`scaling.predictive`) forecasts the pool's load from its own history and launches
nodes `buffer_s` before it. The load is the pool's requests in flight (running and waiting,
from the metrics every serving node publishes, docs/metrics.md); a node is sized for
`target_per_node` of them. The stacks write these figures into the policy
(poolctl_stacks/aws/scaling.py); `plan` prints them with their source; `simulate` replays them.

The buffer is a figure of the file (or the plan's cold start), not the pool's measured starts:
`cdktn synth` in CI has no measurements, and the synthesized JSON must be the same on every
machine. `status` compares it with the measured starts and names the value to set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from poolctl.capacity import run_pool
from poolctl.cloud import Cloud
from poolctl.config import Pool
from poolctl.errors import UsageError
from poolctl.simulate import SimResult, SimWindow, percentile, summary
from poolctl.sizing import PoolPlan, plan_pool
from poolctl.traces import Trace

# AWS's limit on SchedulingBufferTime: less than the forecast interval of 3,600 s
# (PredictiveScalingConfiguration, Auto Scaling API reference).
MAX_BUFFER_S = 3599
# AWS's modes, by poolctl's names.
MODES = {"forecast": "ForecastOnly", "forecast-and-scale": "ForecastAndScale"}


@dataclass(frozen=True)
class Predictive:
    mode: str  # "forecast" or "forecast-and-scale"
    target_per_replica: float  # requests in flight a replica is sized for
    target_per_node: float
    buffer_s: int
    buffer_source: str

    @property
    def aws_mode(self) -> str:
        return MODES[self.mode]

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "target_per_replica": self.target_per_replica,
                "target_per_node": self.target_per_node, "buffer_s": self.buffer_s,
                "buffer_source": self.buffer_source}

    def line(self) -> str:
        return (f"predictive scaling ({self.mode}): {self.target_per_node:g} requests in flight "
                "per node (scaling.predictive_target x replicas per node); nodes launch "
                f"{self.buffer_s} s ahead of the forecast ({self.buffer_source})")


def predictive(pool: Pool, plan: PoolPlan) -> Predictive | None:
    """The pool's predictive scaling figures; None when `scaling.predictive` is off."""
    s = pool.scaling
    if s.predictive == "off":
        return None
    assert s.predictive_target is not None  # the config requires it with predictive on
    per_replica = float(s.predictive_target)
    if s.predictive_buffer_s is not None:
        buffer_s, buffer_source = int(s.predictive_buffer_s), "scaling.predictive_buffer_s"
    else:
        cold = plan.start_seconds.get("cold", 0.0)
        buffer_s = min(MAX_BUFFER_S, round(cold))
        buffer_source = "the plan's cold start"
    return Predictive(s.predictive, per_replica, round(per_replica * plan.replicas_per_node, 1),
                      buffer_s, buffer_source)


# ---------------------------------------------------------------------------------------
# Launch windows from the pool's history (`warm --suggest`): what a cloud without a load
# forecast (GCP) schedules instead, and a check of a forecast's shape on AWS.

MIN_HISTORY_HOURS = 24


@dataclass(frozen=True)
class Suggestion:
    """A daily busy stretch of the pool's history as a launch window for its next
    occurrence: `nodes` beyond the minimum from `start` (the stretch's first hour less the
    lead time) to `end`."""

    hours_utc: tuple[int, ...]  # the busy UTC hours, in order
    nodes: int
    replicas: int
    peak_in_flight: float  # the busiest hour's mean requests in flight
    start: datetime
    end: datetime

    def to_json(self) -> dict[str, object]:
        return {"hours_utc": list(self.hours_utc), "nodes": self.nodes,
                "replicas": self.replicas, "peak_in_flight": round(self.peak_in_flight, 1),
                "from": self.start.isoformat(timespec="seconds"),
                "until": self.end.isoformat(timespec="seconds")}


def hour_of_day_means(history: dict[datetime, float]) -> dict[int, float]:
    """UTC hour of day -> the mean of the history's hours at that hour."""
    by: dict[int, list[float]] = {}
    for at, v in history.items():
        by.setdefault(at.astimezone(UTC).hour, []).append(v)
    return {h: sum(vs) / len(vs) for h, vs in by.items()}


def suggest_windows(history: dict[datetime, float], per_node: float, min_nodes: int,
                    max_nodes: int, rpn: int, lead_s: float, now: datetime
                    ) -> list[Suggestion]:
    """The hours of the day whose mean load (requests in flight) needs more nodes than the
    pool's minimum at `per_node` each, as launch windows: each run of such hours (across
    midnight too) one window of the run's largest need beyond the minimum, from `lead_s`
    before its first hour (the nodes' start) to the end of its last, at its next occurrence
    that can still start in time."""
    means = hour_of_day_means(history)
    need = {h: min(max_nodes, max(min_nodes, math.ceil(v / per_node - 1e-9)))
            for h, v in means.items()}
    busy = sorted(h for h, n in need.items() if n > min_nodes)
    if not busy:
        return []
    runs: list[list[int]] = []
    for h in busy:
        if runs and runs[-1][-1] == h - 1:
            runs[-1].append(h)
        else:
            runs.append([h])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == 23:  # across midnight
        runs[0] = runs.pop() + runs[0]
    out = []
    for run in runs:
        first = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        first += timedelta(hours=(run[0] - first.hour) % 24)
        if first - timedelta(seconds=lead_s) < now:
            first += timedelta(days=1)
        nodes = max(need[h] for h in run) - min_nodes
        out.append(Suggestion(tuple(run), nodes, nodes * rpn, max(means[h] for h in run),
                              first - timedelta(seconds=lead_s),
                              first + timedelta(hours=len(run))))
    return sorted(out, key=lambda s: s.start)


# ---------------------------------------------------------------------------------------
# Several days replayed with and without scaling ahead (`simulate --days N --predictive`).

HOUR_S = 3600
MINUTE_S = 60
FORECAST_DAYS = 14  # AWS's forecast reads up to 14 days back


@dataclass(frozen=True)
class ScalingRun:
    """One way of scaling the pool over the replay, and what it cost and lost."""

    name: str  # reactive | warm pool | predictive
    slo_minutes_lost: int  # minutes (by arrival) whose p90 TTFT or TPOT missed the SLO
    minutes: int  # minutes with at least one request
    lost_after_day_1: int  # of them, after the first day (the forecast's first day)
    cost_usd: float
    node_hours: float
    goodput: float  # share of requests within both SLOs
    ttft_p90_s: float | None
    windows: int = 0  # hours the forecast raised the minimum (predictive)

    def to_json(self) -> dict[str, object]:
        return {"scaling": self.name, "slo_minutes_lost": self.slo_minutes_lost,
                "slo_minutes_lost_after_day_1": self.lost_after_day_1, "minutes": self.minutes,
                "cost_usd": round(self.cost_usd, 2),
                "node_hours": round(self.node_hours, 2), "goodput": self.goodput,
                "ttft_p90_s": self.ttft_p90_s, "forecast_hours": self.windows}


def hourly_in_flight(res: SimResult, hours: int) -> list[float]:
    """The replay's mean requests in flight (arrived, not finished: running and waiting,
    what the nodes publish as the load) over each hour."""
    acc = [0.0] * hours
    q = res.req
    for a, f, refused in zip(q.arrival, q.finish, q.refused, strict=True):
        if refused or f != f:  # refused, or never finished (NaN)
            continue
        h = int(a // HOUR_S)
        while h < hours and a < f:
            end = min(f, (h + 1) * HOUR_S)
            acc[h] += end - a
            a, h = end, h + 1
    return [x / HOUR_S for x in acc]


def same_hour_mean(load: Mapping[int, float], hour: int) -> float | None:
    """The forecast of `hour` (an hour index) from `load` by hour index: the mean of the same
    hour on up to FORECAST_DAYS earlier days that have a value; None when none has. The rule
    the sandbox's stand-in for AWS's forecast (sandbox/extensions/forecasts.py) and
    `simulate --predictive` share."""
    past = [load[hour - 24 * k] for k in range(1, FORECAST_DAYS + 1) if hour - 24 * k in load]
    return sum(past) / len(past) if past else None


def forecast_in_flight(in_flight: list[float]) -> list[float | None]:
    """Each hour's forecast (same_hour_mean); None on the first day (AWS needs 24 hours of
    history)."""
    load = dict(enumerate(in_flight))
    return [same_hour_mean(load, h) for h in range(len(in_flight))]


def ahead_windows(in_flight: list[float], per_node: float, min_nodes: int, max_nodes: int,
                  buffer_s: float) -> tuple[SimWindow, ...]:
    """Predictive scaling as launch windows: each forecast hour whose capacity is above the
    minimum raises the minimum to it from `buffer_s` before the hour, for an hour; at the
    end only the minimum returns (the queue policy scales in)."""
    out = []
    for h, fc in enumerate(forecast_in_flight(in_flight)):
        if fc is None:
            continue
        cap = min(max_nodes, max(min_nodes, math.ceil(fc / per_node - 1e-9)))
        if cap > min_nodes:
            out.append(SimWindow(h * HOUR_S - buffer_s, (h + 1) * HOUR_S - buffer_s,
                                 cap - min_nodes, running=True, drains=False))
    return tuple(out)


def slo_minutes_lost(res: SimResult, ttft_slo_s: float, tpot_slo_s: float | None
                     ) -> list[int]:
    """The minutes (from the replay's start) that missed: a minute, by its requests'
    arrival, misses when their p90 TTFT (or TPOT, with a target) is over the SLO, or a
    request of it was refused or never finished; and, last, how many minutes had requests:
    [missed minute, ..., count]."""
    q = res.req
    ttft: dict[int, list[float]] = {}
    tpot: dict[int, list[float]] = {}
    failed: set[int] = set()
    for i, a in enumerate(q.arrival):
        m = int(a // MINUTE_S)
        ttft.setdefault(m, [])
        first, fin = q.first[i], q.finish[i]
        if q.refused[i] or first != first or fin != fin:
            failed.add(m)
            continue
        ttft[m].append(first - a)
        if q.outputs[i] > 1:
            tpot.setdefault(m, []).append((fin - first) / (q.outputs[i] - 1))
    lost = []
    for m, xs in ttft.items():
        over = m in failed or (bool(xs) and (percentile(sorted(xs), 0.9) or 0) > ttft_slo_s)
        if tpot_slo_s is not None and m in tpot:
            over = over or (percentile(sorted(tpot[m]), 0.9) or 0) > tpot_slo_s
        if over:
            lost.append(m)
    return [*lost, len(ttft)]


def _run(name: str, res: SimResult, pool: Pool, windows: int = 0) -> ScalingRun:
    s = summary(res, pool.slo.ttft_p90_s, pool.slo.tpot_p90_s)
    *lost, minutes = slo_minutes_lost(res, pool.slo.ttft_p90_s, pool.slo.tpot_p90_s)
    day = 24 * 60
    return ScalingRun(name, len(lost), minutes, sum(m >= day for m in lost),
                      s.cost.usd or 0.0, s.cost.node_hours or 0.0, s.slo.goodput,
                      s.ttft_s.p90, windows)


def compare_scaling(pool: Pool, cloud: Cloud, trace: Trace, warm_replicas: int,
                    starts: Mapping[str, float] | None = None,
                    progress: Callable[[str], None] = lambda _: None) -> list[ScalingRun]:
    """The trace replayed three ways: reactive (the queue policy alone, no warm pool), with
    `warm_replicas` in the warm pool, and predictive (the queue policy, no warm pool, the
    minimum raised ahead of each hour's forecast). The forecast reads the reactive replay's
    load, hour by hour (what a pool that scaled reactively would have published); the lead
    time and the target are the file's (`scaling.predictive_buffer_s`, the plan's cold start
    by default; `scaling.predictive_target`, required)."""
    target = pool.scaling.predictive_target
    if target is None:
        raise UsageError(f"pools.{pool.name}.scaling.predictive_target: --predictive sizes the "
                         "forecast's nodes by it (requests in flight per replica); set it: "
                         "`poolctl plan --traffic TRACE` prints it for your traffic")
    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    buffer_s = (float(pool.scaling.predictive_buffer_s)
                if pool.scaling.predictive_buffer_s is not None
                else min(MAX_BUFFER_S, float((starts or {}).get(
                    "cold", plan.start_seconds["cold"]))))
    hours = math.ceil(trace.arrivals[-1] / HOUR_S) if trace.arrivals else 0
    progress("reactive")
    reactive = run_pool(pool, cloud, trace, autoscale=True, warm_replicas=0, starts=starts)
    runs = [_run("reactive", reactive, pool)]
    if warm_replicas:
        progress("warm pool")
        runs.append(_run(f"warm pool ({warm_replicas} replicas)", run_pool(
            pool, cloud, trace, autoscale=True, warm_replicas=warm_replicas, starts=starts),
            pool))
    windows = ahead_windows(hourly_in_flight(reactive, hours), float(target) * rpn,
                            plan.nodes.min, plan.nodes.max, buffer_s)
    progress("predictive")
    ahead = run_pool(pool, cloud, trace, autoscale=True, warm_replicas=0, starts=starts,
                     windows=windows)
    runs.append(_run("predictive", ahead, pool, len(windows)))
    return runs
