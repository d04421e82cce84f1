"""The sandbox serves (`sandbox start --serve`): a deployed pool's nodes run the synthesized
boot script for real (the aws CLI against the sandbox, the instance metadata service, Secrets
Manager for the API key, the weights manifest check), the stand-in engine serves vLLM's API
on each node's own loopback address, HAProxy routes through the load balancer's target group,
and the autoscaler acts on the queue the nodes publish.

One serving sandbox for the module, with one pool deployed once (one node of four replicas at
its minimum, two at most, no warm pool, an API key); each test leaves it at one serving node,
so they stand alone: serving, a burst that scales the pool out and back, boots that fail."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time

import pytest

from poolctl.clouds.aws.ops import BOOT_LOOKS
from poolctl.simulate import percentile
from tests.plugins.sandbox import boto3_client, poolctl_env, run_poolctl, terraform_missing
from tests.serving.pool import KEY, KEY_VAR, MODEL, azure_trace, serving, serving_pool, wait_for
from tests.serving.standin import call

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 10.0
# The scale-in alarm waits this long below half the queue target (10 periods of 60 s).
DOWN_S = 600


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving_pool(tmp_path_factory.mktemp("serving-home"), SPEED, min_replicas=4,
                      max_replicas=8, warm=0, down_s=DOWN_S) as pool:
        yield pool


def test_a_completion_streams_through_the_load_balancer_from_a_node_that_booted(served):
    status, raw = call(served["lb"], "/v1/completions",
                       {"model": MODEL, "prompt": "hello " * 100, "max_tokens": 20,
                        "stream": True}, key=KEY)
    assert status == 200
    events = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert len(text.split()) == 20
    # The node's own log: the synthesized script ran its phases and completed its hook.
    node = serving(served["url"])["nodes"][0]
    # the sandbox's first node: its own address, 127.<the sandbox's port as two bytes>.2
    port = int(served["url"].rsplit(":", 1)[1])
    assert node["BootExitCode"] == 0 and node["Address"] == f"127.{port // 256}.{port % 256}.2"
    log = (served["home"] / "sandbox" / "nodes" / node["InstanceId"] / "boot.log").read_text()
    for line in ("phase=weights", "weights: 2 of 2 files verified", "phase=readiness",
                 "lifecycle=CONTINUE", "phase=total"):
        assert line in log, log
    # The key went secret store -> the server's environment, never the node's files:
    assert KEY not in log and not any(
        KEY in p.read_text(errors="replace")
        for p in (served["home"] / "sandbox" / "nodes").rglob("*") if p.is_file())


def test_without_the_api_key_the_load_balancer_answers_401(served):
    assert call(served["lb"], "/v1/models")[0] == 401
    assert call(served["lb"], "/v1/completions", {"prompt": "a"}, key="wrong")[0] == 401
    assert call(served["lb"], "/health")[0] == 200  # the health check needs no key


def test_status_shows_the_loopback_endpoint_and_the_published_queue(served):
    def status():
        r = run_poolctl(served["home"], "status", "--sandbox", "-f", str(served["cfg"]),
                        "--cloud", "aws", "--json")
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)["pools"][0]
        # Nothing waits on an idle pool: its newest minute (6 wall s at speed 10) says 0,
        # once the minutes of any traffic before have passed.
        return s if s.get("queue_per_replica") == 0 else None

    # the queue timer: 30 s of pool time after boot (3 s at speed 10), then every 5 wall s
    s = wait_for("a queue datapoint of 0", status, timeout=60)
    assert s["endpoint"]["url"] == served["lb"] and s["endpoint"]["api_key"] is True
    # A pool whose nodes all booted shows no failure; after a test that broke a boot, the
    # newest of the last BOOT_LOOKS ended nodes that failed, with its FAILED line (as the
    # sandbox recorded that node's boot).
    ended = [n for n in serving(served["url"])["nodes"] if not n["Running"]][-BOOT_LOOKS:]
    failed = [n for n in ended if n["Failure"]]
    assert s["boot_failure"] == (f"{failed[-1]['InstanceId']}: {failed[-1]['Failure']}"
                                 if failed else None)


def test_a_burst_scales_the_pool_out_then_back_in_one_node_at_a_time(served, tmp_path):
    # 7 requests/s of 2,000 + 200 tokens for 20 min. `simulate` on this file: 4 replicas
    # (one node) are saturated (TTFT p90 > 20 s at 6/s), 8 (two) keep it under 1 s at 8/s.
    trace, rows = tmp_path / "burst.csv", tmp_path / "requests.csv"
    azure_trace(trace, 7, 1200, 2000, 200)
    start = serving(served["url"])["pool_seconds"]
    p = subprocess.Popen(
        [sys.executable, "-m", "poolctl", "replay", "--sandbox", "-f", str(served["cfg"]),
         "--cloud", "aws", "--trace", str(trace), "--api-key-env", KEY_VAR,
         "--requests-out", str(rows), "--json"],
        env=poolctl_env(served["home"], **{KEY_VAR: KEY}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    in_service = None
    while p.poll() is None:  # the second node: booted and routed to
        rep = serving(served["url"])
        targets = sum(len(t) for lb in rep["load_balancers"] for t in lb["Targets"].values())
        if in_service is None and targets == 2:
            in_service = rep["pool_seconds"] - start
        time.sleep(0.5)
    out, err = p.communicate()
    assert p.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert result["errors"] == {} and result["completed"] == 8400
    rep = serving(served["url"])
    out_events = [s for s in rep["scaling"] if s["To"] > s["From"]]
    assert out_events and out_events[0]["Cause"].startswith("target tracking")
    assert out_events[0]["To"] == 2  # ceil(1 node x metric / 4) capped at the maximum
    assert in_service is not None, "no second node went into service"
    # It booted through its boot script, which pulls the image beside the weights fetch: node
    # boot 120 + max(image 120, weights 45.2) + load 35.3 + engine 90 s, then two health
    # checks 15 s apart = 395.3 s of pool time (the plan's 440.5 s adds image and weights).
    took = in_service - (out_events[0]["PoolSeconds"] - start)
    assert 370 <= took <= 460, took
    with open(rows) as f:
        reqs = list(csv.DictReader(f))

    def p90(lo, hi):
        xs = sorted(float(r["ttft_s"]) for r in reqs if lo <= float(r["arrival_s"]) < hi)
        return percentile(xs, 0.9)

    # TTFT p90 recovers: past 10 s before the second node (one node saturated), a tenth of
    # that or less in the burst's last 2 minutes (two nodes, the backlog drained; `simulate`
    # puts 8 replicas at 8/s at 0.8 s).
    before, after = p90(in_service - 150, in_service - 20), p90(1080, 1200)
    assert before > 10 and after < before / 10, (before, after)
    # Back to one node once the queue stayed low for DOWN_S, one node at a time.
    def scaled_in():
        r = serving(served["url"])
        ins = [s for s in r["scaling"] if s["To"] < s["From"]]
        running = [n for n in r["nodes"] if n["Running"]]
        return ins if ins and len(running) == 1 else None

    ins = wait_for("the scale-in", scaled_in, timeout=240, every=1)
    assert [(s["From"], s["To"]) for s in ins] == [(2, 1)]
    assert ins[0]["Cause"] == ("policy acme-chat-70b-scale-in: alarm acme-chat-70b-queue-low "
                               "in ALARM")
    # The stack's TTFT alarm (p90 above the SLO, 2 s, for 5 one-minute periods) fired while
    # one node was saturated and cleared once two served: its state changes, in order.
    ttft = [(t["From"], t["To"]) for t in serving(served["url"])["alarms"]
            if t["AlarmName"] == "acme-chat-70b-ttft-slo"]
    assert ("OK", "ALARM") in ttft and ttft[-1] == ("ALARM", "OK"), ttft


def test_a_node_whose_weights_do_not_match_the_manifest_is_abandoned_and_replaced(served):
    url = served["url"]
    s3 = boto3_client(url, "s3")
    key = "llama-3.1-70b/model-00001-of-00001.safetensors"
    good = s3.get_object(Bucket="acme-models", Key=key)["Body"].read()
    s3.put_object(Bucket="acme-models", Key=key, Body=b"\x01" * len(good))  # same size
    asg = boto3_client(url, "autoscaling")
    # The node in service goes; the group launches its replacement (desired stays 1).
    [serving_node] = [n for n in serving(url)["nodes"] if n["Running"]]
    asg.terminate_instance_in_auto_scaling_group(InstanceId=serving_node["InstanceId"],
                                                 ShouldDecrementDesiredCapacity=False)

    def failed():
        return [n for n in serving(url)["nodes"] if n["Failure"]]

    bad = wait_for("a failed boot", failed, timeout=120)
    assert "does not match its manifest.json" in bad[0]["Failure"]
    # The hook was ABANDONed: the group ended that node and launched another, which fails
    # the same way while the weights stay wrong.
    wait_for("a replacement that failed too", lambda: len(failed()) >= 2, timeout=120)
    r = run_poolctl(served["home"], "status", "--sandbox", "-f", str(served["cfg"]),
                    "--cloud", "aws")
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if "boot failed:" in ln]
    assert len(line) == 1 and "weights: s3://acme-models/llama-3.1-70b/ does not match its " \
        "manifest.json" in line[0], r.stdout
    # Weights put right: the next replacement boots and serves through the load balancer.
    s3.put_object(Bucket="acme-models", Key=key, Body=good)
    wait_for("a node serving again", lambda: call(served["lb"], "/v1/models", key=KEY)[0]
             == 200 and any(n["Running"] and n["BootExitCode"] == 0
                            for n in serving(url)["nodes"]), timeout=180)
