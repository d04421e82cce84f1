#!/usr/bin/env python3
"""Where the test suite's time goes: runs it (as scripts/test does, on its workers) with
POOLCTL_TEST_CPU_LOG set, then prints one line per test module, the most CPU first: wall
seconds on its worker, CPU of the pytest worker, of the processes it ran and waited for
(poolctl, Terraform and its provider, node/jsii, checkov ...), and of its sandbox server.

    source scripts/env.sh && python scripts/bench/suite_cpu.py [pytest args, e.g. tests/unit]

Why: on 2 cores the suite is bound by CPU (load ~5 with 4 workers); wall time per module
says little, CPU per module says what to cut. Numbers, not assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cpu.jsonl"
        env = {**os.environ, "POOLCTL_TEST_CPU_LOG": str(log)}
        t0 = time.monotonic()
        rc = subprocess.run([str(ROOT / "scripts" / "test"), *argv], env=env).returncode
        wall = time.monotonic() - t0
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for r in rows:
        r["total"] = r["cpu_s"] + r["children_cpu_s"] + r["sandbox_cpu_s"]
    rows.sort(key=lambda r: -r["total"])
    print(f"{'module':44} {'worker':6} {'tests':>5} {'wall s':>7} {'CPU s':>7} {'self':>6} "
          f"{'children':>8} {'sandbox':>7}")
    for r in rows:
        print(f"{r['module'][:44]:44} {r['worker']:6} {r['tests']:5d} {r['wall_s']:7.1f} "
              f"{r['total']:7.1f} {r['cpu_s']:6.1f} {r['children_cpu_s']:8.1f} "
              f"{r['sandbox_cpu_s']:7.1f}")
    per_worker: dict[str, float] = {}
    ends: dict[str, float] = {}
    for r in rows:
        per_worker[r["worker"]] = per_worker.get(r["worker"], 0.0) + r["wall_s"]
        ends[r["worker"]] = max(ends.get(r["worker"], 0.0), r["end"])
    total = sum(r["total"] for r in rows)
    t0 = min((r["start"] for r in rows), default=0.0)
    print(f"\nwhole run {wall:.0f} s wall (set-up included), {total:.0f} s CPU in tests; "
          "busy seconds per worker: "
          + ", ".join(f"{w} {s:.0f}" for w, s in sorted(per_worker.items()))
          + "; each worker's last test ended at: "
          + ", ".join(f"{w} {e - t0:.0f} s" for w, e in sorted(ends.items())))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
