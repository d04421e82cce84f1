"""Deploys interrupted (Ctrl-C) at three points, and the re-runs that converge: the real CLI
in a subprocess, real Terraform, the session's sandbox holding back the answers of create
calls. The interrupted pool, once converged, is handed to `deployed_pool` (the deployed
example), and the fixture's promise is checked here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.e2e.deploys import (
    ASG,
    CONTRACT_TAGS,
    MISSING,
    POOL,
    STACK,
    deploy_args,
    needs_terraform,
    pool_group,
    state_resources,
    tag_dict,
    terraform_log,
    timed,
)
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE, deploy_with_boto3, empty_sandbox
from tests.plugins.sandbox import poolctl_env, run_poolctl, sandbox_admin

pytestmark = pytest.mark.e2e


class Interrupted(NamedTuple):
    code: int
    stderr: str


def _deploy_interrupted(home: Path, ready: Callable[[str], bool], timeout: float = 600
                        ) -> Interrupted:
    """`poolctl deploy`, with Ctrl-C once `ready(stderr so far)` holds.

    Ctrl-C in a terminal signals the whole foreground process group; a session of its own
    lets the test signal exactly poolctl's group. poolctl runs Terraform in a group of its
    own and forwards one interrupt, so Terraform gets exactly one SIGINT either way."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolctl", "deploy", *deploy_args(home=home)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=poolctl_env(home),
        cwd=str(home), start_new_session=True,
    )
    err: list[str] = []
    stream = proc.stderr
    assert stream is not None  # stderr=PIPE
    reader = threading.Thread(target=lambda: err.extend(stream), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not ready("".join(err)):
            assert proc.poll() is None, f"ended before the interrupt:\n{''.join(err)[-3000:]}"
            assert time.monotonic() < deadline, "".join(err)[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    stderr = "".join(err)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert "Two interrupts received" not in stderr  # Terraform got exactly one
    return Interrupted(code, stderr)


def _one_line(res: Interrupted, phase: str) -> None:
    assert res.code == 1, res.stderr[-3000:]
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("poolctl:")]
    assert f"interrupted during `terraform {phase}`" in line, line
    assert "run the same poolctl command again to resume" in line


def _state_types(home: Path) -> set[str]:
    return {r["type"] for r in state_resources(home) if r["mode"] == "managed"}


@needs_terraform
def test_interrupted_deploys_converge_on_the_next_run(sandbox, sandbox_home, sandbox_client,
                                                     pool_keeper):
    """Ctrl-C during the plan, early in the apply and late in the apply, each on the re-run of
    the one before, on one stack. The two apply interrupts land while a create call is in
    flight whose answer the sandbox holds back (a fault): the resource exists in the cloud but
    not in Terraform's state, as with a connection lost on AWS (without adoption the re-run
    fails: launch template AlreadyExists, listener DuplicateListener). Each re-run adopts what
    the one before left unrecorded (the tags prove poolctl made it), the last one completes,
    and the deploy after it has nothing to do. The other lookups (group, role, VPC ...) are
    tested without Terraform in tests/ops/test_interrupts.py."""
    home = Path(sandbox_home)
    if state_resources(home):  # run alone (-k): start from nothing, as after the destroy
        timed(home, "destroy (clean start)", "destroy", *deploy_args(home=home))
    # An empty emulator (groups before on this worker may have left instances, quota in
    # use): the pool it leaves is then the one `deployed_pool` users expect.
    empty_sandbox(sandbox, home)
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    assert pool_group(asg) is None

    def interrupt_at(action: str, delay_s: float, phase: str, label: str) -> Interrupted:
        """A deploy, interrupted once the sandbox holds back the answer to `action` (it
        acted: a create call made the resource)."""
        sandbox_admin(sandbox, "POST", "/_poolctl/faults",
                      {"action": action, "delay_s": delay_s, "times": 1})
        t0 = time.monotonic()
        res = _deploy_interrupted(home, lambda err: action in sandbox_admin(
            sandbox, "GET", "/_poolctl/faults")["holding"])
        print(f"\n[e2e timing] deploy interrupted {label}: wall {time.monotonic() - t0:.1f} s")
        _one_line(res, phase)
        return res

    def launch_template() -> list:
        return ec2.describe_launch_templates(Filters=[
            {"Name": "launch-template-name", "Values": [ASG]}])["LaunchTemplates"]

    try:
        # 1. During the plan (the provider's account lookup held back): nothing is created.
        interrupt_at("GetCallerIdentity", 5, "plan", "in plan")
        assert _state_types(home) == set() and not launch_template()

        # 2. Early in the apply: the launch template is created, its answer never arrives.
        res = interrupt_at("CreateLaunchTemplate", 60, "apply", "early in apply")
        # Terraform stopped gracefully
        assert "Interrupt received" in terraform_log(res.stderr).read_text()
        assert len(launch_template()) == 1
        recorded = _state_types(home)
        assert recorded and "aws_launch_template" not in recorded, recorded

        # 3. Late in the apply: the listener, the last resource (after the load balancer's
        # minute of waiting) is created, its answer never arrives.
        res = interrupt_at("CreateListener", 60, "apply", "late in apply")
        assert f"adopting launch_template {ASG} ({launch_template()[0]['LaunchTemplateId']})" \
            in res.stderr
        assert {"aws_launch_template", "aws_autoscaling_group", "aws_lb"} <= _state_types(home)
        assert "aws_lb_listener" not in _state_types(home)
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/faults")

    [lb] = elbv2.describe_load_balancers(Names=[ASG])["LoadBalancers"]
    [listener] = elbv2.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]
    # 4. The re-run completes, adopting the listener; the next deploy has nothing to do.
    res = timed(home, "deploy after three interrupts", "deploy", *deploy_args(home=home))
    assert f"adopting lb_listener {listener['ListenerArn']}" in res.stderr
    assert "Apply complete!" in terraform_log(res.stderr).read_text()
    assert "Error" not in res.stderr
    again = timed(home, "deploy after the resume", "deploy", *deploy_args(home=home))
    assert f"== {STACK}: no changes" in again.stderr and "adopting" not in again.stderr
    # One of each, nothing duplicated.
    assert len(launch_template()) == 1
    assert pool_group(asg)["MaxSize"] == 6
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [ASG]}])["Vpcs"]
    assert len(vpcs) == 1
    assert [lb["LoadBalancerName"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]
            ].count(ASG) == 1
    # Leave the pool as `deployed_pool` promises it (nodes booted), and hand it over.
    assert run_poolctl(home, "sandbox", "boot-nodes", "--pool", POOL).returncode == 0
    pool_keeper.adopt(sandbox, home)


