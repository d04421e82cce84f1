"""Insufficient capacity, survived on a fallback type (issue 21, part 4): the deployed
example pool turned into what the stack makes of `aws.fallback_instance_types:
[p5en.48xlarge]` with `warm_pool.replicas: 0` (its warm pool deleted, the group's mixed
instances policy set with boto3 from `poolctl.contract.aws.mixed_instances_policy`, as an
instance refresh passes it); no p5.48xlarge left in any zone: `warm --replicas 8 --running
--wait` grows the pool by 2 nodes on p5en.48xlarge and exits 0."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
import yaml

from poolctl.config import parse_config
from poolctl.contract.aws import mixed_instances_policy
from tests.ops.test_capacity_e2e_aws import ASG, P5, ZONES, booting
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import boto3_client, pool_cli, sandbox_admin

P5EN = "p5en.48xlarge"


def fallback_file() -> str:
    cfg = yaml.safe_load(DEPLOYED_EXAMPLE.read_text())
    cfg["pools"][0]["warm_pool"]["replicas"] = 0
    cfg["pools"][0]["aws"]["fallback_instance_types"] = [P5EN]
    return yaml.safe_dump(cfg)


@pytest.fixture
def on_fallback(deployed_pool, sandbox) -> Iterator[str]:
    text = fallback_file()
    asg = boto3_client(sandbox, "autoscaling")
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])[
        "AutoScalingGroups"][0]
    lt = group["LaunchTemplate"]
    asg.delete_warm_pool(AutoScalingGroupName=ASG, ForceDelete=True)
    asg.update_auto_scaling_group(
        AutoScalingGroupName=ASG, MixedInstancesPolicy=mixed_instances_policy(
            parse_config(text).pools[0], lt["LaunchTemplateId"], lt["Version"]))
    # p5 nowhere beyond the 1 node in service; p5en with room in every zone.
    sandbox_admin(sandbox, "POST", "/_poolctl/capacity", {"limits": {
        **{f"{P5}@{z}": 0 for z in ZONES}, **{f"{P5EN}@{z}": 4 for z in ZONES}}})
    try:
        yield text
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/capacity")


def test_the_pool_grows_on_the_fallback_type(on_fallback, sandbox, sandbox_home, tmp_path):
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(on_fallback)
    cli = pool_cli(sandbox_home, pool_file)
    with booting(sandbox):
        res = cli("warm", "--replicas", "8", "--running", "--wait", "--timeout", "120",
                  timeout=150)
    group = boto3_client(sandbox, "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[ASG])["AutoScalingGroups"][0]
    # The 1 p5 node in service + 8 replicas / 4 per node = 2 more, on p5en.
    assert Counter(i["InstanceType"] for i in group["Instances"]
                   if i["LifecycleState"] == "InService") == Counter({P5: 1, P5EN: 2}), (
        res.stderr)
    st = json.loads(cli("status", "--json").stdout)["pools"][0]
    assert st["nodes"]["in_service"] == 3
