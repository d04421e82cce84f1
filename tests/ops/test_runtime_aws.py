"""Runtime commands on AWS against the sandbox over HTTP, through the real CLI.

`python -m poolctl ... --sandbox --json` runs in a subprocess with POOLCTL_HOME = the session
sandbox's home, on the example pool that `deployed_pool` deployed (Terraform where present).
Each test starts from that pool as deployed (`fresh`: the sandbox's snapshot, a second or
two) and from the example's file, and sets up what else it needs (`four_nodes`, `other_p5`):
status, quota, warm, then rollouts (these need Terraform: a rollout applies the new launch
template version through it), in any order.

The example (examples/llama-70b-p5/poolctl.yaml), worked out by hand: p5.48xlarge, 8 GPUs,
TP 2 -> 4 replicas per node, 192 vCPUs per node; min 4 replicas = 1 node, max 24 = 6 nodes,
surge 4 replicas = 1 node (group MaxSize 6, 7 while a rollout runs), warm 8 replicas = 2
nodes kept stopped.
Quota L-417A185B needed at peak: (6 + 1) x 192 = 1344 vCPU (stopped warm nodes count 0).

The nodes' boot scripts never run in the sandbox: a background thread completes the launch
lifecycle actions through the sandbox's admin endpoint, as they would.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import (
    pool_cli,
    poolctl_env,
    run_poolctl,
    sandbox_admin,
    stand_in_ami,
    terraform_missing,
)

ASG = "acme-chat-70b"
REGION = "us-east-1"
P5 = 192  # vCPUs per p5.48xlarge
QUOTA = "L-417A185B"
MISSING = terraform_missing()
needs_terraform = pytest.mark.skipif(
    MISSING is not None, reason=f"rollouts apply through Terraform: {MISSING}")


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool_file(deployed_pool, tmp_path_factory) -> Path:
    """A copy of the example: rollouts record versions in it (the repo's file stays)."""
    path = tmp_path_factory.mktemp("runtime-aws") / "poolctl.yaml"
    shutil.copy(DEPLOYED_EXAMPLE, path)
    return path


@pytest.fixture(scope="module")
def cli(sandbox, sandbox_home, pool_file) -> Any:
    return pool_cli(sandbox_home, pool_file)


def js(res) -> dict:
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def aws(sandbox) -> Any:
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    return lambda svc: boto3.client(svc, endpoint_url=sandbox, region_name=REGION,
                                    **TEST_CREDENTIALS)


@contextmanager
def booting(endpoint: str, sick_version: str | None = None,
            asg: Any = None) -> Iterator[None]:
    """Complete every open launch action every 0.1 s (the boot scripts' job); with
    `sick_version`, mark in-service nodes of that launch template version Unhealthy (the
    load balancer's verdict on a bad image)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sandbox_admin(endpoint, "POST", "/_poolctl/lifecycle-actions",
                          {"AutoScalingGroupName": ASG, "LifecycleActionResult": "CONTINUE"})
            if sick_version is not None:
                g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG]
                                                     )["AutoScalingGroups"][0]
                for i in g["Instances"]:
                    if (i["LaunchTemplate"]["Version"] == sick_version
                            and i["LifecycleState"] == "InService"
                            and i["HealthStatus"] == "Healthy"):
                        asg.set_instance_health(InstanceId=i["InstanceId"],
                                                HealthStatus="Unhealthy")
            stop.wait(0.1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=10)


def group(aws) -> dict:
    return aws("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ASG]
                                                           )["AutoScalingGroups"][0]


def image_line(path: Path) -> str:
    return next(ln for ln in path.read_text().splitlines() if ln.strip().startswith("image:"))


@pytest.fixture(scope="module", autouse=True)
def leave_as_found(sandbox, pool_keeper, deployed_pool) -> Iterator[None]:
    """After the module: the pool as deployed, start-up quotas (other modules share the
    sandbox)."""
    yield
    pool_keeper.fresh()
    sandbox_admin(sandbox, "DELETE", "/_poolctl/quotas")


@pytest.fixture(autouse=True)
def fresh(pool_keeper, deployed_pool, pool_file) -> None:
    """The pool as deployed (its nodes booted, the warm pool stopped, start-up quotas) and
    the file as the example writes it, whatever a test before did."""
    pool_keeper.fresh()
    shutil.copy(DEPLOYED_EXAMPLE, pool_file)


def set_quota(endpoint: str, value: float) -> None:
    sandbox_admin(endpoint, "POST", "/_poolctl/quotas",
                  {"quotas": {QUOTA: value}, "region": REGION})


# -- status -------------------------------------------------------------------------------


def test_status_counts_nodes_replicas_and_queue(cli, aws):
    # The nodes publish RequestsWaitingPerReplica per group; the newest minute is read.
    aws("cloudwatch").put_metric_data(Namespace="poolctl", MetricData=[{
        "MetricName": "RequestsWaitingPerReplica", "Value": 3.5, "Unit": "Count",
        "Dimensions": [{"Name": "AutoScalingGroupName", "Value": ASG}]}])
    (s,) = js(cli("status", "--json"))["pools"]
    assert (s["pool"], s["cloud"], s["group"]["name"]) == ("chat-70b", "aws", ASG)
    g = s["group"]
    # min 1 node, max 6 (the surge's 7 only during a rollout), desired 1; warm pool 2 stopped
    assert (g["min_nodes"], g["max_nodes"], g["desired_nodes"]) == (1, 6, 1)
    assert (g["warm_min_nodes"], g["warm_state"]) == (2, "stopped")
    assert s["nodes"] == {"in_service": 1, "warm": 2, "pending": 0, "unhealthy": 0,
                          "terminating": 0}
    # 4 replicas per node: 1 node = 4 replicas in service, 2 warm nodes = 8
    assert s["replicas_per_node"] == 4
    assert (s["replicas"]["in_service"], s["replicas"]["warm"]) == (4, 8)
    assert s["queue_per_replica"] == 3.5
    assert sorted(i["state"] for i in s["instances"]) == ["InService", "Warmed:Stopped",
                                                          "Warmed:Stopped"]


def test_status_of_a_pool_that_is_not_deployed(sandbox_home, pool_file, tmp_path):
    other = tmp_path / "poolctl.yaml"
    other.write_text(pool_file.read_text().replace("name: chat-70b", "name: not-deployed"))
    res = run_poolctl(sandbox_home, "status", "-f", str(other), "--sandbox")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "poolctl: pool not-deployed: no Auto Scaling group tagged poolctl:project=acme, "
        "poolctl:pool=not-deployed, poolctl:role=inference in us-east-1; deploy it first "
        "with `poolctl deploy --cloud aws`")


def test_status_endpoint_is_the_stacks_load_balancer(cli, aws):
    # The ALB the deploy made (tagged like the group), its one HTTP listener on 80.
    lbs = [lb for lb in aws("elbv2").describe_load_balancers()["LoadBalancers"]
           if lb["LoadBalancerName"] == ASG]
    (s,) = js(cli("status", "--json"))["pools"]
    dns = lbs[0]["DNSName"]
    assert s["endpoint"] == {
        "scheme": "http", "host": dns, "port": 80, "internal": True, "api_key_secret": None,
        "ca_file": None,
        "url": f"http://{dns}", "api_key": False, "curl": f"curl -sS http://{dns}/v1/models"}


# -- quota --------------------------------------------------------------------------------


@pytest.fixture
def other_p5(aws, fresh) -> Iterator[str]:
    """A p5 another team runs in the region (not the pool's): it uses quota too."""
    ec2 = aws("ec2")
    ami = stand_in_ami(ec2)
    iid = ec2.run_instances(ImageId=ami, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1
                            )["Instances"][0]["InstanceId"]
    yield iid
    ec2.terminate_instances(InstanceIds=[iid])


def foreign_p_vcpus(aws) -> int:
    """vCPUs of running P instances that are not the pool's (normally only `other_p5`)."""
    n = 0
    for page in aws("ec2").get_paginator("describe_instances").paginate(Filters=[
            {"Name": "instance-state-name", "Values": ["pending", "running"]}]):
        for r in page["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                if i["InstanceType"] == "p5.48xlarge" and tags.get("poolctl:pool") != "chat-70b":
                    n += P5
    return n


def test_quota_check_short_exits_1_with_the_shortfall(sandbox, cli, aws, other_p5):
    set_quota(sandbox, 1000)
    others = foreign_p_vcpus(aws)
    assert others >= P5  # at least the other team's p5
    res = cli("quota", "check", "--cloud", "aws", "--json", ok=1)
    out = js(res)
    assert out["ok"] is False
    (q,) = out["quotas"]
    assert (q["pool"], q["name"], q["scope"], q["unit"]) == ("chat-70b", QUOTA, REGION, "vCPU")
    assert q["description"] == "Running On-Demand P instances"
    # needed (6 + 1) x 192 = 1344; in use: the pool's 1 node (192) + others
    assert (q["needed"], q["granted"]) == (1344, 1000)
    assert (q["in_use"], q["pool_in_use"]) == (P5 + others, P5)
    # 1344 + others - 1000: with only the other team's p5, 1344 + 192 - 1000 = 536
    assert q["shortfall"] == 1344 + others - 1000
    assert q["ok"] is False
    last = res.stderr.strip().splitlines()[-1]
    assert last == (f"poolctl: quota {QUOTA} in {REGION}: short by {1344 + others - 1000} vCPU "
                    f"(needs 1344 beside {others} in use by others, granted 1000); file an "
                    "increase with `poolctl quota request --cloud aws`")


def test_quota_request_files_once_then_reports_the_open_request(sandbox, cli, aws, other_p5):
    set_quota(sandbox, 1000)
    others = foreign_p_vcpus(aws)
    first = js(cli("quota", "request", "--cloud", "aws", "--yes", "--json"))["requests"]
    assert len(first) == 1
    r = first[0]
    # enough for 1344 beside the others' use: 1000 + (1344 + others - 1000) = 1344 + others
    assert (r["name"], r["scope"], r["desired"]) == (QUOTA, REGION, 1344 + others)
    assert (r["state"], r["already_open"]) == ("PENDING", False)
    assert re.fullmatch(r"[0-9a-f]{32}", r["id"])
    second = js(cli("quota", "request", "--cloud", "aws", "--yes", "--json"))["requests"]
    assert second == [{**r, "already_open": True}]
    sq = aws("service-quotas")
    history = sq.list_requested_service_quota_change_history_by_quota(
        ServiceCode="ec2", QuotaCode=QUOTA)["RequestedQuotas"]
    assert [h["Id"] for h in history if h["Status"] == "PENDING"] == [r["id"]]
    # AWS approves: the check passes, and nothing more is requested
    sandbox_admin(sandbox, "POST", f"/_poolctl/quota-requests/{r['id']}", {"status": "APPROVED"})
    ok = js(cli("quota", "check", "--cloud", "aws", "--json"))
    assert ok["ok"] is True and ok["quotas"][0]["granted"] == 1344 + others
    assert js(cli("quota", "request", "--cloud", "aws", "--yes", "--json")) == {"requests": []}


# -- warm ---------------------------------------------------------------------------------


def test_warm_rounds_up_to_nodes_and_repeats_as_a_no_op(sandbox, cli, aws):
    set_quota(sandbox, 100_000)
    res = cli("warm", "--replicas", "10", "--json")
    w = js(res)
    # 10 replicas / 4 per node = 2.5 -> 3 nodes = 12 replicas
    assert (w["mode"], w["replicas_requested"], w["nodes"], w["replicas"]) == ("warm", 10, 3, 12)
    assert w["rounded_up"] is True
    assert w["rounding"] == "10 replicas rounded up to 3 whole node(s) of 4 replicas = 12 replicas"
    assert f"chat-70b: {w['rounding']}" in res.stderr
    assert w["before"] == {"min_nodes": 1, "warm_nodes": 2, "desired_nodes": 1}
    assert w["after"] == {"min_nodes": 1, "warm_nodes": 3, "desired_nodes": 1}
    assert w["changed"] is True
    # quota for what runs at once: 1 node in service + 1 new warm node while it launches
    assert w["quota"][0]["needed"] == 2 * P5
    wp = aws("autoscaling").describe_warm_pool(AutoScalingGroupName=ASG)
    # the stack's rule kept: prepared capacity = minimum + warm = 1 + 3
    assert wp["WarmPoolConfiguration"]["MinSize"] == 3
    assert wp["WarmPoolConfiguration"]["MaxGroupPreparedCapacity"] == 4
    assert wp["WarmPoolConfiguration"]["PoolState"] == "Stopped"
    assert len(wp["Instances"]) == 3
    again = js(cli("warm", "--replicas", "10", "--json"))
    assert again["changed"] is False
    assert again["before"] == again["after"] == w["after"]
    assert again["message"] == "chat-70b: already at warm pool minimum 3 node(s); nothing changed"


def test_warm_wait_reports_each_new_node(sandbox, sandbox_home, pool_file):
    # 16 replicas = 4 warm nodes: the 2 of the file and 2 new ones
    argv = [sys.executable, "-m", "poolctl", "warm", "--replicas", "16", "--wait",
            "--timeout", "60", "--json", "-f", str(pool_file), "--sandbox"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=poolctl_env(sandbox_home, POOLCTL_POLL_S="0.05"))
    lines = []
    # The boot scripts start only once the wait has looked (so every new node is timed).
    for line in proc.stderr:
        lines.append(line)
        if re.search(r"\d+/4 warm", line):
            break
    with booting(sandbox):
        out, err = proc.communicate(timeout=120)
    lines.append(err)
    assert proc.returncode == 0, "".join(lines)
    w = json.loads(out)
    assert w["after"]["warm_nodes"] == 4 and w["nodes"] == 4
    assert (w["wait"]["ready"], w["wait"]["target"]) == (4, 4)
    assert len(w["wait"]["nodes"]) == 2  # the two that were not warm yet
    text = "".join(lines)
    for n in w["wait"]["nodes"]:
        assert f"chat-70b: {n['id']} warm after {n['seconds']:g} s" in text
    assert "chat-70b: 4/4 warm, 0 pending" in text
    # off a terminal: one line per change of state (with the seconds waited), none repeated
    states = re.findall(r"^chat-70b: (\d+/4 warm, \d+ pending) \(\d+ s\)$", text, re.M)
    assert states[-1] == "4/4 warm, 0 pending"
    assert all(a != b for a, b in zip(states, states[1:], strict=False)), states


def test_ctrl_c_leaves_warming_running_and_says_how_to_watch(sandbox_home, pool_file, aws):
    argv = [sys.executable, "-m", "poolctl", "warm", "--replicas", "20", "--wait",
            "-f", str(pool_file), "--sandbox"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=poolctl_env(sandbox_home, POOLCTL_POLL_S="0.05"))
    lines = []
    # A pool in another state never prints the line below: fail, not wait for ever.
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    for line in proc.stderr:  # nobody boots the 3 new nodes: the wait goes on
        lines.append(line)
        if "2/5 warm" in line:
            break
    watchdog.cancel()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + err
    assert (f"chat-70b: interrupted; the warm operation keeps running in aws; watch it with "
            f"`poolctl status --cloud aws -f {pool_file} --pool chat-70b --sandbox`") in err
    # 20 replicas = 5 nodes: the change stands, the 3 new nodes keep booting in the cloud
    wp = aws("autoscaling").describe_warm_pool(AutoScalingGroupName=ASG)
    assert wp["WarmPoolConfiguration"]["MinSize"] == 5
    states = sorted(i["LifecycleState"] for i in wp["Instances"])
    assert states == ["Warmed:Pending:Wait"] * 3 + ["Warmed:Stopped"] * 2


def test_warm_running_puts_nodes_in_service(sandbox, cli, aws):
    with booting(sandbox):
        w = js(cli("warm", "--replicas", "12", "--running", "--wait", "--timeout", "60",
                   "--json"))
    # 12 replicas = 3 nodes above the file's minimum of 1: minimum 4, in service now
    assert w["mode"] == "running" and w["rounded_up"] is False
    assert w["after"] == {"min_nodes": 4, "warm_nodes": 2, "desired_nodes": 4}
    assert (w["wait"]["ready"], w["wait"]["target"]) == (4, 4)
    g = group(aws)
    assert (g["MinSize"], g["DesiredCapacity"]) == (4, 4)
    assert sum(i["LifecycleState"] == "InService" for i in g["Instances"]) == 4


def test_warm_refuses_when_quota_is_short_and_changes_nothing(sandbox, cli, aws, four_nodes):
    # 4 in service (four_nodes); --running 5 nodes -> minimum 6 (the group's max), all in service:
    # 6 x 192 = 1152 vCPU beside the others'; granted 1000 -> short by 152 + others
    set_quota(sandbox, 1000)
    others = foreign_p_vcpus(aws)
    res = cli("warm", "--replicas", "20", "--running", ok=1)
    assert (f"chat-70b: not enough quota for 6 node(s) running at once; quota {QUOTA} in "
            f"{REGION}: short by {152 + others} vCPU") in res.stderr
    assert "nothing was changed" in res.stderr
    g = group(aws)
    assert (g["MinSize"], g["DesiredCapacity"]) == (4, 4)
    set_quota(sandbox, 100_000)


def test_warm_reset_returns_to_the_file(cli, aws, four_nodes):
    w = js(cli("warm", "--reset", "--json"))
    assert w["mode"] == "reset"
    assert w["before"] == {"min_nodes": 4, "warm_nodes": 2, "desired_nodes": 4}
    # back to min 1 / warm 2; desired gives back the 3 nodes --running added: 4 - 3 = 1
    assert w["after"] == {"min_nodes": 1, "warm_nodes": 2, "desired_nodes": 1}
    g = group(aws)
    assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)
    assert g["WarmPoolConfiguration"]["MinSize"] == 2
    assert js(cli("warm", "--reset", "--json"))["changed"] is False
    bad = cli("warm", "--replicas", "4", "--reset", ok=2)
    assert bad.stderr.strip() == ("poolctl: --reset: give it alone (it returns to the file's "
                                  "sizes), without --replicas, --running or --exact")


# -- rollout ------------------------------------------------------------------------------


@pytest.fixture
def four_nodes(sandbox, cli, fresh) -> None:
    """4 nodes in service, so that checkpoints 25 / 50 / 100 % are 1 / 2 / 4 nodes."""
    set_quota(sandbox, 100_000)
    with booting(sandbox):
        cli("warm", "--replicas", "12", "--running", "--wait", "--timeout", "60")


def refreshes(aws) -> list[dict]:
    return aws("autoscaling").describe_instance_refreshes(AutoScalingGroupName=ASG,
                                                          MaxRecords=1)["InstanceRefreshes"]


def lt_versions(aws) -> tuple[str, set[str]]:
    """(the group's launch template version, the versions its in-service nodes run)."""
    g = group(aws)
    return (g["LaunchTemplate"]["Version"],
            {i["LaunchTemplate"]["Version"] for i in g["Instances"]
             if i["LifecycleState"] == "InService"})


@needs_terraform
def test_rollout_refuses_a_surge_without_quota(sandbox, cli, aws, pool_file, four_nodes):
    before = pool_file.read_text()
    # 4 nodes in service + 1 surge node = 5 x 192 = 960 vCPU beside the others' use;
    # granted 800 + others -> short by 160
    set_quota(sandbox, 800 + foreign_p_vcpus(aws))
    res = cli("rollout", "start", "--cloud", "aws", "--image", "vllm/vllm-openai:v0.34.1",
              "--yes", ok=1)
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("poolctl: chat-70b: not enough quota for the rollout with its surge "
                           f"of 1 node(s): quota {QUOTA} in {REGION}: short by 160 vCPU")
    assert last.endswith("or roll without surge with --no-surge (one node at a time out of "
                         "service, no extra node)")
    assert pool_file.read_text() == before


def test_rollout_refuses_a_key_the_file_does_not_write(cli, pool_file, four_nodes):
    # the example leaves model.version to its default: there is no line to change
    before = pool_file.read_text()
    res = cli("rollout", "start", "--cloud", "aws", "--model-version", "2", "--yes", ok=2)
    assert res.stderr.strip() == (f"poolctl: {pool_file}: pools[0].model.version is not "
                                  "written in the file (its default applies); add it there, "
                                  "then run the command again")
    assert pool_file.read_text() == before


@needs_terraform
def test_rollout_no_surge_reaches_every_checkpoint_and_status_lists_them(sandbox, cli, aws,
                                                                          pool_file, four_nodes):
    # without surge 4 x 192 = 768 beside the others' use: it fits in 800 + others
    set_quota(sandbox, 800 + foreign_p_vcpus(aws))
    text_before = pool_file.read_text()
    version_before, _ = lt_versions(aws)
    with booting(sandbox):
        res = cli("rollout", "start", "--cloud", "aws", "--image", "vllm/vllm-openai:v0.34.1",
                  "--no-surge", "--yes", "--json")
    r = js(res)  # stdout is only the JSON (the plan summary went to stderr)
    assert (r["key"], r["from"], r["to"]) == ("serving.image", "vllm/vllm-openai:v0.34.0",
                                              "vllm/vllm-openai:v0.34.1")
    # the plan summary: the launch template changes in place (a new version); the cost
    assert re.search(r"│ aws_launch_template +│ +│ +1 │ +│", res.stderr), res.stderr[-3000:]
    # warm --running keeps 4 nodes in service (4 x $55.04), no surge: at most 6 (6 x $55.04)
    assert ("the pool costs $220.16/h at its minimum (4 node(s)) to $330.24/h at its maximum "
            "(6 node(s))") in res.stderr
    # off a terminal: one line per change of the rollout's state, none repeated
    steps = re.findall(r"^chat-70b: rollout (.+) \(\d+ s\)$", res.stderr, re.M)
    assert len(steps) == len(r["progress"]), steps
    assert all(a != b for a, b in zip(steps, steps[1:], strict=False)), steps
    assert r["file_changed"] and r["applied"] and r["no_surge"]
    assert r["quota"][0]["needed"] == 4 * P5
    assert r["final"]["status"] == "successful" and r["final"]["percentage_complete"] == 100
    assert r["final"]["cloud_status"] == "Successful"  # the instance refresh's own word
    # checkpoints seen in order; 4 live nodes: 25 % = 1 node, 50 % = 2, 100 % = 4
    reached = [p["checkpoint_reached"] for p in r["progress"] if p["checkpoint_reached"]]
    assert sorted(set(reached)) == [25, 50, 100] and reached == sorted(reached)
    assert r["progress"][-1]["status"] == "successful"
    # the file: only the image line changed, its comment-free layout kept
    diff = [(a, b) for a, b in zip(text_before.splitlines(), pool_file.read_text().splitlines(),
                                   strict=True) if a != b]
    assert diff == [("      image: vllm/vllm-openai:v0.34.0",
                     "      image: vllm/vllm-openai:v0.34.1")]
    assert pool_file.read_text().startswith("# Llama-3.1-70B on p5.48xlarge")
    # AWS: the refresh ran with the pool's checkpoints, no surge (min 75 %, max 100 % of 4),
    # auto rollback, toward the next launch template version; the group now runs it
    (ref,) = refreshes(aws)
    prefs = ref["Preferences"]
    assert prefs["CheckpointPercentages"] == [25, 50, 100]
    assert (prefs["MinHealthyPercentage"], prefs["MaxHealthyPercentage"]) == (75, 100)
    assert prefs["AutoRollback"] is True and prefs["CheckpointDelay"] == 300
    new = str(int(version_before) + 1)
    assert ref["DesiredConfiguration"]["LaunchTemplate"]["Version"] == new
    assert lt_versions(aws) == (new, {new})

    # `rollout status` of the finished rollout: each checkpoint reached, both versions named
    s = js(cli("rollout", "status", "--cloud", "aws", "--json"))
    r = s["rollout"]
    assert r["status"] == "successful" and r["done"] is True
    assert s["checkpoints"] == [{"percentage": 25, "reached": True},
                                {"percentage": 50, "reached": True},
                                {"percentage": 100, "reached": True}]
    assert s["group_version"] == new
    assert r["from_version"] == f"serving.image=vllm/vllm-openai:v0.34.0 (v{version_before})"
    assert r["to_version"] == f"serving.image=vllm/vllm-openai:v0.34.1 (v{new})"
    assert s["record"]["status"] == "successful"


@needs_terraform
def test_unhealthy_new_nodes_roll_back_automatically(sandbox, cli, aws, pool_file, four_nodes):
    set_quota(sandbox, 100_000)
    good, _ = lt_versions(aws)
    bad = str(int(good) + 1)
    with booting(sandbox, sick_version=bad, asg=aws("autoscaling")):
        res = cli("rollout", "start", "--cloud", "aws", "--image", "vllm/vllm-openai:v0.34.2",
                  "--yes", "--json", ok=1)
    r = js(res)
    assert r["final"]["status"] == "rolled_back"
    assert "Replacement instance(s) failed health checks" in r["final"]["reason"]
    assert ("rolled back automatically" in res.stderr.strip().splitlines()[-1])
    # the group never left the good version, and every replaced node is back on it
    assert lt_versions(aws) == (good, {good})
    # the file records the version that runs again
    assert image_line(pool_file) == "      image: vllm/vllm-openai:v0.34.0"
    assert "(restored)" in res.stderr


@needs_terraform
def test_rollback_of_a_rollout_in_progress(sandbox, cli, aws, pool_file, four_nodes):
    good, _ = lt_versions(aws)
    new = str(int(good) + 1)
    r = js(cli("rollout", "start", "--cloud", "aws", "--image", "vllm/vllm-openai:v0.34.3",
               "--yes", "--no-wait", "--json"))
    assert r["rollout"]["status"] == "pending" and "final" not in r
    assert image_line(pool_file) == "      image: vllm/vllm-openai:v0.34.3"
    # let it replace the first node (checkpoint 25 %), as it would in an hour of real time
    with booting(sandbox):
        for _ in range(100):
            s = js(cli("rollout", "status", "--cloud", "aws", "--json"))["rollout"]
            if s["checkpoint_reached"]:
                break
    assert s["status"] == "in_progress" and s["checkpoint_reached"] == 25
    assert new in lt_versions(aws)[1]  # one node runs the new version
    assert group(aws)["MaxSize"] == 6 + 1  # the surge's room, only while it rolls
    with booting(sandbox):
        b = js(cli("rollout", "rollback", "--cloud", "aws", "--yes", "--json"))
    assert (b["how"], b["from"], b["to"]) == ("cloud_rollback", "vllm/vllm-openai:v0.34.3",
                                              "vllm/vllm-openai:v0.34.0")
    assert b["final"]["status"] == "rolled_back"
    assert lt_versions(aws) == (good, {good})
    assert image_line(pool_file) == "      image: vllm/vllm-openai:v0.34.0"
    assert group(aws)["MaxSize"] == 6  # the rollback's end gave the surge room back


@needs_terraform
def test_cancel_then_rollback_rolls_the_previous_version_out_again(sandbox, cli, aws,
                                                                    pool_file, four_nodes):
    cli("rollout", "start", "--cloud", "aws", "--image", "vllm/vllm-openai:v0.34.4", "--yes",
        "--no-wait")
    assert group(aws)["MaxSize"] == 6 + 1
    c = js(cli("rollout", "cancel", "--cloud", "aws", "--json"))
    assert c["final"]["status"] == "cancelled"
    assert group(aws)["MaxSize"] == 6  # the cancel gave the surge room back
    assert [p["status"] for p in c["progress"]][-1] == "cancelled"
    again = cli("rollout", "cancel", "--cloud", "aws", ok=1)
    assert again.stderr.strip() == "poolctl: chat-70b: no rollout in progress; nothing to cancel"
    # the file still says v0.34.4; rollback of an ended rollout rolls v0.34.0 out anew
    assert image_line(pool_file) == "      image: vllm/vllm-openai:v0.34.4"
    with booting(sandbox):
        b = js(cli("rollout", "rollback", "--cloud", "aws", "--yes", "--json"))
    assert (b["how"], b["to"]) == ("new_rollout", "vllm/vllm-openai:v0.34.0")
    assert b["final"]["status"] == "successful"
    assert image_line(pool_file) == "      image: vllm/vllm-openai:v0.34.0"
    v, running = lt_versions(aws)
    assert running == {v}
    # a second rollback would roll v0.34.4 forward again: refused
    twice = cli("rollout", "rollback", "--cloud", "aws", "--yes", ok=1)
    assert twice.stderr.strip().splitlines()[-1] == (
        "poolctl: chat-70b: the last rollout was already a rollback (to serving.image="
        "vllm/vllm-openai:v0.34.0); to go to vllm/vllm-openai:v0.34.4 again, use "
        "`poolctl rollout start`")
