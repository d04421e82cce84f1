"""The sandbox's capacity (extensions/capacity.py, activities.py): zones that run out, Capacity
Reservations, and the scaling activities that say so, driven with boto3 over HTTP.

The messages are AWS's (see the modules' docstrings for the sources); the zones a message
offers instead are the us-east-1 zones moto lists as offering the type that have room:
p5.48xlarge is offered in us-east-1a..f, p4d.24xlarge in us-east-1a..d.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.plugins.sandbox import stand_in_ami

P5, P4D = "p5.48xlarge", "p4d.24xlarge"
A, B, C = "us-east-1a", "us-east-1b", "us-east-1c"
EXCEEDED = ("The requested reservation does not have sufficient compatible and available "
            "capacity for this request.")


def ice(itype: str, zone: str, others: list[str]) -> str:
    """EC2's InsufficientInstanceCapacity message for a launch in `zone`."""
    text = (f"We currently do not have sufficient {itype} capacity in the Availability Zone you "
            f"requested ({zone}). Our system will be working on provisioning additional "
            "capacity.")
    if others:
        text += (f" You can currently get {itype} capacity by not specifying an Availability "
                 f"Zone in your request or choosing {', '.join(others)}.")
    return text


def admin(endpoint: str, method: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


@pytest.fixture
def sandbox_capacity(sandbox_reset):
    """An empty sandbox; the capacity limits a test sets are gone afterwards."""
    yield sandbox_reset
    admin(sandbox_reset, "DELETE", "/_poolctl/capacity")


@pytest.fixture
def clients(sandbox_capacity):
    """boto3 clients that do not retry: a 500 InsufficientInstanceCapacity is seen once."""
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    def make(service: str):
        return boto3.client(service, endpoint_url=sandbox_capacity, region_name="us-east-1",
                            config=Config(retries={"max_attempts": 1}), **TEST_CREDENTIALS)

    return make("ec2"), make("autoscaling")


def limit(endpoint: str, **limits: int | None) -> dict:
    """Set launch limits, as p5=... keyword names: P5_A=1 is p5.48xlarge@us-east-1a."""
    types = {"P5": P5, "P4D": P4D}
    body = {f"{types[k.rsplit('_', 1)[0]]}@us-east-1{k.rsplit('_', 1)[1].lower()}": v
            for k, v in limits.items()}
    return admin(endpoint, "POST", "/_poolctl/capacity", {"limits": body})


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _template(ec2, itype: str = P5, **data) -> str:
    return ec2.create_launch_template(
        LaunchTemplateName=_name("lt"),
        LaunchTemplateData={"ImageId": stand_in_ami(ec2), "InstanceType": itype, **data},
    )["LaunchTemplate"]["LaunchTemplateId"]


def _group(asg, lt_id: str, desired: int, zones=(A, B), **kw) -> str:
    name = _name("grp")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=10, DesiredCapacity=desired,
        AvailabilityZones=list(zones), LaunchTemplate={"LaunchTemplateId": lt_id, "Version": "1"},
        **kw)
    return name


def _zones(asg, name: str) -> Counter:
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return Counter(i["AvailabilityZone"] for i in group["Instances"])


def _activities(asg, name: str, status: str | None = None) -> list[dict]:
    acts = asg.describe_scaling_activities(AutoScalingGroupName=name)["Activities"]
    return [a for a in acts if status is None or a["StatusCode"] == status]


def _run(ec2, n: int = 1, zone: str | None = A, itype: str = P5, **kw) -> list[dict]:
    if zone is not None:
        kw["Placement"] = {"AvailabilityZone": zone}
    return ec2.run_instances(ImageId=stand_in_ami(ec2), MinCount=n, MaxCount=n, InstanceType=itype,
                             **kw)["Instances"]


def _reservation(ec2, zone: str = A, count: int = 2, criteria: str = "targeted") -> str:
    return ec2.create_capacity_reservation(
        InstanceType=P5, InstancePlatform="Linux/UNIX", AvailabilityZone=zone,
        InstanceCount=count, InstanceMatchCriteria=criteria)["CapacityReservation"][
        "CapacityReservationId"]


