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
# poolctl's edges, which vLLM 0.32.0 and later take from `--custom-histogram-buckets` and the
# boot script passes: over the range where a family's percentiles matter (interactive
# serving), each edge at most 10 % above the one before it; vLLM's own edges outside it. A
# default bucket there is 50-100 % wide ((25, 50] ms of TPOT, (0.5, 0.75] s of TTFT): a p90
# read back from it can miss by 10-30 %; from these, by under 10 %.
# Mantissas of one decade, each at most 10 % above the one before (9.4 -> 10: 6.4 %).
_MANTISSAS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.2, 2.4, 2.6, 2.8, 3.0,
              3.3, 3.6, 3.9, 4.2, 4.6, 5.0, 5.5, 6.0, 6.6, 7.2, 7.9, 8.6, 9.4)


def _fine(lo: float, hi: float, vllm: tuple[float, ...]) -> tuple[float, ...]:
    """vLLM's edges below `lo` and above `hi`, poolctl's 10 % steps from `lo` to `hi` (an
    edge itself, whatever its mantissa)."""
    steps = sorted({hi, *(round(m * 10.0 ** k, 6) for k in range(-4, 4) for m in _MANTISSAS)})
    return (*(e for e in vllm if e < lo), *(e for e in steps if lo <= e <= hi),
            *(e for e in vllm if e > hi))


# The time_to_first_token family: 50 ms to 5 s (72 edges, vLLM's 22). TTFTs below 50 ms are
# below any SLO worth a pool; above 5 s a pool is failing whatever the edge says.
TTFT_FINE_BUCKETS = _fine(0.05, 5.0, TTFT_BUCKETS)
# The inter_token_latency family (both TPOT histograms): 5 ms to 250 ms (63 edges, vLLM's 19).
TPOT_FINE_BUCKETS = _fine(0.005, 0.25, TPOT_BUCKETS)
# vLLM's names of the two families (vllm/v1/metrics/buckets.py), and their edges: vLLM's own
# and poolctl's.
TTFT_FAMILY, TPOT_FAMILY = "time_to_first_token", "inter_token_latency"
VLLM_BUCKETS = {TTFT_FAMILY: TTFT_BUCKETS, TPOT_FAMILY: TPOT_BUCKETS}
FINE_BUCKETS = {TTFT_FAMILY: TTFT_FINE_BUCKETS, TPOT_FAMILY: TPOT_FINE_BUCKETS}


def engine_buckets(fine: bool) -> dict[str, tuple[float, ...]]:
    """A pool's engines' TTFT and TPOT edges by family: poolctl's when its vLLM takes them."""
    return FINE_BUCKETS if fine else VLLM_BUCKETS
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
