"""What the deploy tests share: the example stack's names, `poolctl deploy` run and timed
against the session's sandbox, and what Terraform left under POOLCTL_HOME."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import run_poolctl, terraform_missing

STACK = "acme-chat-70b-aws"
ASG = "acme-chat-70b"
POOL = "chat-70b"
CONTRACT_TAGS = {"poolctl:project": "acme", "poolctl:pool": POOL, "poolctl:role": "inference"}
TIMINGS = re.compile(rf"== {STACK}: (synth [\d.]+ s(?:, \w+ [\d.]+ s)*)")
LOG_LINE = re.compile(rf"== {STACK}: Terraform's output goes to (\S+)")
# p5.48xlarge at the catalog's $55.04 per node-hour: 1 node at the minimum, 6 at the maximum
COST_LINE = ("the pool {verb} $55.04/h at its minimum (1 node(s)) to $330.24/h at its maximum "
             "(6 node(s)): p5.48xlarge at $55.04 per node-hour")

MISSING = terraform_missing()
needs_terraform = pytest.mark.skipif(MISSING is not None, reason=f"e2e deploy: {MISSING}")


def deploy_args(*extra: str, file: Path = DEPLOYED_EXAMPLE, home: Path) -> list[str]:
    return ["--cloud", "aws", "--sandbox", "--auto-approve", "-f", str(file),
            "--out", str(home / "cdktf.out"), *extra]


def timed(home: Path, label: str, *args: str, child: bool = False
           ) -> subprocess.CompletedProcess:
    """`poolctl ARGS`, timed; `child`: as the console script in its own process (the first
    deploy runs so, end to end), else in this worker (tests/inproc.py)."""
    start = time.monotonic()
    res = run_poolctl(home, *args, child=child)
    wall = time.monotonic() - start
    split = TIMINGS.search(res.stderr)
    print(f"\n[e2e timing] {label}: wall {wall:.1f} s; {split.group(1) if split else 'no split'}")
    assert res.returncode == 0, f"{label} failed ({res.returncode}):\n{res.stderr[-4000:]}"
    return res


def terraform_log(stderr: str) -> Path:
    """The log of the run's Terraform output, whose path the run printed; private."""
    [path] = LOG_LINE.findall(stderr)
    log = Path(path)
    assert log.stat().st_mode & 0o777 == 0o600
    return log


def state_resources(home: Path) -> list:
    path = home / "sandbox" / "state" / f"{STACK}.tfstate"
    if not path.exists():
        return []
    return json.loads(path.read_text() or "{}").get("resources", [])


def tag_dict(items) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or []}


def pool_group(asg) -> dict | None:
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"]
    return groups[0] if groups else None
