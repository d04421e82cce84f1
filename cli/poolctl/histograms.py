"""vLLM's latency histograms as a pool reads them back: the instrument between the engines'
per-request times and the percentiles `status` shows.

An engine observes each request's TTFT and TPOT into Prometheus histograms with fixed bucket
edges (below, from vLLM's source); the node agent (boot/_node_lib.sh.j2 `latency_metrics`)
turns each interval's bucket counts and sum into value/count arrays (`spread`, this module's
twin of the agent's awk, kept equal by tests/unit/test_boot_runtime.py); CloudWatch takes
percentiles over them (`weighted_percentile`: nearest rank over weights, the sandbox's rule).

Within a bucket the histogram cannot see: TPOTs all between 30 and 40 ms land in one bucket
(25, 50] ms, read back as spread over the part of it their mean allows. A prediction compared
with what the pool read back (status's drift, `perf fit --pool`) goes through the same
instrument (`read_back`), so that the comparison measures the model, not the buckets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# vLLM's default buckets, the same from v0.11 (vllm/v1/metrics/loggers.py) to v0.34
# (vllm/v1/metrics/buckets.py): time to first token, time per output token (the per-request
# mean: vllm:request_time_per_output_token_seconds, the inter_token_latency family), end to end.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# poolctl's buckets for the inter_token_latency family (both TPOT histograms), which vLLM
# 0.32.0 and later take from `--custom-histogram-buckets` and the boot script passes: each
# edge at most 10 % above the one before it from 5 ms to 250 ms (TPOTs of interactive
# serving), then vLLM's own edges. The default (25, 50] ms bucket is 100 % wide: a TPOT p90
# read back from it can miss by 30 % and more; from these, by under 10 %. 63 edges: 44 more
# series per histogram and engine than vLLM's 19.
TPOT_FINE_BUCKETS = (
    0.005, 0.0055, 0.006, 0.0066, 0.0072, 0.0079, 0.0086, 0.0094, 0.01, 0.011, 0.012, 0.013,
    0.014, 0.015, 0.016, 0.017, 0.018, 0.019, 0.02, 0.022, 0.024, 0.026, 0.028, 0.03, 0.033,
    0.036, 0.039, 0.042, 0.046, 0.05, 0.055, 0.06, 0.066, 0.072, 0.079, 0.086, 0.094, 0.1,
    0.11, 0.12, 0.13, 0.14, 0.15, 0.16, 0.17, 0.18, 0.19, 0.2, 0.22, 0.24, 0.25,
    *TPOT_BUCKETS[TPOT_BUCKETS.index(0.3):])
FINE_FAMILY = "inter_token_latency"  # vLLM's name of the family (vllm/v1/metrics/buckets.py)


def tpot_buckets(fine: bool) -> tuple[float, ...]:
    """The TPOT edges of a pool's engines: poolctl's when its vLLM takes them."""
    return TPOT_FINE_BUCKETS if fine else TPOT_BUCKETS
MAX_VALUES = 150  # CloudWatch's limit on one datum's Values
MAX_PER_BUCKET = 10


def counts(values: Iterable[float], edges: Sequence[float]) -> list[float]:
    """Requests per bucket (lo, hi] of `edges`, and past the last edge (+Inf) at the end."""
    out = [0.0] * (len(edges) + 1)
    for v in values:
        i = 0
        while i < len(edges) and v > edges[i]:
            i += 1
        out[i] += 1
    return out


def spread(bucket_counts: Sequence[float], edges: Sequence[float], total: float
           ) -> list[tuple[float, float]]:
    """(value, count) points of one histogram interval, as the node agent publishes them:
    each bucket (lo, hi] spread evenly over up to MAX_PER_BUCKET points (MAX_VALUES in all);
    the bucket holding the most, when it holds half of them or more, is first narrowed
    around its mean, which `total` (the histogram's sum) gives once the others are taken at
    their middles. (When the requests spread over several buckets, the others' middles are
    too rough for that: it moved a lognormal's p50 by -40 % in scripts/bench/
    histogram_readback.py.) The +Inf bucket is a point at the last edge."""
    n = len(bucket_counts)
    lo = [0.0 if i == 0 else float(edges[i - 1]) for i in range(n)]
    hi = [float(edges[i]) if i < len(edges) else lo[i] for i in range(n)]
    held = [i for i in range(n) if bucket_counts[i] > 0]
    if not held:
        return []
    d = held[0]
    for i in held:  # the first of the largest, as the agent's strict '>' picks it
        if bucket_counts[i] > bucket_counts[d]:
            d = i
    if 2 * bucket_counts[d] >= sum(bucket_counts):
        m = total
        for i in held:
            if i != d:
                m -= bucket_counts[i] * (lo[i] + hi[i]) / 2
        m = min(max(m / bucket_counts[d], lo[d]), hi[d])
        if m <= (lo[d] + hi[d]) / 2:
            hi[d] = 2 * m - lo[d]
        else:
            lo[d] = 2 * m - hi[d]
    k = min(MAX_PER_BUCKET, MAX_VALUES // len(held))
    out: list[tuple[float, float]] = []
    for i in held:
        w = k if hi[i] > lo[i] else 1
        for j in range(w):
            out.append((float(f"{lo[i] + (j + 0.5) * (hi[i] - lo[i]) / w:.6g}"),
                        float(f"{bucket_counts[i] / w:.6g}")))
    return out


def weighted_percentile(points: Iterable[tuple[float, float]], q: float) -> float | None:
    """The smallest value whose cumulative count reaches q (0-1) of the total (nearest rank
    over weights); None when the total is 0."""
    pts = sorted((v, c) for v, c in points if c > 0)
    total = sum(c for _, c in pts)
    if total <= 0:
        return None
    need = q * total
    run = 0.0
    for v, c in pts:
        run += c
        if run >= need - 1e-9 * total:
            return v
    return pts[-1][0]


def percent_rank(points: Iterable[tuple[float, float]], lo: float | None,
                 hi: float | None) -> float | None:
    """The percentage of the total count with lo < value <= hi (a bound None: open);
    CloudWatch's `PR(lo:hi)`. None when the total is 0."""
    pts = [(v, c) for v, c in points if c > 0]
    total = sum(c for _, c in pts)
    if total <= 0:
        return None
    inside = sum(c for v, c in pts if (lo is None or v > lo) and (hi is None or v <= hi))
    return 100.0 * inside / total


def read_back(values: Sequence[float], edges: Sequence[float], q: float) -> float | None:
    """The q-quantile of `values` as a pool reports it: observed into the histogram, spread
    by the agent, read back by percentile (one interval)."""
    if not values:
        return None
    return weighted_percentile(spread(counts(values, edges), edges, sum(values)), q)