def _check_pool_like_the_stack(sandbox_client, name: str) -> None:
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    group = pool_group(asg)
    assert group is not None, name
    assert group["AutoScalingGroupName"] == name
    assert (group["MinSize"], group["MaxSize"]) == (1, 6)
    assert CONTRACT_TAGS.items() <= tag_dict(group["Tags"]).items()
    [hook] = asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"]
    assert (hook["LifecycleHookName"], hook["HeartbeatTimeout"]) == ("poolctl-node-ready", 880)
    warm = asg.describe_warm_pool(AutoScalingGroupName=name)
    assert (warm["WarmPoolConfiguration"]["MinSize"],
            warm["WarmPoolConfiguration"]["PoolState"]) == (2, "Stopped")
    # Booted, as the fixture promises: the node InService, the warm pool settled.
    assert [i["LifecycleState"] for i in group["Instances"]] == ["InService"]
    assert [i["LifecycleState"] for i in warm["Instances"]] == ["Warmed:Stopped"] * 2
    ids = [i["InstanceId"] for i in group["Instances"] + warm["Instances"]]
    for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]:
        for inst in r["Instances"]:
            assert CONTRACT_TAGS.items() <= tag_dict(inst["Tags"]).items()
    data = ec2.describe_launch_template_versions(
        LaunchTemplateId=group["LaunchTemplate"]["LaunchTemplateId"], Versions=["$Latest"],
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False
    [lb] = elbv2.describe_load_balancers(Names=[name])["LoadBalancers"]
    assert lb["Scheme"] == "internal"
    lb_tags = elbv2.describe_tags(ResourceArns=[lb["LoadBalancerArn"]])["TagDescriptions"][0]
    assert CONTRACT_TAGS.items() <= tag_dict(lb_tags["Tags"]).items()


# After the interrupt test (file order) the fixture finds the pool it handed over; run alone,
# the fixture deploys it.
def test_deployed_pool_fixture_yields_the_example_pool(deployed_pool, sandbox_client):
    assert deployed_pool == {"file": str(DEPLOYED_EXAMPLE), "asg": ASG, "region": "us-east-1",
                             "via": "boto3" if MISSING else "terraform"}
    _check_pool_like_the_stack(sandbox_client, ASG)


def test_deployed_pool_boto3_fallback_makes_the_same_pool(tmp_path):
    """On a sandbox of its own: wiping the session's would cost its next user a deploy."""
    import boto3

    from poolctl.sandbox import manager
    from poolctl.sandbox.manager import TEST_CREDENTIALS

    home = tmp_path / "home"
    endpoint = str(manager.start(port=0, home=home, parent_pid=os.getpid(),
                                 boot_speedup=0).endpoint)
    try:
        deploy_with_boto3(endpoint)
        sandbox_admin(endpoint, "POST", "/_poolctl/lifecycle-actions",
                      {"AutoScalingGroupName": ASG})
        _check_pool_like_the_stack(lambda service: boto3.client(
            service, endpoint_url=endpoint, region_name="us-east-1", **TEST_CREDENTIALS), ASG)
    finally:
        manager.stop(home=home)
