#!/usr/bin/env python3
"""Benchmarks of the commands users wait on: wall time and peak memory of the whole process
tree (poolctl plus the jsii Node process that synthesis starts), sampled from /proc.

    source scripts/env.sh && python scripts/bench/run.py [--repeat 3] [--only synth-aws]

Numbers, not assertions: the targets (help < 0.3 s; synth of the examples < 8 s and < 0.8 GB
per cloud) are compared and reported, never enforced by tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root_pid: int) -> int:
    """Sum of RSS over root_pid and all its descendants, in bytes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
            ppid, pages = int(parts[1]), int(parts[21])
        except (OSError, IndexError, ValueError):
            continue
        pid = int(entry)
        children.setdefault(ppid, []).append(pid)
        rss[pid] = pages * PAGE
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def measure(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        err = proc.stderr.read().decode()[-800:] if proc.stderr else ""
        raise SystemExit(f"bench: {' '.join(argv)} failed ({proc.returncode}): {err}")
    return wall, peak


def cases(out: str) -> dict[str, tuple[list[str], float | None, float | None]]:
    py = [sys.executable, "-m", "poolctl"]
    aws_files = [EX / "llama-70b-p5" / "poolctl.yaml", EX / "qwen-7b-p4d" / "poolctl.yaml"]
    gcp_files = [EX / "llama-70b-p5" / "poolctl.yaml", EX / "mistral-gcp" / "poolctl.yaml"]
    synth_all = (
        "import sys\n"
        "from poolctl.config import load_config\n"
        "from poolctl_stacks.app import synth\n"
        "cloud, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
        "cfgs = [load_config(f) for f in files]\n"
        "synth([(c, c.targets(None, cloud)) for c in cfgs], out)\n"
    )
    return {
        # name: (argv, target seconds, target bytes)
        "help": (py + ["--help"], 0.3, None),
        "validate": (py + ["validate", "-f", str(aws_files[0])], None, None),
        "plan": (py + ["plan", "-f", str(aws_files[0]), "--json"], None, None),
        "synth-aws": ([sys.executable, "-c", synth_all, "aws", f"{out}/aws",
                       *map(str, aws_files)], 8.0, 0.8e9),
        "synth-gcp": ([sys.executable, "-c", synth_all, "gcp", f"{out}/gcp",
                       *map(str, gcp_files)], 8.0, 0.8e9),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", action="append", help="run only these cases")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        table = cases(out)
        names = args.only or list(table)
        print(f"{'case':<10} {'median s':>9} {'min s':>7} {'peak MB':>8}  target")
        for name in names:
            argv, t_target, m_target = table[name]
            runs = [measure(argv) for _ in range(args.repeat)]
            walls = [w for w, _ in runs]
            peak = max(p for _, p in runs)
            target = []
            if t_target:
                ok = statistics.median(walls) < t_target
                target.append(f"< {t_target} s {'ok' if ok else 'MISSED'}")
            if m_target:
                target.append(f"< {m_target / 1e6:.0f} MB {'ok' if peak < m_target else 'MISSED'}")
            print(f"{name:<10} {statistics.median(walls):>9.2f} {min(walls):>7.2f} "
                  f"{peak / 1e6:>8.0f}  {', '.join(target)}")


if __name__ == "__main__":
    main()
