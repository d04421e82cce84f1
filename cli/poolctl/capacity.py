"""Capacity planning over the simulator: a pool's autoscaling as the stacks deploy it, runs
of a pool on a trace, and the replica counts `plan --traffic` recommends."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poolctl.cloud import Cloud
from poolctl.errors import OperationFailed
from poolctl.servingmodel import ReplicaModel, at_tp, replica_model
from poolctl.simulate import (
    AWS_SCALE_IN_COOLDOWN_S,
    Autoscale,
    SimResult,
    SimSummary,
    SimWindow,
    json_safe,
    percentile,
    simulate,
    summary,
)
from poolctl.sizing import PoolPlan, instance_row, nodes_for, plan_pool, reserved_nodes
from poolctl.traces import MAX_REPLICAS, Trace

if TYPE_CHECKING:
    from poolctl.config import Pool, Slo
    from poolctl.servingmodel import Topology
    from poolctl.starts import KindStarts


def measured_start_times(pool: Pool, cloud: Cloud, measured: Mapping[str, KindStarts]
                         ) -> dict[str, float]:
    """Start times by kind from the pool's measured ones (poolctl.starts: power-on to
    serving, p50) plus what the ledger cannot see: joining the load balancer (the plan's
    `register` phase). A running warm node's start is its registration alone (its boot
    happened before demand): measured boots do not change it."""
    register = plan_pool(pool, cloud).start_phases["cold"].get("register", 0.0)
    return {k: round(v.p50_s + register, 1) for k, v in measured.items()
            if k in ("cold", "warm_stopped")}


def autoscale_for(pool: Pool, cloud: Cloud, plan: PoolPlan,
                  warm_replicas: int | None = None,
                  starts: Mapping[str, float] | None = None) -> Autoscale:
    """The pool's scaling as the stacks deploy it, with start times from plan's phases, or
    `starts` by kind ("cold", "warm_stopped", "warm_running": seconds from the decision to
    a serving node) where given (the pool's measured ones: measured_start_times)."""
    starts = starts or {}
    rpn = plan.replicas_per_node
    s, wp = pool.scaling, pool.warm_pool
    warm = plan.nodes.warm if warm_replicas is None else math.ceil(warm_replicas / rpn)
    warm_key = "warm_running" if wp.state == "running" else "warm_stopped"
    return Autoscale(
        replicas_per_node=rpn,
        min_nodes=max(1, plan.nodes.min),
        max_nodes=max(1, plan.nodes.max),
        warm_nodes=warm,
        warm_start_s=starts.get(warm_key, sum(plan.start_phases[warm_key].values())),
        cold_start_s=starts.get("cold", sum(plan.start_phases["cold"].values())),
        queue_target=s.queue_target,
        scale_down_stabilization_s=s.scale_down_stabilization_s,
        # GCP's scale-in control removes one VM per stabilization window; AWS's simple
        # policy one node per cooldown once its alarm fires.
        scale_in_cooldown_s=AWS_SCALE_IN_COOLDOWN_S if cloud == Cloud.aws
        else s.scale_down_stabilization_s,
        warm_running=wp.state == "running",
    )


def run_pool(pool: Pool, cloud: Cloud, trace: Trace, *, replicas: int | None = None,
             autoscale: bool = False, warm_replicas: int | None = None,
             min_replicas: int | None = None, max_replicas: int | None = None,
             balancer: str | None = None, stop_if_p90_over: float | None = None,
             topology: Topology | None = None, windows: tuple[SimWindow, ...] = (),
             run_until_s: float = 0.0, starts: Mapping[str, float] | None = None
             ) -> SimResult:
    """`trace` through the pool on `cloud`: fixed `replicas`, or its autoscaling. The balancer
    is the file's `serving.balancer` unless given; `topology` splits each replica's prefill
    and decode (servingmodel.topology); `windows` are launch windows (`--warm-window`), and
    the autoscaled pool runs to `run_until_s` at least; `starts` as in `autoscale_for`."""
    balancer = balancer or pool.serving.balancer
    plan = plan_pool(pool, cloud)
    m = replica_model(pool, cloud)
    price = plan.price_per_node_hour_usd
    # A disaggregated replica holds prefill and decode GPUs: fewer of them share a node.
    rpn = (plan.replicas_per_node if topology is None
           else plan.gpus_per_node // topology.gpus)
    power = power_kw_per_node(pool, cloud)
    reserved = reserved_nodes(pool, cloud)
    if not autoscale:
        return simulate(trace, m, replicas=replicas, price_per_node_hour=price,
                        replicas_per_node=rpn, balancer=balancer,
                        stop_if_p90_over=stop_if_p90_over, power_kw_per_node=power,
                        prefix_caching=pool.serving.prefix_caching, topology=topology,
                        reserved_nodes=reserved)
    sc = autoscale_for(pool, cloud, plan, warm_replicas, starts)
    sc.replicas_per_node = rpn
    if min_replicas is not None:
        sc.min_nodes = max(1, nodes_for(min_replicas, rpn))
    if max_replicas is not None:
        sc.max_nodes = max(sc.min_nodes, nodes_for(max_replicas, rpn))
    sc.windows = windows
    return simulate(trace, m, scale=sc, price_per_node_hour=price, balancer=balancer,
                    power_kw_per_node=power, prefix_caching=pool.serving.prefix_caching,
                    topology=topology, run_until_s=run_until_s, reserved_nodes=reserved)


def power_kw_per_node(pool: Pool, cloud: Cloud) -> float | None:
    """The catalog's maximum system power of the pool's node type (None: not known)."""
    power = instance_row(pool, cloud).power
    return None if power is None else power.max_kw


def judge(s: SimSummary, slo: Slo) -> bool:
    """The fixed-count test `plan --traffic` sizes by: every p90 target met at or below the
    utilization target."""
    return s.slo.met and s.utilization <= slo.target_utilization


def busiest_window(trace: Trace, width_s: float) -> tuple[float, float]:
    """Start and end of the `width_s` window holding the most arrivals."""
    a, best, start, j = trace.arrivals, -1, 0.0, 0
    for i, t in enumerate(a):
        while a[j] < t - width_s:
            j += 1
        if i - j + 1 > best:
            best, start = i - j + 1, max(0.0, t - width_s)
    return start, start + width_s


PEAK_WINDOW_S = 600  # the stretch of traffic max_replicas is sized for


@dataclass(frozen=True)
class Floor:
    """What the prefill compute floor allows for the served requests of a trace."""

    served: int  # requests within max_model_len
    over_max_model_len: int  # refused, never simulated
    shortest: int  # prompt + output tokens of the shortest request
    p90_prompt: float  # tokens, over the served requests
    p90_prompt_floor_s: float  # the fastest TTFT of a p90 prompt (one idle replica)
    ttft_p90_floor_s: float  # the lowest TTFT p90 any replica count reaches


def monotone_percentile(sorted_xs: list[int], f: Callable[[int], float], q: float
                        ) -> float | None:
    """percentile([f(x) for x in sorted_xs], q) for a non-decreasing f, with two calls of f
    (linear interpolation between closest ranks, as `percentile`)."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    a, b = f(sorted_xs[lo]), f(sorted_xs[hi])
    return a + (b - a) * (pos - lo)


def ttft_floor(m: ReplicaModel, trace: Trace,
               transfer_s: Callable[[int], float] | None = None) -> Floor:
    """The lowest TTFT p90 possible for `trace` on replicas of `m`: the p90 of each served
    request's prefill compute floor. Every TTFT is at least its floor, so the p90 of the TTFTs
    is at least the p90 of the floors; with a replica per request in flight each request
    gets its floor, so it is reached as the replicas grow. `transfer_s`: a disaggregated
    replica's KV hand-off of a prompt, which its TTFT waits for (it grows with the prompt)."""
    limit = m.max_model_len
    lens = [(max(1, i), max(1, o)) for i, o in zip(trace.inputs, trace.outputs, strict=True)]
    prompts = sorted(i for i, o in lens if i + o <= limit)
    p90_prompt = percentile([float(p) for p in prompts], 0.9)
    # The floor grows with the prompt, so the floors sort as the prompts do: their p90 needs
    # only the floors of the two prompts it interpolates between.
    def floor(x: int) -> float:
        return m.ttft_floor_s(x) + (0.0 if transfer_s is None else transfer_s(x))

    p90_floor = monotone_percentile(prompts, floor, 0.9)
    return Floor(
        served=len(prompts), over_max_model_len=len(lens) - len(prompts),
        shortest=min(i + o for i, o in lens),
        p90_prompt=math.nan if p90_prompt is None else p90_prompt,
        p90_prompt_floor_s=math.nan if p90_prompt is None else floor(round(p90_prompt)),
        ttft_p90_floor_s=math.nan if p90_floor is None else p90_floor,
    )


def _unreachable(pool: Pool, cloud: Cloud, m: ReplicaModel, trace: Trace, fl: Floor,
                 gpus_per_node: int, what: str) -> OperationFailed:
    """The line `plan --traffic` ends with when no replica count can meet the TTFT SLO: the
    binding floor with its numbers, and what would help."""
    slo = pool.slo.ttft_p90_s
    need = math.ceil(fl.ttft_p90_floor_s * 100) / 100
    helps = [f"raise slo.ttft_p90_s to at least {need:g} s" + _nearest(pool, cloud, trace, fl)]
    # The pool at a higher TP, built as the file would be (that TP's fitted factors, the
    # weights and the KV cache split over more GPUs): the first that brings the floor under
    # the SLO, or TP 8's.
    tp, better = m.tp, None
    for t in (2, 4, 8):
        if tp < t <= gpus_per_node:
            mt = replica_model(at_tp(pool, t), cloud)
            better = (t, ttft_floor(mt, trace).ttft_p90_floor_s)
            if better[1] <= slo:
                break
    if better is not None and better[1] < fl.ttft_p90_floor_s:
        t, f = better
        helps.append(f"raise serving.tensor_parallel to {t} (its floor: {f:.2f} s"
                     + ("" if f <= slo else ", still over the SLO") + ")")
    over = (f"; {fl.over_max_model_len:,} longer than max_model_len are refused"
            if fl.over_max_model_len else "")
    return OperationFailed(
        f"{pool.name}/{cloud}: no replica count meets slo.ttft_p90_s {slo:g} s on {what}: "
        f"its p90 prompt is {fl.p90_prompt:,.0f} tokens (of {fl.served:,} requests within "
        f"max_model_len{over}), which one idle TP {m.tp} replica prefills in "
        f"{fl.p90_prompt_floor_s:.2f} s at best (the prefill compute floor), so the lowest "
        f"TTFT p90 possible with this configuration is {fl.ttft_p90_floor_s:.2f} s; "
        + " or ".join(helps))


NEAREST_MAX_REPLICAS = 512  # how far the nearest-SLO estimate looks (it only informs)


def _nearest(pool: Pool, cloud: Cloud, trace: Trace, fl: Floor) -> str:
    """", e.g. S s is met with N replicas ($/h)" for the nearest SLO worth asking for: a
    quarter above the floor (rounded up to 10 ms), which finitely many replicas reach; the
    floor itself is reached only with a replica per request in flight."""
    near = math.ceil(fl.ttft_p90_floor_s * 1.25 * 100) / 100
    loose = pool.model_copy(update={"slo": pool.slo.model_copy(update={"ttft_p90_s": near})})
    plan = plan_pool(pool, cloud)

    def probe(n: int) -> SimSummary | None:
        res = run_pool(loose, cloud, trace, replicas=n, stop_if_p90_over=near)
        return None if res.aborted else summary(res, near)

    found = smallest_count(probe, lambda s: judge(s, loose.slo), limit=NEAREST_MAX_REPLICAS)
    if found is None:
        return ""
    nodes = nodes_for(found[0], plan.replicas_per_node)
    return (f" (e.g. {near:g} s is met with {found[0]:,} replicas: {nodes:,} node(s), "
            f"${nodes * plan.price_per_node_hour_usd:,.2f}/h)")


def tpot_floor_s(m: ReplicaModel, trace: Trace) -> float:
    """The lowest TPOT p90 possible: the p90 over served requests of one decode step alone
    at the request's mean context (prompt + half its output). A step's time grows with the
    KV it reads and with every sequence sharing it, so no request's TPOT is below it."""
    limit = m.max_model_len
    contexts = sorted(i + o // 2 for i, o in zip(trace.inputs, trace.outputs, strict=True)
                      if max(1, i) + max(1, o) <= limit and o > 1)
    # A step's time does not fall as its context grows: the p90 step is the p90 context's.
    p90 = monotone_percentile(contexts, lambda c: m.decode_step_s(1, c), 0.9)
    return 0.0 if p90 is None else p90


Probe = Callable[[int], "SimSummary | None"]


def smallest_count(probe: Probe, ok: Callable[[SimSummary], bool], start: int = 1,
                   limit: int = MAX_REPLICAS) -> tuple[int, SimSummary] | None:
    """The smallest n in 1..limit with ok(probe(n)), for a test monotone in n (more
    replicas never hurt): gallop from `start` (a guess) up or down, then bisect. None when
    even `limit` fails. A probe returns None for a run stopped early (a sure failure)."""

    def good(n: int) -> SimSummary | None:
        s = probe(n)
        return s if s is not None and ok(s) else None

    start = max(1, min(start, limit))
    s = good(start)
    if s is not None:
        hi, s_hi, lo, step = start, s, 0, 1
        while hi - step >= 1:
            s = good(hi - step)
            if s is None:
                lo = hi - step
                break
            hi, s_hi, step = hi - step, s, step * 2
    else:
        lo, step = start, 1
        while True:
            if lo >= limit:
                return None
            hi = min(limit, lo + step)
            found = good(hi)
            if found is not None:
                s_hi = found
                break
            lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        s = good(mid)
        if s is not None:
            hi, s_hi = mid, s
        else:
            lo = mid
    return hi, s_hi


@dataclass(frozen=True)
class Recommendation:
    """What `plan --traffic` recommends for a pool (`to_json`: the contract's shape)."""

    min_replicas: int
    max_replicas: int
    warm_replicas: int
    autoscaled: SimSummary  # the pool autoscaling between min and max with the warm pool
    at_min: SimSummary  # min_replicas_needed replicas, fixed
    min_replicas_needed: int
    peak_replicas_needed: int
    peak_window_s: tuple[float, float]
    cost_per_hour_usd_at_min: float
    requests: int
    requests_over_max_model_len: int
    max_model_len: int
    ttft_p90_floor_s: float
    tpot_p90_floor_s: float

    @property
    def predictive_target(self) -> float | None:
        """Requests in flight per replica at the smallest fixed count that meets the SLOs:
        what `scaling.predictive_target` sizes a forecast's nodes for (Little's law: the
        simulated mean in the system over the replicas)."""
        n = self.at_min.mean_in_system
        return None if n is None else max(0.1, round(n / self.min_replicas_needed, 1))

    def to_json(self) -> dict[str, Any]:
        a, f = self.autoscaled, self.at_min
        out: dict[str, Any] = json_safe({
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "warm_replicas": self.warm_replicas,
            "ttft_p90_s": a.ttft_s.p90,
            "utilization": f.utilization,
            "usd_per_1m_output_tokens": a.cost.usd_per_1m_output_tokens,
            "min_replicas_needed": self.min_replicas_needed,
            "peak_replicas_needed": self.peak_replicas_needed,
            "peak_window_s": [round(self.peak_window_s[0], 1), round(self.peak_window_s[1], 1)],
            "slo_met_autoscaled": a.slo.met,
            "cost_per_hour_usd_at_min": self.cost_per_hour_usd_at_min,
            "fixed_count_at_min": {"ttft_p90_s": f.ttft_s.p90,
                                   "usd_per_1m_output_tokens": f.cost.usd_per_1m_output_tokens,
                                   "tpot_p90_s": f.tpot_s.p90, "goodput": f.slo.goodput},
            "requests": self.requests,
            "requests_over_max_model_len": self.requests_over_max_model_len,
            "max_model_len": self.max_model_len,
            "ttft_p90_floor_s": round(self.ttft_p90_floor_s, 4),
            "tpot_p90_s": a.tpot_s.p90,
            "tpot_p90_floor_s": round(self.tpot_p90_floor_s, 5),
            "goodput": a.slo.goodput,
            "kwh_per_1m_output_tokens": a.energy.kwh_per_1m_output_tokens,
            "predictive_target": self.predictive_target,
        })
        return out


def too_long(pool: Pool, cloud: Cloud, trace: Trace, fl: Floor, what: str) -> OperationFailed:
    """The line for a trace whose every request is longer than max_model_len."""
    return OperationFailed(
        f"{pool.name}/{cloud}: every one of the {len(trace):,} requests in {what} "
        f"is longer than serving.max_model_len {pool.serving.max_model_len:,} (prompt + "
        f"output): nothing to size for; raise max_model_len (the shortest request has "
        f"{fl.shortest:,} tokens) or give a trace of shorter requests")


def check_reachable(pool: Pool, cloud: Cloud, trace: Trace, what: str | None = None
                    ) -> tuple[ReplicaModel, Floor, float]:
    """The floors of `trace` on the pool's replica; an OperationFailed naming the binding one
    when no replica count can meet the SLOs (or every request is too long)."""
    m = replica_model(pool, cloud)
    slo = pool.slo
    fl = ttft_floor(m, trace)
    what = what or trace.source
    if not fl.served:
        raise too_long(pool, cloud, trace, fl, what)
    if fl.ttft_p90_floor_s > slo.ttft_p90_s:
        raise _unreachable(pool, cloud, m, trace, fl, plan_pool(pool, cloud).gpus_per_node,
                           what)
    tf = tpot_floor_s(m, trace)
    if slo.tpot_p90_s is not None and tf > slo.tpot_p90_s:
        raise OperationFailed(
            f"{pool.name}/{cloud}: no replica count meets slo.tpot_p90_s {slo.tpot_p90_s:g} s "
            f"on {what}: one TP {m.tp} replica decoding a single sequence takes {tf:.4f} s a "
            f"token at the p90 context (the HBM floor: the weight shard and KV streamed each "
            f"step); raise slo.tpot_p90_s to at least {math.ceil(tf * 1000) / 1000:g} s or "
            "raise serving.tensor_parallel")
    return m, fl, tf


def recommend(pool: Pool, cloud: Cloud, trace: Trace, start_replicas: int = 1,
              starts: Mapping[str, float] | None = None) -> Recommendation:
    """Smallest replica count meeting the SLOs (TTFT and TPOT p90) at or below the
    utilization target; a max for the busiest window; the smallest warm pool keeping the SLOs
    under autoscaling. An SLO no replica count can meet (the prefill compute floor, the HBM
    floor of a decode step), or a trace whose every request is longer than max_model_len, is
    an OperationFailed naming the floor. `starts` as in `autoscale_for`."""
    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    slo = pool.slo
    m, fl, tf = check_reachable(pool, cloud, trace)

    def fixed(tr: Trace) -> Probe:
        def probe(n: int) -> SimSummary | None:
            res = run_pool(pool, cloud, tr, replicas=n, stop_if_p90_over=slo.ttft_p90_s)
            return None if res.aborted else summary(res, slo.ttft_p90_s, slo.tpot_p90_s)
        return probe

    def smallest(ok: Callable[[SimSummary], bool], tr: Trace, what: str, start: int = 1
                 ) -> tuple[int, SimSummary]:
        found = smallest_count(fixed(tr), ok, start)
        if found is None:
            raise OperationFailed(
                f"{pool.name}/{cloud}: no replica count up to {MAX_REPLICAS:,} "
                f"meets the SLOs (slo.ttft_p90_s {slo.ttft_p90_s:g} s"
                + (f", slo.tpot_p90_s {slo.tpot_p90_s:g} s" if slo.tpot_p90_s else "")
                + f") at utilization <= {slo.target_utilization:g} on {what} (the prefill "
                f"compute floor allows a TTFT p90 of {fl.ttft_p90_floor_s:.2f} s); raise the "
                "SLOs or serving.tensor_parallel")
        return found

    # (`start_replicas`: a guess of the answer, e.g. the search's; the answer is the same)
    need_min, s_min = smallest(lambda s: judge(s, slo), trace, trace.source, start_replicas)
    w0, w1 = busiest_window(trace, PEAK_WINDOW_S)
    peak = trace.window(w0, w1)
    need_peak = need_min
    if len(peak):
        what = f"the busiest {PEAK_WINDOW_S // 60} minutes of {trace.source} ({w0:.0f}-{w1:.0f} s)"
        fl_peak = ttft_floor(m, peak)
        if fl_peak.served:
            check_reachable(pool, cloud, peak, what)
            need_peak, _ = smallest(lambda s: s.slo.met, peak, what)
    min_r = nodes_for(need_min, rpn) * rpn
    max_r = max(min_r, nodes_for(need_peak, rpn) * rpn)
    warm_r = 0
    s_auto: SimSummary | None = None
    for warm_nodes in range(0, (max_r - min_r) // rpn + 1):
        warm_r = warm_nodes * rpn
        s_auto = summary(run_pool(pool, cloud, trace, autoscale=True, warm_replicas=warm_r,
                                  min_replicas=min_r, max_replicas=max_r, starts=starts),
                         slo.ttft_p90_s, slo.tpot_p90_s)
        if s_auto.slo.met:
            break
    assert s_auto is not None  # max_r >= min_r: the loop above runs at least once
    return Recommendation(
        min_replicas=min_r, max_replicas=max_r, warm_replicas=warm_r, autoscaled=s_auto,
        at_min=s_min, min_replicas_needed=need_min, peak_replicas_needed=need_peak,
        peak_window_s=(w0, w1),
        cost_per_hour_usd_at_min=round(nodes_for(min_r, rpn) * plan.price_per_node_hour_usd, 2),
        requests=len(trace), requests_over_max_model_len=fl.over_max_model_len,
        max_model_len=m.max_model_len, ttft_p90_floor_s=fl.ttft_p90_floor_s,
        tpot_p90_floor_s=tf,
    )
