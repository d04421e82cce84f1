"""Interrupts of Terraform runs and the adoption of what an interrupted apply left behind.

- One interrupt reaches Terraform, however many the user sends: Terraform runs in a process
  group of its own, poolctl forwards the first Ctrl-C as one SIGINT and waits until Terraform
  has saved its state (a second SIGINT makes Terraform exit at once, state unsaved). A fake
  `terraform` (a script that records the signals it gets) stands in, so this takes a second.
- `poolctl.clouds.aws.adopt.find` against the sandbox over HTTP: resources made the way an
  interrupted apply leaves them (in AWS, not in the state) are found by name or Name tag and
  adopted only when the contract tags name this project and pool.
The whole cycle through real Terraform (interrupts during the plan, early and late in the
apply, each re-run converging) is in tests/e2e/test_deploy_sandbox.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from poolctl.clouds.aws import adopt as aws_adopt

FAKE_TERRAFORM = """\
#!{python}
import os, signal, sys, time
log = open(os.environ["FAKE_TF_LOG"], "a", buffering=1)
def stop(signum, frame):
    log.write("SIGINT\\n")
    time.sleep(1.5)  # the calls in flight end
    log.write("state saved\\n")
    sys.exit(1)
signal.signal(signal.SIGINT, stop)
print("applying", flush=True)
time.sleep(60)
log.write("not interrupted\\n")
"""

DRIVER = """\
import sys
from pathlib import Path
from poolctl.errors import OperationFailed
from poolctl.terraform import Terraform
try:
    # verbose: Terraform's output on stderr too, where the test reads it
    Terraform(Path(sys.argv[1]), verbose=True).run("apply", "apply")
except OperationFailed as e:
    print(f"poolctl: {e}", file=sys.stderr)
    sys.exit(1)