def _described(ec2, cr: str) -> dict:
    return ec2.describe_capacity_reservations(CapacityReservationIds=[cr])[
        "CapacityReservations"][0]


# -------------------------------------------------------------------------------------
# launch limits


def test_run_instances_beyond_a_zone_limit_is_aws_insufficient_capacity(sandbox_capacity,
                                                                         clients):
    ec2, _ = clients
    limit(sandbox_capacity, P5_A=1, P5_C=0)
    assert _run(ec2)[0]["Placement"]["AvailabilityZone"] == A
    with pytest.raises(ClientError) as e:
        _run(ec2)
    err = e.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 500  # a server error, as on AWS
    assert err["Error"]["Code"] == "InsufficientInstanceCapacity"
    # Room elsewhere: b, d, e, f (c is limited to 0, a is full).
    assert err["Error"]["Message"] == ice(P5, A, [B, "us-east-1d", "us-east-1e", "us-east-1f"])
    # A type the limit does not name still launches there.
    assert _run(ec2, itype=P4D)[0]["Placement"]["AvailabilityZone"] == A
    # The capacity report: 1 of 1 used in a.
    row = next(r for r in admin(sandbox_capacity, "GET", "/_poolctl/capacity")["limits"]
               if r["zone"] == A)
    assert (row["limit"], row["in_use"], row["room"]) == (1, 1, 0)


def test_group_over_two_zones_launches_where_there_is_room(sandbox_capacity, clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=1)
    name = _group(asg, _template(ec2), desired=3)
    # Balanced: 1st -> a (tie, a first), 2nd -> b, 3rd -> a again (tie) but a is full -> b.
    assert _zones(asg, name) == Counter({A: 1, B: 2})
    failed = _activities(asg, name, "Failed")
    assert len(failed) == 1
    status = ice(P5, A, [B, C, "us-east-1d", "us-east-1e", "us-east-1f"]) + \
        " Launching EC2 instance failed."
    assert failed[0]["StatusMessage"] == status
    assert failed[0]["Description"] == f"Launching a new EC2 instance.  Status Reason: {status}"
    assert json.loads(failed[0]["Details"]) == {"Availability Zone": A}
    assert failed[0]["Cause"].endswith("an instance was started in response to a difference "
                                       "between desired and actual capacity, increasing the "
                                       "capacity from 0 to 3.")
    assert failed[0]["AutoScalingGroupName"] == name and failed[0]["Progress"] == 100
    assert failed[0]["StartTime"] == failed[0]["EndTime"]
    ok = _activities(asg, name, "Successful")
    assert len(ok) == 3 and all(a["Description"].startswith("Launching a new EC2 instance: i-")
                                for a in ok)


def test_every_zone_exhausted_fails_in_each_and_grows_once_capacity_returns(sandbox_capacity,
                                                                           clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=0, P5_B=0)
    name = _group(asg, _template(ec2), desired=2)
    assert _zones(asg, name) == Counter()
    failed = _activities(asg, name, "Failed")
    zones = {json.loads(a["Details"])["Availability Zone"] for a in failed}
    assert zones == {A, B}
    others = [C, "us-east-1d", "us-east-1e", "us-east-1f"]  # a and b have no room
    assert {a["StatusMessage"] for a in failed} == {
        ice(P5, z, others) + " Launching EC2 instance failed." for z in (A, B)}
    # Capacity returns in b: Auto Scaling tries again at once and gets the 1 it can.
    limit(sandbox_capacity, P5_B=1)
    assert _zones(asg, name) == Counter({B: 1})


