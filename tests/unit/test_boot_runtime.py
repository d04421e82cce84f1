"""The rendered start-up script, run for real by bash against stand-ins for what a node has.

Real: bash, curl, awk, python3 (manifest check), the script's control flow, quoting and
traps. Stand-ins: `docker`, `nvidia-smi`, `aws`, `gcloud` (small scripts on PATH that log
their arguments and copy from a local "bucket" folder), and one HTTP server playing the
EC2 instance metadata service (IMDSv2: a GET without a session token gets 401 and is
recorded), the GCE metadata server, the Monitoring API and the vLLM server (/health,
/metrics). The script is pointed at them through its POOLCTL_* environment overrides.

The NVMe step is rendered for a type without local disks and given POOLCTL_NVME_DEVICES=none,
so nothing here touches a block device (tests/ops/test_nvme_raid.py does, as root).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from poolctl import bootscript, naming, weights
from poolctl.cloud import Cloud
from poolctl.errors import UsageError
from poolctl.weights import write_manifest

from .boot_config import EXTRA_ARGS, load

INSTANCE_ID = "i-0123456789abcdef0"
IMDS_TOKEN = "imds-session-token-1"
GCE_TOKEN = "gce-access-token-1"
# Four engines (data parallel 4) plus lines that must not count.
METRICS = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct"} 5.0
vllm:num_requests_waiting{engine="2",model_name="meta-llama/Llama-3.1-70B-Instruct"} 0.0
vllm:num_requests_waiting{engine="3",model_name="meta-llama/Llama-3.1-70B-Instruct"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 100.0
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 7.0
"""
WAITING_TOTAL = 3 + 5 + 0 + 2


