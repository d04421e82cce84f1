"""The local AWS sandbox: the CLI's start/stop/status, and each emulator extension over HTTP.

Every extension test drives a real sandbox server with boto3, and checks what the AWS API
reference documents; expected numbers are worked out by hand next to each assertion.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.plugins.sandbox import sandbox_admin, stand_in_ami

# Each test makes what it checks (or starts a sandbox of its own): any worker may run it.

POOL_TAG = "poolctl:pool"


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POOLCTL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "poolctl", *args], capture_output=True, text=True, env=env,
        timeout=120,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -------------------------------------------------------------------------------------
# poolctl sandbox start / stop / status


def test_cli_start_twice_status_stop_and_stale_pid(tmp_path):
    home = tmp_path / "home"
    first = _cli(home, "sandbox", "start", "--port", "0", "--quota", "L-417A185B=192", "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    pid, endpoint = info["pid"], info["endpoint"]
    try:
        assert info["running"] and not info["already_running"]
        assert endpoint.startswith("http://127.0.0.1:")
        assert (home / "sandbox" / "state.json").exists()
        # The CLI process has exited; the server it started must still answer.
        assert sandbox_admin(endpoint, "GET", "/_poolctl/health")["pid"] == pid

        again = _cli(home, "sandbox", "start", "--port", "0", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["already_running"] is True
        assert json.loads(again.stdout)["pid"] == pid

        import boto3

        sq = boto3.client("service-quotas", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        quota = sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]
        assert quota["Value"] == 192.0  # from --quota at start

        st = _cli(home, "sandbox", "status", "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        assert status["running"] and status["endpoint"] == endpoint
        assert status["holds"]["auto_scaling_groups"] == []
        assert status["holds"]["instances"] == {}

        human = _cli(home, "sandbox", "status")
        assert f"running at {endpoint}" in human.stdout
    finally:
        stop = _cli(home, "sandbox", "stop")
    assert stop.returncode == 0, stop.stderr
    assert f"stopped (pid {pid})" in stop.stdout
    assert not _alive(pid)
    assert not (home / "sandbox" / "state.json").exists()
    assert "not running" in _cli(home, "sandbox", "status").stdout
    assert "no sandbox running" in _cli(home, "sandbox", "stop").stdout

    # A state file left by a crashed server: its pid is gone (a finished child's pid).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (home / "sandbox" / "state.json").write_text(
        json.dumps({"pid": dead.pid, "port": 1, "endpoint": "http://127.0.0.1:1"})
    )
    assert json.loads(_cli(home, "sandbox", "status", "--json").stdout)["running"] is False
    restarted = _cli(home, "sandbox", "start", "--port", "0", "--json")
    assert restarted.returncode == 0, restarted.stderr
    new_pid = json.loads(restarted.stdout)["pid"]
    assert new_pid != dead.pid and _alive(new_pid)
    assert _cli(home, "sandbox", "stop").returncode == 0
    assert not _alive(new_pid)


def test_start_on_a_busy_port_is_one_line_naming_port(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        res = _cli(tmp_path, "sandbox", "start", "--port", str(port))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--port {port}" in lines[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "sandbox" / "state.json").exists()


def _time_wait_on(port: int) -> int:
    """Sockets in TIME_WAIT whose local port is `port` (Linux's /proc/net/tcp: st 06)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows
               if r.split()[3] == "06" and int(r.split()[1].rsplit(":", 1)[1], 16) == port)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(),
                    reason="needs Linux's /proc/net/tcp to see the TIME_WAIT connections")
def test_start_again_at_once_on_the_port_a_busy_sandbox_just_left(tmp_path):
    home = tmp_path / "home"
    first = _cli(home, "sandbox", "start", "--port", "0", "--json")
    assert first.returncode == 0, first.stderr
    port = json.loads(first.stdout)["port"]
    try:
        # Heavy use where the server closes first (HTTP/1.0 read to EOF, as Terraform's
        # client does): each connection leaves a TIME_WAIT socket on the server's port.
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(b"GET /_poolctl/health HTTP/1.0\r\nHost: sandbox\r\n\r\n")
                while conn.recv(65536):
                    pass
    finally:
        assert _cli(home, "sandbox", "stop").returncode == 0
    # The precondition of the bug: without it this test would prove nothing.
    assert _time_wait_on(port) > 0
    again = _cli(home, "sandbox", "start", "--port", str(port), "--json")
    try:
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["port"] == port
    finally:
        assert _cli(home, "sandbox", "stop").returncode == 0


def test_status_reports_pool_groups_instances_and_load_balancers(sandbox_reset, sandbox_home,
                                                                sandbox_client):
    ec2, asg, elbv2 = (sandbox_client(s) for s in ("ec2", "autoscaling", "elbv2"))
    lt_id, _ = launch_template(ec2)
    make_group(asg, "pool-a", lt_id, desired=2, max_size=4, pool="chat")
    make_group(asg, "not-poolctl", lt_id, desired=1, max_size=1, pool=None)
    subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
    elbv2.create_load_balancer(Name="chat-lb", Subnets=subnets, Scheme="internal")

    res = _cli(sandbox_home, "sandbox", "status", "--json")
    assert res.returncode == 0, res.stderr
    holds = json.loads(res.stdout)["holds"]
    # Only the group tagged poolctl:pool is listed; EC2 counts all 2 + 1 instances.
    assert [(g["name"], g["pool"], g["desired"], g["instances"])
            for g in holds["auto_scaling_groups"]] == [("pool-a", "chat", 2, {"InService": 2})]
    assert holds["instances"] == {"running": 3}
    assert [lb["name"] for lb in holds["load_balancers"]] == ["chat-lb"]


def test_sandbox_endpoints_reach_it_and_say_what_it_changes(sandbox, sandbox_home):
    """`--sandbox` resolved once (what commands hand the library): the running sandbox's URL,
    its test credentials and region, and what an emulator changes, as data."""
    from poolctl.cloud import Cloud
    from poolctl.clouds.aws.ops import AwsOps
    from poolctl.sandbox import manager

    e = manager.endpoints(home=sandbox_home)
    assert e.flag == "--sandbox" and e.clouds == {Cloud.aws}
    assert e.loopback_only and e.stand_in_images and e.poll_s == 1.0
    assert e.terraform_home == sandbox_home / "sandbox"
    kwargs = e.aws.client_kwargs("eu-west-1")
    assert kwargs["endpoint_url"] == sandbox and kwargs["region_name"] == "eu-west-1"
    assert kwargs["aws_access_key_id"] == "testing"
    env = e.aws.env("eu-west-1")
    assert env["AWS_ENDPOINT_URL"] == sandbox and env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["AWS_SECRET_ACCESS_KEY"] == "testing"
    sts = AwsOps(e).client("sts", "eu-west-1")
    assert sts.meta.endpoint_url == sandbox
    assert sts.get_caller_identity()["Account"] == "123456789012"  # moto's account


def test_sandbox_endpoints_refuse_when_none_runs(tmp_path):
    from poolctl.errors import UsageError
    from poolctl.sandbox import manager

    with pytest.raises(UsageError, match=r"^--sandbox: the sandbox is not running; start it "
                                         r"with `poolctl sandbox start`$"):
        manager.endpoints(home=tmp_path)


def test_server_refuses_a_non_loopback_host(capsys):
    from poolctl.sandbox import server

    assert server.main(["--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--host 0.0.0.0" in capsys.readouterr().err


def test_endpoint_without_a_running_sandbox_is_a_usage_error(tmp_path):
    from poolctl.errors import UsageError
    from poolctl.sandbox import manager

    with pytest.raises(UsageError, match="poolctl sandbox start"):
        manager.endpoint(home=tmp_path)


# -------------------------------------------------------------------------------------
# helpers for the extension tests


def launch_template(ec2, versions=("t3.micro", "t3.small")) -> tuple[str, str]:
    """A launch template whose version N launches versions[N-1]; returns (id, ami)."""
    ami = stand_in_ami(ec2)
    lt = ec2.create_launch_template(
        LaunchTemplateName=_name("lt"),
        LaunchTemplateData={"ImageId": ami, "InstanceType": versions[0]},
    )["LaunchTemplate"]
    for itype in versions[1:]:
        ec2.create_launch_template_version(
            LaunchTemplateId=lt["LaunchTemplateId"],
            LaunchTemplateData={"ImageId": ami, "InstanceType": itype},
        )
    return lt["LaunchTemplateId"], ami


def make_group(asg, name, lt_id, desired, max_size, version="1", pool="chat", min_size=0):
    tags = [{"Key": POOL_TAG, "Value": pool, "PropagateAtLaunch": True}] if pool else []
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=min_size, MaxSize=max_size, DesiredCapacity=desired,
        AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": lt_id, "Version": version}, Tags=tags,
    )


def _instances(asg, name) -> list[dict]:
    return asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0][
        "Instances"
    ]