def test_stopped_warm_instances_hold_no_capacity(sandbox_capacity, clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=1)
    name = _group(asg, _template(ec2), desired=0, zones=(A,))
    # A warm instance runs before it stops: with room for 1 they launch one after the other.
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=2, MaxGroupPreparedCapacity=2,
                      PoolState="Stopped")
    warm = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert [w["LifecycleState"] for w in warm] == ["Warmed:Stopped"] * 2
    assert admin(sandbox_capacity, "GET", "/_poolctl/capacity")["limits"][0]["in_use"] == 0
    # Scale out to 2: the first warm instance starts (the zone's one slot), the second
    # cannot (starting it is a launch), nor can a new one: the group has 1.
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=2)
    assert _zones(asg, name) == Counter({A: 1})
    left = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert len(left) == 1 and left[0]["LifecycleState"] == "Warmed:Stopped"
    descriptions = [a["Description"] for a in _activities(asg, name, "Failed")]
    assert any(d.startswith("Launching a new EC2 instance from warm pool.  Status Reason: "
                            + ice(P5, A, [])[:60]) for d in descriptions)
    assert any(d.startswith("Launching a new EC2 instance.  Status Reason: ") for d in descriptions)


def test_mixed_instances_policy_falls_back_to_the_next_type(sandbox_capacity, clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=0)
    lt = _template(ec2)
    name = _name("mixed")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=1,
        AvailabilityZones=[A], MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": lt,
                                                               "Version": "1"},
                               "Overrides": [{"InstanceType": P5}, {"InstanceType": P4D}]},
            "InstancesDistribution": {"OnDemandAllocationStrategy": "prioritized"}})
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert [(i["InstanceType"], i["AvailabilityZone"]) for i in group["Instances"]] == [(P4D, A)]
    failed = _activities(asg, name, "Failed")
    assert len(failed) == 1 and P5 in failed[0]["StatusMessage"]


def test_balanced_only_keeps_trying_the_balanced_zone(sandbox_capacity, clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=0)
    name = _group(asg, _template(ec2), desired=1,
                  AvailabilityZoneDistribution={"CapacityDistributionStrategy": "balanced-only"})
    assert _zones(asg, name) == Counter()
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["AvailabilityZoneDistribution"] == {
        "CapacityDistributionStrategy": "balanced-only"}
    assert {json.loads(a["Details"])["Availability Zone"]
            for a in _activities(asg, name, "Failed")} == {A}


def test_launch_held_by_a_hook_is_mid_lifecycle_action(sandbox, sandbox_capacity, clients):
    ec2, asg = clients
    name = _group(asg, _template(ec2), desired=1, LifecycleHookSpecificationList=[{
        "LifecycleHookName": "ready", "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
        "HeartbeatTimeout": 300, "DefaultResult": "ABANDON"}])
    first = _activities(asg, name)
    assert [a["StatusCode"] for a in first] == ["MidLifecycleAction"] and "EndTime" not in first[0]
    admin(sandbox, "POST", "/_poolctl/lifecycle-actions", {"AutoScalingGroupName": name})
    done = _activities(asg, name)
    assert [a["StatusCode"] for a in done] == ["Successful"] and "EndTime" in done[0]


def test_refresh_waits_for_capacity_to_launch_a_replacement(sandbox_capacity, clients):
    ec2, asg = clients
    ami = stand_in_ami(ec2)
    lt = ec2.create_launch_template(LaunchTemplateName=_name("lt"), LaunchTemplateData={
        "ImageId": ami, "InstanceType": "t3.micro"})["LaunchTemplate"]["LaunchTemplateId"]
    ec2.create_launch_template_version(LaunchTemplateId=lt, LaunchTemplateData={
        "ImageId": ami, "InstanceType": P5})
    name = _group(asg, lt, desired=1, zones=(A,))
    limit(sandbox_capacity, P5_A=0)
    asg.start_instance_refresh(
        AutoScalingGroupName=name, Preferences={"MinHealthyPercentage": 0},
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt, "Version": "2"}})

    def step() -> dict:
        return asg.describe_instance_refreshes(AutoScalingGroupName=name)[
            "InstanceRefreshes"][0]

    step()  # Pending -> InProgress
    step()  # the batch: old instance terminated, its p5 replacement finds no room
    for _ in range(2):  # and it stays so, each step trying again
        waiting = step()
        assert waiting["Status"] == "InProgress"
        assert waiting["StatusReason"] == (
            "Waiting to launch 1 replacement instance(s): "
            + ice(P5, A, [B, C, "us-east-1d", "us-east-1e", "us-east-1f"])
            + " Launching EC2 instance failed.")
    assert _zones(asg, name) == Counter()
    limit(sandbox_capacity, P5_A=1)
    step()  # launches it now
    for _ in range(5):
        if step()["Status"] == "Successful":
            break
    assert step()["Status"] == "Successful"
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert [i["InstanceType"] for i in group["Instances"]] == [P5]


