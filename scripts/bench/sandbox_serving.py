#!/usr/bin/env python3
"""Benchmark of the serving sandbox (issue 34): a pool of 8 serving nodes (the example, 32
replicas: min = max) deployed on `sandbox start --serve` at the default speed, then an hour
of the Azure conversation trace rehearsed through its load balancer (`replay --sandbox
--compare`). Reports the wall time to 8 nodes serving, the peak memory of the sandbox's
process tree (moto, every node's boot script and engine, HAProxy) with 8 nodes serving and
through the replay, the replay's wall time, measured beside predicted, and `status`'s wall
time with the hour's live metrics (and what it reads back).

    source scripts/env.sh && python scripts/bench/sandbox_serving.py [--nodes 8] [--duration 1h]

Runs in its own POOLCTL_HOME (a temporary folder) and stops its sandbox at the end; only
loopback traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, tree_rss  # noqa: E402  (the same process-tree sampler as run.py)

EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
TRACE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"


def poolctl(home: Path, *args: str, timeout: float = 3600) -> str:
    env = {**os.environ, "POOLCTL_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "poolctl", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"bench: poolctl {' '.join(args)} failed: {r.stderr[-1500:]}")
    return r.stdout


class Peak:
    """The peak RSS of a process tree, sampled every 0.2 s on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def serving(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{url}/_poolctl/serving", timeout=10) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--duration", default="1h", help="the slice of the trace to rehearse")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="poolctl-bench-") as tmp:
        home = Path(tmp)
        out = poolctl(home, "sandbox", "start", "--serve", "--json")
        url = json.loads(out)["endpoint"]
        state = json.loads((home / "sandbox" / "state.json").read_text())
        peak = Peak(int(state["pid"]))
        try:
            text = EXAMPLE.read_text()
            replicas = 4 * args.nodes
            text = re.sub(r"min_replicas: \d+", f"min_replicas: {replicas}", text)
            text = re.sub(r"max_replicas: \d+", f"max_replicas: {replicas}", text)
            text = re.sub(r"(warm_pool:\n\s+replicas:) \d+", r"\1 0", text)
            cfg = home / "poolctl.yaml"
            cfg.write_text(text)
            t0 = time.monotonic()
            poolctl(home, "deploy", "--sandbox", "--auto-approve", "-f", str(cfg), "--cloud",
                    "aws", "--out", str(home / "cdktf.out"))
            deployed = time.monotonic() - t0
            while True:
                rep = serving(url)
                up = sum(1 for lb in rep["load_balancers"] for h in lb["Health"].values()
                         for st in h.values() if st == "UP")
                if up >= args.nodes:
                    break
                if time.monotonic() - t0 > 1800:
                    raise SystemExit(f"bench: {up} of {args.nodes} nodes serving after 30 min")
                time.sleep(0.5)
            to_serving = time.monotonic() - t0
            at_8 = peak.peak
            t1 = time.monotonic()
            out = poolctl(home, "replay", "--sandbox", "-f", str(cfg), "--cloud", "aws",
                          "--trace", str(TRACE), "--duration", args.duration, "--compare",
                          "--json")
            replay_wall = time.monotonic() - t1
            r = json.loads(out)
            # status with live metrics: the window covers the replay (pool minutes)
            walls = []
            for _ in range(3):
                t2 = time.monotonic()
                st = poolctl(home, "status", "--sandbox", "-f", str(cfg), "--cloud", "aws",
                             "--window", "60", "--json")
                walls.append(time.monotonic() - t2)
            served = json.loads(st)["pools"][0]
        finally:
            top = peak.stop()
            poolctl(home, "sandbox", "stop")
    print(f"speed x{r['speed']:g}, {args.nodes} nodes ({replicas} replicas)")
    print(f"deploy (Terraform apply) {deployed:.0f} s; {args.nodes} nodes serving after "
          f"{to_serving:.0f} s wall")
    print(f"peak memory of the sandbox's process tree: {at_8 / 2**30:.2f} GiB with "
          f"{args.nodes} nodes up, {top / 2**30:.2f} GiB through the replay")
    print(f"replay of {args.duration} ({r['requests']} requests, {r['completed']} completed, "
          f"errors {r['errors'] or 'none'}): {replay_wall:.0f} s wall "
          f"({r['wall_s']:.0f} s sending)")
    for m in ("ttft_s", "tpot_s"):
        print(f"{m} p90: measured {r[m]['p90']:.4f}, simulate {r['predicted'][m]['p90']:.4f} "
              f"({r[m]['p90'] / r['predicted'][m]['p90'] - 1:+.1%})")
    print(f"overhead: {r['overhead_s']:.4f} s per request, {r['overhead_share']:.1%} of TTFT "
          "p90")
    w = served["serving"] or {}
    print(f"status --window 60 (live metrics): {min(walls):.2f} s wall (best of 3); TTFT p90 "
          f"{w.get('ttft_p90_s')}, TPOT p90 {w.get('tpot_p90_s')}, predicted "
          f"{served['predicted']}, drift {served['drift']}")


if __name__ == "__main__":
    main()