def _versions(asg, name) -> list[str]:
    return sorted(i["LaunchTemplate"]["Version"] for i in _instances(asg, name))


def _ec2_instances(ec2, ids) -> dict[str, dict]:
    out = {}
    for r in ec2.describe_instances(InstanceIds=list(ids))["Reservations"]:
        for i in r["Instances"]:
            out[i["InstanceId"]] = i
    return out


def _tags(inst) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


# -------------------------------------------------------------------------------------
# moto fix: instances report the launch template version they really run


def test_instances_carry_the_version_the_group_resolves(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("latest")
    make_group(asg, name, lt_id, desired=2, max_size=2, version="$Latest")
    # $Latest is version 2 (t3.small); moto alone tags them with the default version 1.
    assert _versions(asg, name) == ["2", "2"]
    ids = [i["InstanceId"] for i in _instances(asg, name)]
    for inst in _ec2_instances(ec2, ids).values():
        assert inst["InstanceType"] == "t3.small"
        assert _tags(inst)["aws:ec2launchtemplate:version"] == "2"


# -------------------------------------------------------------------------------------
# (b) warm pool instances


def test_warm_pool_min_size_2_lists_2_stopped_instances_tagged_like_the_group(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("warm")
    make_group(asg, name, lt_id, desired=1, max_size=3)
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=2, PoolState="Stopped")
    # Size = max(MinSize 2, MaxSize 3 - desired 1) = 2.
    pool = asg.describe_warm_pool(AutoScalingGroupName=name)
    states = [i["LifecycleState"] for i in pool["Instances"]]
    assert states == ["Warmed:Stopped", "Warmed:Stopped"]
    warm_ids = {i["InstanceId"] for i in pool["Instances"]}
    group_ids = {i["InstanceId"] for i in _instances(asg, name)}
    assert len(group_ids) == 1 and not warm_ids & group_ids
    for inst in _ec2_instances(ec2, warm_ids).values():
        assert inst["State"]["Name"] == "stopped"
        assert _tags(inst)[POOL_TAG] == "chat"
        assert _tags(inst)["aws:autoscaling:groupName"] == name
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["WarmPoolSize"] == 2


def test_warm_pool_size_follows_the_put_warm_pool_formula(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("size")
    make_group(asg, name, lt_id, desired=2, max_size=10)

    def size(**kw) -> list[str]:
        asg.put_warm_pool(AutoScalingGroupName=name, **kw)
        return [i["LifecycleState"] for i in
                asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]]

    assert size(MaxGroupPreparedCapacity=6) == ["Warmed:Stopped"] * 4  # 6 - 2
    assert size(MaxGroupPreparedCapacity=-1) == ["Warmed:Stopped"] * 8  # unset: 10 - 2
    assert size(MaxGroupPreparedCapacity=3, MinSize=5) == ["Warmed:Stopped"] * 5  # max(5, 1)
    running = size(MaxGroupPreparedCapacity=3, PoolState="Running")  # max(0, 3 - 2) = 1
    assert running == ["Warmed:Running"]
    warm_id = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"][0]["InstanceId"]
    assert _ec2_instances(ec2, [warm_id])[warm_id]["State"]["Name"] == "running"


def test_scale_out_takes_warm_instances_first_then_refills(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("scale")
    make_group(asg, name, lt_id, desired=1, max_size=6)
    asg.put_warm_pool(AutoScalingGroupName=name, MaxGroupPreparedCapacity=4)  # 4 - 1 = 3 warm
    warm_before = {i["InstanceId"] for i in
                   asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]}
    group_before = {i["InstanceId"] for i in _instances(asg, name)}
    assert len(warm_before) == 3

    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=3)
    group_after = {i["InstanceId"] for i in _instances(asg, name)}
    moved = group_after - group_before
    assert len(moved) == 2 and moved <= warm_before  # both new members came from the pool
    for inst in _ec2_instances(ec2, moved).values():
        assert inst["State"]["Name"] == "running"  # started on the way in
    warm_after = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert len(warm_after) == 1  # refilled to 4 - 3

    asg.delete_warm_pool(AutoScalingGroupName=name)
    left = warm_after[0]["InstanceId"]
    assert _ec2_instances(ec2, [left])[left]["State"]["Name"] == "terminated"


# -------------------------------------------------------------------------------------
# admin: snapshots (the suite restores its deployed pool between groups with them)


def test_snapshot_restore_brings_back_resources_ids_and_quotas(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("snap")
    make_group(asg, name, lt_id, desired=1, max_size=6)
    asg.put_warm_pool(AutoScalingGroupName=name, MaxGroupPreparedCapacity=3)  # 2 warm
    member = [i["InstanceId"] for i in _instances(asg, name)]
    warm = sorted(i["InstanceId"] for i in
                  asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"])
    sandbox_admin(sandbox, "POST", "/_poolctl/quotas", {"quotas": {"L-417A185B": 384}})
    # SSM too (Packer looks AMIs up there): its parameter store is a dict moto builds oddly.
    ssm = sandbox_client("ssm")
    ssm.put_parameter(Name=f"/{name}/image", Value="v1", Type="String")
    taken = sandbox_admin(sandbox, "POST", "/_poolctl/snapshots", {"name": "t1"})
    assert taken["name"] == "t1" and taken["backends"] >= 2  # ec2 and autoscaling at least
    assert "t1" in sandbox_admin(sandbox, "GET", "/_poolctl/snapshots")["snapshots"]

    # change everything the snapshot holds
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=3)
    ec2.delete_launch_template(LaunchTemplateId=lt_id)
    sandbox_admin(sandbox, "POST", "/_poolctl/quotas", {"quotas": {"L-417A185B": 0}})
    ssm.put_parameter(Name=f"/{name}/image", Value="v2", Type="String", Overwrite=True)
    other = _name("snap-later")
    make_group(asg, other, launch_template(ec2)[0], desired=1, max_size=1)

    sandbox_admin(sandbox, "POST", "/_poolctl/snapshots/t1/restore")
    assert [i["InstanceId"] for i in _instances(asg, name)] == member
    assert sorted(i["InstanceId"] for i in
                  asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]) == warm
    assert ec2.describe_launch_templates(LaunchTemplateIds=[lt_id])["LaunchTemplates"]
    assert not asg.describe_auto_scaling_groups(AutoScalingGroupNames=[other])[
        "AutoScalingGroups"]
    quotas = sandbox_admin(sandbox, "GET", "/_poolctl/quotas")["quotas"]
    assert quotas["*"]["L-417A185B"] == 384
    param = ssm.get_parameter(Name=f"/{name}/image")["Parameter"]
    assert (param["Value"], param["Version"]) == ("v1", 1)
    # The restored group still launches into the live EC2 backend: a copy that had copied
    # the backends too would launch instances that DescribeInstances never shows.
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=3)
    ids = {i["InstanceId"] for i in _instances(asg, name)}
    assert len(ids) == 3 and set(_ec2_instances(ec2, ids)) == ids
    # A snapshot survives its restore (restore again: back to one member).
    sandbox_admin(sandbox, "POST", "/_poolctl/snapshots/t1/restore")
    assert [i["InstanceId"] for i in _instances(asg, name)] == member