"""


def test_one_interrupt_reaches_terraform_and_poolctl_waits_for_its_state(tmp_path):
    fake = tmp_path / "terraform"
    fake.write_text(FAKE_TERRAFORM.format(python=sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "signals.log"
    env = {**os.environ, "POOLCTL_TERRAFORM": str(fake), "FAKE_TF_LOG": str(log),
           "POOLCTL_HOME": str(tmp_path / "home")}
    env.pop("POOLCTL_PROVIDER_MIRROR", None)
    # A session of its own: os.killpg below is Ctrl-C at a terminal (the foreground group).
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr.readline().strip() == "applying"
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)  # the user presses Ctrl-C again while Terraform saves its state
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.stderr.read()
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert log.read_text().splitlines() == ["SIGINT", "state saved"]
    assert code == 1
    assert "== interrupt: Terraform ends its apply" in err
    assert "still waiting for Terraform to save its state" in err
    [line] = [ln for ln in err.splitlines() if ln.startswith("poolctl:")]
    assert "interrupted during `terraform apply`" in line
    assert "run the same poolctl command again to resume" in line


# ---------------------------------------------------------------------------------------
# Adoption lookups against the sandbox

PROJECT, POOL = "adopt", "orphans"
NAME = f"{PROJECT}-{POOL}"
CONTRACT = {"poolctl:project": PROJECT, "poolctl:pool": POOL}


def _kv(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


@pytest.fixture(scope="module")
def orphans(sandbox):
    """What interrupted applies left of one stack: each resource in AWS, none in a state.
    A `${...}` reference resolves through the state (the listener's load balancer)."""
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    def c(service: str):
        return boto3.client(service, endpoint_url=sandbox, region_name="us-east-1",
                            **TEST_CREDENTIALS)

    ec2, iam, logs, elbv2, kms, asg = (c(s) for s in (
        "ec2", "iam", "logs", "elbv2", "kms", "autoscaling"))
    tags = {**CONTRACT, "poolctl:role": "inference"}
    ids: dict[str, str] = {}
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16", TagSpecifications=[{
        "ResourceType": "vpc", "Tags": _kv({**tags, "Name": NAME})}])["Vpc"]["VpcId"]
    ids["aws_vpc.vpc"] = vpc
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.77.{i * 16}.0/20",
                                 AvailabilityZone=f"us-east-1{z}", TagSpecifications=[{
                                     "ResourceType": "subnet",
                                     "Tags": _kv({**tags, "Name": f"{NAME}-private-{i}"})}],
                                 )["Subnet"]["SubnetId"] for i, z in enumerate("ab")]
    ids["aws_subnet.private-0"] = subnets[0]
    sg = ec2.create_security_group(GroupName=f"{NAME}-nodes", VpcId=vpc, Description="x",
                                   TagSpecifications=[{"ResourceType": "security-group",
                                                       "Tags": _kv(tags)}])["GroupId"]
    ids["aws_security_group.nodes"] = sg
    # Rules: ours (tagged, as Terraform authorizes them), and an untagged one of the same
    # spec but another port (someone's hand edit): only the exact, tagged one is adopted.
    rule_tags = [{"ResourceType": "security-group-rule", "Tags": _kv(tags)}]
    [rule] = ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 8000, "ToPort": 8000,
        "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}], TagSpecifications=rule_tags,
    )["SecurityGroupRules"]
    ids["aws_vpc_security_group_ingress_rule.in"] = rule["SecurityGroupRuleId"]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 8001, "ToPort": 8001,
        "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}])
    [out] = ec2.authorize_security_group_egress(GroupId=sg, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
        "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}], TagSpecifications=rule_tags,
    )["SecurityGroupRules"]
    ids["aws_vpc_security_group_egress_rule.out"] = out["SecurityGroupRuleId"]
    lt = ec2.create_launch_template(
        LaunchTemplateName=NAME, LaunchTemplateData={"InstanceType": "t3.micro"},
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": _kv(tags)}],
    )["LaunchTemplate"]["LaunchTemplateId"]
    ids["aws_launch_template.lt"] = lt
    iam.create_role(RoleName=NAME, AssumeRolePolicyDocument="{}", Tags=_kv(tags))
    ids["aws_iam_role.role"] = NAME
    iam.create_instance_profile(InstanceProfileName=NAME, Tags=_kv(tags))
    ids["aws_iam_instance_profile.profile"] = NAME
    logs.create_log_group(logGroupName=f"/poolctl/{PROJECT}/{POOL}", tags=tags)
    ids["aws_cloudwatch_log_group.logs"] = f"/poolctl/{PROJECT}/{POOL}"
    key = kms.create_key(Tags=[{"TagKey": k, "TagValue": v} for k, v in tags.items()]
                         )["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=f"alias/poolctl/{NAME}", TargetKeyId=key)
    ids["aws_kms_key.key"] = key
    ids["aws_kms_alias.alias"] = f"alias/poolctl/{NAME}"
    lb = elbv2.create_load_balancer(Name=NAME, Subnets=subnets, Scheme="internal",
                                    Tags=_kv(tags))["LoadBalancers"][0]["LoadBalancerArn"]
    tg = elbv2.create_target_group(Name=NAME, Protocol="HTTP", Port=8000, VpcId=vpc,
                                   Tags=_kv(tags))["TargetGroups"][0]["TargetGroupArn"]
    ids["aws_lb_target_group.tg"] = tg
    listener = elbv2.create_listener(
        LoadBalancerArn=lb, Protocol="HTTP", Port=80, Tags=_kv(tags),
        DefaultActions=[{"Type": "forward", "TargetGroupArn": tg}])["Listeners"][0]
    ids["aws_lb_listener.http"] = listener["ListenerArn"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=NAME, MinSize=0, MaxSize=1, VPCZoneIdentifier=subnets[0],
        LaunchTemplate={"LaunchTemplateId": lt, "Version": "$Latest"},
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in tags.items()])
    ids["aws_autoscaling_group.asg"] = NAME
    # Decoys: the same names without this pool's tags (another team's), never adopted.
    ec2.create_launch_template(LaunchTemplateName=f"{NAME}-other",
                               LaunchTemplateData={"InstanceType": "t3.micro"})
    iam.create_role(RoleName=f"{NAME}-other", AssumeRolePolicyDocument="{}",
                    Tags=_kv({**tags, "poolctl:pool": "someone-else"}))
    return {"client": c, "ids": ids, "lb": lb}


def _config(names: dict[str, dict]) -> dict:
    config: dict = {"resource": {}}
    for address, block in names.items():
        kind, name = address.split(".")
        config["resource"].setdefault(kind, {})[name] = block
    return config


