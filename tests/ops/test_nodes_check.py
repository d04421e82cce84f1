"""`poolctl nodes check` run for real against a real OpenSSH sshd on loopback (tests/ops/sshd.py)
whose session finds stub GPU / disk / docker / curl tools printing a p5.48xlarge's output.

Expectations come from examples/llama-70b-p5 on AWS: p5.48xlarge = 8x H100 (catalog), image
vllm/vllm-openai:v0.34.0, health on 127.0.0.1:8000/health, cache at /mnt/poolctl-cache holding
70.6e9 params x 2 B x 1.2 headroom = 169.44e9 B (169.4 GB).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from poolctl.config import parse_config
from tests import inproc
from tests.configs import pool_yaml
from tests.ops.sshd import FakeNode, start_sshd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
CHECKS = ["ssh", "gpus", "nvlink", "no-efa", "cache-mount", "cache-size", "image", "health"]


# Loopback addresses standing for three more nodes: the sandbox gives its instances these
# private IPs, and the same sshd answers on them (nothing leaves the machine).
NODE_IPS = ("127.77.1.50", "127.77.1.51", "127.77.1.52")


@pytest.fixture(scope="module")
def sshd_node(tmp_path_factory) -> Iterator[FakeNode]:
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
    return inproc.run_argv([*argv, *extra], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def by_name(node_json: dict) -> dict[str, dict]:
    return {c["name"]: c for c in node_json["checks"]}


def test_healthy_node_passes_every_check(node):
    r = nodes_check(node)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
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
    assert c["image"]["observed"].startswith("vllm/vllm-openai:v0.34.0 present (sha256:4f1c9ee2")
    assert c["health"]["observed"] == "200 from http://127.0.0.1:8000/health"
    # Each stub ran with the config's values (and the session really used the stubs).
    calls = node.calls()
    assert "docker image inspect --format {{.Id}} vllm/vllm-openai:v0.34.0" in calls
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
        "vllm/vllm-openai:v0.34.0 not on the node "
        "(exit 1: Error: No such image: vllm/vllm-openai:v0.34.0)")
    assert "docker pull vllm/vllm-openai:v0.34.0" in checks["image"]["hint"]
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
    r = inproc.run_argv(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
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


def _sandbox_pool(sandbox_client, tmp_path: Path, region: str, net: str, prefix: str
                  ) -> tuple[Path, Any, str, str, str]:
    """A pool file of a project of its own, and a subnet `net`.1.0/24 in the sandbox to run
    its instances in: (file, ec2 client, subnet, AMI, project)."""
    project = f"{prefix}{uuid.uuid4().hex[:8]}"
    text = pool_yaml(region=region, with_gcp=False).replace("project: acme",
                                                             f"project: {project}")
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(text)
    ec2 = sandbox_client("ec2", region)
    vpc = ec2.create_vpc(CidrBlock=f"{net}.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{net}.1.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    return cfg_file, ec2, subnet, ami, project


def test_discovery_through_the_sandbox_then_ssh(node, sandbox, sandbox_client, tmp_path):
    from poolctl.clouds.aws.ops import AwsOps

    # us-west-2: away from the other sandbox tests' us-east-1
    cfg_file, ec2, subnet, ami, project = _sandbox_pool(sandbox_client, tmp_path, "us-west-2",
                                                        "127.77", "nc")
    cfg = parse_config(cfg_file.read_text())
    for ip in reversed(NODE_IPS):
        _run_tagged(ec2, subnet, ami, ip, project, "chat-70b")
    stopped = _run_tagged(ec2, subnet, ami, "127.77.1.60", project, "chat-70b")
    ec2.stop_instances(InstanceIds=[stopped])
    _run_tagged(ec2, subnet, ami, "127.77.1.61", project, "other-pool")
    _run_tagged(ec2, subnet, ami, "127.77.1.62", f"{project}x", "chat-70b")

    # Page size 1: every node comes from its own page.
    from poolctl.sandbox import manager

    found = AwsOps(manager.endpoints()).node_addresses(cfg, cfg.pools[0], page_size=1)
    assert [ip for ip, _, _ in found] == list(NODE_IPS)

    r = inproc.run_argv(
        [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file), "--sandbox",
         "--cloud", "aws", "--port", str(node.port), "--user", node.user, "--timeout", "20",
         "--known-hosts", str(node.known_hosts), "--identity", str(node.identity), "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
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
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file),
                        "--sandbox", "--cloud", "aws"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "no running node of pool chat-70b on aws in us-east-1" in lines[0]
    assert "pass --host H" in lines[0]


# --- known_hosts as OpenSSH writes it: wildcards, hashes, @revoked, @cert-authority ---------


def _host_key(node: FakeNode) -> str:
    return " ".join(node.host_key_pub.read_text().split()[:2])


def _hashed(name: str) -> str:
    """`ssh-keygen -H` form of a host name."""
    import base64
    import hashlib
    import hmac

    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


@pytest.mark.parametrize("patterns", [
    "[127.0.0.*]:{port}",  # wildcard
    "[127.0.0.?]:{port}",
    "example.internal,[127.0.0.1]:{port}",  # the second pattern of a list
    "hashed",
])
def test_known_hosts_patterns_and_hashes_are_honoured(node, tmp_path, patterns):
    name = f"[127.0.0.1]:{node.port}"
    field = _hashed(name) if patterns == "hashed" else patterns.format(port=node.port)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# team nodes\n{field} {_host_key(node)}\n")
    r = nodes_check(node, known_hosts=kh)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
    assert json.loads(r.stdout)["nodes"][0]["checks"][0]["ok"] is True


def test_a_negated_pattern_excludes_the_host(node, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.*]:{node.port},![127.0.0.1]:{node.port} {_host_key(node)}\n")
    r = nodes_check(node, known_hosts=kh)
    assert r.returncode == 1
    assert "unknown host key" in json.loads(r.stdout)["nodes"][0]["checks"][0]["observed"]
    assert node.calls() == []


def test_a_revoked_host_key_is_refused(node, tmp_path):
    kh = tmp_path / "known_hosts"
    # Listed for the host AND revoked: revocation wins, as in OpenSSH.
    kh.write_text(f"[127.0.0.1]:{node.port} {_host_key(node)}\n"
                  f"@revoked * {_host_key(node)}\n")
    r = nodes_check(node, known_hosts=kh)
    assert r.returncode == 1, r.stderr
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert ssh["observed"] == (
        f"host key ssh-ed25519 {node.fingerprint()} of [127.0.0.1]:{node.port} is REVOKED in "
        f"{kh} (line 2); refused, nothing was run")
    assert "revoked on purpose" in ssh["hint"]
    assert node.calls() == [] and "internal error" not in r.stdout
    # A revoked key presented where another key of its type is listed: REVOKED, not CHANGED.
    other = " ".join((node.root / "wrong_key.pub").read_text().split()[:2])
    kh.write_text(f"[127.0.0.1]:{node.port} {other}\n@revoked * {_host_key(node)}\n")
    ssh = json.loads(nodes_check(node, known_hosts=kh).stdout)["nodes"][0]["checks"][0]
    assert "is REVOKED in" in ssh["observed"] and "CHANGED" not in ssh["observed"]


def test_a_cert_authority_line_is_refused_clearly_or_the_plain_key_used(node, tmp_path):
    ca = " ".join((node.root / "wrong_key.pub").read_text().split()[:2])  # any key: a CA's
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority [127.0.0.*]:{node.port} {ca}\n")
    r = nodes_check(node, known_hosts=kh)
    assert r.returncode == 1, r.stderr
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert ssh["observed"] == (
        f"[127.0.0.1]:{node.port} is trusted through a @cert-authority line of {kh} (line 1), "
        "but poolctl's SSH client (paramiko) cannot verify host certificates; the node's own "
        f"key ssh-ed25519 {node.fingerprint()} is not listed; refused, nothing was run")
    assert f"ssh-keyscan -p {node.port} 127.0.0.1 >> {kh}" in ssh["hint"]
    assert node.calls() == []
    # The node's own key beside the CA line: accepted.
    kh.write_text(f"@cert-authority * {ca}\n[127.0.0.1]:{node.port} {_host_key(node)}\n")
    assert nodes_check(node, known_hosts=kh).returncode == 0


# --- the sandbox never sends traffic outside 127.0.0.0/8 ------------------------------------


def test_sandbox_refuses_a_host_outside_loopback(sandbox, node):
    r = nodes_check(node, "--sandbox", hosts=["10.0.3.7:22"], json_out=False)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("poolctl: --host 10.0.3.7: with --sandbox poolctl connects only to "
                           "loopback addresses")
    assert node.calls() == []
    # A loopback address is fine: the local sshd standing for the node.
    assert nodes_check(node, "--sandbox").returncode == 0


def test_sandbox_refuses_the_fake_private_addresses_of_its_instances(sandbox, sandbox_client,
                                                                    tmp_path):
    cfg_file, ec2, subnet, ami, project = _sandbox_pool(sandbox_client, tmp_path, "us-west-1",
                                                        "10.91", "nc")
    _run_tagged(ec2, subnet, ami, "10.91.1.20", project, "chat-70b")
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file),
                        "--sandbox", "--cloud", "aws", "--timeout", "2"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "node address 10.91.1.20 of pool chat-70b is a fake private address" in line
    assert "--host" in line and "checking" not in r.stderr


# --- reaching nodes without a public port or a long-lived key -------------------------------

# A stand-in for `aws ec2-instance-connect open-tunnel`: stdin/stdout to ADDRESS:PORT (the
# local sshd), recording its arguments (what poolctl substituted) first.
RELAY = """\
import socket, sys, threading
open(sys.argv[1], "a").write(" ".join(sys.argv[2:]) + "\\n")
s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
def up():
    while data := sys.stdin.buffer.read1(65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def _relay(tmp_path) -> tuple[Path, Path]:
    script, log = tmp_path / "relay.py", tmp_path / "relay.log"
    script.write_text(RELAY)
    return script, log


def test_proxy_command_carries_the_ssh_session(node, tmp_path):
    script, log = _relay(tmp_path)
    proxy = f"{sys.executable} {script} {log} %h %p"
    r = nodes_check(node, "--proxy-command", proxy)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
    assert log.read_text().splitlines() == [f"127.0.0.1 {node.port}"]


def test_instance_connect_pushes_a_key_per_check_through_the_sandbox(
        node, sandbox, sandbox_client, tmp_path):
    """Discovery finds the instance (a fake private address: never connected to), a key
    made for this check is pushed with SendSSHPublicKey, and the node's sshd accepts it through
    its AuthorizedKeysCommand, as on EC2; the tunnel command stands in for the endpoint's."""
    region = "eu-west-1"
    cfg_file, ec2, subnet, ami, project = _sandbox_pool(sandbox_client, tmp_path, region,
                                                        "10.92", "eic")
    instance = _run_tagged(ec2, subnet, ami, "10.92.1.20", project, "chat-70b")
    (node.root / "eic.json").write_text(json.dumps({"endpoint": sandbox,
                                                    "instance_id": instance}))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.92.1.20 {_host_key(node)}\n")  # the node by its own address
    script, log = _relay(tmp_path)
    argv = [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file), "--sandbox",
            "--cloud", "aws", "--user", node.user, "--timeout", "20", "--known-hosts", str(kh),
            "--access", "instance-connect", "--json",
            "--proxy-command", f"{sys.executable} {script} {log} 127.0.0.1 {node.port} %i %r"]
    r = inproc.run_argv(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
    [n] = json.loads(r.stdout)["nodes"]
    assert n["host"] == "10.92.1.20:22" and n["ok"] is True
    assert log.read_text().splitlines() == [f"127.0.0.1 {node.port} {instance} {region}"]
    # The pushed key is one made for the check: not any key of this machine's.
    from tests.plugins.sandbox import sandbox_admin

    [pushed] = sandbox_admin(
        sandbox, "GET", f"/_poolctl/instance-connect?instance_id={instance}&user={node.user}"
    )["keys"]
    assert pushed.startswith("ssh-ed25519 ")
    assert pushed.split()[1] not in (node.root / "client_key.pub").read_text()

    # Without Instance Connect the node refuses this machine's other keys.
    (node.root / "eic.json").unlink()
    r = inproc.run_argv(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 1
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert "authentication failed" in ssh["observed"]
    assert "a key pushed by EC2 Instance Connect" in ssh["observed"]


def test_send_ssh_public_key_checks_the_instance(sandbox, sandbox_client):
    import botocore.exceptions

    eic = sandbox_client("ec2-instance-connect", "eu-west-1")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPtcQhW0m8JcGSz9lYpQ2bR5tN4mBvH3dEw1xY7zK0aL x"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        eic.send_ssh_public_key(InstanceId="i-0123456789abcdef0", InstanceOSUser="ubuntu",
                                SSHPublicKey=key)
    assert e.value.response["Error"]["Code"] == "EC2InstanceNotFoundException"


def test_instance_connect_in_the_sandbox_needs_a_local_tunnel(sandbox, tmp_path):
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
                        "--sandbox", "--cloud", "aws", "--access", "instance-connect"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert "--access instance-connect with --sandbox needs --proxy-command" in line


def test_sandbox_instance_connect_endpoints(sandbox, sandbox_client):
    """What `aws.node_access: instance-connect` deploys (the AWS provider creates, reads and
    deletes it so; a manual `deploy --sandbox` of it round-trips with an empty second plan)."""
    import botocore.exceptions

    ec2 = sandbox_client("ec2", "ap-south-1")
    vpc = ec2.create_vpc(CidrBlock="10.93.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.93.1.0/24")["Subnet"]["SubnetId"]
    made = ec2.create_instance_connect_endpoint(
        SubnetId=subnet, SecurityGroupIds=["sg-0123"], PreserveClientIp=False,
        TagSpecifications=[{"ResourceType": "instance-connect-endpoint",
                            "Tags": [{"Key": "poolctl:pool", "Value": "p"}]}],
    )["InstanceConnectEndpoint"]
    eid = made["InstanceConnectEndpointId"]
    assert (made["State"], made["VpcId"], made["SubnetId"], made["PreserveClientIp"]) == (
        "create-complete", vpc, subnet, False)
    [seen] = ec2.describe_instance_connect_endpoints(
        InstanceConnectEndpointIds=[eid])["InstanceConnectEndpoints"]
    assert seen["SecurityGroupIds"] == ["sg-0123"]
    assert seen["Tags"] == [{"Key": "poolctl:pool", "Value": "p"}]
    gone = ec2.delete_instance_connect_endpoint(InstanceConnectEndpointId=eid)
    assert gone["InstanceConnectEndpoint"]["State"] == "delete-complete"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.describe_instance_connect_endpoints(InstanceConnectEndpointIds=[eid])
    assert e.value.response["Error"]["Code"] == "InvalidInstanceConnectEndpointId.NotFound"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.create_instance_connect_endpoint(SubnetId="subnet-0000000000")
    assert e.value.response["Error"]["Code"] == "InvalidSubnetID.NotFound"


# --- GCP: IAP TCP forwarding with OS Login, against the Compute Engine / OS Login fake -------

GCP_PROJECT, GCP_REGION = "acme-prod", "us-central1"
GCP_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
ACCOUNT = "nodecheck@acme-prod.iam.gserviceaccount.com"


def _service_account_file(tmp_path: Path, email: str = ACCOUNT) -> Path:
    """A service-account key file (a fresh RSA key), as GOOGLE_APPLICATION_CREDENTIALS names
    one: google-auth reads the account from it without any network call."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": GCP_PROJECT, "private_key_id": "0" * 40,
        "private_key": pem, "client_email": email, "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    return path


@pytest.fixture
def gce(tmp_path):
    pytest.importorskip("google.cloud.compute_v1",
                        reason="google-cloud-compute is not installed (pip install -e .[gcp])")
    from tests.fakes.gce import FakeGce

    fake = FakeGce().start()
    yield fake
    fake.stop()
    assert fake.errors == []  # a shape the real messages refuse would read as empty


def _gcp_pool(gce, tmp_path: Path, *, node_access: str = "") -> tuple[Path, list[dict]]:
    """The contract's pool deployed in the fake: one running VM of its own, one VM of another
    pool, one stopped standby VM. Returns (file, the pool's running VMs)."""
    from poolctl import naming

    extra = f"      node_access: {node_access}\n" if node_access else ""
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(pool_yaml(extra_gcp=extra))
    cfg = parse_config(cfg_file.read_text())
    labels = naming.gcp_labels(cfg, cfg.pools[0])
    gce.deploy_pool(project=GCP_PROJECT, region=GCP_REGION, name="acme-chat-70b",
                    labels=labels, zones=GCP_ZONES, running=1, stopped=1)
    gce.deploy_pool(project=GCP_PROJECT, region=GCP_REGION, name="acme-other",
                    labels={**labels, naming.LABEL_POOL: "other"}, zones=GCP_ZONES,
                    template="acme-other-1", running=1)
    mine = [mi for mi in gce.instances(GCP_PROJECT, GCP_REGION, "acme-chat-70b")
            if mi["instanceStatus"] == "RUNNING"]
    return cfg_file, mine


def test_gcp_discovery_honours_the_endpoint_and_gives_name_and_zone(gce, tmp_path):
    from poolctl.endpoints import CloudEndpoints
    from poolctl.nodecheck.orchestration import discover_nodes

    cfg_file, [vm] = _gcp_pool(gce, tmp_path)
    gce.set_ip(vm["name"], "10.128.7.9")
    cfg = parse_config(cfg_file.read_text())
    zone = vm["instance"].split("/zones/")[1].split("/")[0]
    # The other pool's VM and the stopped standby VM are left out by the filter.
    assert discover_nodes(cfg, cfg.pools[0], "gcp", CloudEndpoints(gce_url=gce.endpoint)) == [
        ("10.128.7.9", vm["name"], zone)]
    [call] = [r for r in gce.requests if r["path"].endswith("/aggregated/instances")]
    assert call["query"]["filter"] == ('labels.poolctl-project = "acme" AND '
                                       'labels.poolctl-pool = "chat-70b" AND status = "RUNNING"')


def _iap_check(node, gce, tmp_path, cfg_file, *extra, env=None):
    script, log = _relay(tmp_path)
    # No --sandbox (it emulates AWS only): the Compute Engine fake is reached as any GCE
    # endpoint, and the proxy command stands in for the tunnel, so nothing leaves loopback.
    argv = [sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(cfg_file),
            "--cloud", "gcp", "--timeout", "20", "--known-hosts", str(tmp_path / "known_hosts"),
            "--json", "--proxy-command",
            f"{sys.executable} {script} {log} 127.0.0.1 {node.port} %i %z %P", *extra]
    run_env = {**os.environ, "POOLCTL_GCE_ENDPOINT": gce.endpoint,
               "GOOGLE_APPLICATION_CREDENTIALS": str(_service_account_file(tmp_path)),
               **(env or {})}
    return inproc.run_argv(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=run_env), log


def test_iap_imports_an_os_login_key_per_check_and_deletes_it(node, gce, tmp_path):
    """Discovery finds the VM (a fake private address: never connected to), a key made for
    this check is imported into the caller's OS Login profile for a short time, the node's
    sshd accepts it through its AuthorizedKeysCommand (on GCE: the guest agent asking the
    metadata server), the tunnel command stands in for gcloud's IAP tunnel, and the key is
    deleted after the login."""
    cfg_file, [vm] = _gcp_pool(gce, tmp_path, node_access="iap")
    gce.set_ip(vm["name"], "10.128.3.4")
    zone = vm["instance"].split("/zones/")[1].split("/")[0]
    gce.set_os_login_user(ACCOUNT, node.user)
    (node.root / "eic.json").write_text(json.dumps({"endpoint": gce.endpoint,
                                                    "instance_id": vm["name"]}))
    (tmp_path / "known_hosts").write_text(f"10.128.3.4 {_host_key(node)}\n")

    # No --access: the pool's gcp.node_access says iap.
    r, log = _iap_check(node, gce, tmp_path, cfg_file)
    assert r.returncode == 0, r.stderr + r.stdout  # --json: the failed check's details
    [n] = json.loads(r.stdout)["nodes"]
    assert n["host"] == "10.128.3.4:22" and n["ok"] is True and n["cloud"] == "gcp"
    ssh = by_name(n)["ssh"]["observed"]
    assert ssh.startswith(f"{node.user}@10.128.3.4:22, host key ssh-ed25519 ")
    assert f"as the OS Login user of {ACCOUNT}" in r.stderr
    # %i %z %P: the instance name, its zone and the project, each one argument.
    assert log.read_text().splitlines() == [f"127.0.0.1 {node.port} {vm['name']} {zone} "
                                            f"{GCP_PROJECT}"]
    [imp] = [q for q in gce.requests if q["path"].endswith(":importSshPublicKey")]
    assert imp["method"] == "POST" and imp["path"] == f"/v1/users/{ACCOUNT}:importSshPublicKey"
    assert imp["query"] == {"projectId": GCP_PROJECT}
    assert set(imp["body"]) == {"key", "expirationTimeUsec"}
    key = imp["body"]["key"]
    assert key.startswith("ssh-ed25519 ")
    assert key.split()[1] not in (node.root / "client_key.pub").read_text()
    [dele] = [q for q in gce.requests if q["method"] == "DELETE"]
    fp = dele["path"].rsplit("/", 1)[1]
    assert dele["path"] == f"/v1/users/{ACCOUNT}/sshPublicKeys/{fp}"
    assert gce.os_login_keys(ACCOUNT) == {}  # deleted, not left to expire
    # The node asked for the user's keys while the key was there (the login used it).
    asked = [q for q in gce.requests if q["path"] == "/_poolctl/instance-connect"]
    assert asked and asked[0]["query"] == {"instance_id": vm["name"], "user": node.user}


def test_iap_key_expires_soon(gce, tmp_path, monkeypatch):
    """The key's expiry: OS_LOGIN_KEY_TTL_S (300 s) after the import, in microseconds."""
    import time

    from poolctl.clouds.gcp.ops import GcpOps

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account_file(tmp_path)))
    gce.add_project(GCP_PROJECT)
    gce.set_os_login_user(ACCOUNT, "sa_1234")
    ops = GcpOps(client_options={"api_endpoint": gce.endpoint})
    assert ops.caller_account() == ACCOUNT
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPtcQhW0m8JcGSz9lYpQ2bR5tN4mBvH3dEw1xY7zK0aL"
    before = time.time()
    user, fp = ops.import_ssh_key(ACCOUNT, key, GCP_PROJECT, 300)
    after = time.time()
    assert user == "sa_1234"
    exp = int(gce.os_login_keys(ACCOUNT)[fp]["expirationTimeUsec"])
    assert int((before + 300) * 1e6) <= exp <= int((after + 300) * 1e6)
    ops.delete_ssh_key(ACCOUNT, fp)
    assert gce.os_login_keys(ACCOUNT) == {}
    ops.delete_ssh_key(ACCOUNT, fp)  # gone already: nothing to do