def test_a_retried_attempt_gets_the_first_answer_and_creates_nothing_more(sandbox_client):
    ec2 = sandbox_client("ec2")
    lt_id, ami = launch_template(ec2, versions=("t3.micro",))
    sent: list[dict] = []

    def same_call(request, **kw):  # both sends are attempts of one call, the second a retry
        request.headers["amz-sdk-invocation-id"] = f"fixed-{lt_id}"
        request.headers["amz-sdk-request"] = f"attempt={len(sent) + 1}; max=3"
        sent.append(dict(request.headers))

    ec2.meta.events.register("before-send.ec2.CreateLaunchTemplateVersion", same_call)
    data = {"ImageId": ami, "InstanceType": "t3.small"}
    first = ec2.create_launch_template_version(LaunchTemplateId=lt_id, LaunchTemplateData=data)
    again = ec2.create_launch_template_version(LaunchTemplateId=lt_id, LaunchTemplateData=data)
    assert len(sent) == 2
    assert first["LaunchTemplateVersion"]["VersionNumber"] == 2
    assert again["LaunchTemplateVersion"]["VersionNumber"] == 2  # the first answer, again
    versions = ec2.describe_launch_template_versions(LaunchTemplateId=lt_id)
    assert sorted(v["VersionNumber"] for v in versions["LaunchTemplateVersions"]) == [1, 2]
    # A new call (its own invocation id) is performed as usual.
    ec2.meta.events.unregister("before-send.ec2.CreateLaunchTemplateVersion", same_call)
    third = ec2.create_launch_template_version(LaunchTemplateId=lt_id, LaunchTemplateData=data)
    assert third["LaunchTemplateVersion"]["VersionNumber"] == 3


def test_restore_of_an_unknown_snapshot_is_404_and_a_reset_drops_them(sandbox_reset):
    sandbox_admin(sandbox_reset, "POST", "/_poolctl/snapshots", {"name": "t2"})
    with pytest.raises(urllib.error.HTTPError) as err:
        sandbox_admin(sandbox_reset, "POST", "/_poolctl/snapshots/nope/restore")
    assert err.value.code == 404
    sandbox_admin(sandbox_reset, "POST", "/moto-api/reset")
    assert sandbox_admin(sandbox_reset, "GET", "/_poolctl/snapshots") == {"snapshots": []}


# -------------------------------------------------------------------------------------
# (c) lifecycle action completion


def _hooked_group(ec2, asg, name, timeout=300):
    lt_id, _ = launch_template(ec2)
    make_group(asg, name, lt_id, desired=0, max_size=4)
    asg.put_lifecycle_hook(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING", HeartbeatTimeout=timeout,
        DefaultResult="ABANDON",
    )
    return lt_id


def test_lifecycle_completion_moves_the_instance_in_service(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("hook")
    _hooked_group(ec2, asg, name)
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    [inst] = _instances(asg, name)
    assert inst["LifecycleState"] == "Pending:Wait"
    # A pending instance counts towards the desired capacity: no second launch.
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    assert len(_instances(asg, name)) == 1

    iid = inst["InstanceId"]
    asg.record_lifecycle_action_heartbeat(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name, InstanceId=iid)
    report = sandbox_admin(sandbox, "GET", "/_poolctl/lifecycle-actions")
    [action] = [a for a in report["open"] if a["InstanceId"] == iid]
    assert action["Heartbeats"] == 1 and 290 < action["SecondsLeft"] <= 300

    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name, InstanceId=iid,
        LifecycleActionResult="CONTINUE")
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["InService"]
    log = sandbox_admin(sandbox, "GET", "/_poolctl/lifecycle-actions")["log"]
    assert [(e["How"], e["LifecycleActionResult"]) for e in log if e["InstanceId"] == iid] == [
        ("RecordLifecycleActionHeartbeat", None), ("CompleteLifecycleAction", "CONTINUE")]

    with pytest.raises(ClientError) as err:  # nothing is waiting any more
        asg.complete_lifecycle_action(
            LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name, InstanceId=iid,
            LifecycleActionResult="CONTINUE")
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_lifecycle_abandon_by_token_replaces_the_instance(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("abandon")
    _hooked_group(ec2, asg, name)
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    [first] = _instances(asg, name)
    token = next(a["LifecycleActionToken"] for a in
                 sandbox_admin(sandbox, "GET", "/_poolctl/lifecycle-actions")["open"]
                 if a["InstanceId"] == first["InstanceId"])
    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        LifecycleActionToken=token, LifecycleActionResult="ABANDON")
    [second] = _instances(asg, name)
    assert second["InstanceId"] != first["InstanceId"]
    assert second["LifecycleState"] == "Pending:Wait"
    gone = _ec2_instances(ec2, [first["InstanceId"]])[first["InstanceId"]]
    assert gone["State"]["Name"] == "terminated"


def test_lifecycle_heartbeat_timeout_applies_the_default_result(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("timeout")
    _hooked_group(ec2, asg, name)
    # AWS accepts 30..7200 s; the sandbox takes 1 s so the test waits only a moment.
    asg.put_lifecycle_hook(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING", HeartbeatTimeout=1,
        DefaultResult="CONTINUE",
    )
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["Pending:Wait"]
    time.sleep(1.2)
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["InService"]


def test_admin_endpoint_completes_open_actions_like_boot_scripts(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("bootall")
    _hooked_group(ec2, asg, name)
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=2)
    done = sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions",
                         {"AutoScalingGroupName": name})["completed"]
    assert len(done) == 2
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["InService", "InService"]


def test_warm_pool_launch_waits_for_the_hook_then_stops(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("warmhook")
    _hooked_group(ec2, asg, name)
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=1, MaxGroupPreparedCapacity=1)
    [warm] = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert warm["LifecycleState"] == "Warmed:Pending:Wait"
    iid = warm["InstanceId"]
    assert _ec2_instances(ec2, [iid])[iid]["State"]["Name"] == "running"  # preparing
    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name, InstanceId=iid,
        LifecycleActionResult="CONTINUE")
    [warm] = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert warm["LifecycleState"] == "Warmed:Stopped"
    assert _ec2_instances(ec2, [iid])[iid]["State"]["Name"] == "stopped"


# -------------------------------------------------------------------------------------
# (a) instance refresh


def _describe(asg, name) -> dict:
    return asg.describe_instance_refreshes(AutoScalingGroupName=name)["InstanceRefreshes"][0]


def _run_to_end(asg, name, limit=20) -> list[dict]:
    seen = []
    for _ in range(limit):
        r = _describe(asg, name)
        seen.append(r)
        if r["Status"] in ("Successful", "Failed", "Cancelled", "RollbackSuccessful",
                           "RollbackFailed"):
            return seen
    raise AssertionError(f"no terminal status after {limit} steps: {seen[-1]}")


def test_refresh_with_checkpoints_reaches_successful_on_the_new_version(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("refresh")
    make_group(asg, name, lt_id, desired=4, max_size=4)
    old_ids = {i["InstanceId"] for i in _instances(asg, name)}
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 50, "CheckpointPercentages": [50, 100],
                     "CheckpointDelay": 600},
    )
    # Batch = floor(4 * 100%) - ceil(4 * 50%) = 2 instances. Each Describe shows the state,
    # then one step passes: start; 2 replaced (checkpoint 50%); the checkpoint delay;
    # 2 more replaced (100%); done.
    steps = []
    mid_versions = None
    for _ in range(6):
        r = _describe(asg, name)
        steps.append((r["Status"], r["PercentageComplete"], r["InstancesToUpdate"]))
        if r.get("StatusReason", "").startswith("Checkpoint 50%"):
            mid_versions = _versions(asg, name)
    assert steps == [
        ("Pending", 0, 4), ("InProgress", 0, 4), ("InProgress", 50, 2), ("InProgress", 50, 2),
        ("InProgress", 100, 0), ("Successful", 100, 0),
    ]
    assert mid_versions == ["1", "1", "2", "2"]  # paused at the checkpoint, half replaced
    assert r["Preferences"]["CheckpointPercentages"] == [50, 100]
    assert r["ProgressDetails"]["LivePoolProgress"] == {"PercentageComplete": 100,
                                                        "InstancesToUpdate": 0}
    assert "EndTime" in r

    now = _instances(asg, name)
    assert [i["LaunchTemplate"]["Version"] for i in now] == ["2"] * 4
    assert not {i["InstanceId"] for i in now} & old_ids
    ec2_now = _ec2_instances(ec2, [i["InstanceId"] for i in now])
    assert {i["InstanceType"] for i in ec2_now.values()} == {"t3.small"}
    assert {i["State"]["Name"] for i in _ec2_instances(ec2, old_ids).values()} == {"terminated"}
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["LaunchTemplate"]["Version"] == "2"  # the desired configuration is applied


