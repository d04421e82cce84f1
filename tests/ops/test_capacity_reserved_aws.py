"""Reservations only, on the deployed example pool: a reservation of 2 p5.48xlarge in
us-east-1a, the group's CapacityReservationSpecification `capacity-reservations-only`
targeting it (what the stack writes for `preference: reservations-only`, set here with
boto3), and no open capacity in any zone. `capacity check` exits 1 first; then `warm
--replicas 16 --running --wait` (16 replicas = 4 nodes in service: 3 more than the 1
running) gets 2 into the reservation and names the third's ReservationCapacityExceeded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from tests.ops.test_capacity_e2e_aws import booting
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import boto3_client, pool_cli, sandbox_admin

ASG = "acme-chat-70b"
P5 = "p5.48xlarge"
ZONES = [f"us-east-1{z}" for z in "abcdef"]


@pytest.fixture
def reserved(deployed_pool, sandbox) -> Iterator[str]:
    ec2 = boto3_client(sandbox, "ec2")
    rid = ec2.create_capacity_reservation(
        InstanceType=P5, InstancePlatform="Linux/UNIX", AvailabilityZone="us-east-1a",
        InstanceCount=2, InstanceMatchCriteria="targeted")["CapacityReservation"][
        "CapacityReservationId"]
    boto3_client(sandbox, "autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=ASG, CapacityReservationSpecification={
            "CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationIds": [rid]}})
    sandbox_admin(sandbox, "POST", "/_poolctl/capacity",
                  {"limits": {f"{P5}@{z}": 0 for z in ZONES}})
    try:
        yield rid
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/capacity")
        ec2.cancel_capacity_reservation(CapacityReservationId=rid)


def test_reservations_only_fills_the_reservation_and_names_the_rest(
        reserved, sandbox, sandbox_home, tmp_path):
    cfg = yaml.safe_load(DEPLOYED_EXAMPLE.read_text())
    cfg["pools"][0]["aws"]["capacity"] = {"reservations": [reserved],
                                          "preference": "reservations-only"}
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(yaml.safe_dump(cfg))
    cli = pool_cli(sandbox_home, pool_file)
    chk = cli("capacity", "check", "--cloud", "aws", "--json", ok=1)
    assert json.loads(chk.stdout)["pools"][0]["held"] == 2
    assert "the peak of 7 node(s) needs 5 beyond the 2" in chk.stderr
    with booting(sandbox):
        res = cli("warm", "--replicas", "16", "--running", "--wait", "--timeout", "600", ok=1,
                  timeout=120)
    last = res.stderr.strip().splitlines()[-1]
    assert "ReservationCapacityExceeded: the reservations have no p5.48xlarge left" in last, (
        res.stderr)
    r = boto3_client(sandbox, "ec2").describe_capacity_reservations(
        CapacityReservationIds=[reserved])["CapacityReservations"][0]
    assert (r["TotalInstanceCount"], r["AvailableInstanceCount"]) == (2, 0)
    st = json.loads(cli("status", "--json").stdout)["pools"][0]
    assert "ReservationCapacityExceeded" in {f["code"] for f in st["capacity_failures"]}
