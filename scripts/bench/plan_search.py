#!/usr/bin/env python3
"""Benchmark of the configuration search (issue 20): `poolctl plan --traffic --search` on the
whole Azure conversation trace (19,366 requests, ~1 h) for the example pool on AWS. Wall
time, CPU time and peak memory of the process tree (workers included), for 1 and 2 worker
processes; then what the search chose against the file's own configuration.

    source scripts/env.sh && python scripts/bench/plan_search.py [--repeat 1] [--workers 1,2]

Target (reported, never enforced by tests): <= 30 s wall on 2 cores (bar: 60 s). On a
shared machine wall time includes waiting for a core: the CPU time says what the search
itself costs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, tree_rss  # noqa: E402  (the same process-tree sampler as run.py)

TRACE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
TARGET_S, BAR_S = 30.0, 60.0


def run(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds, peak RSS bytes of the tree, and stdout of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.PIPE)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - start
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            raise SystemExit(f"bench: {' '.join(argv)} failed ({proc.returncode}): {err[-800:]}")
        out.seek(0)
        text = out.read().decode()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, peak, text


def describe(c: dict[str, object]) -> str:
    return (f"{c['nodes']} x {c['instance_type']} TP {c['tensor_parallel']} "
            f"(seqs {c['max_num_seqs']}, step {c['max_num_batched_tokens']}): "
            f"${c['cost_per_hour_usd']}/h, ${c['usd_per_1m_output_tokens']} per 1M output "
            f"tokens, TTFT p90 {c['ttft_s']['p90']} s, TPOT p90 {c['tpot_s']['p90']} s, "  # type: ignore[index]
            f"{c['kwh_per_1m_output_tokens']} kWh per 1M output tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    args = ap.parse_args()
    argv = [sys.executable, "-m", "poolctl", "plan", "-f", str(EXAMPLE), "--cloud", "aws",
            "--traffic", str(TRACE), "--search", "--json"]
    last = ""
    for w in (int(x) for x in args.workers.split(",")):
        runs = [run([*argv, "--workers", str(w)]) for _ in range(args.repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        peak = max(r[2] for r in runs) / 2**20
        last = runs[-1][3]
        print(f"plan --search --workers {w}: {wall:6.1f} s wall {cpu:6.1f} s CPU "
              f"{peak:5.0f} MiB peak   target {TARGET_S:.0f} s (bar {BAR_S:.0f} s)")
    search = json.loads(last)["pools"][0]["search"]
    print(f"configurations: {search['configurations']} (refused by rules: "
          f"{search['refused_by_rules']}), candidates simulated: {len(search['candidates'])}, "
          f"on the front: {len(search['front'])}")
    print("chosen: " + describe(search["chosen"]))
    if search["file"] is not None:
        print("file:   " + describe(search["file"]))


if __name__ == "__main__":
    main()
