"""Insufficient capacity, seen: on the deployed example pool (tests/plugins/deployed_pool.py:
1 node in service, 2 kept stopped), a zone limited to 1 p5.48xlarge and every other zone of
the region at 0; `warm --replicas 8 --running --wait` (8 replicas = 2 more nodes in service)
cannot launch them and says so, naming the code and the zones, within a minute; `status`
lists the failures. The limits are removed at the end (other tests on the worker)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import boto3_client, pool_cli, sandbox_admin

ASG = "acme-chat-70b"
P5 = "p5.48xlarge"
ZONES = [f"us-east-1{z}" for z in "abcdef"]  # the zones moto lists as offering p5


@pytest.fixture
def exhausted(deployed_pool, sandbox) -> Iterator[None]:
    limits = {f"{P5}@{z}": (1 if z == "us-east-1a" else 0) for z in ZONES}
    sandbox_admin(sandbox, "POST", "/_poolctl/capacity", {"limits": limits})
    try:
        yield
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/capacity")


@contextmanager
def booting(endpoint: str) -> Iterator[None]:
    """Complete every open launch action (the boot scripts' job) every 0.1 s."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sandbox_admin(endpoint, "POST", "/_poolctl/lifecycle-actions",
                          {"AutoScalingGroupName": ASG, "LifecycleActionResult": "CONTINUE"})
            stop.wait(0.1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=10)


def test_warm_wait_stops_on_insufficient_capacity_and_status_lists_it(
        exhausted, sandbox, sandbox_home, tmp_path):
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(Path(DEPLOYED_EXAMPLE).read_text())
    cli = pool_cli(sandbox_home, pool_file)
    started = time.time() - 1  # the sandbox's clock is this machine's
    with booting(sandbox):
        res = cli("warm", "--replicas", "8", "--running", "--wait", "--timeout", "600",
                  ok=1, timeout=120)
    ended = time.time()
    last = res.stderr.strip().splitlines()[-1]
    # One line: the pool, the code, the type and the group's zones that failed.
    assert last.startswith("poolctl: chat-70b: InsufficientInstanceCapacity: no p5.48xlarge "
                           "capacity in us-east-1"), res.stderr
    assert "of 3 node(s) in service" in last and "poolctl capacity check" in last
    st_res = cli("status", "--json")
    status_at = time.time()
    st = json.loads(st_res.stdout)
    (pool,) = st["pools"]
    failures = pool["capacity_failures"]
    assert failures and {f["code"] for f in failures} == {"InsufficientInstanceCapacity"}
    assert {f["instance_type"] for f in failures} == {P5}
    zones = sorted({f["zone"] for f in failures})
    assert set(zones) <= {"us-east-1a", "us-east-1b"}  # the group's subnets' zones
    assert f"in {', '.join(zones)}" in last
    text = cli("status").stdout
    assert f"launches failing: InsufficientInstanceCapacity: no {P5} capacity in " in text
    # The first failed launch of the group, from its own record (status lists only those
    # after its newest successful launch).
    acts = boto3_client(sandbox, "autoscaling").describe_scaling_activities(
        AutoScalingGroupName=ASG)["Activities"]
    first = min(a["StartTime"].timestamp() for a in acts
                if a["StatusCode"] == "Failed" and a["StartTime"].timestamp() >= started)
    # Measured, not asserted beyond the bound: first failed launch -> the line.
    print(f"\nfirst failed launch -> warm --wait's line: {ended - first:.1f} s; -> status "
          f"--json: {status_at - first:.1f} s\n{last}", file=sys.stderr)
    assert ended - first < 60
