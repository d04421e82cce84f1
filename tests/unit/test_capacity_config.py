"""aws.capacity: reservation ids and groups by shape, the preference, one line per mistake."""

from __future__ import annotations

import pytest

from poolctl.config import parse_config
from poolctl.errors import UsageError
from tests.configs import pool_yaml

CR = "cr-0123456789abcdef0"
GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/p5-reservations"


def capacity(body: str) -> str:
    return pool_yaml(extra_aws=f"      capacity: {body}\n")


def error_of(text: str) -> str:
    with pytest.raises(UsageError) as e:
        parse_config(text)
    assert e.value.exit_code == 2
    msg = str(e.value)
    assert msg.count("\n") == 0, msg
    return msg


@pytest.mark.parametrize(("body", "ids", "group", "mode"), [
    ("{}", [], None, "open"),
    (f"{{reservations: [{CR}]}}", [CR], None, "reservations-first"),
    (f"{{reservations: {GROUP}, preference: reservations-only}}", [], GROUP,
     "reservations-only"),
    ("{preference: none}", [], None, "none"),
])
def test_capacity_forms(body, ids, group, mode):
    cap = parse_config(capacity(body)).pools[0].aws.capacity
    assert (cap.reservation_ids, cap.group_arn, cap.mode) == (ids, group, mode)


def test_no_capacity_key_is_open():
    assert parse_config(pool_yaml()).pools[0].aws.capacity.mode == "open"


@pytest.mark.parametrize(("body", "key", "says"), [
    ("{reservations: [cr-123]}", "pools[0].aws.capacity.reservations[0]",
     "not an On-Demand Capacity Reservation id"),
    ("{reservations: [CR-0123456789ABCDEF0]}", "pools[0].aws.capacity.reservations[0]",
     "not an On-Demand Capacity Reservation id"),
    ("{reservations: 7}", "pools[0].aws.capacity.reservations",
     "must be a list of reservation ids (cr-...) or one resource group ARN"),
    ("{reservations: arn:aws:resource-groups:us-east-1:12:group/g}",
     "pools[0].aws.capacity.reservations", "not a resource group ARN"),
    ("{reservations: arn:aws:resource-groups:us-west-2:123456789012:group/g}",
     "pools[0].aws.capacity.reservations", "is a resource group in us-west-2, the pool in "
     "us-east-1"),
    (f"{{reservations: [{CR}, {CR}]}}", "pools[0].aws.capacity.reservations",
     "names a reservation twice"),
    ("{preference: sometimes}", "pools[0].aws.capacity.preference", "must be one of"),
    ("{preference: reservations-only}", "pools[0].aws.capacity.preference",
     "reservations-only needs aws.capacity.reservations"),
    (f"{{reservations: [{CR}], preference: none}}", "pools[0].aws.capacity.preference",
     "the named reservations would be ignored"),
    ("{reservation: []}", "pools[0].aws.capacity.reservation", ""),
    ("{capacity_block: cb-0123456789abcdef0}", "pools[0].aws.capacity.capacity_block",
     "not an On-Demand Capacity Reservation id"),
    (f"{{capacity_block: {CR}, reservations: [{CR}]}}", "pools[0].aws.capacity.capacity_block",
     "is the only reservation a Capacity Block pool launches into"),
    (f"{{capacity_block: {CR}, preference: reservations-only}}",
     "pools[0].aws.capacity.capacity_block", "remove aws.capacity.reservations and preference"),
])
def test_capacity_refused_naming_the_key(body, key, says):
    msg = error_of(capacity(body))
    assert f" {key}: " in msg and says in msg, msg


def block(**kw) -> str:
    return pool_yaml(extra_aws=f"      capacity: {{capacity_block: {CR}}}\n", **kw)


def test_capacity_block_is_kept():
    cap = parse_config(block(warm=0)).pools[0].aws.capacity
    # The block is no reservation of the reservations key: those stay EC2's default.
    assert (cap.capacity_block, cap.reservation_ids, cap.mode) == (CR, [], "open")


def test_capacity_block_with_fallback_types_is_refused():
    text = pool_yaml(warm=0, extra_aws=f"      capacity: {{capacity_block: {CR}}}\n"
                     "      fallback_instance_types: [p5e.48xlarge]\n")
    msg = error_of(text)
    assert " pools[0].aws.fallback_instance_types: " in msg and "holds instance_type" in msg, msg


def test_capacity_block_with_a_warm_pool_is_refused():
    msg = error_of(block(warm=8))
    assert " pools[0].warm_pool.replicas: " in msg and "keeps no warm pool" in msg, msg
