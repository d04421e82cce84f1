"""`poolctl deploy --cloud aws --sandbox` end to end: the real CLI in a subprocess, real
cdktf synthesis, real Terraform with the AWS provider, against the session's sandbox server.

The deploy tests run in file order on one pool: deploy, inspect, boot, redeploy (no changes),
--plan-only, destroy, then deploys interrupted at three points and the re-run that converges
(which leaves the pool deployed, as `deployed_pool` users expect to find it). Wall times and
the synth/init/plan/apply split of every run are printed (`pytest -s` shows them).

The example pool (examples/llama-70b-p5/poolctl.yaml), worked out by hand: TP 2 on 8 GPUs =
4 replicas per node; 4..24 replicas = 1..6 nodes, the group's MaxSize 6 (a rollout adds its
surge of 4 replicas = 1 node only while it runs); 8 warm replicas = 2 warm nodes, prepared
capacity 1 + 2 = 3.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE, deploy_with_boto3, empty_sandbox
from tests.plugins.sandbox import poolctl_env, run_poolctl, sandbox_admin, terraform_missing

STACK = "acme-chat-70b-aws"
ASG = "acme-chat-70b"
POOL = "chat-70b"
CONTRACT_TAGS = {"poolctl:project": "acme", "poolctl:pool": POOL, "poolctl:role": "inference"}
TIMINGS = re.compile(rf"== {STACK}: (synth [\d.]+ s(?:, \w+ [\d.]+ s)*)")
LOG_LINE = re.compile(rf"== {STACK}: Terraform's output goes to (\S+)")
# p5.48xlarge at the catalog's $55.04 per node-hour: 1 node at the minimum, 6 at the maximum
COST_LINE = ("the pool {verb} $55.04/h at its minimum (1 node(s)) to $330.24/h at its maximum "
             "(6 node(s)): p5.48xlarge at $55.04 per node-hour")

MISSING = terraform_missing()
needs_terraform = pytest.mark.skipif(MISSING is not None, reason=f"e2e deploy: {MISSING}")
pytestmark = pytest.mark.e2e


def _deploy_args(*extra: str, file: Path = DEPLOYED_EXAMPLE, home: Path) -> list[str]:
    return ["--cloud", "aws", "--sandbox", "--auto-approve", "-f", str(file),
            "--out", str(home / "cdktf.out"), *extra]


def _timed(home: Path, label: str, *args: str, child: bool = False
           ) -> subprocess.CompletedProcess:
    """`poolctl ARGS`, timed; `child`: as the console script in its own process (the first
    deploy runs so, end to end), else in this worker (tests/inproc.py)."""
    start = time.monotonic()
    res = run_poolctl(home, *args, child=child)
    wall = time.monotonic() - start
    split = TIMINGS.search(res.stderr)
    print(f"\n[e2e timing] {label}: wall {wall:.1f} s; {split.group(1) if split else 'no split'}")
    assert res.returncode == 0, f"{label} failed ({res.returncode}):\n{res.stderr[-4000:]}"
    return res


def _terraform_log(stderr: str) -> Path:
    """The log of the run's Terraform output, whose path the run printed; private."""
    [path] = LOG_LINE.findall(stderr)
    log = Path(path)
    assert log.stat().st_mode & 0o777 == 0o600
    return log


def _state_resources(home: Path) -> list:
    path = home / "sandbox" / "state" / f"{STACK}.tfstate"
    if not path.exists():
        return []
    return json.loads(path.read_text() or "{}").get("resources", [])


def _tags(items) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or []}


def _group(asg) -> dict | None:
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"]
    return groups[0] if groups else None


@pytest.fixture(scope="module")
def first_deploy(sandbox, sandbox_home):
    """The pool deployed from nothing (an earlier deployment of the stack is destroyed)."""
    if MISSING:
        pytest.skip(f"e2e deploy: {MISSING}")
    home = Path(sandbox_home)
    if _state_resources(home):
        _timed(home, "destroy (clean start)", "destroy", *_deploy_args(home=home))
    res = _timed(home, "first deploy", "deploy", *_deploy_args(home=home), child=True)
    synthesized = json.loads(
        (home / "cdktf.out" / "stacks" / STACK / "cdk.tf.json").read_text())
    # Every resource block is one resource (none has a count or for_each).
    total = sum(len(blocks) for blocks in synthesized["resource"].values())
    return {"res": res, "home": home, "total": total}


