"""Status (`poolctl status`): nodes, rollout, queue and what the engines served lately
(latency against the SLOs, requests, tokens, KV cache) of a deployed pool.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from poolctl.capacity import run_pool
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    ForecastsLoad,
    LoadForecast,
    NodeState,
    PoolStatus,
    PublishesQueueMetric,
    ReportsBootFailures,
    ReportsLaunchFailures,
    ReportsServing,
    RunsBlockWindows,
    SchedulesWarmWindows,
    SchedulesWindows,
    ServingPrediction,
    ServingWindow,
)
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract_aws
from poolctl.histograms import TPOT_FAMILY, TTFT_FAMILY, engine_buckets, read_back
from poolctl.predictive import predictive
from poolctl.runtime.ledger import pool_ledger
from poolctl.runtime.purchases import bought_blocks, unanswered
from poolctl.runtime.records import annotate_rollout, load_record
from poolctl.runtime.rollout import return_surge
from poolctl.simulate import latencies
from poolctl.sizing import capacity_block, plan_pool, reserved_nodes
from poolctl.traces import MAX_REQUESTS, MAX_TOKENS, synthetic
from poolctl.vllm_releases import fine_edges

# ---------------------------------------------------------------------------------------
# Status


DEFAULT_WINDOW_S = 600.0  # `status --window`: what the engines served over the last 10 min
# Measured p90 this far above the serving model's prediction: `status` says the model is
# optimistic for this pool and names the fix.
DRIFT_WARN = 0.25
# Requests waited this much per replica on average over the window: latency measured
# queueing on the pool's capacity (and its scaling), not the model; no drift is judged.
DRIFT_QUEUE_MAX = 0.5
PREDICT_MIN_S = 600.0  # simulate at least this much of the observed load (steady state)
# The predictive policy's forecast `status` shows: the last hours (what it forecast for them,
# beside what happened) and the next.
FORECAST_BACK_H = 6
FORECAST_AHEAD_H = 2


def predict(pool: Pool, cloud: Cloud, w: ServingWindow, replicas: int
            ) -> ServingPrediction | None:
    """The serving model on the window's load: Poisson arrivals at its rate, exponential
    lengths around its mean prompt and output, on `replicas` (those in service); its p90s
    read through vLLM's histograms as the pool's own are (histograms.read_back), so that
    the drift is the model's, not the buckets'."""
    if w.requests <= 0 or replicas <= 0 or w.output_tokens <= 0:
        return None
    prompt = min(max(w.prompt_tokens / w.requests, 1.0), float(MAX_TOKENS))
    output = min(max(w.output_tokens / w.requests, 1.0), float(MAX_TOKENS))
    span = max(w.window_s, PREDICT_MIN_S)
    rate = min(w.requests_per_s, MAX_REQUESTS / span)
    res = run_pool(pool, cloud, synthetic(rate, span, 0, prompt, output), replicas=replicas)
    ttft, tpot = latencies(res.req)
    edges = engine_buckets(fine_edges(pool.serving.image))
    return ServingPrediction(replicas, read_back(ttft, edges[TTFT_FAMILY], 0.9),
                             read_back(tpot, edges[TPOT_FAMILY], 0.9))


def status(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
           window_s: float = DEFAULT_WINDOW_S) -> PoolStatus:
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    nodes = ops.nodes(group)
    rollout = ops.rollout_state(group)
    return_surge(cfg, pool, cloud, ops, group, rollout)
    queue = ops.queue_per_replica(group) if isinstance(ops, PublishesQueueMetric) else None
    boot_failure = ops.boot_failure(group) if isinstance(ops, ReportsBootFailures) else None
    serving = (ops.serving_window(group, window_s, pool.slo.ttft_p90_s, pool.slo.tpot_p90_s)
               if isinstance(ops, ReportsServing) else None)
    in_service = sum(1 for n in nodes if n.phase == "in_service")
    ledger = pool_ledger(cfg, pool, cloud, ops, (group, nodes))
    predicted = (predict(pool, cloud, serving, in_service * plan.replicas_per_node)
                 if serving is not None else None)
    if rollout is not None:
        annotate_rollout(rollout, load_record(cfg, pool, cloud))
    placement = pool.placement(cloud)
    assert placement is not None  # a target of the pool's own placements
    failures = (ops.launch_failures(group, placement.type_name)
                if isinstance(ops, ReportsLaunchFailures) else [])
    windows, kept = (ops.scheduled_windows(group) if isinstance(ops, SchedulesWindows)
                     else ([], None))
    now = datetime.now(UTC)
    warm_windows, warm_kept = (ops.scheduled_warm_windows(group)
                               if isinstance(ops, SchedulesWarmWindows) and plan.nodes.warm
                               else ([], None))
    bws = [bw for bw in (ops.block_windows(cfg, pool) if isinstance(ops, RunsBlockWindows)
                         else []) if bw.window.end > now or bw.in_service]
    blocks = bought_blocks(cfg, pool, ops)
    used = {bw.block for bw in bws}
    known = ({b.window or "" for b in blocks} | {w.id for w in windows}
             | {w.id for w in warm_windows} | {bw.window.id for bw in bws})
    ahead = predictive(pool, plan) if cloud == Cloud.aws else None
    forecast = (ops.load_forecast(group, contract_aws.predictive_policy(group.name),
                                  FORECAST_BACK_H, FORECAST_AHEAD_H)
                if ahead is not None and isinstance(ops, ForecastsLoad) else None)
    return PoolStatus(pool=pool.name, cloud=cloud, group=group,
                      replicas_per_node=plan.replicas_per_node, nodes=nodes, rollout=rollout,
                      queue_per_replica=queue, capacity_failures=failures,
                      boot_failure=boot_failure, serving=serving, predicted=predicted,
                      reserved_nodes=reserved_nodes(pool, cloud),
                      capacity_block=capacity_block(pool, cloud),
                      windows=[w for w in windows if w.end > now], windows_kept_min=kept,
                      block_windows=bws,
                      warm_windows=[w for w in warm_windows if w.end > now],
                      warm_windows_kept=warm_kept,
                      unused_blocks=[b for b in blocks if b.id not in used],
                      pending_purchases=unanswered(cfg, pool, cloud, known),
                      price_per_node_hour_usd=plan.price_per_node_hour_usd,
                      starts=ledger.starts if ledger is not None else {},
                      forecast=forecast,
                      forecast_buffer_s=ahead.buffer_s if ahead is not None else None)


def forecast_error(fc: LoadForecast) -> tuple[float, int] | None:
    """How far the forecast load was from what happened: mean absolute error over the
    mean load, and the hours that had both; None when no hour had both."""
    pairs = [(h.load, h.actual_load) for h in fc.hours
             if h.load is not None and h.actual_load is not None]
    total = sum(a for _, a in pairs)
    if not pairs or total <= 0:
        return None
    return sum(abs(f - a) for f, a in pairs) / total, len(pairs)



def node_json(n: NodeState) -> dict[str, Any]:
    return asdict(n)