def test_refresh_rollback_restores_the_previous_version(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("rollback")
    make_group(asg, name, lt_id, desired=2, max_size=2)
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 50},
    )
    _describe(asg, name)  # Pending; then it starts
    _describe(asg, name)  # InProgress 0%; then floor(2) - ceil(1) = 1 instance is replaced
    assert _versions(asg, name) == ["1", "2"]
    with pytest.raises(ClientError) as err:
        asg.start_instance_refresh(AutoScalingGroupName=name)
    assert err.value.response["Error"]["Code"] == "InstanceRefreshInProgress"

    asg.rollback_instance_refresh(AutoScalingGroupName=name)
    seen = _run_to_end(asg, name)
    assert seen[0]["Status"] == "RollbackInProgress"
    assert seen[0]["RollbackDetails"]["InstancesToUpdateOnRollback"] == 1
    assert seen[0]["RollbackDetails"]["RollbackReason"] == "Rollback requested by user"
    final = seen[-1]
    assert final["Status"] == "RollbackSuccessful"
    assert final["RollbackDetails"]["PercentageCompleteOnRollback"] == 100
    assert final["PercentageComplete"] == 0  # goes back down to zero during a rollback
    assert _versions(asg, name) == ["1", "1"]
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert group["LaunchTemplate"]["Version"] == "1"


def test_refresh_without_desired_configuration_cannot_roll_back_but_cancels(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("cancel")
    make_group(asg, name, lt_id, desired=2, max_size=2)
    asg.start_instance_refresh(AutoScalingGroupName=name)
    with pytest.raises(ClientError) as err:
        asg.rollback_instance_refresh(AutoScalingGroupName=name)
    assert err.value.response["Error"]["Code"] == "IrreversibleInstanceRefresh"
    asg.cancel_instance_refresh(AutoScalingGroupName=name)
    assert [r["Status"] for r in _run_to_end(asg, name)] == ["Cancelling", "Cancelled"]
    with pytest.raises(ClientError) as err:
        asg.cancel_instance_refresh(AutoScalingGroupName=name)
    assert err.value.response["Error"]["Code"] == "ActiveInstanceRefreshNotFound"


def test_refresh_auto_rollback_when_a_replacement_is_unhealthy(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("autorb")
    make_group(asg, name, lt_id, desired=2, max_size=2)
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 50, "AutoRollback": True},
    )
    _describe(asg, name)
    _describe(asg, name)  # one instance replaced by a version-2 one
    [new] = [i for i in _instances(asg, name) if i["LaunchTemplate"]["Version"] == "2"]
    asg.set_instance_health(InstanceId=new["InstanceId"], HealthStatus="Unhealthy")
    seen = _run_to_end(asg, name)
    assert seen[1]["Status"] == "RollbackInProgress"
    assert new["InstanceId"] in seen[1]["RollbackDetails"]["RollbackReason"]
    assert seen[-1]["Status"] == "RollbackSuccessful"
    assert _versions(asg, name) == ["1", "1"]


def test_refresh_skip_matching_and_ignoring_protected_instances(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("skip")
    make_group(asg, name, lt_id, desired=3, max_size=3)
    ids = sorted(i["InstanceId"] for i in _instances(asg, name))
    asg.set_instance_protection(AutoScalingGroupName=name, InstanceIds=[ids[0]],
                                ProtectedFromScaleIn=True)
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 0, "SkipMatching": True,
                     "ScaleInProtectedInstances": "Ignore"},
    )
    seen = _run_to_end(asg, name)
    assert seen[0]["InstancesToUpdate"] == 2  # 3 minus the protected one
    assert seen[-1]["Status"] == "Successful"
    after = {i["InstanceId"]: i["LaunchTemplate"]["Version"] for i in _instances(asg, name)}
    assert after[ids[0]] == "1" and sorted(after.values()) == ["1", "2", "2"]

    # Every instance but the protected one already runs version 2: nothing to update.
    kept = set(after)
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"SkipMatching": True, "ScaleInProtectedInstances": "Ignore"},
    )
    seen = _run_to_end(asg, name)
    assert seen[0]["InstancesToUpdate"] == 0 and seen[-1]["Status"] == "Successful"
    assert set(i["InstanceId"] for i in _instances(asg, name)) == kept


def test_refresh_replaces_the_warm_pool_after_the_live_pool(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("warmrefresh")
    make_group(asg, name, lt_id, desired=1, max_size=2)
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=1)  # max(1, 2 - 1) = 1
    [old_warm] = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 0},
    )
    seen = _run_to_end(asg, name)
    # Pending; InProgress (live 0%); live replaced; warm replaced; Successful.
    assert [(r["Status"], r["ProgressDetails"]["LivePoolProgress"]["PercentageComplete"],
             r["ProgressDetails"]["WarmPoolProgress"]["PercentageComplete"]) for r in seen] == [
        ("Pending", 0, 0), ("InProgress", 0, 0), ("InProgress", 100, 0),
        ("InProgress", 100, 100), ("Successful", 100, 100)]
    [new_warm] = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert new_warm["InstanceId"] != old_warm["InstanceId"]
    assert new_warm["LaunchTemplate"]["Version"] == "2"
    assert new_warm["LifecycleState"] == "Warmed:Stopped"


def test_refresh_waits_for_replacements_to_complete_their_launch_hook(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name = _name("hookrefresh")
    lt_id = _hooked_group(ec2, asg, name)
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions", {"AutoScalingGroupName": name})
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 0},
    )
    _describe(asg, name)  # Pending; then it starts
    _describe(asg, name)  # InProgress; then the instance is replaced
    [new] = _instances(asg, name)
    assert new["LifecycleState"] == "Pending:Wait"
    assert _describe(asg, name)["PercentageComplete"] == 0  # launched, not yet InService
    for _ in range(3):  # however often it is asked, the refresh waits for the node
        r = _describe(asg, name)
        assert r["Status"] == "InProgress" and new["InstanceId"] in r["StatusReason"]
        assert (r["PercentageComplete"], r["InstancesToUpdate"]) == (0, 1)
    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        InstanceId=new["InstanceId"], LifecycleActionResult="CONTINUE")
    assert _run_to_end(asg, name)[-1]["Status"] == "Successful"
    assert _versions(asg, name) == ["2"]


def _surge_refresh(sandbox, ec2, asg, prefix, **prefs):
    """A one-node group with the launch hook, refreshed to version 2 with MaxHealthyPercentage
    200; returns once the refresh has launched the replacement: (group name, the old node)."""
    name = _name(prefix)
    lt_id = _hooked_group(ec2, asg, name)
    asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=1)
    sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions", {"AutoScalingGroupName": name})
    [old] = _instances(asg, name)
    asg.start_instance_refresh(
        AutoScalingGroupName=name,
        DesiredConfiguration={"LaunchTemplate": {"LaunchTemplateId": lt_id, "Version": "2"}},
        Preferences={"MinHealthyPercentage": 100, "MaxHealthyPercentage": 200, **prefs},
    )
    _describe(asg, name)  # Pending; then it starts
    _describe(asg, name)  # InProgress; then floor(1 x 200%) - ceil(1 x 100%) = 1 launched
    return name, old


def test_refresh_with_surge_launches_first_and_retires_the_old_node_once_it_serves(
        sandbox, sandbox_client):
    # MaxHealthyPercentage 200 on a one-node group: AWS launches the replacement first and
    # terminates the old node once the new one is InService, so the pool is never empty.
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    name, old = _surge_refresh(sandbox, ec2, asg, "surge")
    states = {i["InstanceId"]: i["LifecycleState"] for i in _instances(asg, name)}
    [new_id] = set(states) - {old["InstanceId"]}
    assert states == {old["InstanceId"]: "InService", new_id: "Pending:Wait"}
    _describe(asg, name)
    r = _describe(asg, name)  # still waiting for the replacement: the old node serves on
    assert new_id in r["StatusReason"] and old["InstanceId"] in {
        i["InstanceId"] for i in _instances(asg, name)}
    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        InstanceId=new_id, LifecycleActionResult="CONTINUE")
    _describe(asg, name)  # the replacement is InService: the old node is terminated
    assert [i["InstanceId"] for i in _instances(asg, name)] == [new_id]
    assert _ec2_instances(ec2, [old["InstanceId"]])[old["InstanceId"]]["State"]["Name"] == (
        "terminated")
    assert _run_to_end(asg, name)[-1]["Status"] == "Successful"