class Node:
    """What the script talks to, all on 127.0.0.1, plus the logs of what it did."""

    def __init__(self, root: Path):
        self.root = root
        self.logs = root / "logs"
        self.buckets = root / "buckets"
        self.bin = root / "bin"
        self.cache = root / "cache"
        self.state = root / "state"
        for d in (self.logs, self.buckets, self.bin, self.cache, self.state):
            d.mkdir()
        self.target_state = "InService"
        self.serving = True
        self.metrics = METRICS  # what /metrics answers
        self.tokenless_gets: list[str] = []
        self.posts: list[tuple[dict, dict]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self._fakes()

    def _handler(self):
        node = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                if (self.path == "/latest/api/token"
                        and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")):
                    return self._send(200, IMDS_TOKEN)
                self._send(400)

            def do_GET(self):
                p = self.path
                if p.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                        node.tokenless_gets.append(p)
                        return self._send(401)
                    answers = {
                        "/latest/meta-data/instance-id": INSTANCE_ID,
                        "/latest/meta-data/autoscaling/target-lifecycle-state":
                            node.target_state,
                    }
                    return self._send(200, answers[p]) if p in answers else self._send(404)
                if p.startswith("/computeMetadata/v1/"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    answers = {
                        "instance/id": "4242424242",
                        "instance/zone": "projects/123456/zones/us-central1-b",
                        "instance/service-accounts/default/token": json.dumps(
                            {"access_token": GCE_TOKEN, "expires_in": 3599,
                             "token_type": "Bearer"}),
                    }
                    key = p.removeprefix("/computeMetadata/v1/")
                    return self._send(200, answers[key]) if key in answers else self._send(404)
                if p == "/health":
                    started = (node.logs / "docker-run.args").exists()
                    return self._send(200 if started and node.serving else 503)
                if p == "/metrics" and node.serving:
                    return self._send(200, node.metrics)
                self._send(404)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                node.posts.append((dict(self.headers), json.loads(body)))
                self._send(200, "{}")

        return H

    def _fakes(self) -> None:
        fakes = {
            "aws": r"""
printf '%s\n' "$*" >>"$FAKE_LOGS/aws.log"
case "$1 $2" in
  "s3 cp") src=${*: -2:1}; dst=${*: -1}; cp -r "$FAKE_BUCKETS/${src#s3://}." "$dst/" ;;
  "secretsmanager get-secret-value") printf '%s\n' "$FAKE_SECRET" ;;
  "autoscaling complete-lifecycle-action")
    if [[ -n ${FAKE_NO_PENDING:-} ]]; then
      echo "ValidationError: No active Lifecycle Action found with instance ID" >&2; exit 254
    fi ;;
esac
""",
            "gcloud": r"""
printf '%s\n' "$*" >>"$FAKE_LOGS/gcloud.log"
if [[ "$1 $2" == "storage cp" ]]; then src=${4%\*}; cp -r "$FAKE_BUCKETS/${src#gs://}." "$5"; fi
if [[ "$1 $2 $3" == "secrets versions access" ]]; then printf '%s\n' "$FAKE_SECRET"; fi
""",
            "docker": r"""
printf '%s\n' "$*" >>"$FAKE_LOGS/docker.log"
case $1 in
  image) [[ -f $FAKE_LOGS/pulled ]] ;;
  pull) touch "$FAKE_LOGS/pulled" ;;
  run) printf '%s\0' "$@" >"$FAKE_LOGS/docker-run.args"
    for ((i = 1; i < $#; i++)); do
      if [[ ${!i} == --env-file ]]; then
        j=$((i + 1)); stat -c %a "${!j}" >"$FAKE_LOGS/env-file.mode"
        cp "${!j}" "$FAKE_LOGS/env-file.content"
      fi
    done ;;
  inspect) echo 0 ;;
esac
""",
            # Records the rules; `-C` (check) succeeds once the rule was inserted.
            "iptables": r"""
printf '%s\n' "$*" >>"$FAKE_LOGS/iptables.log"
if [[ $1 == -C ]]; then [[ -f $FAKE_LOGS/iptables.rule ]]; else touch "$FAKE_LOGS/iptables.rule"; fi
""",
            "nvidia-smi": r"""
for ((i = 0; i < ${FAKE_GPUS:-8}; i++)); do
  echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"
done
""",
        }
        for name, body in fakes.items():
            f = self.bin / name
            f.write_text("#!/bin/bash\n" + body.lstrip())
            f.chmod(0o755)
        # The nodes' python3 is the system one; here, the interpreter running the tests.
        (self.bin / "python3").symlink_to(sys.executable)

    def bucket(self, uri: str, files: dict[str, bytes]) -> Path:
        folder = self.buckets / uri.split("://", 1)[1]
        for rel, data in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
        write_manifest(folder)
        return folder

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        path = self.root / "node.sh"
        path.write_text(script)
        base = {
            "PATH": f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.root),
            "FAKE_LOGS": str(self.logs),
            "FAKE_BUCKETS": str(self.buckets),
            "POOLCTL_NVME_DEVICES": "none",
            "POOLCTL_CACHE_MOUNT": str(self.cache),
            "POOLCTL_STATE_DIR": str(self.state),
            "POOLCTL_IMDS_URL": f"http://127.0.0.1:{self.port}/latest",
            "POOLCTL_METADATA_URL": f"http://127.0.0.1:{self.port}/computeMetadata/v1",
            "POOLCTL_MONITORING_URL": f"http://127.0.0.1:{self.port}",
        }
        return subprocess.run(["bash", str(path), *args], env={**base, **env}, text=True,
                              capture_output=True, timeout=120, cwd=self.root)

    def log(self, name: str) -> list[str]:
        p = self.logs / f"{name}.log"
        return p.read_text().splitlines() if p.exists() else []

    def docker_run_args(self) -> list[str]:
        return (self.logs / "docker-run.args").read_text().split("\0")[:-1]


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.server.shutdown()
    n.server.server_close()


def _script(node: Node, pool_idx: int, cloud: Cloud, secret: str | None = None,
            from_image: bool = False) -> str:
    cfg = load(aws_port=node.port, gcp_port=node.port, api_key_secret=secret)
    # No local NVMe on this stand-in node: the cache is a folder (see module docstring).
    ctx = bootscript.context(cfg, cfg.pools[pool_idx], cloud, from_image) | {"nvme_expected": 0}
    return bootscript.environment().get_template("node.sh.j2").render(ctx)


def _phases(stderr: str) -> list[str]:
    return re.findall(r"^poolctl: phase=(\w+) seconds=\d+", stderr, re.M)


AWS_URI = "s3://acme-models/llama-3.1-70b/"
WEIGHTS = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}',
           "model-00001-of-00002.safetensors": os.urandom(300_000),
           "model-00002-of-00002.safetensors": os.urandom(200_000),
           "tokenizer/tokenizer.json": b"{}"}


def _continue_line(result: str) -> str:
    return ("autoscaling complete-lifecycle-action --auto-scaling-group-name acme-chat-70b "
            f"--lifecycle-hook-name poolctl-node-ready --instance-id {INSTANCE_ID} "
            f"--lifecycle-action-result {result}")


