"""`perf fit --pool`: the serving model's factors fitted to what a deployed pool's engines
served, read back from the histograms its nodes publish (status's window), instead of a
benchmark's result file.

The window becomes one open-loop run on one replica (perffit.open_loop): the pool's arrival
rate over the replicas in service, exponential lengths around the observed mean prompt and
output, measured mean TTFT and TPOT (exact from the histograms' sums, where their
percentiles are only as sharp as vLLM's buckets). The same forward model predicts status's line,
so the fitted factors, once written, make the prediction match the pool's measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from poolctl.cloud import Cloud
from poolctl.clouds.base import CloudOps, ReportsServing, ServingWindow
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.perffit import Fit, StepRatio, fit, open_loop, step_ratio, with_fit
from poolctl.servingmodel import replica_model
from poolctl.sizing import plan_pool

# Fewer finished requests than this over the window: percentiles of a handful, not a fit.
MIN_REQUESTS = 200


@dataclass(frozen=True)
class LiveFit:
    """A fit to a pool's own window: what was read, the fit, and the fitted model's steps
    against the current model's at the observed load."""

    window: ServingWindow
    replicas: int  # in service over the window's end
    fit: Fit
    ratio: StepRatio

    def to_json(self) -> dict[str, Any]:
        w = self.window
        return {"window_s": w.window_s, "requests": w.requests, "replicas": self.replicas,
                "requests_per_s": w.requests_per_s,
                "prompt_tokens_mean": w.prompt_tokens / w.requests,
                "output_tokens_mean": w.output_tokens / w.requests,
                "measured": {"ttft_mean_s": w.ttft_mean_s, "tpot_mean_s": w.tpot_mean_s,
                             "ttft_p90_s": w.ttft_p90_s, "tpot_p90_s": w.tpot_p90_s},
                "engine_vs_model": asdict(self.ratio)}


def label(window_s: float) -> str:
    return f"pool (last {window_s / 60:g} min)"


def pool_fit(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, window_s: float
             ) -> LiveFit:
    """Read the pool's window and fit; UsageError when there is too little to fit."""
    if not isinstance(ops, ReportsServing):
        raise UsageError(f"perf fit --pool: {cloud} pools publish no latency histograms "
                         "poolctl can read; fit a benchmark's result file instead")
    group = ops.find_group(cfg, pool)
    w = ops.serving_window(group, window_s, pool.slo.ttft_p90_s, pool.slo.tpot_p90_s)
    where = f"pool {pool.name} ({cloud}), last {window_s / 60:g} min"
    if w is None or w.requests < MIN_REQUESTS:
        got = 0 if w is None else round(w.requests)
        raise UsageError(f"perf fit --pool: {where}: {got} request(s) finished, fewer than "
                         f"the {MIN_REQUESTS} a fit needs; widen --window or wait for traffic")
    stats = {"ttft_mean": w.ttft_mean_s, "tpot_mean": w.tpot_mean_s}
    measured = {k: v for k, v in stats.items() if v is not None and v > 0}
    if not any(k.startswith("ttft") for k in measured) or w.output_tokens <= 0:
        raise OperationFailed(f"perf fit --pool: {where}: the nodes published counters but "
                              "no latency histograms; see docs/metrics.md")
    plan = plan_pool(pool, cloud)
    in_service = sum(1 for n in ops.nodes(group) if n.phase == "in_service")
    replicas = in_service * plan.replicas_per_node
    if replicas <= 0:
        raise UsageError(f"perf fit --pool: {where}: no node in service now; fit while the "
                         "pool serves (the rate per replica needs their number)")
    prompt, output = w.prompt_tokens / w.requests, w.output_tokens / w.requests
    run = open_loop(label(window_s), pool.serving.tensor_parallel,
                    w.requests_per_s / replicas, prompt, output, measured)
    rm = replace(replica_model(pool, cloud), max_num_seqs=pool.serving.max_num_seqs)
    f = fit([rm], [run])
    # the batch a replica decoded: running requests per node over its replicas (Little's
    # law's L, which the nodes publish as it is)
    batch = (w.running or 0.0) / plan.replicas_per_node
    return LiveFit(w, replicas, f, step_ratio(rm, with_fit(rm, f.factors), prompt, output,
                                              batch))
