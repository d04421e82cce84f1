#!/usr/bin/env python3
"""Synth cost per stack: `poolctl synth --cloud C` of the example, wall time and the peak
resident memory of the process tree that did it (poolctl and the jsii Node process the
generator starts), median of `--repeat` runs, each in a fresh process and output folder.

    source scripts/env.sh && python scripts/bench/synth.py [--repeat 3] [--python PY]

`--python`: another environment's interpreter (one with the generator to compare installed,
e.g. CDK Terrain's cdktn and its prebuilt providers), run on this checkout's examples.
Numbers, not assertions (issue 37 asks for synth at most 2 s on this machine).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


# Run in a process of its own: ru_maxrss of waited children is the largest child's so far.
_MEASURE = """
import resource, subprocess, sys, time
t0 = time.monotonic()
subprocess.run(sys.argv[1:], check=True, capture_output=True)
print(time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def one(python: str, cloud: str) -> tuple[float, float]:
    """(wall s, peak RSS MB of the largest process: poolctl or the jsii Node) of one synth."""
    with tempfile.TemporaryDirectory() as out:
        got = subprocess.run(
            [sys.executable, "-c", _MEASURE, python, "-m", "poolctl", "synth", "--cloud",
             cloud, "-f", str(EXAMPLE), "--out", out],
            check=True, capture_output=True, text=True).stdout.split()
    return float(got[0]), float(got[1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    for cloud in ("aws", "gcp"):
        runs = [one(args.python, cloud) for _ in range(args.repeat)]
        print(f"{cloud}: wall {statistics.median(w for w, _ in runs):.2f} s (median of "
              f"{args.repeat}), peak RSS {max(m for _, m in runs):.0f} MB")


if __name__ == "__main__":
    main()