@needs_terraform
def test_first_deploy_creates_the_pool_as_the_contract_says(first_deploy, sandbox_client):
    res, total = first_deploy["res"], first_deploy["total"]
    # Terraform's output goes to its log; the screen has poolctl's lines, stdout its results.
    log = _terraform_log(res.stderr).read_text()
    assert "Initializing provider plugins..." in log
    assert f"Apply complete! Resources: {total} added, 0 changed, 0 destroyed." in log
    assert "Apply complete" not in res.stdout + res.stderr
    assert "Initializing" not in res.stderr and "Refreshing" not in res.stderr
    # Terraform's -json stream, its messages logged: one per resource, no attribute values,
    # so the boot script (base64 of "#!/...": "IyEv") is in no log and on no screen
    assert re.search(r"^aws_launch_template\.\S+: Creation complete after \d+s", log, re.M)
    assert "user_data" not in log
    assert "IyEv" not in log + res.stderr + res.stdout
    assert TIMINGS.search(res.stderr), res.stderr[-2000:]
    assert f"{STACK}: autoscaling_group_name = {ASG}" in res.stdout
    # the summary before the apply: adds by type, the sizes, the cost per hour
    assert re.search(r"│ aws_autoscaling_group +│ +1 │ +│ +│", res.stdout), res.stdout
    assert re.search(rf"│ total +│ +{total} │ +0 │ +0 │", res.stdout), res.stdout
    assert re.search(r"│ warm_pool\.min_size +│ +│ +2 \(8 replicas\) │", res.stdout), res.stdout
    assert COST_LINE.format(verb="costs") in res.stdout
    # off a terminal, the apply's progress is one line per resource finished, in order
    done = re.findall(rf"^{STACK}: apply (\d+)/{total}: \S+ created \(\d+ s\)$", res.stderr,
                      re.M)
    assert done == [str(i) for i in range(1, total + 1)]

    asg, ec2, elbv2, cw = (sandbox_client(s) for s in
                           ("autoscaling", "ec2", "elbv2", "cloudwatch"))
    group = _group(asg)
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (1, 6, 1)
    assert group["DefaultInstanceWarmup"] == 440  # plan's cold start, 440.5 s, whole seconds
    assert group["HealthCheckType"] == "ELB"
    assert CONTRACT_TAGS.items() <= _tags(group["Tags"]).items()
    assert all(t["PropagateAtLaunch"] for t in group["Tags"])

    [hook] = asg.describe_lifecycle_hooks(AutoScalingGroupName=ASG)["LifecycleHooks"]
    assert (hook["LifecycleHookName"], hook["LifecycleTransition"], hook["DefaultResult"]) == (
        "poolctl-node-ready", "autoscaling:EC2_INSTANCE_LAUNCHING", "ABANDON")
    assert hook["HeartbeatTimeout"] == 880  # min(7200, max(600, 2 x 440))
    # No boot script runs in the sandbox: the first node waits on the hook.
    assert [i["LifecycleState"] for i in group["Instances"]] == ["Pending:Wait"]

    warm = asg.describe_warm_pool(AutoScalingGroupName=ASG)
    config = warm["WarmPoolConfiguration"]
    assert (config["MinSize"], config["MaxGroupPreparedCapacity"], config["PoolState"]) == (
        2, 3, "Stopped")
    # max(MinSize 2, 3 - desired 1) = 2 warm nodes, each waiting on the hook too.
    assert [i["LifecycleState"] for i in warm["Instances"]] == ["Warmed:Pending:Wait"] * 2

    ids = [i["InstanceId"] for i in group["Instances"] + warm["Instances"]]
    instances = [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                 for i in r["Instances"]]
    assert len(instances) == 3
    for inst in instances:
        assert CONTRACT_TAGS.items() <= _tags(inst["Tags"]).items()
        assert inst["InstanceType"] == "p5.48xlarge"

    lt_id = group["LaunchTemplate"]["LaunchTemplateId"]
    [version] = ec2.describe_launch_template_versions(
        LaunchTemplateId=lt_id, Versions=["$Latest"])["LaunchTemplateVersions"]
    data = version["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    [nic] = data["NetworkInterfaces"]
    assert nic["AssociatePublicIpAddress"] is False
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    assert {s["ResourceType"] for s in data["TagSpecifications"]} == {"instance", "volume"}
    # The emulator's stock AMI carries no boot-library tag: the plan chose the whole boot
    # script (a built image gets the image variant: tests/ops/test_image_build.py).
    # gzip: cloud-init decompresses it (bootscript.user_data)
    user_data = gzip.decompress(base64.b64decode(data["UserData"])).decode()
    assert "verify_weights() {" in user_data and "POOLCTL_LIB_VERSION=" not in user_data

    [lb] = elbv2.describe_load_balancers(Names=[ASG])["LoadBalancers"]
    assert (lb["Scheme"], lb["Type"]) == ("internal", "application")
    lb_tags = elbv2.describe_tags(ResourceArns=[lb["LoadBalancerArn"]])["TagDescriptions"][0]
    assert CONTRACT_TAGS.items() <= _tags(lb_tags["Tags"]).items()
    [tg] = elbv2.describe_target_groups(Names=[ASG])["TargetGroups"]
    assert (tg["HealthCheckPath"], tg["Port"], tg["Protocol"]) == ("/health", 8000, "HTTP")
    assert group["TargetGroupARNs"] == [tg["TargetGroupArn"]]
    [listener] = elbv2.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]
    assert listener["Port"] == 80
    assert listener["DefaultActions"][0]["TargetGroupArn"] == tg["TargetGroupArn"]

    policies = {p["PolicyName"]: p for p in
                asg.describe_policies(AutoScalingGroupName=ASG)["ScalingPolicies"]}
    target = policies[f"{ASG}-queue-target"]
    tt = target["TargetTrackingConfiguration"]
    assert target["PolicyType"] == "TargetTrackingScaling" and target["Enabled"] is True
    assert tt["TargetValue"] == 4.0 and tt["DisableScaleIn"] is True  # queue_target 4
    metric = tt["CustomizedMetricSpecification"]
    assert (metric["Namespace"], metric["MetricName"]) == ("poolctl", "RequestsWaitingPerReplica")
    scale_in = policies[f"{ASG}-scale-in"]
    assert (scale_in["PolicyType"], scale_in["AdjustmentType"], scale_in["ScalingAdjustment"],
            scale_in["Cooldown"]) == ("SimpleScaling", "ChangeInCapacity", -1, 300)

    [alarm] = cw.describe_alarms(AlarmNames=[f"{ASG}-queue-low"])["MetricAlarms"]
    # queue_target 4 / 2 = 2 waiting per replica, held for 900 s / 60 s = 15 periods.
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (2.0, "LessThanThreshold")
    assert (alarm["Period"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (
        60, 15, 15)
    assert alarm["AlarmActions"] == [scale_in["PolicyARN"]]


@needs_terraform
def test_terraform_files_under_poolctl_home_are_private(first_deploy):
    """State, plan, lock file, override, workdir: 0700 folders, 0600 files (point 11)."""
    from tests.unit.test_private_files import not_private

    sandbox_dir = first_deploy["home"] / "sandbox"
    written = [sandbox_dir / "deploy" / STACK / name for name in (
        "tfplan", ".terraform.lock.hcl", "cdk.tf.json", "endpoint_override.tf.json")]
    assert all(p.is_file() for p in written)
    assert (sandbox_dir / "state" / f"{STACK}.tfstate").is_file()
    assert not_private(sandbox_dir) == []


@needs_terraform
def test_boot_nodes_moves_the_waiting_node_in_service(first_deploy, sandbox_client):
    res = run_poolctl(first_deploy["home"], "sandbox", "boot-nodes", "--pool", POOL, "--json")
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    assert sorted(n["state"] for n in nodes) == ["InService", "Warmed:Stopped", "Warmed:Stopped"]
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    [node] = _group(asg)["Instances"]
    assert node["LifecycleState"] == "InService"
    warm = asg.describe_warm_pool(AutoScalingGroupName=ASG)["Instances"]
    warm_ids = [w["InstanceId"] for w in warm]
    states = {i["InstanceId"]: i["State"]["Name"]
              for r in ec2.describe_instances(InstanceIds=warm_ids)["Reservations"]
              for i in r["Instances"]}
    assert states == {i: "stopped" for i in warm_ids}
    [tg] = elbv2.describe_target_groups(Names=[ASG])["TargetGroups"]
    targets = elbv2.describe_target_health(TargetGroupArn=tg["TargetGroupArn"])
    assert [t["Target"]["Id"] for t in targets["TargetHealthDescriptions"]] == [
        node["InstanceId"]]


@needs_terraform
def test_second_deploy_reports_no_changes_and_applies_nothing(first_deploy, sandbox_client):
    asg = sandbox_client("autoscaling")
    before = _group(asg)
    res = _timed(first_deploy["home"], "second deploy", "deploy",
                 *_deploy_args(home=first_deploy["home"]))
    assert f"== {STACK}: no changes" in res.stderr
    assert "terraform apply" not in res.stderr and "Apply complete" not in res.stderr
    # the working folder was initialized by the first deploy: init is not run again
    assert f"== {STACK}: terraform init skipped" in res.stderr
    assert "Initializing" not in _terraform_log(res.stderr).read_text()
    after = _group(asg)
    assert [i["InstanceId"] for i in after["Instances"]] == [
        i["InstanceId"] for i in before["Instances"]]
    assert after["LaunchTemplate"] == before["LaunchTemplate"]
    # what a CI job runs to find drift: no changes is exit 0, and no resource line
    ci = run_poolctl(first_deploy["home"], "deploy",
                     *_deploy_args("--plan-only", "--detailed-exitcode",
                                   home=first_deploy["home"]))
    assert ci.returncode == 0, ci.stderr[-3000:]
    assert not re.search(rf"^{STACK}: (create|update|replace|destroy|import) ", ci.stdout, re.M)


@needs_terraform
def test_plan_only_shows_a_change_and_applies_nothing(first_deploy, sandbox_client, tmp_path):
    home = first_deploy["home"]
    changed = tmp_path / "poolctl.yaml"
    changed.write_text(DEPLOYED_EXAMPLE.read_text().replace("queue_target: 4",
                                                            "queue_target: 6"))
    res = run_poolctl(home, "deploy", *_deploy_args(
        "--plan-only", "--detailed-exitcode", "--json", "--verbose", file=changed, home=home))
    # Terraform's -detailed-exitcode: 2 is "changes present", not a usage error
    assert res.returncode == 2, res.stderr[-4000:]
    assert not [x for x in res.stderr.splitlines() if x.startswith("poolctl: ")]  # no error
    assert f"== {STACK}: --plan-only, nothing applied" in res.stderr
    # --verbose: Terraform's output on stderr too, and in its log
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in res.stderr
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in _terraform_log(res.stderr).read_text()
    [stack] = json.loads(res.stdout)["stacks"]  # stdout is the JSON and nothing else
    assert (stack["cost_per_hour_usd"]["min"], stack["cost_per_hour_usd"]["max"]) == (
        55.04, 330.24)
    assert stack["sizes"] == []  # the queue target sizes nothing
    # The target, the alarm threshold (6 / 2 = 3) and the dashboard's target line change in
    # place; nothing else.
    assert stack["summary"] == {
        "aws_autoscaling_policy": {"add": 0, "change": 1, "destroy": 0},
        "aws_cloudwatch_dashboard": {"add": 0, "change": 1, "destroy": 0},
        "aws_cloudwatch_metric_alarm": {"add": 0, "change": 1, "destroy": 0},
    }
    # and the same, resource by resource: three in-place updates of resources the stack has
    synthesized = json.loads((home / "cdktf.out" / "stacks" / STACK / "cdk.tf.json").read_text())
    addresses = {f"{t}.{name}" for t, blocks in synthesized["resource"].items()
                 for name in blocks}
    assert sorted((c["action"], c["address"].split(".")[0]) for c in stack["changes"]) == [
        ("update", "aws_autoscaling_policy"), ("update", "aws_cloudwatch_dashboard"),
        ("update", "aws_cloudwatch_metric_alarm")]
    assert {c["address"] for c in stack["changes"]} <= addresses
    assert stack["applied"] is False
    assert "Apply complete" not in res.stderr
    asg, cw = sandbox_client("autoscaling"), sandbox_client("cloudwatch")
    [target] = asg.describe_policies(
        AutoScalingGroupName=ASG, PolicyNames=[f"{ASG}-queue-target"])["ScalingPolicies"]
    assert target["TargetTrackingConfiguration"]["TargetValue"] == 4.0
    [alarm] = cw.describe_alarms(AlarmNames=[f"{ASG}-queue-low"])["MetricAlarms"]
    assert alarm["Threshold"] == 2.0


@needs_terraform
def test_destroy_removes_the_pool(first_deploy, sandbox_client):
    home, total = first_deploy["home"], first_deploy["total"]
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    group = _group(asg)
    ids = [i["InstanceId"] for i in group["Instances"]] + [
        w["InstanceId"] for w in asg.describe_warm_pool(AutoScalingGroupName=ASG)["Instances"]]
    res = _timed(home, "destroy", "destroy", *_deploy_args(home=home))
    assert f"Apply complete! Resources: 0 added, 0 changed, {total} destroyed." in (
        _terraform_log(res.stderr).read_text())
    assert COST_LINE.format(verb="stops") in res.stdout
    assert re.search(rf"│ total +│ +0 │ +0 │ +{total} │", res.stdout), res.stdout
    assert _group(asg) is None
    assert ASG not in {lb["LoadBalancerName"] for lb in
                       elbv2.describe_load_balancers()["LoadBalancers"]}
    states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
              for i in r["Instances"]}
    assert states == {"terminated"}
    assert _state_resources(home) == []
    assert not (home / "sandbox" / "deploy" / STACK).exists()


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
        [sys.executable, "-m", "poolctl", "deploy", *_deploy_args(home=home)],
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
    return {r["type"] for r in _state_resources(home) if r["mode"] == "managed"}


# Own xdist groups (own worker, own sandbox): the interrupt chain and the deployed_pool
# checks each take minutes of Terraform waits and need nothing of the first-deploy chain.
@needs_terraform
@pytest.mark.xdist_group("e2e/interrupts")
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
    if _state_resources(home):  # run alone (-k): start from nothing, as after the destroy
        _timed(home, "destroy (clean start)", "destroy", *_deploy_args(home=home))
    # An empty emulator (groups before on this worker may have left instances, quota in
    # use): the pool it leaves is then the one `deployed_pool` users expect.
    empty_sandbox(sandbox, home)
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    assert _group(asg) is None

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
        assert "Interrupt received" in _terraform_log(res.stderr).read_text()
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
    res = _timed(home, "deploy after three interrupts", "deploy", *_deploy_args(home=home))
    assert f"adopting lb_listener {listener['ListenerArn']}" in res.stderr
    assert "Apply complete!" in _terraform_log(res.stderr).read_text()
    assert "Error" not in res.stderr
    again = _timed(home, "deploy after the resume", "deploy", *_deploy_args(home=home))
    assert f"== {STACK}: no changes" in again.stderr and "adopting" not in again.stderr
    # One of each, nothing duplicated.
    assert len(launch_template()) == 1
    assert _group(asg)["MaxSize"] == 6
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [ASG]}])["Vpcs"]
    assert len(vpcs) == 1
    assert [lb["LoadBalancerName"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]
            ].count(ASG) == 1
    # Leave the pool as `deployed_pool` promises it (nodes booted), and hand it over.
    assert run_poolctl(home, "sandbox", "boot-nodes", "--pool", POOL).returncode == 0
    pool_keeper.adopt(sandbox, home)


