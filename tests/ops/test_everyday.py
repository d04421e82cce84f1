"""Everyday commands through the CLI (`poolctl.app.main` in process): `--cloud` defaults,
the endpoint in `status`, `ls` and `logs`.

AWS runs against the session sandbox over HTTP: the resources the stack would leave behind
are made with boto3 (much cheaper than a Terraform apply) in us-west-2, away from the example
deployed in us-east-1, for two pools of project `everyday`: `chat-70b` (HTTP listener on 80,
model tagged) and `keyed` (HTTPS listener on 443, API key in Secrets Manager). GCP runs
against the GCE fake (tests/fakes/gce.py) with the real google-cloud-compute client.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.configs import pool_yaml, with_second_pool
from tests.plugins.sandbox import poolctl_env, stand_in_ami

REGION = "us-west-2"
PROJECT = "everyday"
SECRET_ARN = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:everyday-key-AbCdEf"
SECRET_VALUE = "sk-everyday-0123456789abcdef"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def run(monkeypatch, capsys, *args: str) -> tuple[int | str | None, str, str]:
    from poolctl.app import main

    monkeypatch.setattr(sys, "argv", ["poolctl", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def both_clouds_file(tmp_path: Path) -> Path:
    f = tmp_path / "both.yaml"
    f.write_text(pool_yaml())
    return f


# -- --cloud: the pool's only placement, else required ------------------------------------


@pytest.mark.parametrize("argv", [
    ["status"], ["warm", "--replicas", "4"], ["rollout", "status"], ["rollout", "cancel"],
    ["quota", "check"], ["deploy", "--plan-only"], ["destroy", "--plan-only"], ["logs"],
    ["nodes", "check"], ["image", "list"], ["simulate", "--rate", "1"],
])
def test_cloud_is_required_when_the_pool_has_both(monkeypatch, capsys, tmp_path, argv):
    code, out, err = run(monkeypatch, capsys, *argv, "-f", str(both_clouds_file(tmp_path)))
    assert code == 2 and out == ""
    assert err.splitlines() == ["poolctl: --cloud: pool 'chat-70b' has aws and gcp "
                                "placements; pick one with --cloud aws or --cloud gcp"]


def test_each_pool_defaults_to_its_own_placement(monkeypatch, capsys, tmp_path):
    # chat-70b on AWS only, gpu-b on GCP only: --pool picks the cloud; both together need it.
    text = with_second_pool(pool_yaml(), name="gpu-b")
    head, tail = text.split("  - name: gpu-b\n")
    f = tmp_path / "split.yaml"
    f.write_text(re.sub(r"\n    gcp:\n(      .*\n)+", "\n", head) + "  - name: gpu-b\n"
                 + re.sub(r"\n    aws:\n(      .*\n)+", "\n", tail))
    for pool, cloud in (("gpu-b", "gcp"), ("chat-70b", "aws")):
        code, out, err = run(monkeypatch, capsys, "simulate", "-f", str(f), "--pool", pool,
                             "--rate", "1", "--duration", "60", "--json")
        assert code == 0, err
        assert (json.loads(out)["pool"], json.loads(out)["cloud"]) == (pool, cloud)
    code, _, err = run(monkeypatch, capsys, "status", "-f", str(f))
    assert code == 2 and err.splitlines()[-1] == (
        "poolctl: --cloud: the selected pools have aws and gcp placements; pick one with "
        "--cloud aws or --cloud gcp")


def test_ls_needs_a_cloud_without_sandbox(monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, "ls")
    assert code == 2 and err.splitlines() == [
        "poolctl: --cloud: ls reads no file to take the cloud from; pick one with --cloud "
        "aws or --cloud gcp"]
    code, _, err = run(monkeypatch, capsys, "ls", "--cloud", "gcp", "--region", "r1")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    assert code == 2 and "--project" in err and len(err.splitlines()) == 1


def test_logs_since_must_be_a_duration(monkeypatch, capsys, tmp_path):
    code, _, err = run(monkeypatch, capsys, "logs", "--cloud", "aws", "--since", "yesterday",
                       "-f", str(both_clouds_file(tmp_path)))
    assert code == 2 and err.splitlines() == [
        "poolctl: --since 'yesterday': give a duration such as 30s, 10m, 2h or 1d"]


def test_since_units():
    from poolctl.inventory import since_seconds

    assert [since_seconds(s) for s in ("30s", "10m", "2h", "1d", "1h30m")] == [
        30, 600, 7200, 86400, 5400]


# -- AWS: two pools made with boto3 in the sandbox ----------------------------------------


def aws_file(tmp_path: Path) -> Path:
    text = pool_yaml(region=REGION, with_gcp=False).replace("project: acme\n",
                                                            f"project: {PROJECT}\n")
    text = with_second_pool(text, name="keyed")
    head, tail = text.split("  - name: keyed\n")
    tail = tail.replace("      port: 8000\n", f"      port: 8000\n      api_key_secret: "
                        f"{SECRET_ARN}\n", 1)
    f = tmp_path / "poolctl.yaml"
    f.write_text(f"{head}  - name: keyed\n{tail}")
    return f


@pytest.fixture(scope="module")
def aws(sandbox) -> Any:
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    return lambda svc: boto3.client(svc, endpoint_url=sandbox, region_name=REGION,
                                    **TEST_CREDENTIALS)


@pytest.fixture(scope="module")
def aws_pools(aws, tmp_path_factory) -> dict[str, Any]:
    """What the AWS stack leaves for each pool that status/ls/logs read: a tagged internal
    ALB with its listener, a tagged group, the log group; plus an untagged group (not a
    pool) and a secret whose value must never be printed."""
    path = aws_file(tmp_path_factory.mktemp("everyday"))
    ec2, elbv2, asg, logs = aws("ec2"), aws("elbv2"), aws("autoscaling"), aws("logs")
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.50.{i}.0/24",
                                 AvailabilityZone=f"{REGION}{z}")["Subnet"]["SubnetId"]
               for i, z in enumerate("ab")]
    ami = stand_in_ami(ec2)
    lt = ec2.create_launch_template(LaunchTemplateName="everyday", LaunchTemplateData={
        "ImageId": ami, "InstanceType": "p5.48xlarge"})["LaunchTemplate"]["LaunchTemplateId"]
    aws("secretsmanager").create_secret(Name="everyday-key", SecretString=SECRET_VALUE)
    now_ms = int(time.time() * 1000)
    out: dict[str, Any] = {"file": path, "dns": {}, "now_ms": now_ms}
    for pool, https in (("chat-70b", False), ("keyed", True)):
        tags = {"poolctl:project": PROJECT, "poolctl:pool": pool, "poolctl:role": "inference"}
        kv = [{"Key": k, "Value": v} for k, v in tags.items()]
        lb = elbv2.create_load_balancer(Name=f"everyday-{pool}", Subnets=subnets,
                                        Scheme="internal", Type="application", Tags=kv
                                        )["LoadBalancers"][0]
        tg = elbv2.create_target_group(Name=f"everyday-{pool}", Protocol="HTTP", Port=8000,
                                       VpcId=vpc)["TargetGroups"][0]["TargetGroupArn"]
        forward = [{"Type": "forward", "TargetGroupArn": tg}]
        elbv2.create_listener(LoadBalancerArn=lb["LoadBalancerArn"], Protocol="HTTP", Port=80,
                              DefaultActions=forward)
        if https:
            cert = aws("acm").request_certificate(DomainName="llm.everyday.internal")
            elbv2.create_listener(LoadBalancerArn=lb["LoadBalancerArn"], Protocol="HTTPS",
                                  Port=443, DefaultActions=forward,
                                  Certificates=[{"CertificateArn": cert["CertificateArn"]}])
        extra = {} if https else {"poolctl:model": MODEL}
        asg.create_auto_scaling_group(
            AutoScalingGroupName=f"everyday-{pool}", MinSize=1, MaxSize=6, DesiredCapacity=1,
            VPCZoneIdentifier=",".join(subnets), TargetGroupARNs=[tg],
            LaunchTemplate={"LaunchTemplateId": lt, "Version": "$Latest"},
            Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True}
                  for k, v in {**tags, **extra}.items()])
        out["dns"][pool] = lb["DNSName"]
    asg.create_auto_scaling_group(  # not poolctl's: no contract tags
        AutoScalingGroupName="someone-else", MinSize=0, MaxSize=1, DesiredCapacity=0,
        VPCZoneIdentifier=subnets[0],
        LaunchTemplate={"LaunchTemplateId": lt, "Version": "$Latest"})
    group = f"/poolctl/{PROJECT}/chat-70b"
    logs.create_log_group(logGroupName=group)
    for stream in ("i-0aaa", "i-0bbb"):
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    put = lambda stream, ms, msg: logs.put_log_events(  # noqa: E731
        logGroupName=group, logStreamName=stream,
        logEvents=[{"timestamp": ms, "message": msg}])
    put("i-0aaa", now_ms - 2 * 3600_000, "boot: too old for --since 1h")
    put("i-0bbb", now_ms - 120_000, "phase=weights seconds=212")
    put("i-0aaa", now_ms - 180_000, "boot: chat-70b serving")
    return out


def test_status_prints_the_endpoint_and_a_test_curl(monkeypatch, capsys, aws_pools):
    f = str(aws_pools["file"])
    code, out, err = run(monkeypatch, capsys, "status", "--sandbox", "-f", f, "--pool",
                         "chat-70b")
    assert code == 0, err
    dns = aws_pools["dns"]["chat-70b"]
    assert f"  endpoint: http://{dns} (internal: from inside the pool's network)\n" in out
    assert f"  try: curl -sS http://{dns}/v1/models\n" in out
    assert "Authorization" not in out


def test_status_json_endpoint_field_by_field(monkeypatch, capsys, aws_pools):
    code, out, err = run(monkeypatch, capsys, "status", "--sandbox", "--json", "-f",
                         str(aws_pools["file"]))
    assert code == 0, err
    pools = {p["pool"]: p for p in json.loads(out)["pools"]}
    assert list(pools) == ["chat-70b", "keyed"]
    plain, keyed = pools["chat-70b"]["endpoint"], pools["keyed"]["endpoint"]
    dns = aws_pools["dns"]
    assert plain == {
        "scheme": "http", "host": dns["chat-70b"], "port": 80, "internal": True,
        "api_key_secret": None,
        "ca_file": None, "url": f"http://{dns['chat-70b']}", "api_key": False,
        "curl": f"curl -sS http://{dns['chat-70b']}/v1/models"}
    # The HTTPS listener wins over the port-80 one; the key is a placeholder, never the
    # secret (its ARN says where it lives).
    assert keyed == {
        "scheme": "https", "host": dns["keyed"], "port": 443, "internal": True,
        "api_key_secret": SECRET_ARN,
        "ca_file": None, "url": f"https://{dns['keyed']}", "api_key": True,
        "curl": f'curl -sS -H "Authorization: Bearer $VLLM_API_KEY" '
                f"https://{dns['keyed']}/v1/models"}
    assert SECRET_VALUE not in out
    # The rest of status is unchanged beside the new key.
    assert pools["keyed"]["group"]["name"] == "everyday-keyed"


def test_ls_lists_the_region_by_tags(monkeypatch, capsys, aws_pools):
    code, out, err = run(monkeypatch, capsys, "ls", "--sandbox", "--region", REGION, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["cloud"], doc["region"]) == ("aws", REGION)
    assert doc["pools"] == [
        {"project": PROJECT, "pool": "chat-70b", "cloud": "aws", "region": REGION,
         "group": "everyday-chat-70b",
         "nodes": {"min": 1, "desired": 1, "max": 6, "in_service": 1},
         "model": MODEL, "image": None},
        {"project": PROJECT, "pool": "keyed", "cloud": "aws", "region": REGION,
         "group": "everyday-keyed",
         "nodes": {"min": 1, "desired": 1, "max": 6, "in_service": 1},
         "model": None, "image": None},
    ]
    code, out, err = run(monkeypatch, capsys, "ls", "--sandbox", "--region", REGION)
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if PROJECT in ln]
    assert len(rows) == 2 and "chat-70b" in rows[0] and MODEL in rows[0]
    assert "someone-else" not in out


def test_ls_of_an_empty_region(monkeypatch, capsys, sandbox):
    code, out, err = run(monkeypatch, capsys, "ls", "--sandbox", "--region", "eu-north-1")
    assert (code, out, err) == (0, "", "no poolctl pools in aws eu-north-1\n")


def test_logs_since_prints_the_groups_events_in_time_order(monkeypatch, capsys, aws_pools):
    args = ("logs", "--sandbox", "-f", str(aws_pools["file"]), "--pool", "chat-70b",
            "--since", "1h")
    now_ms = aws_pools["now_ms"]
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 0, err
    lines = out.splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == [
        "i-0aaa boot: chat-70b serving", "i-0bbb phase=weights seconds=212"]
    stamp = datetime.fromtimestamp((now_ms - 180_000) / 1000, UTC)
    assert lines[0].startswith(stamp.isoformat(timespec="milliseconds")[:23] + "Z ")
    code, out, err = run(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    events = [json.loads(ln) for ln in out.splitlines()]
    assert [(e["timestamp_ms"], e["source"], e["message"]) for e in events] == [
        (now_ms - 180_000, "i-0aaa", "boot: chat-70b serving"),
        (now_ms - 120_000, "i-0bbb", "phase=weights seconds=212")]


def test_a_log_line_cannot_drive_the_terminal(monkeypatch, capsys, aws, aws_pools):
    # An escape sequence (clear screen, set title) in a message is shown, not sent.
    group = f"/poolctl/{PROJECT}/chat-70b"
    aws("logs").create_log_stream(logGroupName=group, logStreamName="i-0esc")
    aws("logs").put_log_events(logGroupName=group, logStreamName="i-0esc", logEvents=[
        {"timestamp": aws_pools["now_ms"] - 50 * 60_000,
         "message": "evil \x1b[2J\x1b]0;owned\x07 done"}])
    try:
        code, out, err = run(monkeypatch, capsys, "logs", "--sandbox", "-f",
                             str(aws_pools["file"]), "--pool", "chat-70b", "--since", "1h")
    finally:  # the other tests read this group's two events
        aws("logs").delete_log_stream(logGroupName=group, logStreamName="i-0esc")
    assert code == 0, err
    [line] = [ln for ln in out.splitlines() if " i-0esc " in ln]
    assert line.endswith(" i-0esc evil \\x1b[2J\\x1b]0;owned\\x07 done")
    assert "\x1b" not in out


def test_logs_of_a_pool_without_a_log_group(monkeypatch, capsys, aws_pools):
    code, out, err = run(monkeypatch, capsys, "logs", "--sandbox", "-f",
                         str(aws_pools["file"]), "--pool", "keyed")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"poolctl: pool keyed: no log group /poolctl/{PROJECT}/keyed in {REGION}; deploy the "
        "pool first with `poolctl deploy --cloud aws`"]


def test_logs_says_when_there_is_nothing(monkeypatch, capsys, aws_pools):
    code, out, err = run(monkeypatch, capsys, "logs", "--sandbox", "-f",
                         str(aws_pools["file"]), "--pool", "chat-70b", "--since", "30s")
    assert (code, out, err) == (0, "", "chat-70b/aws: no log lines in the last 30s\n")


def test_logs_follow_prints_new_events_and_stops_on_ctrl_c(aws, aws_pools, sandbox_home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolctl", "logs", "--follow", "--since", "10m", "--sandbox",
         "-f", str(aws_pools["file"]), "--pool", "chat-70b"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=poolctl_env(sandbox_home, POOLCTL_POLL_S="0.05"))
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    group = f"/poolctl/{PROJECT}/chat-70b"
    try:
        first = [proc.stdout.readline() for _ in range(2)]
        assert [ln.split(" ", 2)[2] for ln in first] == [
            "boot: chat-70b serving\n", "phase=weights seconds=212\n"]
        # A new node's stream (the other tests read the group's two events: it goes after)
        aws("logs").create_log_stream(logGroupName=group, logStreamName="i-0new")
        aws("logs").put_log_events(
            logGroupName=group, logStreamName="i-0new",
            logEvents=[{"timestamp": int(time.time() * 1000), "message": "phase=total"}])
        assert proc.stdout.readline().endswith(" i-0new phase=total\n")
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        logs = aws("logs")
        with contextlib.suppress(logs.exceptions.ResourceNotFoundException):
            logs.delete_log_stream(logGroupName=group, logStreamName="i-0new")
    # Each event once: the newest timestamp is asked again on every poll.
    assert (proc.returncode, rest) == (0, "")
    assert err.splitlines() == ["poolctl: stopped following the logs (Ctrl-C)"]


# -- GCP: the GCE fake ------------------------------------------------------------------


GCP_PROJECT, GCP_REGION = "acme-prod", "us-central1"


def gcp_only(text: str) -> str:
    return re.sub(r"\n    aws:\n(      .*\n)+", "\n", text)


@pytest.fixture
def gce(monkeypatch):
    pytest.importorskip("google.cloud.compute_v1",
                        reason="google-cloud-compute is not installed (pip install -e .[gcp])")
    from tests.fakes.gce import FakeGce

    fake = FakeGce().start()
    monkeypatch.setenv("POOLCTL_GCE_ENDPOINT", fake.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    yield fake
    fake.stop()
    assert fake.errors == []


def gcp_pool(fake, tmp_path: Path, *, https: bool = False) -> tuple[Path, dict]:
    from poolctl import naming
    from poolctl.config import parse_config

    text = gcp_only(pool_yaml())
    if https:
        text = text.replace("      port: 8000\n", "      port: 8000\n      api_key_secret: "
                            "llm-key\n", 1)
    f = tmp_path / "poolctl.yaml"
    f.write_text(text)
    cfg = parse_config(text)
    labels = naming.gcp_labels(cfg, cfg.pools[0])
    made = fake.deploy_pool(project=GCP_PROJECT, region=GCP_REGION, name="acme-chat-70b",
                            labels=labels, zones=[f"{GCP_REGION}-a"], running=1, stopped=2)
    # As the stack describes its templates: `poolctl NAME: MODEL vVERSION`.
    fake.templates[(GCP_PROJECT, made["template"])]["description"] = (
        f"poolctl acme-chat-70b: {MODEL} v1")
    fake.add_forwarding_rule(GCP_PROJECT, GCP_REGION, "acme-chat-70b-rule", ip="10.8.0.5",
                             port=443 if https else 80, https=https, labels=labels)
    # Decoys: another project's rule with other labels.
    fake.add_forwarding_rule(GCP_PROJECT, GCP_REGION, "other-rule", ip="10.8.0.9", port=80,
                             labels={"poolctl-project": "other", "poolctl-pool": "x",
                                     "poolctl-role": "inference"})
    return f, made


def test_gcp_status_defaults_to_the_only_placement_and_prints_the_endpoint(
        monkeypatch, capsys, tmp_path, gce):
    f, _ = gcp_pool(gce, tmp_path)
    code, out, err = run(monkeypatch, capsys, "status", "-f", str(f), "--json")
    assert code == 0, err
    (s,) = json.loads(out)["pools"]
    assert s["cloud"] == "gcp" and s["endpoint"] == {
        "scheme": "http", "host": "10.8.0.5", "port": 80, "internal": True,
        "api_key_secret": None, "ca_file": None, "url": "http://10.8.0.5", "api_key": False,
        "curl": "curl -sS http://10.8.0.5/v1/models"}


def test_gcp_https_endpoint_with_an_api_key(monkeypatch, capsys, tmp_path, gce):
    f, _ = gcp_pool(gce, tmp_path, https=True)
    code, out, err = run(monkeypatch, capsys, "status", "-f", str(f))
    assert code == 0, err
    assert "  endpoint: https://10.8.0.5 (internal: from inside the pool's network)\n" in out
    assert ('  try: curl -sS -H "Authorization: Bearer $VLLM_API_KEY" '
            "https://10.8.0.5/v1/models\n") in out
    assert "  (set $VLLM_API_KEY to the API key in projects/acme-prod/secrets/llm-key)" in out


def test_gcp_ls_by_template_labels(monkeypatch, capsys, tmp_path, gce):
    gcp_pool(gce, tmp_path)
    gce.deploy_pool(project=GCP_PROJECT, region=GCP_REGION, name="not-poolctl", labels={},
                    zones=[f"{GCP_REGION}-a"], running=1, autoscaler=None)
    code, out, err = run(monkeypatch, capsys, "ls", "--cloud", "gcp", "--project",
                         GCP_PROJECT, "--region", GCP_REGION, "--json")
    assert code == 0, err
    assert json.loads(out) == {"cloud": "gcp", "region": GCP_REGION, "pools": [
        {"project": "acme", "pool": "chat-70b", "cloud": "gcp", "region": GCP_REGION,
         "group": "acme-chat-70b",
         # autoscaler 1..6 (the fake's default), 1 serving VM; the 2 stopped are standby
         "nodes": {"min": 1, "desired": 1, "max": 6, "in_service": 1},
         "model": MODEL, "image": None}]}


def test_gcp_logs_of_the_pools_vms(monkeypatch, capsys, tmp_path, gce):
    f, _ = gcp_pool(gce, tmp_path)
    vms = gce.instances(GCP_PROJECT, GCP_REGION, "acme-chat-70b")
    now = datetime.now(UTC)
    gce.write_log(GCP_PROJECT, vms[1]["id"], "boot: warm pool (stopped), image ready",
                  now - timedelta(minutes=4))
    gce.write_log(GCP_PROJECT, vms[0]["id"], "boot: chat-70b serving",
                  now - timedelta(minutes=3))
    gce.write_log(GCP_PROJECT, vms[0]["id"], "too old", now - timedelta(hours=3))
    gce.write_log(GCP_PROJECT, "999", "another VM's line", now - timedelta(minutes=2))
    from poolctl.clouds.gcp import inventory as gcp_inventory

    monkeypatch.setattr(gcp_inventory, "LOG_PAGE_SIZE", 1)  # one entry a page: two pages
    code, out, err = run(monkeypatch, capsys, "logs", "-f", str(f), "--since", "1h")
    assert code == 0, err
    assert [ln.split(" ", 1)[1] for ln in out.splitlines()] == [
        f"{vms[1]['name']} boot: warm pool (stopped), image ready",
        f"{vms[0]['name']} boot: chat-70b serving"]
    assert sum(r["path"] == "/v2/entries:list" for r in gce.requests) == 2


def loaded_sdks(runs: list[list[str]], env: dict) -> list[str]:
    """Run each command line through `main()` in one fresh process (each must exit 0); the
    SDK and generator packages it loaded."""
    code = (
        "import sys\n"
        "from poolctl.app import main\n"
        f"for argv in {runs!r}:\n"
        "    sys.argv = ['poolctl', *argv]\n"
        "    try:\n        main()\n    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "print('LOADED', sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
        "('cdktn', 'jsii', 'cdktn_provider_aws', 'cdktn_provider_google', "
        "'boto3', 'botocore')} | {'google.cloud' for m in sys.modules "
        "if m.startswith('google.cloud')}), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stderr.rsplit("LOADED ", 1)[1].replace("'", '"'))


def test_aws_commands_load_neither_cdktf_nor_googles_sdk(aws_pools, sandbox_home):
    f = str(aws_pools["file"])
    runs = [["status", "--sandbox", "-f", f], ["ls", "--sandbox", "--region", REGION],
            ["logs", "--sandbox", "-f", f, "--pool", "chat-70b"]]
    assert loaded_sdks(runs, poolctl_env(sandbox_home)) == ["boto3", "botocore"]



def test_gcp_logs_without_the_role_is_one_line(monkeypatch, capsys, tmp_path, gce):
    f, _ = gcp_pool(gce, tmp_path)
    gce.fail_next("POST", r"^/v2/entries:list$", 403)
    code, out, err = run(monkeypatch, capsys, "logs", "-f", str(f))
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("poolctl: GCP Logging read the logs of acme-chat-70b: 403 ")
    assert line.endswith("; the caller needs roles/logging.viewer on the project")


def test_gcp_commands_load_neither_cdktf_nor_boto3(tmp_path, gce):
    import os

    f, _ = gcp_pool(gce, tmp_path)
    runs = [["status", "-f", str(f)], ["logs", "-f", str(f)],
            ["ls", "--cloud", "gcp", "--project", GCP_PROJECT, "--region", GCP_REGION]]
    env = {**os.environ, "POOLCTL_HOME": str(tmp_path / "home")}  # the fake's endpoint set
    assert loaded_sdks(runs, env) == ["google.cloud"]