def test_aws_boot_fetches_verifies_serves_and_continues(node):
    node.bucket(AWS_URI, WEIGHTS)
    script = _script(node, 0, "aws")
    r = node.run(script, "boot")
    assert r.returncode == 0, r.stderr
    assert set(_phases(r.stderr)) == {"image", "gpus", "nvme", "weights", "serving",
                                      "readiness", "total"}
    wdir = node.cache / "weights" / "meta-llama_Llama-3.1-70B-Instruct" / "2024-07"
    for rel, data in WEIGHTS.items():
        assert (wdir / rel).read_bytes() == data
    assert (wdir / ".poolctl-complete").read_text() == f"{AWS_URI} 2024-07\n"
    assert "poolctl: weights: 4 of 4 files verified" in r.stderr

    cache, state = str(node.cache), str(node.state)
    assert node.docker_run_args() == [
        "run", "-d", "--name", "poolctl-serving", "--restart", "on-failure", "--gpus", "all",
        "--ipc=host", "--network", "bridge", "-p", f"{node.port}:{node.port}",
        "--env-file", f"{state}/serving.env",
        "--log-driver", "journald", "-e", "HF_HUB_OFFLINE=1",
        "-v", f"{cache}:{cache}:ro", "-v", f"{state}/vllm-cache:/root/.cache",
        "vllm/vllm-openai:v0.11.0", "--model", str(wdir),
        "--served-model-name", "meta-llama/Llama-3.1-70B-Instruct",
        "--tensor-parallel-size", "2", "--data-parallel-size", "4",
        "--max-model-len", "16384", "--gpu-memory-utilization", "0.92",
        "--enable-chunked-prefill", "--max-num-batched-tokens", "8192",
        "--max-num-seqs", "256",
        "--port", str(node.port), *EXTRA_ARGS,
    ]
    aws = node.log("aws")
    assert [a for a in aws if a.startswith("s3 cp")] == [
        f"s3 cp --recursive --only-show-errors {AWS_URI} {wdir}"]
    assert aws[-1] == _continue_line("CONTINUE")
    assert "ABANDON" not in "\n".join(aws)
    assert node.tokenless_gets == []
    assert (node.state / "lifecycle-done").read_text() == "InService\n"
    assert "preferred_transfer_client = crt" in (node.state / "aws-s3.conf").read_text()
    # No API key configured: an empty env-file, removed once docker has read it.
    assert (node.logs / "env-file.content").read_text() == ""
    assert not (node.state / "serving.env").exists()
    assert node.log("iptables") == [f"-{op} DOCKER-USER -d 169.254.169.254/32 -j DROP"
                                     for op in "CI"]

    # Reboot (instance store kept): nothing downloaded or pulled again; the hook has no
    # pending action any more, which is logged, not fatal.
    r2 = node.run(script, "boot", FAKE_NO_PENDING="1")
    assert r2.returncode == 0, r2.stderr
    assert "is in the cache already" in r2.stderr
    assert "is on the root volume already" in r2.stderr
    assert len([a for a in node.log("aws") if a.startswith("s3 cp")]) == 1
    assert [d for d in node.log("docker") if d.startswith("pull")] == [
        "pull -q vllm/vllm-openai:v0.11.0"]
    assert "lifecycle: CONTINUE not taken: ValidationError: No active Lifecycle" in r2.stderr
    assert node.log("iptables")[2:] == ["-C DOCKER-USER -d 169.254.169.254/32 -j DROP"]


def test_aws_boot_abandons_on_a_corrupt_download(node):
    folder = node.bucket(AWS_URI, WEIGHTS)
    shard = folder / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # same size, different content
    shard.write_bytes(bytes(data))
    r = node.run(_script(node, 0, "aws"), "boot")
    assert r.returncode == 1
    assert "poolctl: weights: model-00002-of-00002.safetensors: sha256 mismatch" in r.stderr
    assert "FAILED: weights: s3://acme-models/llama-3.1-70b/ does not match" in r.stderr
    assert node.log("aws")[-1] == _continue_line("ABANDON")
    assert "CONTINUE" not in "\n".join(node.log("aws"))
    assert not (node.logs / "docker-run.args").exists()
    assert not list(node.cache.rglob(".poolctl-complete"))


def test_aws_boot_abandons_a_node_missing_a_gpu(node):
    node.bucket(AWS_URI, WEIGHTS)
    r = node.run(_script(node, 0, "aws"), "boot", FAKE_GPUS="7")
    assert r.returncode == 1
    assert "FAILED: gpus: found 7, expected 8" in r.stderr
    assert node.log("aws")[-1] == _continue_line("ABANDON")


def test_aws_warm_pool_stopped_node_only_pulls_the_image(node):
    node.bucket(AWS_URI, WEIGHTS)
    node.target_state = "Warmed:Stopped"
    r = node.run(_script(node, 0, "aws"), "boot")
    assert r.returncode == 0, r.stderr
    assert set(_phases(r.stderr)) == {"image", "gpus", "total"}
    assert node.log("docker")[-1] == "pull -q vllm/vllm-openai:v0.11.0"
    assert not [a for a in node.log("aws") if a.startswith("s3 ")]
    assert not (node.logs / "docker-run.args").exists()
    assert node.log("aws")[-1] == _continue_line("CONTINUE")
    assert (node.state / "lifecycle-done").read_text() == "Warmed:Stopped\n"