# -------------------------------------------------------------------------------------
# Refusals: fast, before any Terraform work


def _one_poolctl_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("poolctl:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_failed_rule_refuses_before_terraform(sandbox, sandbox_home, tmp_path):
    bad = tmp_path / "poolctl.yaml"
    # TP 1: 141 GB of weights on one 80 GB GPU, the fits-hbm rule fails.
    bad.write_text(DEPLOYED_EXAMPLE.read_text().replace("tensor_parallel: 2",
                                                        "tensor_parallel: 1").replace(
        "project: acme", "project: refused"))
    res = run_poolctl(sandbox_home, "deploy", *_deploy_args(file=bad, home=tmp_path),
                      timeout=120)
    assert res.returncode == 1
    assert "fits-hbm" in res.stderr
    assert "nothing was changed" in _one_poolctl_line(res.stderr)
    # No synthesis, no Terraform folder or state for the stack, no log.
    assert not (tmp_path / "cdktf.out").exists()
    sandbox_dir = Path(sandbox_home) / "sandbox"
    assert not list(sandbox_dir.glob("*/refused-*")) and not list(
        (Path(sandbox_home) / "logs").glob("refused-*"))


def test_missing_terraform_binary_is_one_line_exit_2(sandbox, sandbox_home, tmp_path):
    out = tmp_path / "out"
    res = run_poolctl(sandbox_home, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve",
                      "-f", str(DEPLOYED_EXAMPLE), "--out", str(out), timeout=120,
                      POOLCTL_TERRAFORM="/nonexistent")
    assert res.returncode == 2, res.stderr
    line = _one_poolctl_line(res.stderr)
    assert "POOLCTL_TERRAFORM=/nonexistent" in line and "terraform" in line
    assert not out.exists()  # refused before the synth


def test_sandbox_flag_without_a_running_sandbox_is_exit_2(tmp_path):
    home = tmp_path / "home"
    res = run_poolctl(tmp_path, "deploy", *_deploy_args(home=home), timeout=120,
                      POOLCTL_HOME=str(home))
    assert res.returncode == 2, res.stderr
    assert "poolctl sandbox start" in _one_poolctl_line(res.stderr)
    assert not home.exists()


def test_sandbox_workdir_points_every_service_at_the_emulator(sandbox, sandbox_home, tmp_path):
    from poolctl.deploy import endpoint_workdir
    from poolctl.sandbox import manager

    stack = tmp_path / "stacks" / "probe-stack-aws"
    stack.mkdir(parents=True)
    (stack / "cdk.tf.json").write_text("{}")
    work, env = endpoint_workdir(stack, "us-east-1", manager.endpoints(sandbox_home))
    try:
        override = json.loads((work / "endpoint_override.tf.json").read_text())
        [provider] = override["provider"]["aws"]
        [endpoints] = provider["endpoints"]
        assert set(endpoints.values()) == {sandbox} and "kms" in endpoints
        # The catch-all for any service the list misses: the emulator, never AWS.
        assert env["AWS_ENDPOINT_URL"] == sandbox
        assert env["AWS_ACCESS_KEY_ID"] == "testing" and env["TF_VAR_node_ami_id"]
        # The account id lookup stays on: the provider compares referenced security group
        # owners with it (skipping it made every rule differ on the next plan).
        assert "skip_requesting_account_id" not in provider
        assert override["terraform"]["backend"]["local"]["path"] == str(
            Path(sandbox_home) / "sandbox" / "state" / "probe-stack-aws.tfstate")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_sandbox_with_cloud_gcp_is_exit_2(sandbox, sandbox_home, tmp_path):
    res = run_poolctl(sandbox_home, "deploy", "--cloud", "gcp", "--sandbox", "--auto-approve",
                      "-f", str(DEPLOYED_EXAMPLE), "--out", str(tmp_path / "out"), timeout=120)
    assert res.returncode == 2, res.stderr
    line = _one_poolctl_line(res.stderr)
    assert "--sandbox" in line and "--cloud aws" in line
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------
# The `deployed_pool` fixture (tests/plugins/deployed_pool.py) that runtime-command tests build on


def _check_pool_like_the_stack(sandbox_client, name: str) -> None:
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    group = _group(asg)
    assert group is not None, name
    assert group["AutoScalingGroupName"] == name
    assert (group["MinSize"], group["MaxSize"]) == (1, 6)
    assert CONTRACT_TAGS.items() <= _tags(group["Tags"]).items()
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
            assert CONTRACT_TAGS.items() <= _tags(inst["Tags"]).items()
    data = ec2.describe_launch_template_versions(
        LaunchTemplateId=group["LaunchTemplate"]["LaunchTemplateId"], Versions=["$Latest"],
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False
    [lb] = elbv2.describe_load_balancers(Names=[name])["LoadBalancers"]
    assert lb["Scheme"] == "internal"
    lb_tags = elbv2.describe_tags(ResourceArns=[lb["LoadBalancerArn"]])["TagDescriptions"][0]
    assert CONTRACT_TAGS.items() <= _tags(lb_tags["Tags"]).items()


# In the interrupt chain's group: it leaves the pool deployed, so the fixture finds it there
# (run alone, the fixture deploys it).
@pytest.mark.xdist_group("e2e/interrupts")
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