def test_rollback_before_the_old_node_is_retired_keeps_it(sandbox, sandbox_client):
    asg = sandbox_client("autoscaling")
    name, old = _surge_refresh(sandbox, sandbox_client("ec2"), asg, "surgerb")
    # the replacement launched, the old node still serving
    asg.rollback_instance_refresh(AutoScalingGroupName=name)
    assert _run_to_end(asg, name)[-1]["Status"] == "RollbackSuccessful"
    # the replacement goes without a successor: the old node is the group again
    assert [i["InstanceId"] for i in _instances(asg, name)] == [old["InstanceId"]]


def test_a_replacement_whose_boot_fails_rolls_the_refresh_back_keeping_the_old_node(
        sandbox, sandbox_client):
    # The replacement's launch hook is ABANDONed (its boot failed): an EC2 launch failure to
    # the refresh, which auto-rolls back; the node it was to replace never stopped serving.
    asg = sandbox_client("autoscaling")
    name, old = _surge_refresh(sandbox, sandbox_client("ec2"), asg, "surgefail",
                               AutoRollback=True)
    [new] = [i["InstanceId"] for i in _instances(asg, name) if i["InstanceId"] != old["InstanceId"]]
    asg.complete_lifecycle_action(
        LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=name,
        InstanceId=new, LifecycleActionResult="ABANDON")
    seen = _run_to_end(asg, name)
    assert seen[1]["Status"] == "RollbackInProgress"
    assert seen[1]["StatusReason"] == (
        "Instance refresh failed: Replacement instance(s) ended before they were InService "
        f"(launch failed): {new}")
    assert seen[-1]["Status"] == "RollbackSuccessful"
    assert [i["InstanceId"] for i in _instances(asg, name)] == [old["InstanceId"]]


def test_refresh_rejects_bad_preferences(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("badprefs")
    make_group(asg, name, lt_id, desired=1, max_size=1)
    for prefs in (
        {"CheckpointPercentages": [50, 20]},
        {"CheckpointDelay": 60},
        {"MinHealthyPercentage": 40, "MaxHealthyPercentage": 150},
        {"AutoRollback": True},  # no desired configuration
    ):
        with pytest.raises(ClientError) as err:
            asg.start_instance_refresh(AutoScalingGroupName=name, Preferences=prefs)
        assert err.value.response["Error"]["Code"] == "ValidationError", prefs


# -------------------------------------------------------------------------------------
# (d) Service Quotas for ec2


def test_ec2_quotas_get_set_and_request_without_duplicates(sandbox_reset, sandbox_client):
    sq = sandbox_client("service-quotas")
    p = sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]
    # the sandbox grants enough for the examples (SANDBOX_GRANTS); AWS's default is 0
    assert (p["QuotaName"], p["Value"]) == ("Running On-Demand P instances", 2304.0)
    codes = {q["QuotaCode"] for q in sq.list_service_quotas(ServiceCode="ec2")["Quotas"]}
    assert codes == {"L-417A185B", "L-DB2E81BA", "L-1216C47A"}

    sandbox_admin(sandbox_reset, "POST", "/_poolctl/quotas", {"quotas": {"L-417A185B": 384}})
    assert sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]["Value"] == 384
    default = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")
    assert default["Quota"]["Value"] == 0.0  # the AWS default does not move

    req = sq.request_service_quota_increase(
        ServiceCode="ec2", QuotaCode="L-417A185B", DesiredValue=768)["RequestedQuota"]
    assert req["Status"] == "PENDING" and req["Id"] and req["DesiredValue"] == 768
    assert sq.get_requested_service_quota_change(RequestId=req["Id"])["RequestedQuota"] == req
    with pytest.raises(ClientError) as err:
        sq.request_service_quota_increase(
            ServiceCode="ec2", QuotaCode="L-417A185B", DesiredValue=1152)
    assert err.value.response["Error"]["Code"] == "ResourceAlreadyExistsException"
    history = sq.list_requested_service_quota_change_history_by_quota(
        ServiceCode="ec2", QuotaCode="L-417A185B")["RequestedQuotas"]
    assert [r["Id"] for r in history] == [req["Id"]]
    assert len(sq.list_requested_service_quota_change_history(
        ServiceCode="ec2", Status="PENDING")["RequestedQuotas"]) == 1

    with pytest.raises(ClientError) as err:  # not above the current 0
        sq.request_service_quota_increase(
            ServiceCode="ec2", QuotaCode="L-DB2E81BA", DesiredValue=0)
    assert err.value.response["Error"]["Code"] == "IllegalArgumentException"
    with pytest.raises(ClientError) as err:
        sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-00000000")
    assert err.value.response["Error"]["Code"] == "NoSuchResourceException"

    approved = sandbox_admin(sandbox_reset, "POST", f"/_poolctl/quota-requests/{req['Id']}",
                             {"status": "APPROVED"})
    assert approved["RequestedQuota"]["Status"] == "APPROVED"
    assert sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]["Value"] == 768
    again = sq.request_service_quota_increase(  # no open request any more
        ServiceCode="ec2", QuotaCode="L-417A185B", DesiredValue=1152)["RequestedQuota"]
    assert again["Id"] != req["Id"]

    # moto's own vpc quotas still answer.
    assert sq.list_aws_default_service_quotas(ServiceCode="vpc")["Quotas"]


# -------------------------------------------------------------------------------------
# Terraform's view: what `deploy --sandbox` needs from the emulator (a second plan is empty
# only if every attribute the AWS provider writes comes back as the API reference says)


def test_create_group_hook_specifications_hold_the_first_instances(sandbox, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("inithook")
    spec = {"LifecycleHookName": "poolctl-node-ready", "HeartbeatTimeout": 600,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"}
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=1, MaxSize=3, DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"], LaunchTemplate={"LaunchTemplateId": lt_id},
        LifecycleHookSpecificationList=[spec],
    )
    [hook] = asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"]
    # DefaultResult not given: ABANDON, the documented default; no role, no target.
    assert (hook["LifecycleHookName"], hook["HeartbeatTimeout"], hook["DefaultResult"]) == (
        "poolctl-node-ready", 600, "ABANDON")
    assert "RoleARN" not in hook and "NotificationTargetARN" not in hook
    # The hook existed before the group's first launch, so that instance waits.
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["Pending:Wait"]
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=1)  # max(1, 3 - 1) = 2 warm
    warm = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    assert [w["LifecycleState"] for w in warm] == ["Warmed:Pending:Wait"] * 2

    done = sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions",
                         {"AutoScalingGroupName": name})["completed"]
    assert sorted(d["LifecycleState"] for d in done) == [
        "InService", "Warmed:Stopped", "Warmed:Stopped"]
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["InService"]

    with pytest.raises(ClientError) as err:  # AWS: the name is taken (moto replaced the group)
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=1,
            AvailabilityZones=["us-east-1a"], LaunchTemplate={"LaunchTemplateId": lt_id})
    assert err.value.response["Error"]["Code"] == "AlreadyExists"
    assert len(_instances(asg, name)) == 1

    # Deleting the group deletes its hooks: a new group of that name launches straight
    # into service.
    asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    assert asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"] == []
    make_group(asg, name, lt_id, desired=1, max_size=1)
    assert [i["LifecycleState"] for i in _instances(asg, name)] == ["InService"]


@pytest.mark.parametrize("bad, words", [
    ({"LifecycleHookName": "h", "LifecycleTransition": "autoscaling:EC2_INSTANCE_REBOOTING"},
     "Invalid LifecycleTransition"),
    ({"LifecycleHookName": "h", "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
      "HeartbeatTimeout": 10}, "between 30 and 7200"),
    ({"LifecycleHookName": "h", "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
      "DefaultResult": "RETRY"}, "CONTINUE or ABANDON"),
])
def test_bad_hook_specification_creates_neither_group_nor_hook(sandbox_client, bad, words):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("badhook")
    good = {"LifecycleHookName": "ok", "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"}
    with pytest.raises(ClientError) as err:
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=1, AvailabilityZones=["us-east-1a"],
            LaunchTemplate={"LaunchTemplateId": lt_id},
            LifecycleHookSpecificationList=[good, bad],
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert words in err.value.response["Error"]["Message"]
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"] == []
    assert asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"] == []


