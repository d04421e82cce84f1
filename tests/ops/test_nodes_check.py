"""`poolctl nodes check` run for real against a real OpenSSH sshd on loopback (tests/ops/sshd.py)
whose session finds stub GPU / disk / docker / curl tools printing a p5.48xlarge's output.

Expectations come from examples/llama-70b-p5 on AWS: p5.48xlarge = 8x H100 (catalog), image
vllm/vllm-openai:v0.11.0, health on 127.0.0.1:8000/health, cache at /mnt/poolctl-cache holding
70.6e9 params x 2 B x 1.2 headroom = 169.44e9 B (169.4 GB).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from poolctl.config import parse_config
from tests.configs import pool_yaml
from tests.ops.sshd import FakeNode, start_sshd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
CHECKS = ["ssh", "gpus", "nvlink", "no-efa", "cache-mount", "cache-size", "image", "health"]


# Loopback addresses standing for three more nodes: the sandbox gives its instances these
# private IPs, and the same sshd answers on them (nothing leaves the machine).
NODE_IPS = ("127.77.1.50", "127.77.1.51", "127.77.1.52")


@pytest.fixture(scope="module")
def sshd_node(tmp_path_factory) -> FakeNode:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"), extra_addresses=NODE_IPS)


@pytest.fixture
def node(sshd_node: FakeNode) -> FakeNode:
    sshd_node.reset()
    return sshd_node


def nodes_check(node: FakeNode, *extra: str, hosts: list[str] | None = None,
                known_hosts: Path | None = None, identity: Path | None = None,
                json_out: bool = True,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
            "--cloud", "aws", "--user", node.user, "--timeout", "20",
            "--known-hosts", str(known_hosts or node.known_hosts),
            "--identity", str(identity or node.identity)]
    for h in hosts or [node.target]:
        argv += ["--host", h]
    if json_out:
        argv.append("--json")
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, **(env or {})})


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


def test_hanging_nvidia_smi_times_out(node):
    node.set(nvidia_smi_hangs_s=6)
    r = nodes_check(node, "--timeout", "1.5")  # the last --timeout wins
    assert r.returncode == 1, r.stderr
    checks = by_name(json.loads(r.stdout)["nodes"][0])
    assert {n for n, c in checks.items() if not c["ok"]} == {"gpus", "nvlink"}
    assert checks["gpus"]["observed"] == "nvidia-smi failed: `nvidia-smi` did not finish in 1.5 s"
    assert checks["nvlink"]["observed"] == (
        "nvidia-smi topo -m failed: `nvidia-smi` did not finish in 1.5 s")


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


@pytest.mark.parametrize("columns", [200, 80])
def test_table_output(node, columns):
    node.set(gpus=7)
    r = nodes_check(node, json_out=False, env={"COLUMNS": str(columns)})
    assert r.returncode == 1
    out = r.stdout
    assert out.startswith("nodes check")
    if columns == 200:  # node x check matrix, then each failure with its fix
        header = next(ln for ln in out.splitlines() if "cache-mount" in ln)
        assert [h.strip() for h in header.strip("┃ ").split("┃")] == ["node", *CHECKS]
        row = next(ln for ln in out.splitlines() if f"127.0.0.1:{node.port}" in ln)
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells == [f"127.0.0.1:{node.port}", "✓ ok", "✗ 7/8", "✓ NV18", "✓ none",
                         "✓ /dev/md127 xfs", "✓ 30.4 TB", "✓ 4f1c9ee2b1a9", "✓ 200"]
        assert f"✗ 127.0.0.1:{node.port} gpus: 7 GPUs: 7x NVIDIA H100 80GB HBM3" in out
        assert "fix: expected 8x H100 (p5.48xlarge)" in out
    else:  # too narrow for 9 columns: one row per check, the fix under the failed one
        rows = [ln for ln in out.splitlines() if ln.startswith("│")]
        marks = [ln.split("│")[2].strip() for ln in rows if ln.split("│")[2].strip()]
        assert marks == [f"{'✗' if c == 'gpus' else '✓'} {c}" for c in CHECKS]
        assert "fix: expected 8x H100" in out


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


# --- discovery: the pool's running nodes, found by tag in the sandbox, then checked -------


def _run_tagged(ec2, subnet: str, ami: str, ip: str, project: str, pool: str) -> str:
    tags = [{"Key": "poolctl:project", "Value": project}, {"Key": "poolctl:pool", "Value": pool},
            {"Key": "poolctl:role", "Value": "inference"}]
    # One reservation each: the sandbox (moto) pages describe_instances by reservation.
    inst = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                             SubnetId=subnet, PrivateIpAddress=ip,
                             TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    return inst["Instances"][0]["InstanceId"]


def test_discovery_through_the_sandbox_then_ssh(node, sandbox, sandbox_client, tmp_path):
    from poolctl.nodecheck import discover_aws

    region = "us-west-2"  # away from the other sandbox tests' us-east-1
    project = f"nc{uuid.uuid4().hex[:8]}"
    text = pool_yaml(region=region, with_gcp=False).replace("project: acme",
                                                             f"project: {project}")
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(text)
    cfg = parse_config(text)

    ec2 = sandbox_client("ec2", region)
    vpc = ec2.create_vpc(CidrBlock="127.77.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.77.1.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    for ip in reversed(NODE_IPS):
        _run_tagged(ec2, subnet, ami, ip, project, "chat-70b")
    stopped = _run_tagged(ec2, subnet, ami, "127.77.1.60", project, "chat-70b")
    ec2.stop_instances(InstanceIds=[stopped])
    _run_tagged(ec2, subnet, ami, "127.77.1.61", project, "other-pool")
    _run_tagged(ec2, subnet, ami, "127.77.1.62", f"{project}x", "chat-70b")

    # Page size 1: every node comes from its own page.
    assert discover_aws(cfg, cfg.pools[0], sandbox=True, page_size=1) == list(NODE_IPS)

    r = subprocess.run(
        [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file), "--sandbox",
         "--cloud", "aws", "--port", str(node.port), "--user", node.user, "--timeout", "20",
         "--known-hosts", str(node.known_hosts), "--identity", str(node.identity), "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [n["host"] for n in data["nodes"]] == [f"{ip}:{node.port}" for ip in NODE_IPS]
    assert all(n["ok"] for n in data["nodes"]) and data["ok"] is True
    assert "checking 3 node(s)" in r.stderr
    gpu_queries = [c for c in node.calls() if c.startswith("nvidia-smi --query-gpu")]
    assert len(gpu_queries) == 3


def test_discovery_finds_nothing(sandbox, tmp_path):
    text = pool_yaml(with_gcp=False).replace("project: acme",
                                             f"project: nc{uuid.uuid4().hex[:8]}")
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(text)
    r = subprocess.run([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file),
                        "--sandbox", "--cloud", "aws"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "no running node of pool chat-70b on aws in us-east-1" in lines[0]
    assert "pass --host H" in lines[0]
