"""Capacity planning over the simulator: a pool's autoscaling as the stacks deploy it, runs
of a pool on a trace, and the replica counts `plan --traffic` recommends."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from poolctl.cloud import Cloud
from poolctl.simulate import (
    AWS_SCALE_IN_COOLDOWN_S,
    Autoscale,
    SimResult,
    simulate,
    summary,
)
from poolctl.traces import Trace

if TYPE_CHECKING:
    from poolctl.config import Pool
    from poolctl.sizing import PoolPlan


def autoscale_for(pool: Pool, cloud: Cloud, plan: PoolPlan,
                  warm_replicas: int | None = None) -> Autoscale:
    """The pool's scaling as the stacks deploy it, with start times from plan's phases."""
    rpn = plan.replicas_per_node
    s, wp = pool.scaling, pool.warm_pool
    warm = plan.nodes["warm"] if warm_replicas is None else math.ceil(warm_replicas / rpn)
    warm_key = "warm_running" if wp.state == "running" else "warm_stopped"
    return Autoscale(
        replicas_per_node=rpn,
        min_nodes=max(1, plan.nodes["min"]),
        max_nodes=max(1, plan.nodes["max"]),
        warm_nodes=warm,
        warm_start_s=sum(plan.start_phases[warm_key].values()),
        cold_start_s=sum(plan.start_phases["cold"].values()),
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
             balancer: str = "lor", stop_if_p90_over: float | None = None) -> SimResult:
    from poolctl.servingmodel import replica_model
    from poolctl.sizing import nodes_for, plan_pool

    plan = plan_pool(pool, cloud)
    m = replica_model(pool, cloud)
    price = plan.price_per_node_hour_usd
    rpn = plan.replicas_per_node
    if not autoscale:
        return simulate(trace, m, replicas=replicas, price_per_node_hour=price,
                        replicas_per_node=rpn, balancer=balancer,
                        stop_if_p90_over=stop_if_p90_over)
    sc = autoscale_for(pool, cloud, plan, warm_replicas)
    if min_replicas is not None:
        sc.min_nodes = max(1, nodes_for(min_replicas, rpn))
    if max_replicas is not None:
        sc.max_nodes = max(sc.min_nodes, nodes_for(max_replicas, rpn))
    return simulate(trace, m, scale=sc, price_per_node_hour=price, balancer=balancer)


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


def recommend(pool: Pool, cloud: Cloud, trace: Trace) -> dict[str, Any]:
    """Smallest replica count meeting the TTFT SLO at or below the utilization target; a
    max for the busiest window; the smallest warm pool keeping the SLO under autoscaling."""
    from poolctl.sizing import nodes_for, plan_pool

    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    slo = pool.slo

    def fixed(n: int, tr: Trace) -> dict[str, Any]:
        res = run_pool(pool, cloud, tr, replicas=n, stop_if_p90_over=slo.ttft_p90_s)
        if res.aborted:
            return {"slo": {"met": False}, "utilization": math.inf}
        return summary(res, slo.ttft_p90_s)

    def ok_min(s: dict[str, Any]) -> bool:
        met: bool = s["slo"]["met"]
        utilization: float = s["utilization"]
        return met and utilization <= slo.target_utilization

    def smallest(pred: Callable[[dict[str, Any]], bool], tr: Trace
                 ) -> tuple[int, dict[str, Any]]:
        # Doubling, then bisection: the test of n replicas is monotone in n.
        hi, s_hi = 1, fixed(1, tr)
        while not pred(s_hi):
            if hi >= 4096:
                raise ValueError("no replica count up to 4096 meets the SLO")
            hi *= 2
            s_hi = fixed(hi, tr)
        lo = hi // 2  # fails (or 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            s_mid = fixed(mid, tr)
            if pred(s_mid):
                hi, s_hi = mid, s_mid
            else:
                lo = mid
        return hi, s_hi

    need_min, s_min = smallest(ok_min, trace)
    w0, w1 = busiest_window(trace, PEAK_WINDOW_S)
    peak = trace.window(w0, w1)
    need_peak, _ = smallest(lambda s: s["slo"]["met"], peak) if len(peak) else (need_min, None)
    min_r = nodes_for(need_min, rpn) * rpn
    max_r = max(min_r, nodes_for(need_peak, rpn) * rpn)
    warm_r = 0
    s_auto: dict[str, Any] | None = None
    for warm_nodes in range(0, (max_r - min_r) // rpn + 1):
        warm_r = warm_nodes * rpn
        s_auto = summary(run_pool(pool, cloud, trace, autoscale=True, warm_replicas=warm_r,
                                  min_replicas=min_r, max_replicas=max_r), slo.ttft_p90_s)
        if s_auto["slo"]["met"]:
            break
    assert s_auto is not None  # max_r >= min_r: the loop above runs at least once
    return {
        "min_replicas": min_r,
        "max_replicas": max_r,
        "warm_replicas": warm_r,
        "ttft_p90_s": s_auto["ttft_s"]["p90"],
        "utilization": s_min["utilization"],
        "usd_per_1m_output_tokens": s_auto["cost"]["usd_per_1m_output_tokens"],
        "min_replicas_needed": need_min,
        "peak_replicas_needed": need_peak,
        "peak_window_s": [round(w0, 1), round(w1, 1)],
        "slo_met_autoscaled": s_auto["slo"]["met"],
        "cost_per_hour_usd_at_min": round(nodes_for(min_r, rpn) * plan.price_per_node_hour_usd,
                                          2),
        "fixed_count_at_min": {"ttft_p90_s": s_min["ttft_s"]["p90"],
                               "usd_per_1m_output_tokens":
                                   s_min["cost"]["usd_per_1m_output_tokens"]},
    }
