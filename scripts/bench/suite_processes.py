#!/usr/bin/env python3
"""Where the test suite's CPU goes by kind of process: runs it (as scripts/test does) under
Linux process accounting, then prints CPU seconds, count and CPU per process for each command
name (terraform, terraform-provi[der], python, aws, node, checkov, haproxy ...), the most
first.

    source scripts/env.sh && sudo python scripts/bench/suite_processes.py [pytest args]

Needs root and the `acct` package (`accton`, `dump-acct`; apt install acct). The kernel
writes one record per process as it ends, so it counts what suite_cpu.py cannot: grandchildren,
servers and daemons. Command names are the kernel's (16 characters; every Python process is
`python`, the AWS CLI `aws`). Numbers, not assertions; accounting is switched off at the end.

Why: suite_cpu.py charges a module for the children it reaped, which blurs across modules; this
says which program to make cheaper (it found the AWS CLI's 0.55 s per call, and Terraform's
1.2 s per provider start).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TICKS = 100  # dump-acct prints times in clock ticks of 1/100 s


def main(argv: list[str]) -> int:
    missing = [t for t in ("accton", "dump-acct") if shutil.which(t) is None]
    if missing:
        print(f"suite_processes: {', '.join(missing)} not found: apt install acct",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "pacct"
        log.touch()
        if subprocess.run(["accton", str(log)], capture_output=True).returncode != 0:
            print("suite_processes: accton failed: process accounting needs root",
                  file=sys.stderr)
            return 2
        t0 = time.monotonic()
        try:
            rc = subprocess.run([str(ROOT / "scripts" / "test"), *argv]).returncode
        finally:
            subprocess.run(["accton", "off"], capture_output=True)
        wall = time.monotonic() - t0
        dump = subprocess.run(["dump-acct", str(log)], capture_output=True, text=True).stdout
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for line in dump.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 4:
            continue
        try:
            used = (float(fields[2]) + float(fields[3])) / TICKS  # user + system
        except ValueError:
            continue
        name = fields[0].rstrip("*")  # `*`: the process forked without exec
        cpu[name] += used
        count[name] += 1
    total = sum(cpu.values())
    print(f"{'command':18} {'CPU s':>8} {'share':>6} {'count':>6} {'CPU/each':>9}")
    for name, used in sorted(cpu.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{name:18} {used:8.1f} {used / total:6.1%} {count[name]:6d} "
              f"{used / count[name]:9.2f}")
    print(f"\nwhole run {wall:.0f} s wall, {total:.0f} s CPU in {sum(count.values())} processes")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