def test_default_instance_warmup_is_stored_updated_and_cleared(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("warmup")

    def warmup() -> int | None:
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
            "AutoScalingGroups"][0]
        return group.get("DefaultInstanceWarmup")

    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=1, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": lt_id}, DefaultInstanceWarmup=440,
    )
    assert warmup() == 440
    asg.update_auto_scaling_group(AutoScalingGroupName=name, DefaultInstanceWarmup=300)
    assert warmup() == 300
    asg.update_auto_scaling_group(AutoScalingGroupName=name, MaxSize=2)  # not given: kept
    assert warmup() == 300
    asg.update_auto_scaling_group(AutoScalingGroupName=name, DefaultInstanceWarmup=-1)
    assert warmup() is None  # -1 removes it (UpdateAutoScalingGroup reference)


def test_scaling_policies_report_enabled_and_no_invented_predictive_block(sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("policy")
    make_group(asg, name, lt_id, desired=0, max_size=2)
    asg.put_scaling_policy(
        AutoScalingGroupName=name, PolicyName=f"{name}-target",
        PolicyType="TargetTrackingScaling",
        TargetTrackingConfiguration={
            "PredefinedMetricSpecification": {"PredefinedMetricType": "ASGAverageCPUUtilization"},
            "TargetValue": 50.0},
    )
    asg.put_scaling_policy(AutoScalingGroupName=name, PolicyName=f"{name}-in",
                           PolicyType="SimpleScaling", AdjustmentType="ChangeInCapacity",
                           ScalingAdjustment=-1, Enabled=False)
    policies = {p["PolicyName"]: p for p in
                asg.describe_policies(AutoScalingGroupName=name)["ScalingPolicies"]}
    assert policies[f"{name}-target"]["Enabled"] is True  # the default
    assert policies[f"{name}-in"]["Enabled"] is False
    assert not any("PredictiveScalingConfiguration" in p for p in policies.values())

    asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    # AWS deletes a group's policies with it.
    assert asg.describe_policies(AutoScalingGroupName=name)["ScalingPolicies"] == []


def test_launch_template_tags_stay_on_the_template(sandbox_client):
    ec2 = sandbox_client("ec2")
    ami = stand_in_ami(ec2)
    pool_tags = [{"Key": POOL_TAG, "Value": "chat"}]
    launched = [{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "node"}]}]
    tagged = ec2.create_launch_template(
        LaunchTemplateName=_name("lt"),
        LaunchTemplateData={"ImageId": ami, "TagSpecifications": launched},
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": pool_tags}],
    )["LaunchTemplate"]
    bare = ec2.create_launch_template(
        LaunchTemplateName=_name("lt"), LaunchTemplateData={"ImageId": ami},
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": pool_tags}],
    )["LaunchTemplate"]

    def data(lt) -> dict:
        return ec2.describe_launch_template_versions(
            LaunchTemplateId=lt["LaunchTemplateId"])["LaunchTemplateVersions"][0][
            "LaunchTemplateData"]

    assert data(tagged)["TagSpecifications"] == launched
    assert "TagSpecifications" not in data(bare)
    [described] = ec2.describe_launch_templates(
        LaunchTemplateIds=[bare["LaunchTemplateId"]])["LaunchTemplates"]
    assert described["Tags"] == pool_tags  # the template itself is still tagged


def test_rule_referencing_a_group_keeps_its_description(sandbox_client):
    ec2 = sandbox_client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    lb = ec2.create_security_group(GroupName=_name("lb"), Description="lb", VpcId=vpc)["GroupId"]
    nodes = ec2.create_security_group(GroupName=_name("n"), Description="n", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=nodes, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 8000, "ToPort": 8000,
        "UserIdGroupPairs": [{"GroupId": lb, "Description": "serving port from the ALB"}]}])
    rules = ec2.describe_security_group_rules(
        Filters=[{"Name": "group-id", "Values": [nodes]}])["SecurityGroupRules"]
    [rule] = [r for r in rules if not r["IsEgress"]]
    assert rule["Description"] == "serving port from the ALB"
    assert rule["ReferencedGroupInfo"]["GroupId"] == lb
    # The account the provider compares with (moto's): no "123456789012/sg-..." diff.
    assert rule["ReferencedGroupInfo"]["UserId"] == "123456789012"


def test_aws_managed_policies_are_attachable(sandbox_client):
    iam = sandbox_client("iam")
    role = _name("role")
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    iam.attach_role_policy(RoleName=role, PolicyArn=arn)
    attached = iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [arn]


# -------------------------------------------------------------------------------------
# poolctl sandbox boot-nodes, and the Terraform state that dies with the emulator