def _published(node: Node) -> dict[str, dict]:
    """The metric data of the last put-metric-data, by metric name."""
    data = json.loads((node.state / "metric-data.json").read_text())
    assert all(m["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": "acme-chat-70b"}]
               for m in data)
    return {m["MetricName"]: m for m in data}


def test_aws_publish_queue(node):
    script = _script(node, 0, "aws")
    put = (f"cloudwatch put-metric-data --namespace poolctl --metric-data "
           f"file://{node.state}/metric-data.json")

    # Warm-pool node (serving, no traffic): publishes nothing.
    node.target_state = "Warmed:Running"
    assert node.run(script, "publish-queue").returncode == 0
    assert node.log("aws") == []

    # In service: 10 waiting over 4 replicas; 7 running; no histogram in this scrape.
    node.target_state = "InService"
    assert node.run(script, "publish-queue").returncode == 0
    assert node.log("aws") == [put]
    got = _published(node)
    assert got["RequestsWaitingPerReplica"]["Value"] == 2.5
    assert got["RequestsWaitingPerReplica"]["Unit"] == "Count"
    assert got["RunningRequests"]["Value"] == 7 and got["Requests"]["Value"] == 0
    assert "TimeToFirstToken" not in got  # no request finished: no latency datapoint

    # A Warmed:Running node moved in service without a restart: the timer completes the hook.
    (node.state / "lifecycle-done").write_text("Warmed:Running\n")
    assert node.run(script, "publish-queue").returncode == 0
    assert node.log("aws")[1:] == [_continue_line("CONTINUE"), put]
    assert (node.state / "lifecycle-done").read_text() == "InService\n"
    assert node.run(script, "publish-queue").returncode == 0
    assert node.log("aws")[3:] == [put]

    # Not serving: no data point at all rather than a zero.
    node.serving = False
    assert node.run(script, "publish-queue").returncode == 0
    assert len(node.log("aws")) == 4
    assert node.tokenless_gets == []


def _hist(name: str, engine: int, edges: tuple[str, ...], cum: tuple[float, ...],
          total_s: float) -> str:
    lab = f'engine="{engine}",model_name="m"'
    lines = [f'{name}_bucket{{{lab.split(",")[0]},le="{le}",model_name="m"}} {c}'
             for le, c in zip(edges, cum, strict=True)]
    return "\n".join([*lines, f"{name}_count{{{lab}}} {cum[-1]}",
                      f"{name}_sum{{{lab}}} {total_s}"]) + "\n"


TTFT = "vllm:time_to_first_token_seconds"
EDGES = ("0.1", "0.25", "0.5", "+Inf")


