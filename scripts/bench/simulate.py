#!/usr/bin/env python3
"""Benchmark of the simulator (issue 11): the whole Azure conversation trace (19,366
requests, ~1 h) on 16 replicas, in process and as the `poolctl simulate` command (also
disaggregated, and a Mooncake sample with prefix caching and sticky routing), and
`poolctl plan --traffic` on the same trace. Wall time and peak memory of the process tree.

    source scripts/env.sh && python scripts/bench/simulate.py [--repeat 3]

Targets (reported, never enforced by tests): simulate <= 2 s, plan --traffic <= 15 s.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, measure  # noqa: E402  (the same process-tree sampler as run.py)

TRACE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
# Mooncake-format, with prefix-cache block ids (200 requests of the published trace).
MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl"


def in_process(repeat: int) -> tuple[float, float]:
    """Seconds to load the trace, and to simulate it on 16 replicas (best of `repeat`)."""
    from poolctl.capacity import run_pool
    from poolctl.config import load_config
    from poolctl.traces import load_trace

    pool = load_config(EXAMPLE).pools[0]
    loads, sims = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tr = load_trace(TRACE)
        t1 = time.perf_counter()
        run_pool(pool, "aws", tr, replicas=16)
        sims.append(time.perf_counter() - t1)
        loads.append(t1 - t0)
    return min(loads), min(sims)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    py = [sys.executable, "-m", "poolctl"]
    base = ["-f", str(EXAMPLE), "--cloud", "aws"]
    load_s, sim_s = in_process(args.repeat)
    print(f"{'load trace (in process)':38} {load_s:6.2f} s")
    print(f"{'simulate 16 replicas (in process)':38} {sim_s:6.2f} s   target 2.0 s")
    cases = {
        "poolctl simulate --replicas 16": (
            py + ["simulate", *base, "--trace", str(TRACE), "--replicas", "16", "--json"], 2.0),
        "poolctl simulate --autoscale": (
            py + ["simulate", *base, "--trace", str(TRACE), "--autoscale", "--json"], None),
        "simulate --topology disagg-node": (
            py + ["simulate", *base, "--trace", str(TRACE), "--replicas", "4", "--topology",
                  "disagg-node", "--split", "4:4", "--json"], 2.0),
        "simulate Mooncake --balancer sticky": (
            py + ["simulate", *base, "--trace", str(MOONCAKE), "--replicas", "16",
                  "--balancer", "sticky", "--json"], 2.0),
        "poolctl plan --traffic": (py + ["plan", *base, "--traffic", str(TRACE), "--json"], 15.0),
        "poolctl plan --traffic --time-scale 4": (
            py + ["plan", *base, "--traffic", str(TRACE), "--time-scale", "4", "--json"], 15.0),
    }
    for name, (argv, target) in cases.items():
        runs, cpus = [], []
        for _ in range(args.repeat):
            # CPU time as well: on a shared machine wall time includes waiting for a core.
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs.append(measure(argv))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        wall = statistics.median(w for w, _ in runs)
        peak = max(p for _, p in runs) / 2**20
        goal = f"   target {target:.1f} s" if target else ""
        print(f"{name:38} {wall:6.2f} s wall {statistics.median(cpus):6.2f} s CPU "
              f"{peak:5.0f} MiB{goal}")


if __name__ == "__main__":
    main()
