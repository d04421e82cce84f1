"""The sandbox serves (`sandbox start --serve`): a deployed pool's nodes run the synthesized
boot script for real (the aws CLI against the sandbox, the instance metadata service, the
weights manifest check), the stand-in engine serves vLLM's API on each node's own loopback
address, and HAProxy, driven by the load balancer's target group, routes to them.

One serving sandbox for the module, with the example pool deployed once (its minimum: one
node of four replicas, no warm pool: the tests that need one deploy their own)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from poolctl.sandbox import manager
from tests.configs import pool_yaml
from tests.plugins.sandbox import run_poolctl, sandbox_admin, terraform_missing

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 10.0
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def wait_for(what, check, timeout=180.0, every=0.25):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("serving-home")
    info = manager.start(port=0, home=home, parent_pid=os.getpid(), serve_speed=SPEED)
    url = str(info.endpoint)
    cfg = home / "poolctl.yaml"
    cfg.write_text(pool_yaml(min_replicas=4, max_replicas=8, warm=0, with_gcp=False))
    try:
        r = run_poolctl(home, "deploy", "--sandbox", "--auto-approve", "-f", str(cfg),
                        "--cloud", "aws")
        assert r.returncode == 0, r.stderr[-3000:]

        def ready():
            rep = sandbox_admin(url, "GET", "/_poolctl/serving")
            lbs = [lb for lb in rep["load_balancers"] if lb["Running"]]
            if not lbs or not any(lbs[0]["Targets"].values()):
                return None
            try:
                with urllib.request.urlopen(lbs[0]["Endpoint"] + "/v1/models", timeout=5) as resp:
                    return lbs[0]["Endpoint"] if resp.status == 200 else None
            except OSError:
                return None

        lb = wait_for("a node serving behind the load balancer", ready)
        yield {"home": home, "url": url, "lb": lb, "cfg": cfg}
    finally:
        manager.stop(home=home)


def test_a_completion_streams_through_the_load_balancer_from_a_node_that_booted(served):
    body = json.dumps({"model": MODEL, "prompt": "hello " * 100, "max_tokens": 20,
                       "stream": True}).encode()
    req = urllib.request.Request(served["lb"] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        events = [ln.decode().strip() for ln in resp if ln.startswith(b"data: ")]
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert len(text.split()) == 20
    # The node's own log: the synthesized script ran its phases and completed its hook.
    rep = sandbox_admin(served["url"], "GET", "/_poolctl/serving")
    node = rep["nodes"][0]
    assert node["BootExitCode"] == 0 and node["Address"].startswith("127.77.")
    log = (served["home"] / "sandbox" / "nodes" / node["InstanceId"] / "boot.log").read_text()
    for line in ("phase=weights", "weights: 2 of 2 files verified", "phase=readiness",
                 "lifecycle=CONTINUE", "phase=total"):
        assert line in log, log


def test_status_shows_the_loopback_endpoint_and_the_published_queue(served):
    def status():
        r = run_poolctl(served["home"], "status", "--sandbox", "-f", str(served["cfg"]),
                        "--cloud", "aws", "--json")
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)["pools"][0]
        return s if s.get("queue_per_replica") is not None else None

    # the node publishes every 15 s of pool time (1.5 s at speed 10)
    s = wait_for("a queue datapoint", status, timeout=60)
    assert s["queue_per_replica"] == 0  # nothing waits on an idle pool
    assert s["endpoint"]["url"] == served["lb"]
