"""A rollout whose replacement cannot launch (issue 21, part 3): on the deployed example pool,
no p5.48xlarge left in any zone, an instance refresh to a new launch template version (what
`rollout start` starts; here with boto3, with surge: the old node stays until its
replacement serves); `rollout status` says the rollout is paused, naming the code and the
zones, and `--json` lists the failures."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.ops.test_capacity_e2e_aws import ASG, P5, ZONES
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import boto3_client, pool_cli, sandbox_admin


@pytest.fixture
def refresh_without_capacity(deployed_pool, sandbox) -> Iterator[str]:
    ec2, asg = boto3_client(sandbox, "ec2"), boto3_client(sandbox, "autoscaling")
    lt = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])[
        "AutoScalingGroups"][0]["LaunchTemplate"]
    # The running version's data again (moto ignores SourceVersion): the same p5 node.
    data = ec2.describe_launch_template_versions(
        LaunchTemplateId=lt["LaunchTemplateId"], Versions=[str(lt["Version"])])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["InstanceType"] == P5
    new = ec2.create_launch_template_version(
        LaunchTemplateId=lt["LaunchTemplateId"], LaunchTemplateData=data)[
        "LaunchTemplateVersion"]["VersionNumber"]
    sandbox_admin(sandbox, "POST", "/_poolctl/capacity",
                  {"limits": {f"{P5}@{z}": 0 for z in ZONES}})
    rid = asg.start_instance_refresh(
        AutoScalingGroupName=ASG, Strategy="Rolling",
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt["LaunchTemplateId"],
                                                 "Version": str(new)}},
        Preferences={"MinHealthyPercentage": 100, "MaxHealthyPercentage": 200})[
        "InstanceRefreshId"]
    try:
        yield rid
    finally:
        asg.cancel_instance_refresh(AutoScalingGroupName=ASG)
        sandbox_admin(sandbox, "DELETE", "/_poolctl/capacity")


def test_rollout_status_says_paused_naming_the_failure(refresh_without_capacity, sandbox,
                                                        sandbox_home, tmp_path):
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(DEPLOYED_EXAMPLE.read_text())
    cli = pool_cli(sandbox_home, pool_file)
    data = None
    for _ in range(4):  # the sandbox's refresh moves a step per read: pending, then a launch
        data = json.loads(cli("rollout", "status", "--json").stdout)
        if data["paused"]:
            break
    assert data is not None and data["rollout"]["id"] == refresh_without_capacity
    assert data["paused"] and data["paused"].startswith(
        "a replacement cannot launch: InsufficientInstanceCapacity: no "
        f"{P5} capacity in us-east-1"), data["rollout"]
    assert {f["code"] for f in data["capacity_failures"]} == {"InsufficientInstanceCapacity"}
    text = cli("rollout", "status").stdout
    assert "  paused: a replacement cannot launch: InsufficientInstanceCapacity" in text