def _latency(node: Node, prev: str, cur: str) -> tuple[dict[str, dict], str]:
    """latency_metrics of the rendered script on two scrapes: (metrics by name, stderr)."""
    text = _script(node, 0, Cloud.aws)
    start = text.index("latency_metrics() {\n")
    end = text.index("\n}\n", text.index("}' \"$prev\" \"$2\"", start)) + 3
    fn = node.root / "latency_metrics.sh"  # the function as rendered, alone
    fn.write_text(text[start:end])
    (node.root / "prev").write_text(prev)
    (node.root / "cur").write_text(cur)
    r = subprocess.run(
        ["bash", "-c", 'POOL=acme-chat-70b METRIC_NAME=RequestsWaitingPerReplica; source "$0"; '
         'latency_metrics "$1" "$2" 1.000', str(fn), str(node.root / "prev"),
         str(node.root / "cur")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return {m["MetricName"]: m for m in json.loads(r.stdout)}, r.stderr


def _weighted(values: list[float], counts: list[float], q: float) -> float:
    """Nearest rank over weights: the smallest value whose cumulative count reaches q."""
    run, need = 0.0, q * sum(counts)
    for v, c in sorted(zip(values, counts, strict=True)):
        run += c
        if run >= need - 1e-9:
            return v
    raise AssertionError("no value")


def test_latency_histograms_publish_as_value_count_arrays(node):
    # Two engines. Since the last scrape: engine 0 finished 5 requests (1 in (0.1, 0.25],
    # 4 in (0.25, 0.5], 1.45 s in all), engine 1 five (1 and 4, 2.15 s): 10 requests, 2 in
    # (0.1, 0.25], 8 in (0.25, 0.5], 3.6 s. Counters: engine 0's request counter went from
    # 100 to 7 (a restarted engine: 7 since), tokens 1,000 -> 1,800.
    prev = (_hist(TTFT, 0, EDGES, (1, 1, 1, 1), 0.05)
            + 'vllm:request_success_total{engine="0",finished_reason="length"} 100\n'
            + 'vllm:generation_tokens_total{engine="0"} 1000\n')
    cur = (_hist(TTFT, 0, EDGES, (1, 2, 6, 6), 1.5) + _hist(TTFT, 1, EDGES, (0, 1, 5, 5), 2.15)
           + 'vllm:request_success_total{engine="0",finished_reason="length"} 7\n'
           + 'vllm:generation_tokens_total{engine="0"} 1800\n'
           + 'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n')
    got, _ = _latency(node, prev, cur)
    t = got["TimeToFirstToken"]
    assert t["Unit"] == "Seconds" and sum(t["Counts"]) == pytest.approx(10)
    # By hand: two buckets hold requests, so each spreads over 10 points. (0.1, 0.25]: 10
    # points 0.015 apart from 0.1075, 0.2 each. The most held, (0.25, 0.5], is narrowed
    # around its mean: (3.6 - 2 x 0.175) / 8 = 0.40625, past the bucket's middle, so
    # [2 x 0.40625 - 0.5, 0.5] = [0.3125, 0.5]: 10 points 0.01875 apart from 0.321875, 0.8 each.
    want_v = [0.1 + (j + 0.5) * 0.015 for j in range(10)] + [
        0.3125 + (j + 0.5) * 0.01875 for j in range(10)]
    assert t["Values"] == pytest.approx(want_v)
    assert t["Counts"] == pytest.approx([0.2] * 10 + [0.8] * 10)
    # Percentiles as CloudWatch reads them back (the sandbox: nearest rank over weights): p90
    # needs 9 of 10: 2 + 0.8 n >= 9 at the 9th point of the second bucket, 0.471875; p50 at
    # the 4th, 0.378125.
    assert _weighted(t["Values"], t["Counts"], 0.9) == pytest.approx(0.471875)
    assert _weighted(t["Values"], t["Counts"], 0.5) == pytest.approx(0.378125)
    assert got["Requests"]["Value"] == 7 and got["GenerationTokens"]["Value"] == 800
    assert got["KvCacheUsage"]["Value"] == pytest.approx(0.3)


def test_requests_spread_over_buckets_are_not_narrowed(node):
    # 3 in (0.1, 0.25], 3 in (0.25, 0.5], 3 past 0.5: the largest bucket (the first of the
    # three) holds a third, under half: no bucket is narrowed (the others' middles would be
    # too rough a guess of its mean), each spreads evenly, the +Inf three sit at 0.5.
    got, _ = _latency(node, "", _hist(TTFT, 0, EDGES, (0, 3, 6, 9), 9 * 0.4))
    t = got["TimeToFirstToken"]
    assert t["Values"] == pytest.approx([0.1075 + 0.015 * j for j in range(10)]
                                        + [0.2625 + 0.025 * j for j in range(10)] + [0.5])
    assert t["Counts"] == pytest.approx([0.3] * 20 + [3])


def test_a_histogram_that_goes_back_is_left_out_with_a_line(node):
    # The bucket counts fall while the count does not: not a restart, nothing to trust.
    prev = _hist(TTFT, 0, EDGES, (5, 6, 9, 9), 2.0)
    cur = _hist(TTFT, 0, EDGES, (5, 4, 10, 10), 2.5)
    got, err = _latency(node, prev, cur)
    assert "TimeToFirstToken" not in got
    assert "vllm:time_to_first_token_seconds: bucket le=0.25 went down; left out" in err
    # A restarted engine (its count below the last one): the new values are the increase.
    got, _ = _latency(node, prev, _hist(TTFT, 0, EDGES, (0, 2, 2, 2), 0.4))
    assert got["TimeToFirstToken"]["Counts"] == pytest.approx([0.2] * 10)
    # the one bucket held, narrowed around its mean 0.2: [0.15, 0.25]
    assert got["TimeToFirstToken"]["Values"] == pytest.approx(
        [0.15 + (j + 0.5) * 0.01 for j in range(10)])


def test_the_python_twin_of_the_agents_spread_publishes_the_same_arrays(node):
    # histograms.spread (what status's prediction and perf fit --pool read their model
    # through) against the agent's awk, on random histograms over vLLM's TPOT buckets: the
    # same values and counts. One engine, from nothing (the first interval).
    import random

    from poolctl.histograms import TPOT_BUCKETS, counts, spread
    name = "vllm:request_time_per_output_token_seconds"
    edges = tuple(f"{e:g}" for e in TPOT_BUCKETS) + ("+Inf",)
    rng = random.Random(7)
    for _ in range(4):
        xs = [rng.lognormvariate(-3.2, rng.uniform(0.05, 0.8)) for _ in range(rng.randint(5, 400))]
        per = counts(xs, TPOT_BUCKETS)
        cum, run = [], 0.0
        for c in per:
            run += c
            cum.append(run)
        got, _ = _latency(node, "", _hist(name, 0, edges, tuple(cum), sum(xs)))
        want = spread(per, TPOT_BUCKETS, sum(xs))
        t = got["TimePerOutputToken"]
        assert t["Values"] == pytest.approx([v for v, _ in want], rel=1e-5)
        assert t["Counts"] == pytest.approx([c for _, c in want], rel=1e-5)


GCP_URI = "gs://acme-models/llama-3.1-405b-fp8/"


def test_gcp_boot(node):
    node.bucket(GCP_URI, {"config.json": b"{}", "model.safetensors": os.urandom(100_000)})
    r = node.run(_script(node, 1, "gcp"), "boot")
    assert r.returncode == 0, r.stderr
    wdir = node.cache / "weights" / "meta-llama_Llama-3.1-405B-Instruct-FP8" / "1"
    # The image pull runs in the background beside the weights (boot/_node_lib.sh.j2), so the
    # two gcloud calls come in either order.
    assert sorted(node.log("gcloud")) == [
        "auth configure-docker us-docker.pkg.dev --quiet",
        f"storage cp -r {GCP_URI}* {wdir}/",
    ]
    args = node.docker_run_args()
    i = args.index("--tensor-parallel-size")
    assert args[i:i + 4] == ["--tensor-parallel-size", "8", "--data-parallel-size", "1"]
    assert args[args.index("--port") + 1] == str(node.port)
    assert node.log("aws") == []
    assert "phase=readiness" in r.stderr


def test_gcp_publish_queue(node):
    r = node.run(_script(node, 1, "gcp"), "publish-queue")
    assert r.returncode == 0, r.stderr
    (headers, body), = node.posts
    assert headers["Authorization"] == f"Bearer {GCE_TOKEN}"
    series, *others = body["timeSeries"]
    assert series["metric"] == {
        "type": "custom.googleapis.com/poolctl/requests_waiting_per_replica"}
    assert series["resource"] == {"type": "gce_instance", "labels": {
        "project_id": "acme-prod", "instance_id": "4242424242", "zone": "us-central1-b"}}
    point, = series["points"]
    # tensor_parallel 8: one replica per node, so the node's whole queue.
    assert point["value"] == {"doubleValue": float(WAITING_TOTAL)}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
                        point["interval"]["endTime"])
    # Beside it, labelled with the pool: the counters (none served yet: 0) from the engine's
    # start, and the gauges (this scrape has no histogram and no KV-cache gauge).
    assert {(o["metric"]["type"].rsplit("/", 1)[1], o["metricKind"], o["valueType"])
            for o in others} == {
        ("requests", "CUMULATIVE", "INT64"), ("prompt_tokens", "CUMULATIVE", "INT64"),
        ("generation_tokens", "CUMULATIVE", "INT64"),
        ("running_requests", "GAUGE", "DOUBLE")}
    cfg = load(aws_port=node.port, gcp_port=node.port)
    mig = naming.base(cfg, cfg.pools[1])  # the MIG's name, which status filters on
    assert all(o["metric"]["labels"] == {"pool": mig} for o in others)
    running = next(o for o in others if o["metric"]["type"].endswith("running_requests"))
    assert running["points"][0]["value"] == {"doubleValue": 7.0}

    # Within the minute, the queue alone (Cloud Monitoring bills each point).
    node.posts.clear()
    assert node.run(_script(node, 1, "gcp"), "publish-queue").returncode == 0
    (_, body), = node.posts
    assert [o["metric"]["type"] for o in body["timeSeries"]] == [
        "custom.googleapis.com/poolctl/requests_waiting_per_replica"]

    def start_of(served: int) -> str:
        node.metrics = METRICS + f'vllm:request_success_total{{engine="0"}} {served}.0\n'
        os.utime(node.state / "gcp-count", (0, 0))  # a minute (and more) later
        node.posts.clear()
        assert node.run(_script(node, 1, Cloud.gcp), "publish-queue").returncode == 0
        (_, body), = node.posts
        req = next(o for o in body["timeSeries"] if o["metric"]["type"].endswith("/requests"))
        assert req["points"][0]["value"] == {"int64Value": str(served)}
        return str(req["points"][0]["interval"]["startTime"])

    # The series run from the engine's start; a count below the last one written is a
    # restarted engine: its series start again.
    first = start_of(10)
    assert start_of(12) == first
    time.sleep(1.1)
    restarted = start_of(4)
    assert restarted > first and start_of(9) == restarted


def test_verify_manifest(node, tmp_path):
    script = _script(node, 0, "aws")
    folder = tmp_path / "w"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"a" * 1000)
    (folder / "sub" / "b.bin").write_bytes(b"b" * 10)
    write_manifest(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest == {"files": {
        "a.bin": {"bytes": 1000, "sha256":
                  "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"},
        "sub/b.bin": {"bytes": 10, "sha256":
                      "6d2fe32dc4249ef7e7359c6d874fffbbf335e832e49a2681236e1b686af78794"},
    }}
    assert node.run(script, "verify", str(folder)).returncode == 0
    assert weights.verify(folder).ok

    def both_find(*problems: str) -> None:
        """The node's check and `poolctl weights verify` find the same problems."""
        r = node.run(script, "verify", str(folder))
        assert r.returncode == 1
        found = [ln.removeprefix("poolctl: weights: ") for ln in r.stderr.splitlines()
                 if ln.startswith("poolctl: weights: ") and " files verified" not in ln]
        assert found == list(problems)
        assert weights.verify(folder).problems == list(problems)

    (folder / "a.bin").write_bytes(b"A" + b"a" * 999)
    (folder / "sub" / "b.bin").write_bytes(b"b" * 11)
    both_find("a.bin: sha256 mismatch", "sub/b.bin: 11 bytes, manifest says 10")
    (folder / "sub" / "b.bin").unlink()
    both_find("a.bin: sha256 mismatch", "sub/b.bin: missing")

    (folder / "manifest.json").write_text(json.dumps(
        {"files": {"../../etc/hostname": {"bytes": 1, "sha256": "0" * 64}}}))
    r = node.run(script, "verify", str(folder))
    assert r.returncode == 1 and "../../etc/hostname: outside the weights folder" in r.stderr
    # poolctl refuses such a manifest whole, naming the field (issue 23), before any read
    with pytest.raises(UsageError, match=r'files\["../../etc/hostname"\]: the path has'):
        weights.verify(folder)
    # Manifests a node refuses whole: poolctl refuses them too (one line, exit 2).
    for bad in (json.dumps({"files": {}}), "not json"):
        (folder / "manifest.json").write_text(bad)
        r = node.run(script, "verify", str(folder))
        assert r.returncode == 1 and "Traceback" not in r.stderr
        with pytest.raises(UsageError, match="manifest.json: (lists no files|unusable)"):
            weights.verify(folder)
    assert "manifest.json unusable" in r.stderr


def test_missing_nvme_fails_when_the_type_has_some(node):
    cfg = load()
    script = bootscript.context(cfg, cfg.pools[0], "aws")  # p5: 8 local NVMe devices
    text = bootscript.environment().get_template("node.sh.j2").render(script)
    r = node.run(text, "nvme")
    assert r.returncode == 1
    assert "FAILED: nvme: no local NVMe device found, expected 8" in r.stderr


SECRET = "sk-live-0123456789abcdef"  # what the fake secret stores return
SECRETS = {
    ("aws", 0): "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf",
    ("gcp", 1): "projects/acme-prod/secrets/vllm-key",
}


@pytest.mark.parametrize(("cloud", "idx"), list(SECRETS))
def test_api_key_reaches_vllm_only_through_a_private_env_file(node, cloud, idx):
    """The node reads the key with its own identity; it reaches the container as
    VLLM_API_KEY in a 0600 env-file, never in the script, argv, a log or the output."""
    uri = AWS_URI if cloud == "aws" else GCP_URI
    node.bucket(uri, {"config.json": b"{}"})
    script = _script(node, idx, cloud, secret=SECRETS[cloud, idx])
    r = node.run(script, "boot", FAKE_SECRET=SECRET)
    assert r.returncode == 0, r.stderr
    if cloud == "aws":
        assert ("secretsmanager get-secret-value --region us-east-1 --secret-id "
                f"{SECRETS[cloud, idx]} --query SecretString --output text") in node.log("aws")
    else:
        assert (f"secrets versions access {SECRETS[cloud, idx]}/versions/latest --quiet"
                in node.log("gcloud"))
    assert (node.logs / "env-file.content").read_text() == f"VLLM_API_KEY={SECRET}\n"
    assert (node.logs / "env-file.mode").read_text().strip() == "600"
    assert not (node.state / "serving.env").exists()
    args = node.docker_run_args()
    assert "--api-key" not in args and args[args.index("--network") + 1] == "bridge"
    seen = [script, r.stdout, r.stderr] + [
        f.read_text() for f in node.logs.iterdir() if not f.name.startswith("env-file")]
    assert not [t for t in seen if SECRET in t]


def test_api_key_secret_that_spans_lines_fails_the_boot(node):
    node.bucket(AWS_URI, {"config.json": b"{}"})
    script = _script(node, 0, "aws", secret=SECRETS["aws", 0])
    r = node.run(script, "boot", FAKE_SECRET="line1\nline2")
    assert r.returncode == 1
    assert "FAILED: api key: secret arn:aws:secretsmanager" in r.stderr
    assert "line1" not in r.stderr and not (node.logs / "docker-run.args").exists()


# --- the image variant: the boot library sourced from the node image -------------------------


def _install_lib(node: Node, cloud: Cloud, text: str | None = None) -> dict[str, str]:
    """The library where `poolctl image build` puts it, under a temporary root."""
    lib = bootscript.boot_library(cloud)
    folder = node.root / "image-root" / lib["dir"].lstrip("/")
    folder.mkdir(parents=True)
    (folder / lib["file"]).write_text(lib["text"] if text is None else text)
    return {"POOLCTL_LIB_DIR": str(folder)}


@pytest.mark.parametrize(("cloud", "idx"), [("aws", 0), ("gcp", 1)])
def test_image_variant_boots_like_the_whole_script(node, cloud, idx):
    """User data without the library, the library from the image: the same steps, the same
    container, the same lifecycle answer as the whole script."""
    uri = AWS_URI if cloud == "aws" else GCP_URI
    node.bucket(uri, {"config.json": b"{}", "model.safetensors": os.urandom(50_000)})
    env = _install_lib(node, cloud)
    script = _script(node, idx, cloud, from_image=True)
    assert "verify_weights() {" not in script
    r = node.run(script, "boot", **env)
    assert r.returncode == 0, r.stderr
    # image runs beside gpus (in the background): their order varies.
    assert set(_phases(r.stderr)) == {"image", "gpus", "nvme", "weights", "serving",
                                      "readiness", "total"}
    assert "poolctl: weights: 2 of 2 files verified" in r.stderr
    image_args = node.docker_run_args()
    if cloud == "aws":
        assert node.log("aws")[-1] == _continue_line("CONTINUE")
    else:
        # The image pull (and its registry login) runs beside the weights' copy: either
        # may call gcloud first.
        assert "auth configure-docker us-docker.pkg.dev --quiet" in node.log("gcloud")
    # The whole script on a fresh node: the very same docker run.
    (node.logs / "docker-run.args").unlink()
    for marker in node.cache.rglob(".poolctl-complete"):
        marker.unlink()
    whole = node.run(_script(node, idx, cloud), "boot")
    assert whole.returncode == 0, whole.stderr
    assert node.docker_run_args() == image_args
    # publish-queue runs from the library too.
    assert node.run(script, "publish-queue", **env).returncode == 0


def test_image_variant_fails_loudly_without_the_library(node):
    node.bucket(AWS_URI, {"config.json": b"{}"})
    script = _script(node, 0, "aws", from_image=True)
    missing = node.root / "no-such-image-root"
    r = node.run(script, "boot", POOLCTL_LIB_DIR=str(missing))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"poolctl: FAILED: boot library {missing}/boot.sh is missing: the node image was not "
        "built by this poolctl; rebuild it (poolctl image build) or remove it from the file")
    assert "poolctl: phase=failed seconds=" in r.stderr
    assert node.log("docker") == [] and node.log("aws") == []


