"""What a replay measured, as `simulate --json` reports it: percentiles, the SLO, cost,
energy, the autoscaler's record (`summary`), and the per-request CSV.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from typing import Any

from poolctl.simulate.cluster import PrefixStats, SimResult, replica_seconds
from poolctl.simulate.engine import Requests

# --------------------------------------------------------------------------- reporting


def percentile(sorted_xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Quantiles:
    """Percentiles of one latency, in seconds (None: no request to measure)."""

    p50: float | None
    p90: float | None
    p99: float | None = None


@dataclass(frozen=True)
class SloResult:
    """The SLOs a run was judged by and how it did: `met` when every p90 target is met;
    goodput is the share of all requests meeting every target (TTFT and, if set, TPOT)."""

    ttft_p90_s: float
    tpot_p90_s: float | None
    met: bool
    goodput: float
    ttft_met: bool
    tpot_met: bool


@dataclass(frozen=True)
class CostResult:
    """The bill, fixed (reservations, paid whether used or not; nodes that always run) and
    marginal (On-Demand nodes beyond them, while they run)."""

    node_hours: float
    usd: float
    fixed_usd: float
    marginal_usd: float
    usd_per_1m_output_tokens: float | None
    usd_per_request: float | None
    reserved_nodes: int = 0
    fixed_usd_per_hour: float = 0.0
    marginal_usd_per_hour: float = 0.0
    fixed_usd_per_1m_output_tokens: float | None = None
    marginal_usd_per_1m_output_tokens: float | None = None


@dataclass(frozen=True)
class EnergyResult:
    """Energy at the nodes' maximum draw (an upper bound: the catalog's system power)."""

    power_kw_per_node: float | None
    kwh: float | None
    kwh_per_1m_output_tokens: float | None


@dataclass(frozen=True)
class AutoscaleResult:
    slo_misses: int
    slo_misses_during_cold_starts: int
    scale_outs: int
    nodes_over_time: tuple[tuple[float, int, int], ...]  # (t, serving, starting)


@dataclass(frozen=True)
class TopologyResult:
    """A disaggregated run's split and KV path (see servingmodel.Topology)."""

    kind: str
    prefill_gpus: int
    decode_gpus: int
    kv_link_gbytes_per_s: float
    kv_link: str
    kv_transfer_s_mean: float  # from prefill done to KV on the decode side, queueing included


@dataclass(frozen=True)
class SimSummary:
    """What a run reports (`simulate --json`, via `to_json`, in the contract's shape)."""

    requests: int
    completed: int
    rejected: int
    requests_over_max_model_len: int
    max_model_len: int | None
    duration_s: float
    horizon_s: float
    arrival_rate_per_s: float
    ttft_s: Quantiles
    tpot_s: Quantiles
    e2e_s: Quantiles
    queue_wait_mean_s: float | None
    mean_in_system: float | None
    mean_time_in_system_s: float | None
    utilization: float
    busy_fraction: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    slo: SloResult
    cost: CostResult
    energy: EnergyResult
    replicas: tuple[float, float, float]  # min, max, mean
    kv_tokens_max: int
    running_max: int
    preemptions: int
    autoscale: AutoscaleResult | None = None
    prefix_cache: PrefixStats | None = None
    topology: TopologyResult | None = None  # None: aggregated

    def to_json(self) -> dict[str, Any]:
        lo, hi, mean = self.replicas
        out: dict[str, Any] = {
            "requests": self.requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "duration_s": self.duration_s,
            "horizon_s": self.horizon_s,
            "arrival_rate_per_s": self.arrival_rate_per_s,
            "ttft_s": {"p50": self.ttft_s.p50, "p90": self.ttft_s.p90, "p99": self.ttft_s.p99},
            "tpot_s": {"p50": self.tpot_s.p50, "p90": self.tpot_s.p90},
            "e2e_s": {"p50": self.e2e_s.p50, "p90": self.e2e_s.p90},
            "queue_wait_s": {"mean": self.queue_wait_mean_s},
            "mean_in_system": self.mean_in_system,
            "mean_time_in_system_s": self.mean_time_in_system_s,
            "utilization": self.utilization,
            "busy_fraction": self.busy_fraction,
            "tokens_per_s": {"input": self.input_tokens_per_s,
                             "output": self.output_tokens_per_s},
            "slo": {"ttft_p90_s": self.slo.ttft_p90_s, "met": self.slo.met,
                    "goodput": self.slo.goodput, "tpot_p90_s": self.slo.tpot_p90_s,
                    "ttft_met": self.slo.ttft_met, "tpot_met": self.slo.tpot_met},
            "cost": {
                "node_hours": self.cost.node_hours,
                "usd": self.cost.usd,
                "fixed_usd": self.cost.fixed_usd,
                "marginal_usd": self.cost.marginal_usd,
                "usd_per_1m_output_tokens": self.cost.usd_per_1m_output_tokens,
                "usd_per_request": self.cost.usd_per_request,
                "reserved_nodes": self.cost.reserved_nodes,
                "fixed_usd_per_hour": self.cost.fixed_usd_per_hour,
                "marginal_usd_per_hour": self.cost.marginal_usd_per_hour,
                "fixed_usd_per_1m_output_tokens": self.cost.fixed_usd_per_1m_output_tokens,
                "marginal_usd_per_1m_output_tokens": self.cost.marginal_usd_per_1m_output_tokens,
            },
            "replicas": {"min": lo, "max": hi, "mean": mean},
            "kv_tokens_max": self.kv_tokens_max,
            "running_max": self.running_max,
            "preemptions": self.preemptions,
            "prefix_cache": prefix_cache_summary(self.prefix_cache),
            "topology": topology_summary(self.topology),
            "requests_over_max_model_len": self.requests_over_max_model_len,
            "max_model_len": self.max_model_len,
            "energy": {"power_kw_per_node": self.energy.power_kw_per_node,
                       "kwh": self.energy.kwh,
                       "kwh_per_1m_output_tokens": self.energy.kwh_per_1m_output_tokens},
        }
        if self.autoscale is not None:
            a = self.autoscale
            out["autoscale"] = {
                "slo_misses": a.slo_misses,
                "slo_misses_during_cold_starts": a.slo_misses_during_cold_starts,
                "scale_outs": a.scale_outs,
                "nodes_over_time": [{"t": t, "serving": s, "starting": p}
                                    for t, s, p in a.nodes_over_time],
            }
        return out