STACK = {
    "aws_vpc.vpc": {"tags": {"Name": NAME}},
    "aws_subnet.private-0": {"vpc_id": "${aws_vpc.vpc.id}",
                             "tags": {"Name": f"{NAME}-private-0"}},
    "aws_security_group.nodes": {"name": f"{NAME}-nodes", "vpc_id": "${aws_vpc.vpc.id}"},
    "aws_vpc_security_group_ingress_rule.in": {
        "security_group_id": "${aws_security_group.nodes.id}", "ip_protocol": "tcp",
        "from_port": 8000, "to_port": 8000, "cidr_ipv4": "10.0.0.0/8"},
    "aws_vpc_security_group_egress_rule.out": {
        "security_group_id": "${aws_security_group.nodes.id}", "ip_protocol": "tcp",
        "from_port": 443, "to_port": 443, "cidr_ipv4": "0.0.0.0/0"},
    # The hand-made rule's spec but on a port no rule has: nothing to adopt.
    "aws_vpc_security_group_ingress_rule.none": {
        "security_group_id": "${aws_security_group.nodes.id}", "ip_protocol": "tcp",
        "from_port": 9000, "to_port": 9000, "cidr_ipv4": "10.0.0.0/8"},
    "aws_launch_template.lt": {"name": NAME},
    "aws_iam_role.role": {"name": NAME},
    "aws_iam_instance_profile.profile": {"name": NAME, "role": "${aws_iam_role.role.name}"},
    "aws_cloudwatch_log_group.logs": {"name": f"/poolctl/{PROJECT}/{POOL}"},
    "aws_kms_key.key": {"description": "logs"},
    "aws_kms_alias.alias": {"name": f"alias/poolctl/{NAME}",
                            "target_key_id": "${aws_kms_key.key.key_id}"},
    "aws_lb_target_group.tg": {"name": NAME},
    "aws_lb_listener.http": {"load_balancer_arn": "${aws_lb.lb.arn}", "port": 80},
    "aws_autoscaling_group.asg": {"name": NAME},
    # Not found: nothing of these names, or no name to find them by.
    "aws_launch_template.missing": {"name": f"{NAME}-never-made"},
    "aws_route.default": {"route_table_id": "${aws_route_table.rt.id}"},
    "aws_iam_role.expression": {"name": "${var.role_name}"},
}


def test_adopts_what_the_tags_prove_poolctl_made_for_this_pool(orphans):
    config = _config({**STACK, "aws_lb.lb": {"name": NAME}})
    state = {"aws_lb.lb": {"id": orphans["lb"], "arn": orphans["lb"]}}  # recorded already
    found = aws_adopt.find(orphans["client"], config, state, CONTRACT)
    assert {f.address: f.id for f in found} == orphans["ids"]
    by = {f.address: f.what for f in found}
    assert by["aws_launch_template.lt"] == f"launch_template {NAME}"
    assert by["aws_vpc.vpc"] == f"vpc {NAME}"


def test_never_adopts_another_pools_resources_or_ones_in_the_state(orphans):
    config = _config({
        "aws_launch_template.other": {"name": f"{NAME}-other"},  # no tags at all
        "aws_iam_role.other": {"name": f"{NAME}-other"},  # another pool's tags
        "aws_launch_template.lt": {"name": NAME},
        "aws_iam_role.role": {"name": NAME},
    })
    # The launch template is in the state under another address: not imported twice.
    state = {"aws_launch_template.old": {"id": orphans["ids"]["aws_launch_template.lt"]}}
    found = aws_adopt.find(orphans["client"], config, state, CONTRACT)
    assert [f.address for f in found] == ["aws_iam_role.role"]
    # Another project's name for the same resources finds nothing of ours.
    assert aws_adopt.find(orphans["client"], config, {},
                          {"poolctl:project": "other", "poolctl:pool": POOL}) == []


def test_a_failed_lookup_is_one_clear_line(sandbox):
    from poolctl.errors import OperationFailed

    def broken(service: str):
        class Client:
            def describe_launch_templates(self, **kw):
                raise RuntimeError("connection reset")
        return Client()

    with pytest.raises(OperationFailed,
                       match=r"looking for aws_launch_template\.lt in AWS .* connection reset"):
        aws_adopt.find(broken, _config({"aws_launch_template.lt": {"name": NAME}}), {},
                       CONTRACT)



def test_a_lookup_the_caller_may_not_make_is_skipped_not_fatal():
    import botocore.exceptions

    def denied(service: str):
        class Client:
            def get_role(self, **kw):
                raise botocore.exceptions.ClientError(
                    {"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetRole")
        return Client()

    skipped = []
    found = aws_adopt.find(denied, _config({"aws_iam_role.role": {"name": NAME}}), {},
                           CONTRACT, on_denied=lambda a, c: skipped.append((a, c)))
    assert found == [] and skipped == [("aws_iam_role.role", "AccessDenied")]