def test_boot_nodes_completes_the_launch_hooks_of_one_pool(sandbox, sandbox_home, sandbox_client):
    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    pool, other = _name("bootpool"), _name("otherpool")
    name, other_name = _name("boot"), _name("other")
    for group, tag in ((name, pool), (other_name, other)):
        lt_id, _ = launch_template(ec2)
        make_group(asg, group, lt_id, desired=0, max_size=4, pool=tag)
        asg.put_lifecycle_hook(
            LifecycleHookName="poolctl-node-ready", AutoScalingGroupName=group,
            LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING", HeartbeatTimeout=600)
        asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
    asg.put_warm_pool(AutoScalingGroupName=name, MinSize=1, MaxGroupPreparedCapacity=2)

    res = _cli(sandbox_home, "sandbox", "boot-nodes", "--pool", pool, "--json")
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    # desired 1 InService, plus max(1, 2 - 1) = 1 warm instance settled Stopped.
    assert sorted((n["group"], n["state"], n["warm"]) for n in nodes) == [
        (name, "InService", False), (name, "Warmed:Stopped", True)]
    assert [i["LifecycleState"] for i in _instances(asg, other_name)] == ["Pending:Wait"]

    human = _cli(sandbox_home, "sandbox", "boot-nodes", "--pool", other)
    assert human.returncode == 0, human.stderr
    [iid] = [i["InstanceId"] for i in _instances(asg, other_name)]
    assert f"{other_name}: {iid} -> InService" in human.stdout
    assert "booted 1 node(s): 1 InService, 0 warm" in human.stdout
    again = _cli(sandbox_home, "sandbox", "boot-nodes", "--pool", other)
    assert "no node is waiting" in again.stdout

    missing = _cli(sandbox_home, "sandbox", "boot-nodes", "--pool", "no-such-pool")
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "--pool no-such-pool" in missing.stderr


def test_stop_and_a_fresh_start_remove_stale_terraform_state(tmp_path):
    home = tmp_path / "home"
    sdir = home / "sandbox"

    def leave_state() -> None:
        (sdir / "deploy" / "acme-chat-70b-aws").mkdir(parents=True)
        (sdir / "deploy" / "acme-chat-70b-aws" / "cdk.tf.json").write_text("{}")
        (sdir / "state").mkdir(parents=True)
        (sdir / "state" / "acme-chat-70b-aws.tfstate").write_text("{}")

    assert _cli(home, "sandbox", "start", "--port", "0").returncode == 0
    try:
        leave_state()
    finally:
        stop = _cli(home, "sandbox", "stop")
    assert stop.returncode == 0, stop.stderr
    assert "removed the Terraform workdirs and state" in stop.stdout
    assert not (sdir / "deploy").exists() and not (sdir / "state").exists()

    leave_state()  # e.g. the machine rebooted: the emulator died without `sandbox stop`
    start = _cli(home, "sandbox", "start", "--port", "0", "--json")
    try:
        assert start.returncode == 0, start.stderr
        removed = json.loads(start.stdout)["removed_state"]
        assert sorted(Path(p).name for p in removed) == ["deploy", "state"]
        assert not (sdir / "deploy").exists() and not (sdir / "state").exists()
        # A running sandbox's state is live: starting again keeps it.
        leave_state()
        again = _cli(home, "sandbox", "start", "--port", "0", "--json")
        assert json.loads(again.stdout)["already_running"] is True
        assert (sdir / "state" / "acme-chat-70b-aws.tfstate").exists()
    finally:
        assert _cli(home, "sandbox", "stop").returncode == 0


# -------------------------------------------------------------------------------------
# Self-booting nodes: `sandbox start --boot-speedup`, through the CLI


def test_nodes_boot_by_themselves_so_warm_wait_needs_no_boot_nodes(tmp_path):
    """Its own sandbox (the session's boots by hand), the example pool's resources made
    with boto3 as `deployed_pool` does without Terraform, then `warm --wait` with nobody
    completing a launch hook."""
    from poolctl.config import load_config
    from poolctl.sandbox import manager
    from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE, deploy_with_boto3
    from tests.plugins.sandbox import run_poolctl

    home = tmp_path / "home"
    pool_file = tmp_path / "poolctl.yaml"
    pool_file.write_text(DEPLOYED_EXAMPLE.read_text())
    started = _cli(home, "sandbox", "start", "--port", "0", "--boot-speedup", "1000", "--json")
    assert started.returncode == 0, started.stderr
    endpoint = json.loads(started.stdout)["endpoint"]
    assert json.loads(started.stdout)["boot_speedup"] == 1000

    def poolctl(*args: str) -> dict:
        res = run_poolctl(home, *args, "--cloud", "aws", "--sandbox", "--json",
                          "-f", str(pool_file), POOLCTL_POLL_S="0.05")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    try:
        cfg = load_config(pool_file)
        manager.register_start_times(cfg, cfg.pools[0], home=home)  # what deploy sends
        deploy_with_boto3(endpoint)  # 1 node in service + 2 warm, all launching now
        # 12 replicas / 4 per node = 3 warm nodes: the deploy's 2 and one more, all cold
        w = poolctl("warm", "--replicas", "12", "--wait", "--timeout", "60")
        assert (w["after"]["warm_nodes"], w["wait"]["ready"], w["wait"]["target"]) == (3, 3, 3)
        # 4 replicas running above the minimum: one warm (stopped) node goes in service
        r = poolctl("warm", "--replicas", "4", "--running", "--wait", "--timeout", "60")
        assert (r["after"]["min_nodes"], r["wait"]["ready"], r["wait"]["target"]) == (2, 2, 2)

        log = sandbox_admin(endpoint, "GET", "/_poolctl/lifecycle-actions")["log"]
        assert {e["How"] for e in log} == {"self-boot"}  # never boot-nodes, never a timeout
        kinds = sorted(e["BootKind"] for e in log)
        # cold: the deploy's 1 + 2 warm, warm's third; warm_stopped: the one taken into
        # service (its refill is still booting, or has booted: a fifth cold entry)
        assert kinds[:4] == ["cold"] * 4 and "warm_stopped" in kinds
        for e in log:
            # the plan's 440.5 s cold and 260.5 s stopped-warm start, 1000 times faster
            want = {"cold": 440.5, "warm_stopped": 260.5}[e["BootKind"]] / 1000
            assert e["BootSeconds"] == pytest.approx(want, abs=1e-3)
        group = manager.client("autoscaling", home=home).describe_auto_scaling_groups(
            AutoScalingGroupNames=["acme-chat-70b"])["AutoScalingGroups"][0]
        assert [i["LifecycleState"] for i in group["Instances"]] == ["InService"] * 2

        # `sandbox start` on the running sandbox changes how nodes boot, and says so
        manual = _cli(home, "sandbox", "start", "--manual-boot", "--json")
        assert json.loads(manual.stdout)["already_running"] is True
        assert json.loads(manual.stdout)["boot_speedup"] == 0
        assert sandbox_admin(endpoint, "GET", "/_poolctl/health")["boot_speedup"] == 0
    finally:
        assert _cli(home, "sandbox", "stop").returncode == 0


# -------------------------------------------------------------------------------------
# scheduled actions and the sandbox clock (schedules.py)


def test_scheduled_actions_run_when_the_clock_reaches_them(sandbox_client, sandbox):
    from datetime import UTC, datetime, timedelta

    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("sched")
    make_group(asg, name, lt_id, desired=1, max_size=6, min_size=1)
    start = datetime.now(UTC) + timedelta(minutes=10)
    try:
        asg.put_scheduled_update_group_action(
            AutoScalingGroupName=name, ScheduledActionName="up", StartTime=start, MinSize=3)
        asg.put_scheduled_update_group_action(
            AutoScalingGroupName=name, ScheduledActionName="down",
            StartTime=start + timedelta(hours=1), MinSize=1, DesiredCapacity=1)
        listed = asg.describe_scheduled_actions(AutoScalingGroupName=name)
        acts = listed["ScheduledUpdateGroupActions"]
        assert [a["ScheduledActionName"] for a in acts] == ["up", "down"]  # by start time
        assert acts[0]["MinSize"] == 3 and "DesiredCapacity" not in acts[0]
        assert acts[0]["ScheduledActionARN"].startswith("arn:aws:autoscaling:us-east-1:")
        assert abs((acts[0]["StartTime"] - start).total_seconds()) < 1

        # 11 minutes on: "up" has run (min 3, desired raised to 3) and is gone; "down" waits.
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 11 * 60})
        g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        assert (g["MinSize"], g["DesiredCapacity"], len(g["Instances"])) == (3, 3, 3)
        left = asg.describe_scheduled_actions(AutoScalingGroupName=name)
        assert [a["ScheduledActionName"] for a in left["ScheduledUpdateGroupActions"]] == ["down"]

        # 10 + 60 + 1 minutes: "down" restores min 1 / desired 1.
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"advance_seconds": 60 * 60})
        g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)
        assert asg.describe_scheduled_actions(
            AutoScalingGroupName=name)["ScheduledUpdateGroupActions"] == []
    finally:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})


def test_scheduled_actions_refuse_what_aws_refuses(sandbox_client):
    from datetime import UTC, datetime, timedelta

    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    lt_id, _ = launch_template(ec2)
    name = _name("schedbad")
    make_group(asg, name, lt_id, desired=0, max_size=2)
    soon = datetime.now(UTC) + timedelta(hours=1)

    def code(**kw) -> tuple[str, str]:
        with pytest.raises(ClientError) as err:
            asg.put_scheduled_update_group_action(**{"AutoScalingGroupName": name,
                                                     "ScheduledActionName": "x", **kw})
        e = err.value.response["Error"]
        return e["Code"], e["Message"]

    assert code(StartTime=datetime.now(UTC) - timedelta(minutes=5), MinSize=1) == (
        "ValidationError", "Given start time is in the past")
    assert code(StartTime=soon)[0] == "ValidationError"  # no size at all
    assert code(AutoScalingGroupName="nope", StartTime=soon, MinSize=1)[0] == "ValidationError"
    with pytest.raises(ClientError) as err:
        asg.delete_scheduled_action(AutoScalingGroupName=name, ScheduledActionName="nope")
    assert err.value.response["Error"]["Code"] == "ValidationError"

    # 125 per group (a quota AWS does not raise): the 126th fails, in a batch per action.
    for first in range(0, 125, 50):
        failed = asg.batch_put_scheduled_update_group_action(
            AutoScalingGroupName=name, ScheduledUpdateGroupActions=[
                {"ScheduledActionName": f"a{i}", "StartTime": soon, "MinSize": 0}
                for i in range(first, min(first + 50, 125))])
        assert failed["FailedScheduledUpdateGroupActions"] == []
    failed = asg.batch_put_scheduled_update_group_action(
        AutoScalingGroupName=name, ScheduledUpdateGroupActions=[
            {"ScheduledActionName": "a0", "StartTime": soon, "MinSize": 1},  # an update: fits
            {"ScheduledActionName": "a125", "StartTime": soon, "MinSize": 0}])
    assert [(f["ScheduledActionName"], f["ErrorCode"])
            for f in failed["FailedScheduledUpdateGroupActions"]] == [("a125", "LimitExceeded")]
    # Deleting the group deletes its actions.
    asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    assert asg.describe_scheduled_actions()["ScheduledUpdateGroupActions"] == [] or all(
        a["AutoScalingGroupName"] != name
        for a in asg.describe_scheduled_actions()["ScheduledUpdateGroupActions"])


