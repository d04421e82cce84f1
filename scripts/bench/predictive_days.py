#!/usr/bin/env python3
"""Several days of the Azure trace through a pool scaled three ways (docs/planning.md,
"Several days of traffic"): reactive, with its warm pool, predictive. The pool: Llama-3.1-405B
FP8 on p5.48xlarge, one replica of TP 8 per node, 1 to 8 replicas, 2 stopped warm;
predictive_target 17 (what `plan --traffic` prints for the trace).

    source scripts/env.sh && python scripts/bench/predictive_days.py [--days 3] [--trough 0.2]

About 20 s per replay per 300,000 requests on this machine; three days are 836,810 requests.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.predictive import compare_scaling
from poolctl.traces import daily, load_trace

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "scripts" / "bench" / "pools" / "predictive-405b.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--trough", type=float, default=0.2)
    args = ap.parse_args()
    pool = load_config(POOL).pools[0]
    trace = daily(load_trace(ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"),
                  args.days, trough=args.trough)
    t0 = time.monotonic()
    runs = compare_scaling(pool, Cloud.aws, trace, warm_replicas=2)
    print(f"{len(trace):,} requests over {args.days} day(s), {time.monotonic() - t0:.0f} s")
    print(f"{'scaling':32} {'SLO min lost':>13} {'after day 1':>12} {'cost':>12} {'goodput':>8}")
    for r in runs:
        print(f"{r.name:32} {r.slo_minutes_lost:>13,} {r.lost_after_day_1:>12,} "
              f"${r.cost_usd:>11,.2f} {r.goodput:>8.1%}")


if __name__ == "__main__":
    main()
