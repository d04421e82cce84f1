"""The serving sandbox with HTTPS, stickiness and a steady pool: a certificate imported into
the sandbox's ACM serves TLS on the HTTPS listener (port 80 redirects to it), a sticky pool's
cookie keeps a client on one node, `replay --compare` through the load balancer agrees with
`simulate` on ten minutes of the Azure conversation trace, and scheduled actions run on the
sandbox's one clock.

One pool for the module: two nodes of four replicas (min = max, so nothing scales), sticky
routing, an API key, a self-signed certificate for 127.0.0.1. The tests do not change the
pool; they run in any order."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta

import pytest

from tests.plugins.sandbox import (
    boto3_client,
    poolctl_env,
    run_poolctl,
    sandbox_admin,
    terraform_missing,
)
from tests.serving.pool import (
    AZURE,
    KEY,
    KEY_VAR,
    MODEL,
    serving,
    serving_pool,
    wait_for,
    wait_for_targets,
)
from tests.serving.standin import call

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
# Half the default: the replay compare's client and HTTP overhead, and the engine's lag on a
# busy machine, are magnified by the speed (at 10, CI's four workers on two cores put TTFT p90
# 17 % over simulate's; a quiet machine 3.9 %: docs/sandbox.md).
SPEED = 5.0


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    with serving_pool(tmp_path_factory.mktemp("tls-home"), SPEED, certificate=True,
                      serving_extra="      balancer: sticky\n", min_replicas=8,
                      max_replicas=8, warm=0, down_s=7200) as pool:
        wait_for_targets(pool["url"], 2)  # both, before any test routes
        yield pool


def _listeners(tls) -> dict[str, str]:
    [lb] = serving(tls["url"])["load_balancers"]
    return lb["Listeners"]


def test_https_serves_the_imported_certificate_and_port_80_redirects_to_it(tls):
    assert tls["lb"].startswith("https://127.0.0.1:")
    # verified strictly (chain and host name) against the certificate imported into ACM
    status, body = call(tls["lb"], "/v1/models", key=KEY, ca=tls["cert"])
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    # a client that does not trust it is refused at the handshake: TLS is real
    with pytest.raises(urllib.error.URLError) as exc:
        call(tls["lb"], "/v1/models", key=KEY, ca=None)
    assert isinstance(exc.value.reason, ssl.SSLCertVerificationError)
    # the port-80 listener redirects to the HTTPS one, path and query kept, as the stack's
    # redirect action (HTTP_301 to port 443) does on AWS
    ports = _listeners(tls)
    host, port = ports["80"].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/v1/models?x=1")
    resp = conn.getresponse()
    assert resp.status == 301
    assert resp.getheader("Location") == f"https://{ports['443']}/v1/models?x=1"
    conn.close()


def test_status_prints_the_https_endpoint_and_a_curl_that_works(tls):
    r = run_poolctl(tls["home"], "status", "--sandbox", "-f", str(tls["cfg"]), "--cloud",
                    "aws", "--json")
    assert r.returncode == 0, r.stderr
    ep = json.loads(r.stdout)["pools"][0]["endpoint"]
    assert ep["url"] == tls["lb"] and ep["ca_file"]
    # the printed line, run by a shell with the key in VLLM_API_KEY
    out = subprocess.run(["bash", "-c", ep["curl"]], capture_output=True, text=True,
                         timeout=30, env={**poolctl_env(tls["home"]), "VLLM_API_KEY": KEY})
    assert out.returncode == 0, (ep["curl"], out.stderr)
    assert json.loads(out.stdout)["data"][0]["id"] == MODEL


def _served_by_node(tls) -> dict[str, float]:
    """Requests each node's engine has finished (vLLM's vllm:request_success_total, read
    from the node's own /metrics), by node address."""
    out = {}
    for node in serving(tls["url"])["nodes"]:
        if not node["Running"]:
            continue
        with urllib.request.urlopen(f"http://{node['Address']}:8000/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        out[node["Address"]] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                   if line.startswith("vllm:request_success_total"))
    return out


def _burst(tls, n: int, cookie: str | None) -> None:
    """n requests at once (each a 2,000-token prompt, so they overlap), with the cookie."""
    ctx = ssl.create_default_context(cafile=str(tls["cert"]))
    errors: list[str] = []

    def one():
        body = json.dumps({"model": MODEL, "prompt": "a " * 2000, "max_tokens": 8}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        if cookie:
            headers["Cookie"] = cookie
        req = urllib.request.Request(tls["lb"] + "/v1/completions", data=body,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
                r.read()
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_sticky_pools_cookie_keeps_a_client_on_one_node(tls):
    ctx = ssl.create_default_context(cafile=str(tls["cert"]))
    req = urllib.request.Request(tls["lb"] + "/v1/models",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        cookie = r.headers["Set-Cookie"]
    assert cookie and cookie.startswith("AWSALB=")  # the lb_cookie stickiness cookie
    # Eight overlapping requests without the cookie: least outstanding requests spreads them
    # over both nodes. With it: all eight on the node the cookie names.
    before = _served_by_node(tls)
    _burst(tls, 8, None)
    spread = _served_by_node(tls)
    _burst(tls, 8, cookie.split(";")[0])
    pinned = _served_by_node(tls)
    assert sorted(spread[a] - before[a] for a in before) != [0, 8]
    assert sorted(pinned[a] - spread[a] for a in spread) == [0, 8]


def test_replay_compare_agrees_with_simulate_on_ten_minutes_of_the_azure_trace(tls, tmp_path):
    # The first 10 minutes of the conversation trace (2,800 requests or so), sent through the
    # load balancer (TLS, HAProxy) at speed 5 to both nodes; simulate runs the same slice on
    # the same 8 replicas. Same serving model on both sides: this checks the control loop
    # and the data path, not the GPU model.
    r = run_poolctl(tls["home"], "replay", "--sandbox", "-f", str(tls["cfg"]), "--cloud",
                    "aws", "--trace", str(AZURE), "--duration", "10m", "--compare",
                    "--replicas", "8", "--api-key-env", KEY_VAR, "--json", timeout=900,
                    **{KEY_VAR: KEY})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["errors"] == {} and out["completed"] == out["requests"] > 2000
    # the contract's keys: nothing failed, and the pool's SLO (TTFT p90 2 s) was met
    assert out["failed"] == 0 and out["slo"]["met"] is True and out["slo"]["goodput"] > 0.9
    assert out["predicted"]["replicas"] == 8
    # The client against the model (run on the requests as the client sent them): TPOT within
    # 15 % (a mean over each stream's tokens). The client's raw TTFT is printed below, not
    # bounded: its first token carries this machine's delivery lag (the engine's write,
    # HAProxy's TLS, the client's loop) times the speed. On two cores beside six busy processes
    # the client saw 0.560 s at p90 where the engines recorded 0.4625 s (status, below) and the
    # model said 0.468 s; CI's five workers, 0.69 s. Less each request's own round trip to its
    # response headers (`server_ttft_s`), the lag is counted out instead of magnified.
    measured, predicted = out["tpot_s"]["p90"], out["predicted"]["tpot_s"]["p90"]
    assert measured == pytest.approx(predicted, rel=0.15), (measured, predicted)
    # The overhead (a round trip to the response headers, x5) is reported and small.
    assert 0 < out["overhead_s"] and out["overhead_share"] < 0.15
    # min = max: both nodes served the whole slice
    assert [p["nodes"] for p in out["nodes_in_service"]] == [2]
    # What the engines published (their vLLM histograms, through the node agent into the
    # sandbox's CloudWatch) says what the client (TPOT) and the model (TTFT) say: status over
    # the last 15 minutes of pool time (3 wall minutes: the replay's 10, the sticky test's 16
    # requests before).
    time.sleep(7)  # the nodes' last interval published (every 5 wall seconds)
    r = run_poolctl(tls["home"], "status", "--sandbox", "-f", str(tls["cfg"]), "--cloud",
                    "aws", "--window", "15", "--json")
    assert r.returncode == 0, r.stderr
    pool = json.loads(r.stdout)["pools"][0]
    served = pool["serving"]
    live = pool["live"]  # the contract's block: the same numbers
    assert live["ttft_s"]["p90"] == served["ttft_p90_s"]
    assert live["tpot_s"]["p90"] == served["tpot_p90_s"] and live["drift"] == pool["drift"]
    print("replay vs simulate vs status (p90, pool s):", json.dumps({
        m: [out[f"{m}_s"]["p90"], out["predicted"][f"{m}_s"]["p90"], served[f"{m}_p90_s"]]
        for m in ("ttft", "tpot")}), "client TTFT less its round trip",
        out["server_ttft_s"]["p90"], "overhead", out["overhead_s"], out["overhead_share"],
        "predicted", pool["predicted"], "drift", pool["drift"])
    # its rate is pool time: ~2,880 requests over 15 minutes
    assert served["requests_per_s"] == pytest.approx(served["requests"] / 900)
    assert served["requests"] == pytest.approx(out["requests"], abs=20)  # + the sticky test's
    # TPOT within 10 % of what the client saw (measured: 35.85 ms read back, 35.95 ms seen by
    # the client, -0.3 %; the same beside six busy processes). This slice's TPOTs all fall in
    # vLLM's default bucket (25, 50] ms, which read back 39.1 ms against 35.6 ms (+9.6 %); the
    # engines take poolctl's edges instead (--custom-histogram-buckets, at most 10 % apart).
    assert served["tpot_p90_s"] == pytest.approx(out["tpot_s"]["p90"], rel=0.10), (
        served, out["tpot_s"])
    # TTFT against what the client timed less each request's round trip to its headers (the
    # engines' histograms start at the request's receipt: what status reads), and against the
    # model. Measured beside five busy processes: 450 ms read back, 440.5 ms timed by the
    # client less its round trip (+2.2 %; its raw TTFT 560 ms), 457 ms predicted for the
    # requests as sent. In a fresh-clone CI run on six workers: 470 ms read back, 531 ms
    # (-11.5 %; raw 730 ms): at speed 5, 10 % of this TTFT is 9 ms of wall time, and the
    # stand-in's engines, busy beside six workers on two cores, hand out first tokens later
    # than the times they record by about that much. Observing TTFT where vLLM's front end
    # does (when it hands the output out) moved status up by that lag but left the client's
    # own wait for a CPU: -11 % beside four other serving modules, and the drift test's fit
    # then put the lag on prefill (x1.88 against its 1.8 bound), so the engines record step
    # times still. Hence 15 % here; 10 % holds off CI.
    assert served["ttft_p90_s"] == pytest.approx(out["server_ttft_s"]["p90"], rel=0.15), (
        served, out["server_ttft_s"], out["ttft_s"])
    # Against the model run on the requests as the client sent them: the engines are that model,
    # but "as sent" is the client's clock, which on a busy machine records sends late and in
    # bursts that reach the engines spread out again. Measured: -2 % alone, -2.5 % to -8.4 %
    # beside other serving modules, -14 % in a fresh-clone CI run (595 ms read back, 692.6 ms
    # simulated). Hence 20 %: what this checks is that the data path loses nothing, not the
    # client's timing.
    assert served["ttft_p90_s"] == pytest.approx(out["predicted"]["ttft_s"]["p90"], rel=0.20), (
        served, out["predicted"])
    # The engine is the serving model itself: status's prediction for the load it read back
    # (Poisson arrivals, exponential lengths around the observed means, on the 8 replicas in
    # service) raises no drift line.
    assert pool["predicted"]["replicas"] == 8
    assert set(pool["drift"]) == {"ttft", "tpot"} and max(pool["drift"].values()) <= 0.25


def test_scheduled_actions_run_on_the_sandbox_clock(tls):
    # The sandbox's clock runs 5x the machine's: two wall seconds are ~10 of its own (whole
    # seconds: 9 to 11, more on a busy machine).
    t0 = datetime.fromisoformat(sandbox_admin(tls["url"], "GET", "/_poolctl/clock")["now"])
    time.sleep(2)
    t1 = datetime.fromisoformat(sandbox_admin(tls["url"], "GET", "/_poolctl/clock")["now"])
    assert 9 <= (t1 - t0).total_seconds() <= 20
    # An action two minutes ahead on that clock runs after ~24 wall seconds, not 120.
    asg = boto3_client(tls["url"], "autoscaling")
    [g] = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
    name = g["AutoScalingGroupName"]
    asg.put_scheduled_update_group_action(
        AutoScalingGroupName=name, ScheduledActionName="clock-check",
        StartTime=t1 + timedelta(seconds=120), MinSize=g["MinSize"], MaxSize=g["MaxSize"])
    wall = time.monotonic()

    def ran():
        acts = asg.describe_scheduled_actions(AutoScalingGroupName=name)
        return not acts["ScheduledUpdateGroupActions"]

    wait_for("the scheduled action", ran, timeout=90, every=0.5)
    took = time.monotonic() - wall
    assert 18 <= took <= 60, took