# -------------------------------------------------------------------------------------
# Capacity Reservations


def test_targeted_reservation_of_two_then_exceeded_cancel_and_reset(sandbox_capacity, clients):
    ec2, _ = clients
    limit(sandbox_capacity, P5_A=0)  # no open capacity: what runs in a runs in the reservation
    cr = _reservation(ec2, A, 2)
    r = _described(ec2, cr)
    assert cr.startswith("cr-") and r["CapacityReservationArn"].endswith(
        f":capacity-reservation/{cr}")
    assert (r["InstanceType"], r["AvailabilityZone"], r["TotalInstanceCount"],
            r["AvailableInstanceCount"], r["State"], r["InstanceMatchCriteria"],
            r["EndDateType"], r["ReservationType"], r["Tenancy"], r["InstancePlatform"]) == (
        P5, A, 2, 2, "active", "targeted", "unlimited", "default", "default", "Linux/UNIX")
    target = {"CapacityReservationTarget": {"CapacityReservationId": cr}}
    two = _run(ec2, 2, zone=None, CapacityReservationSpecification=target)
    assert [(i["Placement"]["AvailabilityZone"], i["CapacityReservationId"]) for i in two] == \
        [(A, cr), (A, cr)]
    assert two[0]["CapacityReservationSpecification"] == target
    assert _described(ec2, cr)["AvailableInstanceCount"] == 0
    with pytest.raises(ClientError) as e:
        _run(ec2, zone=None, CapacityReservationSpecification=target)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert e.value.response["Error"] == {"Code": "ReservationCapacityExceeded",
                                         "Message": EXCEEDED}
    ec2.terminate_instances(InstanceIds=[two[0]["InstanceId"]])
    assert _described(ec2, cr)["AvailableInstanceCount"] == 1  # terminating gives it back
    assert ec2.cancel_capacity_reservation(CapacityReservationId=cr)["Return"] is True
    cancelled = _described(ec2, cr)
    assert (cancelled["State"], cancelled["AvailableInstanceCount"]) == ("cancelled", 0)
    with pytest.raises(ClientError) as e:
        _run(ec2, zone=None, CapacityReservationSpecification=target)
    assert e.value.response["Error"]["Code"] == "ReservationCapacityExceeded"
    admin(sandbox_capacity, "POST", "/moto-api/reset")
    assert ec2.describe_capacity_reservations()["CapacityReservations"] == []
    assert admin(sandbox_capacity, "GET", "/_poolctl/capacity")["limits"] == []


def test_open_reservation_takes_matching_launches_none_preference_does_not(sandbox_capacity,
                                                                         clients):
    ec2, _ = clients
    limit(sandbox_capacity, P5_A=0)
    cr = _reservation(ec2, A, 1, criteria="open")
    first = _run(ec2)[0]
    assert first["CapacityReservationId"] == cr  # matched: same type and zone, open
    with pytest.raises(ClientError) as e:
        _run(ec2)  # the reservation is full and a has no open capacity
    assert e.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    # Stopping gives the slot back; a `none` launch still cannot use it.
    ec2.stop_instances(InstanceIds=[first["InstanceId"]])
    assert _described(ec2, cr)["AvailableInstanceCount"] == 1
    with pytest.raises(ClientError) as e:
        _run(ec2, CapacityReservationSpecification={"CapacityReservationPreference": "none"})
    assert e.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    second = _run(ec2)[0]
    assert second["CapacityReservationId"] == cr
    # Starting the stopped one is a launch, and there is no room left for it.
    with pytest.raises(ClientError) as e:
        ec2.start_instances(InstanceIds=[first["InstanceId"]])
    assert e.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    state = ec2.describe_instances(InstanceIds=[first["InstanceId"]])["Reservations"][0][
        "Instances"][0]["State"]["Name"]
    assert state == "stopped"