def test_iap_without_os_login_permission_fails_the_ssh_check(node, gce, tmp_path):
    cfg_file, [vm] = _gcp_pool(gce, tmp_path)
    (tmp_path / "known_hosts").write_text("")
    # No POSIX account for the caller: OS Login answers 403, nothing is connected to.
    r, log = _iap_check(node, gce, tmp_path, cfg_file, "--access", "iap")
    assert r.returncode == 1, r.stderr
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert ssh["ok"] is False
    assert ssh["observed"].startswith(f"GCP OS Login importSshPublicKey for {ACCOUNT}: 403 ")
    assert "roles/compute.osAdminLogin" in ssh["hint"]
    assert not log.exists() and node.calls() == []


def test_iap_login_refused_when_the_node_does_not_take_the_key(node, gce, tmp_path):
    cfg_file, [vm] = _gcp_pool(gce, tmp_path)
    gce.set_ip(vm["name"], "10.128.3.5")
    gce.set_os_login_user(ACCOUNT, node.user)
    (tmp_path / "known_hosts").write_text(f"10.128.3.5 {_host_key(node)}\n")
    # No eic.json: the node's sshd is not told of OS Login keys, so it refuses this one.
    r, _ = _iap_check(node, gce, tmp_path, cfg_file, "--access", "iap")
    assert r.returncode == 1, r.stderr
    ssh = json.loads(r.stdout)["nodes"][0]["checks"][0]
    assert ssh["observed"].startswith(f"authentication failed for {node.user}@10.128.3.5:22 "
                                      "with a key imported into your OS Login profile")
    assert "OS Login refused you" in ssh["hint"]
    assert gce.os_login_keys(ACCOUNT) == {}  # deleted after the failed login too


