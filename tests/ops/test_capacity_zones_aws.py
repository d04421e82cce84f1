"""Insufficient capacity, survived (issue 21, part 4): on the deployed example pool (1 node
in service, 2 kept stopped; its group over us-east-1a and us-east-1b), the zone of the node
in service limited to that 1 p5.48xlarge and the other zone with room: `warm --replicas 8
--running --wait` (8 replicas = 2 more nodes in service) fills them from the second zone and
exits 0; `status` names no failure. The limits are removed at the end."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.test_capacity_e2e_aws import ASG, P5, ZONES, booting
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import boto3_client, pool_cli, sandbox_admin


def _running_zones(endpoint: str) -> Counter:
    ec2 = boto3_client(endpoint, "ec2")
    group = boto3_client(endpoint, "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[ASG])["AutoScalingGroups"][0]
    ids = [i["InstanceId"] for i in group["Instances"]]
    found = ec2.describe_instances(InstanceIds=ids)["Reservations"] if ids else []
    return Counter(i["Placement"]["AvailabilityZone"] for r in found for i in r["Instances"]
                   if i["State"]["Name"] in ("pending", "running"))


@pytest.fixture
def one_zone_full(deployed_pool, sandbox) -> Iterator[tuple[str, str]]:
    (full,) = _running_zones(sandbox)  # the zone of the 1 node in service
    (room,) = {"us-east-1a", "us-east-1b"} - {full}  # the group's other subnet's zone
    limits = {f"{P5}@{z}": (1 if z == full else 8 if z == room else 0) for z in ZONES}
    sandbox_admin(sandbox, "POST", "/_poolctl/capacity", {"limits": limits})
    try:
        yield full, room
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/capacity")


def test_warm_running_fills_from_the_zone_with_room(one_zone_full, sandbox, sandbox_home,
                                                     tmp_path):
    full, room = one_zone_full
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(Path(DEPLOYED_EXAMPLE).read_text())
    cli = pool_cli(sandbox_home, pool_file)
    t0 = time.time()
    with booting(sandbox):
        res = cli("warm", "--replicas", "8", "--running", "--wait", "--timeout", "120",
                  timeout=150)
    print(f"\nsecond-zone fill: {time.time() - t0:.1f} s", file=sys.stderr)
    # 1 node in service + 8 replicas / 4 per node = 3 in service: the 2 new ones in the zone
    # with room, the full one keeping its 1.
    assert _running_zones(sandbox) == Counter({full: 1, room: 2}), res.stderr
    st = json.loads(cli("status", "--json").stdout)["pools"][0]
    assert st["nodes"]["in_service"] == 3 and st["capacity_failures"] == []