def test_describe_filters_modify_and_unknown_ids(sandbox_capacity, clients):
    ec2, _ = clients
    a = _reservation(ec2, A, 2)
    b = _reservation(ec2, B, 3, criteria="open")
    by_zone = ec2.describe_capacity_reservations(
        Filters=[{"Name": "availability-zone", "Values": [B]}])["CapacityReservations"]
    assert [r["CapacityReservationId"] for r in by_zone] == [b]
    ec2.modify_capacity_reservation(CapacityReservationId=a, InstanceCount=4,
                                    EndDateType="limited", EndDate="2099-01-01T00:00:00Z")
    r = _described(ec2, a)
    assert (r["TotalInstanceCount"], r["AvailableInstanceCount"], r["EndDateType"]) == \
        (4, 4, "limited")
    assert r["EndDate"].year == 2099
    with pytest.raises(ClientError) as e:
        ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0123456789abcdef0"])
    assert e.value.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound"
    with pytest.raises(ClientError) as e:
        ec2.create_capacity_reservation(InstanceType=P5, InstancePlatform="Linux/UNIX",
                                        AvailabilityZone=A, InstanceCount=1001)
    assert e.value.response["Error"]["Message"] == (
        "1001 is an invalid value for InstanceCount. InstanceCount must be between 1 and 1000.")


def test_group_reservations_only_launches_two_of_three(sandbox_capacity, clients):
    ec2, asg = clients
    cr = _reservation(ec2, A, 2)
    spec = {"CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationIds": [cr]}}
    name = _group(asg, _template(ec2), desired=3, CapacityReservationSpecification=spec)
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["CapacityReservationSpecification"] == spec  # read back as given
    assert _zones(asg, name) == Counter({A: 2})
    assert _described(ec2, cr)["AvailableInstanceCount"] == 0
    failed = _activities(asg, name, "Failed")
    assert failed and {a["StatusMessage"] for a in failed} == {
        EXCEEDED + " Launching EC2 instance failed."}
    ids = [i["InstanceId"] for i in group["Instances"]]
    got = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    assert {i["CapacityReservationId"] for r in got for i in r["Instances"]} == {cr}


def test_launch_template_reservation_preference_reaches_the_launch(sandbox_capacity, clients):
    ec2, asg = clients
    limit(sandbox_capacity, P5_A=0)
    cr = _reservation(ec2, A, 2, criteria="open")
    # The template says `none`: the group's instance may not use the open reservation.
    none = _group(asg, _template(ec2, CapacityReservationSpecification={
        "CapacityReservationPreference": "none"}), desired=1, zones=(A,))
    assert _zones(asg, none) == Counter()
    # The template targets it: the group's instance runs in it.
    targeted = _group(asg, _template(ec2, CapacityReservationSpecification={
        "CapacityReservationTarget": {"CapacityReservationId": cr}}), desired=1, zones=(A,))
    assert _zones(asg, targeted) == Counter({A: 1})
    assert _described(ec2, cr)["AvailableInstanceCount"] == 1


def test_a_resource_group_of_reservations_is_a_launch_target(sandbox_capacity, clients):
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    ec2, asg = clients
    rg = boto3.client("resource-groups", endpoint_url=sandbox_capacity, region_name="us-east-1",
                      **TEST_CREDENTIALS)
    limit(sandbox_capacity, P5_B=0)
    cr = _reservation(ec2, B, 1)
    arn = _described(ec2, cr)["CapacityReservationArn"]
    group = rg.create_group(Name=_name("crg"), Configuration=[
        {"Type": "AWS::EC2::CapacityReservationPool"},
        {"Type": "AWS::ResourceGroups::Generic", "Parameters": [
            {"Name": "allowed-resource-types", "Values": ["AWS::EC2::CapacityReservation"]}]}],
    )["Group"]
    assert rg.group_resources(Group=group["GroupArn"], ResourceArns=[arn])["Succeeded"] == [arn]
    listed = rg.list_group_resources(Group=group["Name"])["ResourceIdentifiers"]
    assert listed == [{"ResourceArn": arn, "ResourceType": "AWS::EC2::CapacityReservation"}]
    spec = {"CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {
                "CapacityReservationResourceGroupArns": [group["GroupArn"]]}}
    name = _group(asg, _template(ec2), desired=1, zones=(B,),
                  CapacityReservationSpecification=spec)
    assert _zones(asg, name) == Counter({B: 1})
    assert _described(ec2, cr)["AvailableInstanceCount"] == 0
    rg.ungroup_resources(Group=group["GroupArn"], ResourceArns=[arn])
    assert rg.list_group_resources(Group=group["Name"])["ResourceIdentifiers"] == []