@pytest.mark.parametrize(("args", "needle"), [
    (["--cloud", "aws", "--access", "iap"],
     "--access iap: IAP TCP forwarding with OS Login is GCP's; add --cloud gcp"),
    (["--cloud", "gcp", "--access", "instance-connect"],
     "--access instance-connect: EC2 Instance Connect is AWS's; add --cloud aws, or use "
     "--access iap for GCP"),
    (["--cloud", "gcp", "--access", "iap", "--user", "ubuntu"],
     "--user: with --access iap poolctl logs in as your OS Login user"),
    (["--cloud", "gcp", "--access", "iap", "--identity", "/k"], "--identity: iap logs in"),
])
def test_access_refusals_are_one_line_exit_2(args, needle):
    env = {**os.environ, "POOLCTL_GCE_ENDPOINT": "http://127.0.0.1:9"}
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
                        *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert needle in line


@pytest.mark.parametrize(("args", "needle"), [
    (["--cloud", "aws", "--access", "instance-connect"],
     "--access instance-connect with --sandbox needs --proxy-command: the default tunnel (aws "
     "ec2-instance-connect open-tunnel --instance-id) would leave this machine"),
    (["--cloud", "gcp", "--access", "iap"],
     "--sandbox: the sandbox emulates AWS only; use --cloud aws"),
])
def test_sandbox_access_refusals_are_one_line_exit_2(sandbox, args, needle):
    """With --sandbox nothing may leave this machine: no default tunnel, and no GCP (the
    sandbox emulates AWS only)."""
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "nodes", "check", "-f", str(EXAMPLE),
                        "--sandbox", *args], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert needle in line


def test_iap_key_left_to_expire_is_said(node, gce, tmp_path):
    cfg_file, [vm] = _gcp_pool(gce, tmp_path)
    gce.set_ip(vm["name"], "10.128.3.6")
    gce.set_os_login_user(ACCOUNT, node.user)
    (node.root / "eic.json").write_text(json.dumps({"endpoint": gce.endpoint,
                                                    "instance_id": vm["name"]}))
    (tmp_path / "known_hosts").write_text(f"10.128.3.6 {_host_key(node)}\n")
    gce.fail_next("DELETE", r"/sshPublicKeys/", 503)
    r, _ = _iap_check(node, gce, tmp_path, cfg_file, "--access", "iap")
    assert r.returncode == 0, r.stderr  # the node is fine; the note says what was left
    ssh = by_name(json.loads(r.stdout)["nodes"][0])["ssh"]["observed"]
    assert ssh.endswith("; the imported key was not deleted (GCP OS Login delete key of "
                        f"{ACCOUNT}: 503 injected failure); it expires by itself")
    [left] = gce.os_login_keys(ACCOUNT).values()
    assert left["key"].startswith("ssh-ed25519 ")