def _rnd(x: float | None, d: int = 4) -> float | None:
    return None if x is None else round(x, d)


def _tpot(q: Requests, i: int) -> float:
    """Time per output token after the first (0 for a one-token answer: it has none)."""
    return (q.finish[i] - q.first[i]) / (q.outputs[i] - 1) if q.outputs[i] > 1 else 0.0


def latencies(q: Requests) -> tuple[list[float], list[float]]:
    """The served requests' TTFTs (from arrival) and TPOTs (those with more than one output
    token), sorted."""
    done = [i for i, f in enumerate(q.finish) if f == f]  # not NaN: served
    return (sorted(q.first[i] - q.arrival[i] for i in done),
            sorted(_tpot(q, i) for i in done if q.outputs[i] > 1))


def summary(r: SimResult, ttft_slo_s: float, tpot_slo_s: float | None = None) -> SimSummary:
    """A run's figures, judged by the TTFT p90 target and (when given) the TPOT p90 one."""
    q = r.req
    done = [i for i, f in enumerate(q.finish) if f == f]
    ttft, tpot = latencies(q)
    e2e = [q.finish[i] - q.arrival[i] for i in done]
    wait = [q.admitted[i] - q.arrival[i] for i in done]
    out_tokens = sum(q.outputs[i] for i in done)
    in_tokens = sum(q.inputs[i] for i in done)
    h = r.horizon_s or 1.0
    span = q.arrival[-1] - q.arrival[0] if q.arrival else 0.0
    tpot_ok = math.inf if tpot_slo_s is None else tpot_slo_s
    # A one-token answer has no TPOT: it meets any TPOT target.
    met = sum(1 for i in done if q.first[i] - q.arrival[i] <= ttft_slo_s
              and _tpot(q, i) <= tpot_ok)
    usd = r.node_s / 3600 * r.price_per_node_hour
    fixed_usd = min(r.fixed_node_s, r.node_s) / 3600 * r.price_per_node_hour
    p90 = percentile(ttft, 0.9)
    tpot90 = percentile(tpot, 0.9)
    ttft_met = p90 is not None and p90 <= ttft_slo_s
    tpot_met = tpot_slo_s is None or tpot90 is None or tpot90 <= tpot_slo_s
    kw = r.power_kw_per_node
    kwh = None if kw is None else r.node_s / 3600 * kw
    autoscale = None
    if r.replicas_fixed is None:
        windows = r.cold_window
        missed = [i for i in done if q.first[i] - q.arrival[i] > ttft_slo_s]
        cold = [i for i in missed if any(a <= q.arrival[i] <= b for a, b in windows)]
        autoscale = AutoscaleResult(
            slo_misses=len(missed), slo_misses_during_cold_starts=len(cold),
            scale_outs=len(windows),
            nodes_over_time=tuple((round(t, 1), s, p) for t, s, p in r.timeline))
    rnd = _rnd
    return SimSummary(
        requests=len(q.arrival),
        completed=len(done),
        rejected=sum(q.refused),
        requests_over_max_model_len=sum(q.refused),
        max_model_len=r.max_model_len,
        duration_s=round(span, 3),
        horizon_s=round(h, 3),
        arrival_rate_per_s=round(len(q.arrival) / span if span else 0.0, 4),
        ttft_s=Quantiles(rnd(percentile(ttft, 0.5)), rnd(p90), rnd(percentile(ttft, 0.99))),
        tpot_s=Quantiles(rnd(percentile(tpot, 0.5), 5), rnd(tpot90, 5)),
        e2e_s=Quantiles(rnd(percentile(sorted(e2e), 0.5)), rnd(percentile(sorted(e2e), 0.9))),
        queue_wait_mean_s=rnd(sum(wait) / len(wait) if wait else 0.0),
        mean_in_system=rnd(r.in_system_integral / h),
        mean_time_in_system_s=rnd(sum(e2e) / len(e2e) if e2e else 0.0),
        utilization=round(r.occupied_s / r.replica_s if r.replica_s else 0.0, 4),
        busy_fraction=round(r.busy_s / r.replica_s if r.replica_s else 0.0, 4),
        input_tokens_per_s=round(in_tokens / h, 1),
        output_tokens_per_s=round(out_tokens / h, 1),
        slo=SloResult(ttft_p90_s=ttft_slo_s, tpot_p90_s=tpot_slo_s,
                      met=ttft_met and tpot_met,
                      goodput=round(met / len(q.arrival) if q.arrival else 0.0, 4),
                      ttft_met=ttft_met, tpot_met=tpot_met),
        cost=CostResult(
            node_hours=round(r.node_s / 3600, 3),
            usd=round(usd, 2),
            fixed_usd=round(fixed_usd, 2),
            marginal_usd=round(usd - fixed_usd, 2),
            usd_per_1m_output_tokens=rnd(usd / out_tokens * 1e6 if out_tokens else None, 3),
            usd_per_request=rnd(usd / len(done) if done else None, 5),
            reserved_nodes=r.reserved_nodes,
            fixed_usd_per_hour=round(fixed_usd / h * 3600, 2),
            marginal_usd_per_hour=round((usd - fixed_usd) / h * 3600, 2),
            fixed_usd_per_1m_output_tokens=rnd(
                fixed_usd / out_tokens * 1e6 if out_tokens else None, 3),
            marginal_usd_per_1m_output_tokens=rnd(
                (usd - fixed_usd) / out_tokens * 1e6 if out_tokens else None, 3),
        ),
        energy=EnergyResult(
            power_kw_per_node=kw, kwh=rnd(kwh, 3),
            kwh_per_1m_output_tokens=rnd(kwh / out_tokens * 1e6
                                         if kwh is not None and out_tokens else None, 3)),
        replicas=_replica_stats(r),
        kv_tokens_max=r.max_kv_tokens,
        running_max=r.max_running,
        preemptions=r.preemptions,
        autoscale=autoscale,
        prefix_cache=r.prefix_cache,
        topology=None if r.topology is None else TopologyResult(
            kind=r.topology.kind, prefill_gpus=r.topology.prefill.tp,
            decode_gpus=r.topology.decode.tp,
            kv_link_gbytes_per_s=round(r.topology.link_bytes_per_s / 1e9, 3),
            kv_link=r.topology.link, kv_transfer_s_mean=round(r.kv_transfer_s_mean, 5)),
    )


