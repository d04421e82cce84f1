"""`poolctl nodes check` run for real against a real OpenSSH sshd on loopback (tests/ops/sshd.py)
whose session finds stub GPU / disk / docker / curl tools printing a p5.48xlarge's output.

Expectations come from examples/llama-70b-p5 on AWS: p5.48xlarge = 8x H100 (catalog), image
vllm/vllm-openai:v0.11.0, health on 127.0.0.1:8000/health, cache at /mnt/poolctl-cache holding
70.6e9 params x 2 B x 1.2 headroom = 169.44e9 B (169.4 GB).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.sshd import FakeNode, start_sshd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
CHECKS = ["ssh", "gpus", "nvlink", "no-efa", "cache-mount", "cache-size", "image", "health"]


@pytest.fixture(scope="module")
def sshd_node(tmp_path_factory) -> FakeNode:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"))


@pytest.fixture
def node(sshd_node: FakeNode) -> FakeNode:
    sshd_node.reset()
    return sshd_node


def nodes_check(node: FakeNode, *extra: str, hosts: list[str] | None = None,
                known_hosts: Path | None = None, identity: Path | None = None,
                json_out: bool = True) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
            "--cloud", "aws", "--user", node.user, "--timeout", "20",
            "--known-hosts", str(known_hosts or node.known_hosts),
            "--identity", str(identity or node.identity)]
    for h in hosts or [node.target]:
        argv += ["--host", h]
    if json_out:
        argv.append("--json")
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def by_name(node_json: dict) -> dict[str, dict]:
    return {c["name"]: c for c in node_json["checks"]}


def test_healthy_node_passes_every_check(node):
    r = nodes_check(node)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True
    assert len(data["nodes"]) == 1
    n = data["nodes"][0]
    assert n["host"] == f"127.0.0.1:{node.port}"
    assert n["ok"] is True and n["pool"] == "chat-70b" and n["cloud"] == "aws"
    assert [c["name"] for c in n["checks"]] == CHECKS
    for c in n["checks"]:
        assert set(c) == {"name", "ok", "observed", "hint"}
        assert c["ok"] is True and c["hint"] is None, c
    c = by_name(n)
    assert c["ssh"]["observed"] == (
        f"{node.user}@127.0.0.1:{node.port}, host key ssh-ed25519 {node.fingerprint()}")
    assert c["gpus"]["observed"] == "8x NVIDIA H100 80GB HBM3 (81559 MiB)"
    # 8 GPUs: 8*7/2 = 28 pairs; H100 SXM has 18 links per GPU.
    assert c["nvlink"]["observed"] == "all 28 GPU pairs over NVLink (NV18); 18 active links per GPU"
    assert c["no-efa"]["observed"] == ("none (no /sys/class/infiniband device, no EFA/RDMA PCI "
                                       "device, fi_info -p efa finds none)")
    assert c["cache-mount"]["observed"] == "/dev/md127 (xfs) at /mnt/poolctl-cache"
    assert c["cache-size"]["observed"] == (
        "30.4 TB (30,397,335,011,328 B), 30.2 TB free; "
        "the weights need 169.4 GB with 20% headroom")
    assert c["image"]["observed"].startswith("vllm/vllm-openai:v0.11.0 present (sha256:4f1c9ee2")
    assert c["health"]["observed"] == "200 from http://127.0.0.1:8000/health"
    # Each stub ran with the config's values (and the session really used the stubs).
    calls = node.calls()
    assert "docker image inspect --format {{.Id}} vllm/vllm-openai:v0.11.0" in calls
    assert ("curl -fsS -o /dev/null -w %{http_code} --max-time 5 "
            "http://127.0.0.1:8000/health") in calls
    assert "findmnt -n -o SOURCE,FSTYPE --mountpoint /mnt/poolctl-cache" in calls
    assert "df -B1 --output=target,size,avail /mnt/poolctl-cache" in calls
    assert {c.split()[0] for c in calls} == {"nvidia-smi", "lspci", "fi_info", "findmnt", "df",
                                             "docker", "curl"}
    assert f"node 127.0.0.1:{node.port} (chat-70b/aws): ok, 8 checks passed" in r.stderr


@pytest.mark.parametrize(
    ("breakage", "failing", "observed"),
    [
        ({"gpus": 7}, {"gpus"}, "7 GPUs: 7x NVIDIA H100 80GB HBM3 (81559 MiB)"),
        ({"efa": True}, {"no-efa"},
         "/sys/class/infiniband: rdmap16s27, rdmap32s27, rdmap48s27, rdmap64s27"),
        ({"cache": False}, {"cache-mount", "cache-size"}, "nothing mounted at /mnt/poolctl-cache"),
    ],
    ids=["7-gpus", "efa", "no-cache"],
)
def test_broken_node_fails_the_right_check(node, breakage, failing, observed):
    node.set(**breakage)
    r = nodes_check(node)
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["nodes"][0]["ok"] is False
    checks = by_name(data["nodes"][0])
    assert {n for n, c in checks.items() if not c["ok"]} == failing
    first = sorted(failing, key=CHECKS.index)[0]
    assert checks[first]["observed"].startswith(observed), checks[first]
    assert checks[first]["hint"]
    assert f"1 of 1 node(s) failed a check (127.0.0.1:{node.port}: " in r.stderr
    assert "Traceback" not in r.stderr


def test_efa_node_names_every_source(node):
    node.set(efa=True)
    r = nodes_check(node)
    c = by_name(json.loads(r.stdout)["nodes"][0])["no-efa"]
    assert "PCI: " in c["observed"] and "Elastic Fabric Adapter (EFA) [1d0f:efa1]" in c["observed"]
    assert "fi_info -p efa lists the efa provider" in c["observed"]
    assert "aws.efa_interfaces: 0" in c["hint"]
    # The topology now carries NIC columns; NVLink between the GPUs is still read right.
    assert by_name(json.loads(r.stdout)["nodes"][0])["nvlink"]["ok"] is True


def test_no_cache_size_check_names_the_cause(node):
    node.set(cache=False)
    c = by_name(json.loads(nodes_check(node).stdout)["nodes"][0])["cache-size"]
    assert c["observed"] == ("not checked: /mnt/poolctl-cache is not mounted "
                             "(df reports /)")


def test_image_and_health_failures(node):
    node.set(image=False, health="503")
    r = nodes_check(node)
    assert r.returncode == 1
    checks = by_name(json.loads(r.stdout)["nodes"][0])
    assert {n for n, c in checks.items() if not c["ok"]} == {"image", "health"}
    assert checks["image"]["observed"] == (
        "vllm/vllm-openai:v0.11.0 not on the node "
        "(exit 1: Error: No such image: vllm/vllm-openai:v0.11.0)")
    assert "docker pull vllm/vllm-openai:v0.11.0" in checks["image"]["hint"]
    assert checks["health"]["observed"] == "HTTP 503 from http://127.0.0.1:8000/health"


def test_unknown_host_key_is_refused_and_nothing_runs(node, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = nodes_check(node, known_hosts=empty)
    assert r.returncode == 1
    n = json.loads(r.stdout)["nodes"][0]
    assert [c["name"] for c in n["checks"]] == ["ssh"]
    ssh = n["checks"][0]
    assert ssh["ok"] is False
    assert ssh["observed"] == (
        f"unknown host key ssh-ed25519 {node.fingerprint()} for [127.0.0.1]:{node.port}: "
        f"not in {empty}; refused, nothing was run")
    assert ssh["hint"].endswith(f"ssh-keyscan -p {node.port} 127.0.0.1 >> {empty}")
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("node ")]
    assert len(line) == 1 and "FAILED ssh: unknown host key" in line[0]
    assert node.calls() == []
    assert "Traceback" not in r.stderr


def test_changed_host_key_is_refused(node, tmp_path):
    other = (node.root / "wrong_key.pub").read_text().split()
    forged = tmp_path / "known_hosts"
    forged.write_text(f"[127.0.0.1]:{node.port} {other[0]} {other[1]}\n")
    r = nodes_check(node, known_hosts=forged)
    assert r.returncode == 1
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert ssh["ok"] is False and "CHANGED" in ssh["observed"]
    assert node.fingerprint() in ssh["observed"]
    assert f"ssh-keygen -R '[127.0.0.1]:{node.port}'" in ssh["hint"]
    assert node.calls() == []


def test_wrong_key_is_an_auth_failure(node):
    r = nodes_check(node, identity=node.wrong_identity)
    assert r.returncode == 1
    n = json.loads(r.stdout)["nodes"][0]
    assert [c["name"] for c in n["checks"]] == ["ssh"]
    ssh = n["checks"][0]
    assert ssh["observed"].startswith(
        f"authentication failed for {node.user}@127.0.0.1:{node.port} with key "
        f"{node.wrong_identity}")
    assert "--identity" in ssh["hint"]
    assert node.calls() == []


def test_two_nodes_one_refused(node):
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        r = nodes_check(node, hosts=[node.target, f"127.0.0.1:{dead}"])
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert [n["host"] for n in data["nodes"]] == [node.target, f"127.0.0.1:{dead}"]
    assert [n["ok"] for n in data["nodes"]] == [True, False]
    refused = data["nodes"][1]["checks"][0]
    assert refused["observed"] == f"connection refused by 127.0.0.1:{dead}"
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("node ")]
    assert len(progress) == 2


def test_table_output(node):
    node.set(gpus=7)
    r = nodes_check(node, json_out=False)
    assert r.returncode == 1
    assert "nodes check" in r.stdout and "✓" in r.stdout and "✗" in r.stdout
    assert f"✗ 127.0.0.1:{node.port} gpus: 7 GPUs: 7x NVIDIA H100 80GB HBM3" in r.stdout
    assert "fix: expected 8x H100 (p5.48xlarge)" in r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--identity", "/nonexistent/key"], "--identity /nonexistent/key: no such file"),
        (["--known-hosts", "/nonexistent/kh"], "--known-hosts /nonexistent/kh: no such file"),
        (["--host", "127.0.0.1:99999"], "--host 127.0.0.1:99999: the port must be"),
    ],
)
def test_usage_errors_exit_2(node, args, needle):
    argv = [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
            "--cloud", "aws", "--identity", str(node.identity),
            "--known-hosts", str(node.known_hosts), "--host", node.target, *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert node.calls() == []