def test_image_variant_refuses_another_library_version(node):
    lib = bootscript.boot_library("aws")
    other = lib["text"].replace(lib["version"], "aws-0123456789ab")
    env = _install_lib(node, "aws", text=other + "docker() { touch \"$FAKE_LOGS/sourced\"; }\n")
    r = node.run(_script(node, 0, "aws", from_image=True), "boot", **env)
    assert r.returncode == 1
    assert (f"boot library {env['POOLCTL_LIB_DIR']}/boot.sh is version aws-0123456789ab, "
            f"this script needs {lib['version']}; rebuild the image") in r.stderr
    assert not (node.logs / "sourced").exists()  # refused before it was sourced
    assert node.log("docker") == []


def test_phases_count_the_nodes_own_seconds(node):
    # The script's clock as rendered: on a node x1; the sandbox at speed 10 sets 10000 and a
    # 0.3-s step is 3 s of the pool's time (integer seconds, rounded down).
    text = _script(node, 0, Cloud.aws)
    fns = "\n".join(re.findall(r"^(?:log|clock|since)\(\) \{.*\}$", text, re.M))
    start = text.index("\nphase() {\n") + 1
    fns += "\n" + text[start:text.index("\n}\n", start) + 2]
    for scale, seconds in ((None, "0"), ("10000", "3")):
        env = {k: v for k, v in os.environ.items() if k != "POOLCTL_TIME_SCALE_MILLI"}
        if scale is not None:
            env["POOLCTL_TIME_SCALE_MILLI"] = scale
        r = subprocess.run(["bash", "-c", fns + "\nphase step sleep 0.3"], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stderr == f"poolctl: phase=step seconds={seconds}\n", (
            scale, r.stderr)
