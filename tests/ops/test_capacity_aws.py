"""`poolctl capacity check` against the sandbox's Capacity Reservations (AWS).

The example pool (examples/llama-70b-p5), by hand: p5.48xlarge, min 1 node, max 6, surge 1,
2 warm nodes kept stopped (they hold no capacity) -> needs min 1, max 6, peak 6 + 1 = 7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.plugins.sandbox import boto3_client, run_poolctl, sandbox_admin

ROOT = Path(__file__).resolve().parents[2]
P5, P4D = "p5.48xlarge", "p4d.24xlarge"


@pytest.fixture
def reserve(sandbox_reset):
    ec2 = boto3_client(sandbox_reset, "ec2")

    def make(itype: str, zone: str, count: int, criteria: str = "targeted") -> str:
        r = ec2.create_capacity_reservation(
            InstanceType=itype, InstancePlatform="Linux/UNIX", AvailabilityZone=zone,
            InstanceCount=count, InstanceMatchCriteria=criteria)
        return str(r["CapacityReservation"]["CapacityReservationId"])

    yield make
    sandbox_admin(sandbox_reset, "DELETE", "/_poolctl/capacity")


def check(home: Path, tmp_path: Path, capacity: dict) -> tuple[int, dict | None, str]:
    cfg = yaml.safe_load((ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml").read_text())
    cfg["pools"][0]["aws"]["capacity"] = capacity
    path = tmp_path / "poolctl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = run_poolctl(home, "capacity", "check", "-f", str(path), "--cloud", "aws", "--sandbox",
                    "--json")
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr


def test_reservations_only_short_of_the_peak_exits_1(reserve, sandbox_home, tmp_path):
    a = reserve(P5, "us-east-1a", 1)
    b = reserve(P5, "us-east-1b", 1)
    rc, out, err = check(sandbox_home, tmp_path,
                         {"reservations": [a, b], "preference": "reservations-only"})
    assert rc == 1, err
    assert out is not None
    (pool,) = out["pools"]
    assert pool["needs"] == {"min": 1, "warm": 2, "surge": 1, "max": 6, "peak": 7}
    assert (pool["held"], pool["beyond"]) == (2, {"min": 0, "max": 4, "peak": 5})
    zones = {z["zone"]: z for z in pool["zones"]}
    assert set(zones) == {"us-east-1a", "us-east-1b"}  # the example's 2 created zones
    assert [(r["id"], r["total"], r["available"], r["in_use"], r["match_criteria"], r["end"])
            for r in zones["us-east-1a"]["reservations"]] == [(a, 1, 1, 0, "targeted", None)]
    assert zones["us-east-1a"]["offered"] and zones["us-east-1b"]["offered"]
    assert err.count("\n") == 1 and "reservations-only: the peak of 7 node(s) needs 5" in err


def test_reservations_first_is_ok_beyond_them(reserve, sandbox_home, tmp_path):
    a = reserve(P5, "us-east-1a", 3)
    rc, out, err = check(sandbox_home, tmp_path, {"reservations": [a]})
    assert rc == 0, err
    assert out is not None and out["ok"]
    assert out["pools"][0]["preference"] == "reservations-first"
    assert out["pools"][0]["beyond"] == {"min": 0, "max": 3, "peak": 4}


def test_enough_reserved_passes_reservations_only(reserve, sandbox_home, tmp_path):
    a = reserve(P5, "us-east-1a", 4)
    b = reserve(P5, "us-east-1b", 3)
    rc, out, err = check(sandbox_home, tmp_path,
                         {"reservations": [a, b], "preference": "reservations-only"})
    assert rc == 0, err
    assert out is not None and out["pools"][0]["held"] == 7


@pytest.mark.parametrize(("what", "says"), [
    ("type", "reserves p4d.24xlarge, the pool runs p5.48xlarge"),
    ("zone", "is in us-east-1c, outside the pool's zones (us-east-1a, us-east-1b)"),
    ("missing", "not found in us-east-1"),
])
def test_a_reservation_the_pool_cannot_use_names_the_key(reserve, sandbox_home, tmp_path,
                                                         what, says):
    rid = {"type": lambda: reserve(P4D, "us-east-1a", 1),
           "zone": lambda: reserve(P5, "us-east-1c", 1),
           "missing": lambda: "cr-0123456789abcdef0"}[what]()
    rc, out, err = check(sandbox_home, tmp_path, {"reservations": [rid]})
    assert rc == 2 and out is None
    assert err.startswith("poolctl: pools[0].aws.capacity.reservations: ") and says in err, err
    assert err.count("\n") == 1


def test_open_reservations_of_the_type_count_by_default(reserve, sandbox_home, tmp_path):
    reserve(P5, "us-east-1a", 2, criteria="open")
    reserve(P5, "us-east-1b", 5, criteria="targeted")  # not used without a target
    rc, out, _ = check(sandbox_home, tmp_path, {})
    assert rc == 0 and out is not None and out["pools"][0]["held"] == 2
    rc, out, _ = check(sandbox_home, tmp_path, {"preference": "none"})
    assert rc == 0 and out is not None and out["pools"][0]["held"] == 0



def block_check(home: Path, tmp_path: Path, block: str) -> tuple[int, dict | None, str]:
    """`capacity check --json` of the example on a Capacity Block: no warm pool (a block pool
    keeps none), so by hand it needs min 1, warm 0, surge 1, max 6, peak 6 + 1 = 7."""
    cfg = yaml.safe_load((ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml").read_text())
    cfg["pools"][0]["warm_pool"]["replicas"] = 0
    cfg["pools"][0]["aws"]["capacity"] = {"capacity_block": block}
    path = tmp_path / "poolctl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = run_poolctl(home, "capacity", "check", "-f", str(path), "--cloud", "aws", "--sandbox",
                    "--json")
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr


def test_a_capacity_block_is_the_only_capacity_of_a_block_pool(reserve, sandbox_reset,
                                                                sandbox_home, tmp_path):
    (block,) = sandbox_admin(sandbox_reset, "POST", "/_poolctl/capacity", {"capacity_blocks": [
        {"instance_type": P5, "zone": "us-east-1b", "count": 2, "hours": 24}]})["created"]
    rc, out, err = block_check(sandbox_home, tmp_path, block)
    assert rc == 1, err
    assert out is not None
    (pool,) = out["pools"]
    assert pool["preference"] == "capacity-block"
    assert pool["needs"] == {"min": 1, "warm": 0, "surge": 1, "max": 6, "peak": 7}
    # Every launch targets the block: 2 held, the peak's other 5 would fail.
    assert (pool["held"], pool["beyond"]) == (2, {"min": 0, "max": 4, "peak": 5})
    (row,) = {z["zone"]: z for z in pool["zones"]}["us-east-1b"]["reservations"]
    assert (row["id"], row["kind"], row["state"], row["total"]) == (
        block, "capacity-block", "active", 2)
    assert row["start"] and row["end"] and row["start"] < row["end"]
    assert err.count("\n") == 1 and f"Capacity Block ({block} is active until" in err, err
    assert "needs 5 beyond the 2 it holds" in err, err

    # An On-Demand reservation named as the block: the key, exit 2.
    odcr = reserve(P5, "us-east-1a", 1)
    rc, _, err = block_check(sandbox_home, tmp_path, odcr)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("poolctl: pools[0].aws.capacity.capacity_block: ") and \
        "not a Capacity Block" in err, err


def test_a_scheduled_capacity_block_has_no_instance_in_use(reserve, sandbox_reset,
                                                           sandbox_home, tmp_path):
    """Issue 31: a bought block that has not begun was listed "in use 1" with no instance
    (EC2 reports AvailableInstanceCount 0 until a block is active). Nothing runs in it, and
    it holds nothing for the pool yet."""
    from datetime import UTC, datetime, timedelta

    ec2 = boto3_client(sandbox_reset, "ec2")
    start = datetime.now(UTC) + timedelta(days=2)
    (offer, *_) = ec2.describe_capacity_block_offerings(
        InstanceType=P5, InstanceCount=1, CapacityDurationHours=24, StartDateRange=start,
        EndDateRange=start + timedelta(days=3))["CapacityBlockOfferings"]
    block = ec2.purchase_capacity_block(
        CapacityBlockOfferingId=offer["CapacityBlockOfferingId"],
        InstancePlatform="Linux/UNIX")["CapacityReservation"]["CapacityReservationId"]
    rc, out, err = block_check(sandbox_home, tmp_path, block)
    assert out is not None, err
    (pool,) = out["pools"]
    (row,) = [r for z in pool["zones"] for r in z["reservations"]]
    assert (row["id"], row["state"], row["total"], row["available"], row["in_use"]) == (
        block, "scheduled", 1, 0, 0)
    assert pool["held"] == 0  # a block holds the pool's nodes from its start on
