"""Capacity ahead of demand: what a pool's predictive scaling forecasts on and sizes for.

A start takes minutes and the queue rises only after users already wait, so AWS predictive
scaling (`scaling.predictive`) forecasts the pool's load from its own history and launches
nodes `buffer_s` before it. The load is the pool's requests in flight (running and waiting,
from the metrics every serving node publishes, docs/metrics.md); a node is sized for
`target_per_node` of them. The stacks write these figures into the policy
(poolctl_stacks/aws/scaling.py); `plan` prints them with their source; `simulate` replays them.

The buffer is a figure of the file (or the plan's cold start), not the pool's measured starts:
`cdktf synth` in CI has no measurements, and the synthesized JSON must be the same on every
machine. `status` compares it with the measured starts and names the value to set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from poolctl.config import Pool
from poolctl.sizing import PoolPlan

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