def test_capacity_block_from_the_admin_endpoint_is_targeted_only(sandbox_capacity, clients):
    ec2, _ = clients
    limit(sandbox_capacity, P5_A=0)
    made = admin(sandbox_capacity, "POST", "/_poolctl/capacity", {"capacity_blocks": [
        {"instance_type": P5, "zone": A, "count": 1, "hours": 24}]})["created"]
    block = _described(ec2, made[0])
    assert (block["ReservationType"], block["InstanceMatchCriteria"], block["EndDateType"],
            block["TotalInstanceCount"]) == ("capacity-block", "targeted", "limited", 1)
    with pytest.raises(ClientError):
        _run(ec2)  # an untargeted launch does not get it
    target = {"CapacityReservationTarget": {"CapacityReservationId": made[0]}}
    with pytest.raises(ClientError) as e:
        _run(ec2, zone=None, CapacityReservationSpecification=target)  # no market type
    assert e.value.response["Error"] == {
        "Code": "InvalidParameterValue", "Message": "The market type (purchasing) option is "
        "not valid. Choose a different market type and try again."}
    with pytest.raises(ClientError) as e:
        _run(ec2, InstanceMarketOptions=BLOCK_MARKET)  # the market without a block
    assert e.value.response["Error"]["Code"] == "InvalidParameterCombination"
    got = _run(ec2, zone=None, CapacityReservationSpecification=target,
               InstanceMarketOptions=BLOCK_MARKET)
    assert got[0]["CapacityReservationId"] == made[0]
    # DescribeInstances' InstanceLifecycle (botocore's InstanceLifecycleType has it).
    assert got[0].get("InstanceLifecycle") == "capacity-block"


BLOCK_MARKET = {"MarketType": "capacity-block"}


def _clock(endpoint: str, seconds: float) -> None:
    admin(endpoint, "POST", "/_poolctl/clock", {"offset_seconds": seconds})


def test_a_group_launches_into_its_block_only_while_it_is_open(sandbox_capacity, clients):
    ec2, asg = clients
    (cr,) = admin(sandbox_capacity, "POST", "/_poolctl/capacity", {"capacity_blocks": [
        {"instance_type": P5, "zone": A, "count": 2, "hours": 1}]})["created"]
    lt = _template(ec2, InstanceMarketOptions=BLOCK_MARKET, CapacityReservationSpecification={
        "CapacityReservationTarget": {"CapacityReservationId": cr}})
    try:
        _clock(sandbox_capacity, -600)  # 10 min before the block starts: it is scheduled
        early = _group(asg, lt, 1, zones=(A,))
        assert _zones(asg, early) == Counter()
        assert _activities(asg, early, "Failed")[0]["StatusMessage"].startswith(EXCEEDED)
        _clock(sandbox_capacity, 0)
        name = _group(asg, lt, 2, zones=(A,))
        assert _zones(asg, name) == Counter({A: 2})
        ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
        described = [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                     for i in r["Instances"]]
        assert {i["CapacityReservationId"] for i in described} == {cr}
        assert _described(ec2, cr)["AvailableInstanceCount"] == 0  # 2 - 2 launched
        # The block ends 60 min after it began; EC2 empties it from 60 - 30 = 30 min on.
        _clock(sandbox_capacity, 29 * 60)
        states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)[
            "Reservations"] for i in r["Instances"]}
        assert states == {"running"}
        _clock(sandbox_capacity, 31 * 60)
        states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)[
            "Reservations"] for i in r["Instances"]}
        assert states <= {"shutting-down", "terminated"}, states
        # The group replaces them, but not into the block: its launches fail.
        running = [i for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
            "AutoScalingGroups"][0]["Instances"] if i["InstanceId"] not in ids]
        assert running == []
    finally:
        _clock(sandbox_capacity, 0)