@pytest.mark.parametrize("clock, expected", [
    # 14:16:30: from 14:20 (the next 5-minute mark) to 11:30 tomorrow, 21 h 10 min, the
    # closest short of the 24 h asked, and to 11:30 the day after, 45 h 10 min; then a day
    # from tomorrow's 11:30. Fees: 55.04 $/h x 2 x 21 1/6 h = 2,311.68 + 18.35 = 2,330.03 $;
    # x 45 1/6 h = 4,953.60 + 18.35 = 4,971.95 $; x 24 h = 2,641.92 $.
    ((14, 16, 30), [((14, 20), 0, 21, 10, "2330.03"), ((14, 20), 0, 45, 10, "4971.95"),
                    ((11, 30), 1, 24, 0, "2641.92")]),
    # 08:58: from 09:00 to today's 11:30 (2 h 30 min: 275.20 $) and to tomorrow's (26 h
    # 30 min: 2,917.12 $), then today's 11:30 for 24 h. (The clock runs on between the admin
    # call and the search: minutes before the mark, not seconds.)
    ((8, 58, 0), [((9, 0), 0, 2, 30, "275.20"), ((9, 0), 0, 26, 30, "2917.12"),
                 ((11, 30), 0, 24, 0, "2641.92")]),
])
def test_capacity_block_offerings_from_now_start_at_the_next_5_minute_mark_never_before(
        sandbox, sandbox_client, clock, expected):
    from datetime import UTC, datetime, time, timedelta

    today = datetime.now(UTC).date() + timedelta(days=1)
    moment = datetime.combine(today, time(*clock, tzinfo=UTC))
    sandbox_admin(sandbox, "POST", "/_poolctl/clock",
                  {"offset_seconds": (moment - datetime.now(UTC)).total_seconds()})
    try:
        # A StartDateRange in the past (yesterday's 11:30) is a search from now.
        offers = sandbox_client("ec2").describe_capacity_block_offerings(
            InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24,
            StartDateRange=moment - timedelta(days=1))["CapacityBlockOfferings"]
    finally:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    got = [((o["StartDate"].hour, o["StartDate"].minute), (o["StartDate"].date() - today).days,
            o["CapacityBlockDurationHours"], o["CapacityBlockDurationMinutes"], o["UpfrontFee"])
           for o in offers]
    assert len(got) == 6 and got[:3] == expected  # then a day from 11:30, 24 h each
    for o in offers:
        assert o["StartDate"] >= moment and (o["EndDate"].hour, o["EndDate"].minute) == (11, 30)
        assert o["EndDate"] - o["StartDate"] == timedelta(
            hours=o["CapacityBlockDurationHours"], minutes=o["CapacityBlockDurationMinutes"])


def test_capacity_block_offerings_end_at_1130_utc_and_a_purchase_makes_the_reservation(
        sandbox_client):
    from datetime import UTC, datetime, timedelta

    ec2 = sandbox_client("ec2")
    start = datetime.now(UTC) + timedelta(days=2)
    offers = ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=48,
        StartDateRange=start)["CapacityBlockOfferings"]
    assert len(offers) == 6  # AWS: "up to 6 available blocks"
    for o in offers:
        assert (o["StartDate"].hour, o["StartDate"].minute) == (11, 30)
        assert o["EndDate"] - o["StartDate"] == timedelta(hours=48)
        assert o["StartDate"] >= start - timedelta(seconds=1)
        # Catalog On-Demand price 55.04 $/h x 2 instances x 48 h = 5,283.84 $.
        assert (o["UpfrontFee"], o["CurrencyCode"], o["InstanceCount"]) == (
            "5283.84", "USD", 2)
    for bad in ({"InstanceCount": 3, "CapacityDurationHours": 24},
                {"InstanceCount": 2, "CapacityDurationHours": 25},
                {"InstanceCount": 2, "CapacityDurationHours": 15 * 24}):  # 15 d: 7-day steps
        with pytest.raises(ClientError) as err:
            ec2.describe_capacity_block_offerings(InstanceType="p5.48xlarge", **bad)
        assert err.value.response["Error"]["Code"] == "InvalidParameterValue"

    first = offers[0]["CapacityBlockOfferingId"]
    bought = ec2.purchase_capacity_block(CapacityBlockOfferingId=first,
                                         InstancePlatform="Linux/UNIX")["CapacityReservation"]
    assert (bought["ReservationType"], bought["InstanceMatchCriteria"], bought["State"],
            bought["TotalInstanceCount"]) == ("capacity-block", "targeted", "scheduled", 2)
    assert bought["StartDate"] == offers[0]["StartDate"]
    listed = ec2.describe_capacity_reservations(
        CapacityReservationIds=[bought["CapacityReservationId"]])["CapacityReservations"]
    assert listed[0]["EndDate"] == offers[0]["EndDate"]
    with pytest.raises(ClientError) as err:  # an offering is bought once
        ec2.purchase_capacity_block(CapacityBlockOfferingId=first, InstancePlatform="Linux/UNIX")
    assert err.value.response["Error"]["Code"] == "InvalidCapacityBlockOfferingId.NotFound"


def test_a_secret_marked_for_deletion_is_refused_with_awss_message_until_restored(
        sandbox_client):
    sm = sandbox_client("secretsmanager")
    arn = sm.create_secret(Name=_name("doomed-key"), SecretString="k-1")["ARN"]
    sm.delete_secret(SecretId=arn, RecoveryWindowInDays=7)
    with pytest.raises(ClientError) as err:
        sm.get_secret_value(SecretId=arn)
    assert err.value.response["Error"] == {
        "Code": "InvalidRequestException",
        "Message": "You can't perform this operation on the secret because it was marked for "
                   "deletion."}
    sm.restore_secret(SecretId=arn)
    assert sm.get_secret_value(SecretId=arn)["SecretString"] == "k-1"


# -------------------------------------------------------------------------------------
# CloudWatch: value/count arrays kept weighted, percentiles and percentile rank of them


def test_percentiles_of_published_value_count_arrays(sandbox_client):
    from datetime import UTC, datetime, timedelta

    cw = sandbox_client("cloudwatch")
    dims = [{"Name": "AutoScalingGroupName", "Value": _name("pct")}]
    # What a node's agent publishes for 10 requests (tests/unit/test_boot_runtime.py works
    # the arrays out from a histogram): 10 points of 0.2 in (0.1, 0.25], 10 of 0.8 in
    # [0.3125, 0.5]. Fractional counts: moto alone truncated each to 0 and kept nothing.
    values = [0.1 + (j + 0.5) * 0.015 for j in range(10)] + [
        0.3125 + (j + 0.5) * 0.01875 for j in range(10)]
    counts = [0.2] * 10 + [0.8] * 10
    cw.put_metric_data(Namespace="poolctl", MetricData=[
        {"MetricName": "TimeToFirstToken", "Dimensions": dims, "Unit": "Seconds",
         "Values": values, "Counts": counts}])
    end = datetime.now(UTC) + timedelta(minutes=1)

    def stat(s):
        got = cw.get_metric_data(
            MetricDataQueries=[{"Id": "q", "MetricStat": {
                "Metric": {"Namespace": "poolctl", "MetricName": "TimeToFirstToken",
                           "Dimensions": dims}, "Period": 600, "Stat": s}}],
            StartTime=end - timedelta(minutes=10), EndTime=end)["MetricDataResults"][0]
        return got["Values"][0]

    # Nearest rank over the counts, by hand: p90 needs 9 of 10, 2 + 0.8 n >= 9 at the 9th
    # point of the second bucket; p50 needs 5, at its 4th.
    assert stat("p90") == pytest.approx(0.3125 + 8.5 * 0.01875)
    assert stat("p50") == pytest.approx(0.3125 + 3.5 * 0.01875)
    assert stat("SampleCount") == pytest.approx(10)
    assert stat("Sum") == pytest.approx(sum(v * c for v, c in zip(values, counts, strict=True)))
    # Percentile rank: the share at or below 0.25 (the first bucket's 2 of 10) and within
    # (0.25, 0.4] (the second bucket's points up to 0.396875: 5 of them, 4.0).
    assert stat("PR(:0.25)") == pytest.approx(20.0)
    assert stat("PR(0.25:0.4)") == pytest.approx(40.0)