def prefix_cache_summary(p: PrefixStats | None) -> dict[str, Any]:
    """`simulate --json`'s `prefix_cache`: hit_rate is the share of admitted prompt tokens
    found cached (so not prefilled); 0 with the cache off or a trace without block ids."""
    if p is None:
        return {"enabled": False, "hit_rate": 0.0, "hit_tokens": 0, "prompt_tokens": None,
                "block_tokens": None, "evicted_blocks": 0}
    return {"enabled": True, "hit_rate": round(p.hit_rate, 4), "hit_tokens": p.hit_tokens,
            "prompt_tokens": p.prompt_tokens, "block_tokens": p.block_tokens,
            "evicted_blocks": p.evicted_blocks}


def topology_summary(t: TopologyResult | None) -> dict[str, Any]:
    """`simulate --json`'s `topology`: where prefill and decode run and what the KV
    transfer cost (mean seconds per request, queueing on the link included)."""
    if t is None:
        return {"kind": "aggregated"}
    return {"kind": t.kind, "prefill_gpus": t.prefill_gpus, "decode_gpus": t.decode_gpus,
            "kv_link_gbytes_per_s": t.kv_link_gbytes_per_s, "kv_link": t.kv_link,
            "kv_transfer_s_mean": t.kv_transfer_s_mean}


def json_safe(obj: Any) -> Any:
    """`obj` with every float that is not finite (inf, NaN: JSON has neither) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _replica_stats(r: SimResult) -> tuple[float, float, float]:
    if r.replicas_fixed is not None:
        n = r.replicas_fixed
        return n, n, float(n)
    counts = [s * r.replicas_per_node for _, s, _ in r.timeline]
    mean = replica_seconds(r.timeline, r.replicas_per_node, r.horizon_s) / (r.horizon_s or 1)
    return min(counts), max(counts), round(mean, 2)


def write_requests_csv(r: SimResult, path: str | os.PathLike[str]) -> None:

    q = r.req
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "replica", "input_tokens", "output_tokens", "first_token_s",
                    "finish_s"])

        def f(x: float) -> str:
            return "" if x != x else f"{x:.6f}"

        for i in range(len(q.arrival)):
            w.writerow([f"{q.arrival[i]:.6f}", "" if q.refused[i] else q.replica[i],
                        q.inputs[i], q.outputs[i], f(q.first[i]), f(q.finish[i])])
