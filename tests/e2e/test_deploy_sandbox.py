"""`poolctl deploy --cloud aws --sandbox` end to end: the real CLI in a subprocess, real
cdktf synthesis, real Terraform with the AWS provider, against the session's sandbox server.

One pool, deployed once from nothing (`first_deploy`); each test starts from the pool as that
deploy left it (`fresh_deploy` restores the sandbox's snapshot of that moment, with its
Terraform state and working folder), so the tests stand alone: inspect, boot, redeploy (no
changes), --plan-only, destroy, in any order. Wall times and the synth/init/plan/apply split
of every run are printed (`pytest -s` shows them). The interrupted deploys are in
test_deploy_interrupted.py.

The example pool (examples/llama-70b-p5/poolctl.yaml), worked out by hand: TP 2 on 8 GPUs =
4 replicas per node; 4..24 replicas = 1..6 nodes, the group's MaxSize 6 (a rollout adds its
surge of 4 replicas = 1 node only while it runs); 8 warm replicas = 2 warm nodes, prepared
capacity 1 + 2 = 3.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.e2e.deploys import (
    ASG,
    CONTRACT_TAGS,
    COST_LINE,
    MISSING,
    POOL,
    STACK,
    TIMINGS,
    deploy_args,
    needs_terraform,
    pool_group,
    state_resources,
    tag_dict,
    terraform_log,
    timed,
)
from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE, keep_snapshot, restore_snapshot
from tests.plugins.sandbox import run_poolctl

pytestmark = pytest.mark.e2e
SNAPSHOT = "first-deploy"


@pytest.fixture(scope="module")
def first_deploy(sandbox, sandbox_home, pool_keeper):
    """The pool deployed from nothing (an earlier deployment of the stack is destroyed), and
    the sandbox's snapshot of that moment. After the module, the pool as deployed, its nodes
    booted, is handed to `deployed_pool` (the same example): a later module on this worker
    needs no deploy of its own."""
    if MISSING:
        pytest.skip(f"e2e deploy: {MISSING}")
    home = Path(sandbox_home)
    if state_resources(home):
        timed(home, "destroy (clean start)", "destroy", *deploy_args(home=home))
    res = timed(home, "first deploy", "deploy", *deploy_args(home=home), child=True)
    synthesized = json.loads(
        (home / "cdktf.out" / "stacks" / STACK / "cdk.tf.json").read_text())
    # Every resource block is one resource (none has a count or for_each).
    total = sum(len(blocks) for blocks in synthesized["resource"].values())
    keep_snapshot(sandbox, home, SNAPSHOT)
    yield {"res": res, "home": home, "total": total, "untouched": True}
    if restore_snapshot(sandbox, home, SNAPSHOT):
        booted = run_poolctl(home, "sandbox", "boot-nodes", "--pool", POOL)
        assert booted.returncode == 0, booted.stderr
        pool_keeper.adopt(sandbox, home)


@pytest.fixture
def fresh_deploy(first_deploy, sandbox):
    """The pool as the first deploy left it, whatever a test before did to it: the first
    test that asks gets it as it is, the others from the snapshot (a second or two)."""
    if not first_deploy.pop("untouched", False):
        assert restore_snapshot(sandbox, first_deploy["home"], SNAPSHOT), (
            "the first deploy's snapshot is gone: a test reset the sandbox")
    return first_deploy


@needs_terraform
def test_first_deploy_creates_the_pool_as_the_contract_says(fresh_deploy, sandbox_client):
    res, total = fresh_deploy["res"], fresh_deploy["total"]
    # Terraform's output goes to its log; the screen has poolctl's lines, stdout its results.
    log = terraform_log(res.stderr).read_text()
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
    group = pool_group(asg)
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (1, 6, 1)
    assert group["DefaultInstanceWarmup"] == 440  # plan's cold start, 440.5 s, whole seconds
    assert group["HealthCheckType"] == "ELB"
    assert CONTRACT_TAGS.items() <= tag_dict(group["Tags"]).items()
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
        assert CONTRACT_TAGS.items() <= tag_dict(inst["Tags"]).items()
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
    assert CONTRACT_TAGS.items() <= tag_dict(lb_tags["Tags"]).items()
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
def test_terraform_files_under_poolctl_home_are_private(fresh_deploy):
    """State, plan, lock file, override, workdir: 0700 folders, 0600 files (point 11)."""
    from tests.unit.test_private_files import not_private

    sandbox_dir = fresh_deploy["home"] / "sandbox"
    written = [sandbox_dir / "deploy" / STACK / name for name in (
        "tfplan", ".terraform.lock.hcl", "cdk.tf.json", "endpoint_override.tf.json")]
    assert all(p.is_file() for p in written)
    assert (sandbox_dir / "state" / f"{STACK}.tfstate").is_file()
    assert not_private(sandbox_dir) == []


@needs_terraform
def test_boot_nodes_moves_the_waiting_node_in_service(fresh_deploy, sandbox_client):
    res = run_poolctl(fresh_deploy["home"], "sandbox", "boot-nodes", "--pool", POOL, "--json")
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    assert sorted(n["state"] for n in nodes) == ["InService", "Warmed:Stopped", "Warmed:Stopped"]
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    [node] = pool_group(asg)["Instances"]
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
def test_second_deploy_reports_no_changes_and_applies_nothing(fresh_deploy, sandbox_client):
    asg = sandbox_client("autoscaling")
    before = pool_group(asg)
    res = timed(fresh_deploy["home"], "second deploy", "deploy",
                 *deploy_args(home=fresh_deploy["home"]))
    assert f"== {STACK}: no changes" in res.stderr
    assert "terraform apply" not in res.stderr and "Apply complete" not in res.stderr
    # the working folder was initialized by the first deploy: init is not run again
    assert f"== {STACK}: terraform init skipped" in res.stderr
    assert "Initializing" not in terraform_log(res.stderr).read_text()
    after = pool_group(asg)
    assert [i["InstanceId"] for i in after["Instances"]] == [
        i["InstanceId"] for i in before["Instances"]]
    assert after["LaunchTemplate"] == before["LaunchTemplate"]
    # what a CI job runs to find drift: no changes is exit 0, and no resource line
    ci = run_poolctl(fresh_deploy["home"], "deploy",
                     *deploy_args("--plan-only", "--detailed-exitcode",
                                   home=fresh_deploy["home"]))
    assert ci.returncode == 0, ci.stderr[-3000:]
    assert not re.search(rf"^{STACK}: (create|update|replace|destroy|import) ", ci.stdout, re.M)


@needs_terraform
def test_plan_only_shows_a_change_and_applies_nothing(fresh_deploy, sandbox_client, tmp_path):
    home = fresh_deploy["home"]
    changed = tmp_path / "poolctl.yaml"
    changed.write_text(DEPLOYED_EXAMPLE.read_text().replace("queue_target: 4",
                                                            "queue_target: 6"))
    res = run_poolctl(home, "deploy", *deploy_args(
        "--plan-only", "--detailed-exitcode", "--json", "--verbose", file=changed, home=home))
    # Terraform's -detailed-exitcode: 2 is "changes present", not a usage error
    assert res.returncode == 2, res.stderr[-4000:]
    assert not [x for x in res.stderr.splitlines() if x.startswith("poolctl: ")]  # no error
    assert f"== {STACK}: --plan-only, nothing applied" in res.stderr
    # --verbose: Terraform's output on stderr too, and in its log
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in res.stderr
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in terraform_log(res.stderr).read_text()
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
def test_destroy_removes_the_pool(fresh_deploy, sandbox_client):
    home, total = fresh_deploy["home"], fresh_deploy["total"]
    asg, ec2, elbv2 = (sandbox_client(s) for s in ("autoscaling", "ec2", "elbv2"))
    group = pool_group(asg)
    ids = [i["InstanceId"] for i in group["Instances"]] + [
        w["InstanceId"] for w in asg.describe_warm_pool(AutoScalingGroupName=ASG)["Instances"]]
    res = timed(home, "destroy", "destroy", *deploy_args(home=home))
    assert f"Apply complete! Resources: 0 added, 0 changed, {total} destroyed." in (
        terraform_log(res.stderr).read_text())
    assert COST_LINE.format(verb="stops") in res.stdout
    assert re.search(rf"│ total +│ +0 │ +0 │ +{total} │", res.stdout), res.stdout
    assert pool_group(asg) is None
    assert ASG not in {lb["LoadBalancerName"] for lb in
                       elbv2.describe_load_balancers()["LoadBalancers"]}
    states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
              for i in r["Instances"]}
    assert states == {"terminated"}
    assert state_resources(home) == []
    assert not (home / "sandbox" / "deploy" / STACK).exists()


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
    res = run_poolctl(sandbox_home, "deploy", *deploy_args(file=bad, home=tmp_path),
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
    res = run_poolctl(tmp_path, "deploy", *deploy_args(home=home), timeout=120,
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


