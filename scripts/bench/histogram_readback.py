#!/usr/bin/env python3
"""How close percentiles read back from vLLM's histograms come to the requests' own (the
instrument of docs/metrics.md): for request times drawn from shapes a pool sees (TPOT
normal around a step time, TTFT lognormal), the p50 and p90 of the values themselves against
those read back through vLLM's buckets and the node agent's spread (poolctl.histograms, the
awk's twin), beside two other rules for comparison: every bucket spread evenly (Prometheus's
histogram_quantile interpolation) and the largest bucket always narrowed around its mean (the
agent's rule before this bench).

    source scripts/env.sh && python scripts/bench/histogram_readback.py [--requests 3000]
        [--edges fine]

`--edges fine`: every shape through poolctl's edges (histograms.TTFT_FINE_BUCKETS and
TPOT_FINE_BUCKETS, which the boot script gives vLLM 0.32 and later) instead of vLLM's
default ones.

Pure computation, seconds; prints one row a shape and the worst error of each rule. The
first 15 shapes are the ones the agent's rule (narrow only a bucket holding half the
requests) was chosen on; the 10 `held out` ones were drawn after.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence

from poolctl.histograms import (
    TPOT_FAMILY,
    TTFT_FAMILY,
    counts,
    engine_buckets,
    spread,
    weighted_percentile,
)
from poolctl.simulate import percentile


def even(bc: Sequence[float], edges: Sequence[float], total: float, narrow: bool
         ) -> list[tuple[float, float]]:
    """Every bucket spread evenly; with `narrow` the largest always narrowed (the old rule)."""
    n = len(bc)
    lo = [0.0 if i == 0 else float(edges[i - 1]) for i in range(n)]
    hi = [float(edges[i]) if i < len(edges) else lo[i] for i in range(n)]
    held = [i for i in range(n) if bc[i] > 0]
    d = max(held, key=lambda i: (bc[i], -i))
    if narrow:
        m = total - sum(bc[i] * (lo[i] + hi[i]) / 2 for i in held if i != d)
        m = min(max(m / bc[d], lo[d]), hi[d])
        if m <= (lo[d] + hi[d]) / 2:
            hi[d] = 2 * m - lo[d]
        else:
            lo[d] = 2 * m - hi[d]
    k = min(10, 150 // len(held))
    return [(lo[i] + (j + 0.5) * (hi[i] - lo[i]) / w, bc[i] / w) for i in held
            for w in [k if hi[i] > lo[i] else 1] for j in range(w)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--edges", choices=("vllm", "fine"), default="vllm")
    args = ap.parse_args()
    n = args.requests
    edges = engine_buckets(args.edges == "fine")
    tpot, ttft = edges[TPOT_FAMILY], edges[TTFT_FAMILY]
    rng = random.Random(1)
    shapes = [(f"TPOT normal {mu * 1000:.0f} ms sd {sd * 1000:.0f}", tpot,
               [max(0.001, rng.gauss(mu, sd)) for _ in range(n)])
              for mu, sd in ((0.033, 0.002), (0.036, 0.004), (0.030, 0.006), (0.045, 0.005),
                             (0.052, 0.004), (0.040, 0.015), (0.020, 0.003), (0.070, 0.010))]
    shapes += [(f"TTFT lognormal median {med:g} s sigma {s:g}", ttft,
                [rng.lognormvariate(math.log(med), s) for _ in range(n)])
               for med, s in ((0.3, 0.4), (0.45, 0.6), (0.2, 1.0), (1.2, 0.5), (0.15, 0.2),
                              (0.6, 0.15), (3.0, 0.8))]
    # Held out: shapes drawn after the agent's rule was chosen on the ones above (gamma
    # TPOTs, two-mode TPOTs, TTFTs with a queueing tail), its errors as they came.
    rng = random.Random(20261207)
    shapes += [(f"held out: TPOT gamma k {k} theta {th * 1000:g} ms", tpot,
                [rng.gammavariate(k, th) for _ in range(n)])
               for k, th in ((20, 0.002), (8, 0.006), (50, 0.001), (4, 0.012))]
    shapes += [(f"held out: TPOT two modes {a * 1000:g}/{b * 1000:g} ms", tpot,
                [rng.gauss(a if rng.random() < w else b, 0.002) for _ in range(n)])
               for a, b, w in ((0.03, 0.06, 0.7), (0.028, 0.045, 0.5))]
    shapes += [(f"held out: TTFT {base:g} s + queue exp {tail:g} s", ttft,
                [rng.lognormvariate(math.log(base), 0.3)
                 + (rng.expovariate(1 / tail) if rng.random() < 0.4 else 0) for _ in range(n)])
               for base, tail in ((0.2, 0.5), (0.4, 2.0), (0.08, 0.3), (1.5, 4.0))]
    rules = {"agent": lambda c, e, t: spread(c, e, t),
             "even": lambda c, e, t: even(c, e, t, False),
             "always narrowed": lambda c, e, t: even(c, e, t, True)}
    worst = {r: [0.0, 0.0] for r in rules}
    print(f"{'shape':52s} " + " ".join(f"{r + ' p90/p50':>22s}" for r in rules))
    for name, edges, xs in shapes:
        xs.sort()
        t90, t50 = percentile(xs, 0.9) or 0.0, percentile(xs, 0.5) or 0.0
        c = counts(xs, edges)
        cells = []
        for r, rule in rules.items():
            pts = rule(c, edges, sum(xs))
            e90 = (weighted_percentile(pts, 0.9) or 0.0) / t90 - 1
            e50 = (weighted_percentile(pts, 0.5) or 0.0) / t50 - 1
            worst[r] = [max(worst[r][0], abs(e90)), max(worst[r][1], abs(e50))]
            cells.append(f"{e90:+.1%} / {e50:+.1%}")
        print(f"{name:52s} " + " ".join(f"{x:>22s}" for x in cells))
    print(f"{'worst |error|':52s} " + " ".join(
        f"{f'{w[0]:.1%} / {w[1]:.1%}':>22s}" for w in worst.values()))


if __name__ == "__main__":
    main()