def test_bad_admin_capacity_bodies_are_400(sandbox_capacity):
    import urllib.error

    for body in ({"limits": {"p5.48xlarge": 1}}, {"limits": {f"{P5}@{A}": -1}},
                 {"limits": [1]}, {"capacity_blocks": [{"zone": A}]}):
        with pytest.raises(urllib.error.HTTPError) as e:
            admin(sandbox_capacity, "POST", "/_poolctl/capacity", body)
        assert e.value.code == 400, body


# -------------------------------------------------------------------------------------
# poolctl sandbox start --capacity


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POOLCTL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "poolctl", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_start_capacity_flags_reach_the_server_and_survive_reset(tmp_path):
    home = tmp_path / "home"
    res = _cli(home, "sandbox", "start", "--port", "0", "--manual-boot",
               "--capacity", f"{P5}@{A}=1", "--capacity", f"{P4D}@{B}=0", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    try:
        assert info["capacity"] == {f"{P5}@{A}": 1, f"{P4D}@{B}": 0}
        endpoint = info["endpoint"]
        rows = admin(endpoint, "GET", "/_poolctl/capacity")["limits"]
        assert {(r["instance_type"], r["zone"], r["limit"]) for r in rows} == {
            (P5, A, 1), (P4D, B, 0)}
        # On a running sandbox the flag sets the limit.
        again = _cli(home, "sandbox", "start", "--capacity", f"{P5}@{A}=3")
        assert again.returncode == 0, again.stderr
        rows = admin(endpoint, "GET", "/_poolctl/capacity")["limits"]
        assert {(r["zone"], r["limit"]) for r in rows} == {(A, 3), (B, 0)}
        admin(endpoint, "POST", "/moto-api/reset")  # back to the start-up limits
        rows = admin(endpoint, "GET", "/_poolctl/capacity")["limits"]
        assert {(r["zone"], r["limit"]) for r in rows} == {(A, 1), (B, 0)}
    finally:
        assert _cli(home, "sandbox", "stop").returncode == 0


@pytest.mark.parametrize("item", ["p5.48xlarge=1", "p5.48xlarge@us-east-1a", "@us-east-1a=1",
                                  "p5.48xlarge@us-east-1a=-1", "p5.48xlarge@us-east-1a=x"])
def test_bad_capacity_flag_is_one_line_exit_2(tmp_path, item):
    res = _cli(tmp_path, "sandbox", "start", "--port", "0", "--capacity", item)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--capacity {item}" in lines[0] and "TYPE@ZONE=N" in lines[0]
    assert not (tmp_path / "sandbox" / "state.json").exists()


def test_an_update_without_a_template_keeps_the_mixed_instances_policy(sandbox_capacity,
                                                                       clients):
    # AWS keeps a group's mixed instances policy across UpdateAutoScalingGroup calls that
    # do not name one (a new MinSize, as `warm --running` sends); moto dropped it.
    ec2, asg = clients
    lt = _template(ec2)
    name = _name("mixed-kept")
    policy = {"LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": lt,
                                                                 "Version": "1"},
                                 "Overrides": [{"InstanceType": P5}, {"InstanceType": P4D}]},
              "InstancesDistribution": {"OnDemandAllocationStrategy": "prioritized"}}
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=4,
                                  DesiredCapacity=0, AvailabilityZones=[A],
                                  MixedInstancesPolicy=policy)
    limit(sandbox_capacity, P5_A=0)
    asg.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=1, DesiredCapacity=1)
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    overrides = group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    assert [o["InstanceType"] for o in overrides] == [P5, P4D]
    assert [i["InstanceType"] for i in group["Instances"]] == [P4D]  # the fallback launched
