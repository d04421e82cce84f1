"""A rollout under traffic in the serving sandbox: `poolctl rollout start` on a one-node pool
while `poolctl replay` sends a steady load through the load balancer. The instance refresh
surges (MaxHealthyPercentage 200): the new node boots its new image, goes into service behind
HAProxy, and only then is the old node deregistered, drained and terminated, so no request
fails (on AWS as in the sandbox: refresh.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest

from tests.plugins.sandbox import boto3_client, poolctl_env, run_poolctl, terraform_missing
from tests.serving.pool import KEY, KEY_VAR, azure_trace, serving, serving_pool, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 10.0
NEW_IMAGE = "vllm/vllm-openai:v0.34.2"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # one node of 4 replicas; a surge of 4 replicas = one node of room while it rolls
    with serving_pool(tmp_path_factory.mktemp("rollout-home"), SPEED, min_replicas=4,
                      max_replicas=8, warm=0, surge=4, checkpoints="[100]") as pool:
        yield pool


@contextmanager
def steady_load(served, tmp_path):
    """`poolctl replay` of 2 requests/s of 1,000 + 100 tokens (well inside one node of 4
    replicas) through the pool's load balancer, for longer than a rollout takes; stopped with
    Ctrl-C on leaving. Yields a dict that gets the replay's --json report."""
    trace = tmp_path / "steady.csv"
    azure_trace(trace, 2, 3600, 1000, 100)
    replay = subprocess.Popen(
        [sys.executable, "-m", "poolctl", "replay", "--sandbox", "-f", str(served["cfg"]),
         "--cloud", "aws", "--trace", str(trace), "--api-key-env", KEY_VAR, "--json"],
        env=poolctl_env(served["home"], **{KEY_VAR: KEY}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    report: dict = {}
    try:
        yield report
    finally:
        replay.send_signal(signal.SIGINT)
        out, err = replay.communicate(timeout=120)
    assert replay.returncode == 130, err[-2000:]
    report.update(json.loads(out))
    # Every request sent was answered, none refused or cut off; only those still in flight at
    # the Ctrl-C count as interrupted.
    assert report["interrupted"] and report["requests"] > 100
    failed = {k: n for k, n in report["errors"].items() if k != "interrupted"}
    assert failed == {}, report["errors"]
    assert report["completed"] + report["errors"].get("interrupted", 0) == report["requests"]


def _rollout(served, *args):
    return run_poolctl(served["home"], "rollout", "start", "--sandbox", "-f", str(served["cfg"]),
                       "--cloud", "aws", *args, "--yes", "--json",
                       "--out", str(served["home"] / "cdktf.out"), timeout=600)


def test_a_rollout_under_load_fails_no_request(served, tmp_path):
    url, home = served["url"], served["home"]
    asg = boto3_client(url, "autoscaling")
    [old] = [n["InstanceId"] for n in serving(url)["nodes"] if n["Running"]]
    with steady_load(served, tmp_path):
        r = _rollout(served, "--image", NEW_IMAGE)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["final"]["status"] == "successful"

        # The old node: deregistered, drained (the target group's delay / speed), ended.
        def one_new_node():
            running = [n["InstanceId"] for n in serving(url)["nodes"] if n["Running"]]
            return running if len(running) == 1 and running != [old] else None

        [new] = wait_for("the old node ended", one_new_node, timeout=120, every=0.5)
    [inst] = asg.describe_auto_scaling_instances(InstanceIds=[new])["AutoScalingInstances"]
    group = asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[inst["AutoScalingGroupName"]])["AutoScalingGroups"][0]
    assert inst["LaunchTemplate"]["Version"] == group["LaunchTemplate"]["Version"] != "1"
    # its engine runs the new image (the docker stand-in's record of `docker run`)
    [record] = (home / "sandbox" / "nodes" / new / "containers").glob("*.json")
    assert json.loads(record.read_text())["image"] == NEW_IMAGE


def test_a_rollout_to_a_flag_vllm_lacks_rolls_back_and_status_names_the_failure(
        served, tmp_path):
    url, home, cfg = served["url"], served["home"], served["cfg"]
    [old] = [n["InstanceId"] for n in serving(url)["nodes"] if n["Running"]]
    text = cfg.read_text()
    cfg.write_text(text.replace(
        "      port: 8000\n", "      port: 8000\n      extra_args: [--no-such-flag]\n"))
    try:
        with steady_load(served, tmp_path):
            r = _rollout(served, "--image", "vllm/vllm-openai:v0.34.3")
            # The new node's engine refuses the flag as vLLM's parser does; its boot script
            # says so and ABANDONs its launch hook; the refresh counts a failed launch and
            # rolls back.
            assert r.returncode == 1, r.stderr[-3000:]
            assert json.loads(r.stdout)["final"]["status"] == "rolled_back"
    finally:  # the rollback restored the image line; the flag goes too (the next test's file)
        cfg.write_text(text)
    # the old node served throughout (steady_load: no request failed) and still does
    def only_old():
        nodes = serving(url)["nodes"]
        return nodes if [n["InstanceId"] for n in nodes if n["Running"]] == [old] else None

    # the failed node was terminated: every process of it ends
    [bad] = [n for n in wait_for("the failed node ended", only_old, timeout=60) if n["Failure"]]
    # the boot script's FAILED line ends with the server's own last line
    assert bad["Failure"].startswith("serving: ") and bad["Failure"].endswith(
        " restarts: vllm serve: error: unrecognized arguments: --no-such-flag"), bad
    s = run_poolctl(home, "status", "--sandbox", "-f", str(cfg), "--cloud", "aws")
    assert s.returncode == 0, s.stderr
    [line] = [ln for ln in s.stdout.splitlines() if "boot failed:" in ln]
    assert "unrecognized arguments: --no-such-flag" in line, s.stdout
