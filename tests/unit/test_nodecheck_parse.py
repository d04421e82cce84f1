"""The parsing and judging half of `poolctl nodes check` (poolctl.nodecheck.checks), on output
recorded from the tools' formats, without SSH; and what needs no connection of the rest (ssh,
orchestration). The SSH half runs against a real sshd in tests/ops/test_nodes_check.py.

The spec is the contract example on AWS: p5.48xlarge (8x H100, 81920 MiB in the catalog),
vllm/vllm-openai:v0.34.0 on port 8000, cache need 70.6e9 x 2 B x 1.2 = 169,440,000,000 B.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config, parse_config
from poolctl.endpoints import CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.nodecheck import checks, orchestration, ssh
from tests.configs import pool_yaml

# What --sandbox resolves to, as far as plan_work looks (no sandbox needed).
SANDBOX_LIKE = CloudEndpoints(flag="--sandbox", clouds=frozenset({Cloud.aws}), loopback_only=True)
LOOPBACK_ONLY = CloudEndpoints(flag="--sandbox", loopback_only=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config(EXAMPLE)


@pytest.fixture(scope="module")
def spec(cfg):
    return checks.spec_for(cfg.pools[0], "aws")


def ok(stdout: str = "", rc: int = 0, stderr: str = "") -> checks.CmdResult:
    return checks.CmdResult(rc, stdout, stderr)


H100 = "NVIDIA H100 80GB HBM3, 81559 MiB\n"

# `nvidia-smi topo -m` of an 8x H100 SXM node (tabs as nvidia-smi prints them).
TOPO_P5 = "\t" + "\t".join(f"GPU{i}" for i in range(8)) + \
    "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" + "".join(
        f"GPU{i}\t" + "\t".join(" X " if j == i else "NV18" for j in range(8))
        + ("\t0-47,96-143\t0\t\tN/A\n" if i < 4 else "\t48-95,144-191\t1\t\tN/A\n")
        for i in range(8)) + """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# A PCIe-only 4-GPU box (g6e-like): no NVLink anywhere.
TOPO_PCIE = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPHB\tSYS\tSYS\t0-47\t0\t\tN/A
GPU1\tPHB\t X \tSYS\tSYS\t0-47\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tPHB\t48-95\t1\t\tN/A
GPU3\tSYS\tSYS\tPHB\t X \t48-95\t1\t\tN/A

Legend:

  X    = Self
"""

# 2 GPUs plus NIC columns and rows, and a NIC legend (an EFA node).
TOPO_NIC = """\
\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tPXB\tSYS\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tSYS\tPXB\t0-47\t0\t\tN/A
NIC0\tPXB\tSYS\t X \tSYS
NIC1\tSYS\tPXB\tSYS\t X

Legend:

  X    = Self

NIC Legend:

  NIC0: rdmap16s27
  NIC1: rdmap32s27
"""


def nvlink_s(gpus: int = 8, links: int = 18, inactive: dict[int, int] | None = None) -> str:
    inactive = inactive or {}
    out = []
    for g in range(gpus):
        out.append(f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-{g:012x})")
        for link in range(links):
            speed = "<inactive>" if link < inactive.get(g, 0) else "26.562 GB/s"
            out.append(f"\t Link {link}: {speed}")
    return "\n".join(out) + "\n"


# --- the spec --------------------------------------------------------------------------


def test_spec_from_the_example(spec):
    assert (spec.instance_type, spec.gpu, spec.gpus, spec.hbm_mib_per_gpu) == (
        "p5.48xlarge", "H100", 8, 81920)
    assert spec.nvlink is True
    assert spec.image == "vllm/vllm-openai:v0.34.0"
    assert spec.health_url == "http://127.0.0.1:8000/health"
    assert spec.cache_mount == "/mnt/poolctl-cache"
    # 70.6e9 parameters x 2 bytes (bfloat16) x 1.2 headroom
    assert spec.cache_bytes_needed == 169_440_000_000


def test_spec_for_gcp(cfg):
    s = checks.spec_for(cfg.pools[0], "gcp")
    assert (s.instance_type, s.gpu, s.gpus) == ("a3-highgpu-8g", "H100", 8)


# --- gpus --------------------------------------------------------------------------------


def test_parse_gpus_with_and_without_units():
    assert checks.parse_gpus(H100 * 2) == [checks.Gpu("NVIDIA H100 80GB HBM3", 81559)] * 2
    assert checks.parse_gpus("NVIDIA A100-SXM4-40GB, 40960\n") == [
        checks.Gpu("NVIDIA A100-SXM4-40GB", 40960)]
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        checks.parse_gpus("No devices were found\n")


def test_gpus_pass(spec):
    c = checks.check_gpus(ok(H100 * 8), spec)
    assert c.ok and c.observed == "8x NVIDIA H100 80GB HBM3 (81559 MiB)" and c.hint is None


def test_gpus_seven(spec):
    c = checks.check_gpus(ok(H100 * 7), spec)
    assert not c.ok and c.observed.startswith("7 GPUs: 7x NVIDIA H100")
    assert c.hint.startswith("expected 8x H100 (p5.48xlarge)")


def test_gpus_wrong_model_and_small_hbm(spec, cfg):
    c = checks.check_gpus(ok("NVIDIA A100-SXM4-80GB, 81920 MiB\n" * 8), spec)
    assert not c.ok and c.observed.startswith("wrong model")
    # p4de rows are A100 80GB: a 40GB A100 has the right name but half the memory.
    p4de = checks.spec_for(parse_config(pool_yaml(instance_type="p4de.24xlarge")).pools[0], "aws")
    c = checks.check_gpus(ok("NVIDIA A100-SXM4-40GB, 40960 MiB\n" * 8), p4de)
    assert not c.ok and c.observed.startswith("too little HBM")
    # 79000 MiB is within 5 % of 81920 (floor 77824): still an H100 80GB.
    assert checks.check_gpus(ok("NVIDIA H100 80GB HBM3, 79000 MiB\n" * 8), spec).ok


def test_gpus_driver_missing_or_failing(spec):
    c = checks.check_gpus(ok(rc=127, stderr="bash: nvidia-smi: command not found"), spec)
    assert not c.ok and c.observed == "nvidia-smi not found"
    c = checks.check_gpus(ok(rc=9, stdout="NVIDIA-SMI has failed because it couldn't communicate "
                                          "with the NVIDIA driver."), spec)
    assert not c.ok and "couldn't communicate" in c.observed


# --- nvlink ------------------------------------------------------------------------------


def test_parse_topo_p5():
    links = checks.parse_topo(TOPO_P5)
    assert len(links) == 8 * 7  # ordered pairs
    assert set(links.values()) == {"NV18"}


def test_parse_topo_reads_past_nic_columns():
    assert checks.parse_topo(TOPO_NIC) == {("GPU0", "GPU1"): "NV18", ("GPU1", "GPU0"): "NV18"}


def test_nvlink_pass(spec):
    c = checks.check_nvlink(ok(TOPO_P5), ok(nvlink_s()), spec)
    assert c.ok, c.observed
    assert c.observed == "all 28 GPU pairs over NVLink (NV18); 18 active links per GPU"


def test_nvlink_pcie_only_fails(spec):
    c = checks.check_nvlink(ok(TOPO_PCIE), ok(""), spec)
    assert not c.ok
    # 4 GPUs: 6 pairs, none over NVLink; the first four are named.
    assert c.observed == ("6 of 6 GPU pairs not over NVLink: GPU0-GPU1 PHB, GPU0-GPU2 SYS, "
                          "GPU0-GPU3 SYS, GPU1-GPU2 SYS and 2 more")


def test_nvlink_inactive_links_fail(spec):
    c = checks.check_nvlink(ok(TOPO_P5), ok(nvlink_s(inactive={3: 2})), spec)
    assert not c.ok and c.observed == "links down: GPU3 2 of 18 inactive"
    assert "nvidia-fabricmanager" in c.hint


def test_parse_nvlink_status():
    assert checks.parse_nvlink_status(nvlink_s(gpus=2, links=4, inactive={1: 4})) == {
        "GPU0": (4, 0), "GPU1": (0, 4)}


def test_nvlink_topo_garbage(spec):
    c = checks.check_nvlink(ok("NVML: Unknown Error\n"), ok(""), spec)
    assert not c.ok and "no GPU header row" in c.observed


# --- no-efa ------------------------------------------------------------------------------

LSPCI_ENA = ("00:05.0 Ethernet controller [0200]: Amazon.com, Inc. Elastic Network Adapter "
             "(ENA) [1d0f:ec20]\n")
LSPCI_EFA = ("10:1b.0 Ethernet controller [0200]: Amazon.com, Inc. Elastic Fabric Adapter "
             "(EFA) [1d0f:efa1]\n")
LSPCI_CX7 = ("c1:00.0 Ethernet controller [0200]: Mellanox Technologies MT2910 Family "
             "[ConnectX-7] [15b3:1021]\n")
FI_NONE = checks.CmdResult(1, "", "fi_getinfo: -61 (No data available)\n")


def test_rdma_pci_devices():
    assert checks.rdma_pci_devices(LSPCI_ENA) == []
    assert checks.rdma_pci_devices(LSPCI_ENA + LSPCI_EFA + LSPCI_CX7) == [
        LSPCI_EFA.strip(), LSPCI_CX7.strip()]


def test_no_efa_pass_and_tools_missing():
    c = checks.check_no_efa(ok(""), ok(LSPCI_ENA), FI_NONE)
    assert c.ok and c.observed.startswith("none (no /sys/class/infiniband device")
    c = checks.check_no_efa(ok(""), ok(rc=127), ok(rc=127))
    assert c.ok and "lspci not installed" in c.observed


def test_no_efa_each_source_fails_alone():
    assert not checks.check_no_efa(ok("rdmap16s27\n"), ok(LSPCI_ENA), FI_NONE).ok
    assert not checks.check_no_efa(ok(""), ok(LSPCI_CX7), FI_NONE).ok
    fi = ok("provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n")
    c = checks.check_no_efa(ok(""), ok(LSPCI_ENA), fi)
    assert not c.ok and c.observed == "fi_info -p efa lists the efa provider"


# --- cache -------------------------------------------------------------------------------

DF = "Mounted on             1B-blocks           Avail\n"


def test_parse_findmnt_and_df():
    assert checks.parse_findmnt("/dev/md127 xfs\n") == ("/dev/md127", "xfs")
    assert checks.parse_findmnt("") is None
    assert checks.parse_df(DF + "/mnt/poolctl-cache 30397335011328 30224942011328\n") == (
        "/mnt/poolctl-cache", 30397335011328, 30224942011328)
    with pytest.raises(ValueError):
        checks.parse_df(DF)


def test_cache_mount(spec):
    assert checks.check_cache_mount(ok("/dev/md127 xfs\n"), spec).ok
    assert checks.check_cache_mount(ok("/dev/nvme1n1 ext4\n"), spec).ok
    c = checks.check_cache_mount(ok(rc=1), spec)
    assert not c.ok and c.observed == "nothing mounted at /mnt/poolctl-cache"
    # A tmpfs or the root volume at the mount point is not the NVMe cache.
    c = checks.check_cache_mount(ok("tmpfs tmpfs\n"), spec)
    assert not c.ok and "not the local NVMe" in c.observed


def test_cache_size_boundary(spec):
    need = 169_440_000_000
    assert checks.check_cache_size(ok(DF + f"/mnt/poolctl-cache {need} {need}\n"), spec).ok
    c = checks.check_cache_size(ok(DF + f"/mnt/poolctl-cache {need - 1} 0\n"), spec)
    assert not c.ok
    assert c.observed == ("169.4 GB (169,439,999,999 B), 0.0 GB free; the weights need "
                          "169.4 GB with 20% headroom")


def test_cache_size_unmounted(spec):
    c = checks.check_cache_size(ok(DF + "/ 207929917440 150312738816\n"), spec)
    assert not c.ok and c.observed.startswith("not checked: /mnt/poolctl-cache is not mounted")


# --- image, health -----------------------------------------------------------------------


def test_image(spec):
    c = checks.check_image(ok("sha256:" + "ab" * 32 + "\n"), spec)
    assert c.ok and c.short == "abababababab"
    c = checks.check_image(ok("\n", 1, "Error: No such image: vllm/vllm-openai:v0.34.0\n"), spec)
    assert not c.ok and "docker pull vllm/vllm-openai:v0.34.0" in c.hint
    denied = ("permission denied while trying to connect to the Docker daemon socket at "
              "unix:///var/run/docker.sock\n")
    c = checks.check_image(ok("", 1, denied), spec)
    assert not c.ok and "docker group" in c.hint


@pytest.mark.parametrize(("res", "good", "observed"), [
    (checks.CmdResult(0, "200"), True, "200 from http://127.0.0.1:8000/health"),
    (checks.CmdResult(22, "503", "curl: (22) The requested URL returned error: 503"), False,
     "HTTP 503 from http://127.0.0.1:8000/health"),
    (checks.CmdResult(7, "000", "curl: (7) Failed to connect"), False,
     "http://127.0.0.1:8000/health: connection refused: nothing listens on the port"),
    (checks.CmdResult(28, "000", "curl: (28) Operation timed out"), False,
     "http://127.0.0.1:8000/health: timed out"),
    (checks.CmdResult(None, error="`curl` did not finish in 10 s"), False,
     "http://127.0.0.1:8000/health: `curl` did not finish in 10 s"),
])
def test_health(spec, res, good, observed):
    c = checks.check_health(res, spec)
    assert (c.ok, c.observed) == (good, observed)


# --- the composition, with a fake runner ------------------------------------------------


def healthy_outputs(spec) -> dict[str, checks.CmdResult]:
    cmd = checks.commands(spec)
    return {
        cmd["gpus"]: ok(H100 * 8),
        cmd["topo"]: ok(TOPO_P5),
        cmd["nvlink"]: ok(nvlink_s()),
        cmd["infiniband"]: ok(""),
        cmd["lspci"]: ok(LSPCI_ENA),
        cmd["fi_info"]: FI_NONE,
        cmd["findmnt"]: ok("/dev/md127 xfs\n"),
        cmd["df"]: ok(DF + "/mnt/poolctl-cache 30397335011328 30224942011328\n"),
        cmd["image"]: ok("sha256:" + "0" * 64 + "\n"),
        cmd["health"]: ok("200"),
    }


def test_run_checks_healthy(spec):
    outputs = healthy_outputs(spec)
    ran = []

    def run(cmd):
        ran.append(cmd)
        return outputs[cmd]

    results = checks.run_checks(run, spec)
    assert [c.name for c in results] == list(checks.CHECK_NAMES[1:])
    assert all(c.ok for c in results), [c for c in results if not c.ok]
    assert sorted(ran) == sorted(outputs)


def test_commands_quote_config_values(spec):
    from dataclasses import replace

    odd = replace(spec, image="repo/img:v1;rm -rf /", health_path="/health?x=$(id)")
    cmd = checks.commands(odd)
    assert cmd["image"] == "docker image inspect --format '{{.Id}}' 'repo/img:v1;rm -rf /'"
    assert cmd["health"].endswith("'http://127.0.0.1:8000/health?x=$(id)'")


# --- hosts and planning ------------------------------------------------------------------


@pytest.mark.parametrize(("text", "host", "port", "label"), [
    ("10.0.0.5", "10.0.0.5", 22, "10.0.0.5:22"),
    ("10.0.0.5:2222", "10.0.0.5", 2222, "10.0.0.5:2222"),
    ("node-1.internal", "node-1.internal", 22, "node-1.internal:22"),
    ("[fd00::5]:2200", "fd00::5", 2200, "[fd00::5]:2200"),
    ("fd00::5", "fd00::5", 22, "[fd00::5]:22"),
])
def test_parse_host(text, host, port, label):
    h = ssh.parse_host(text)
    assert (h.host, h.port, h.label) == (host, port, label)


def test_known_hosts_name():
    assert ssh.parse_host("10.0.0.5").known_hosts_name == "10.0.0.5"
    assert ssh.parse_host("10.0.0.5:2222").known_hosts_name == "[10.0.0.5]:2222"


@pytest.mark.parametrize("bad", ["10.0.0.5:0", "10.0.0.5:x", "10.0.0.5:70000", ":22", "[::1",
                                 "-oProxyCommand=x"])
def test_parse_host_rejects(bad):
    with pytest.raises(UsageError, match="--host"):
        ssh.parse_host(bad)


def test_plan_work_hosts_need_one_target(cfg):
    both = cfg.targets(None, None)
    with pytest.raises(UsageError, match="--host: the nodes could belong to chat-70b/aws, "
                                         "chat-70b/gcp"):
        orchestration.plan_work(cfg, both, ["10.0.0.5"])
    work = orchestration.plan_work(cfg, cfg.targets(None, "aws"),
                                   ["10.0.0.5", "10.0.0.5:22", "10.0.0.6"], default_port=22)
    assert [h.label for h, _ in work] == ["10.0.0.5:22", "10.0.0.6:22"]


def test_plan_work_discovery(cfg, monkeypatch):
    monkeypatch.delenv("POOLCTL_GCE_ENDPOINT", raising=False)
    seen = []

    def discover(c, pool, cloud, endpoints):
        seen.append((pool.name, cloud, endpoints))
        return ["10.40.1.7", "10.40.1.12"] if cloud == "aws" else []

    work = orchestration.plan_work(cfg, cfg.targets(None, "aws"), None, default_port=2222,
                                   discover=discover)
    assert [(h.label, s.cloud) for h, s in work] == [("10.40.1.7:2222", "aws"),
                                                      ("10.40.1.12:2222", "aws")]
    with pytest.raises(OperationFailed, match="no running node of pool chat-70b on gcp in "
                                              "us-central1"):
        orchestration.plan_work(cfg, cfg.targets(None, "gcp"), None, discover=discover)
    with pytest.raises(UsageError, match="--sandbox: the sandbox emulates AWS only"):
        orchestration.plan_work(cfg, cfg.targets(None, None), None, endpoints=SANDBOX_LIKE,
                                discover=discover)


def test_plan_work_gcp_hosts_carry_name_zone_and_project(cfg, monkeypatch):
    def discover(c, pool, cloud, endpoints):
        return [("10.128.0.9", "acme-chat-70b-0a1b", "us-central1-b")]

    [(host, spec)] = orchestration.plan_work(cfg, cfg.targets(None, "gcp"), None, discover=discover)
    assert host == ssh.Host("10.128.0.9", 22, "acme-chat-70b-0a1b", region="us-central1",
                            zone="us-central1-b", project="acme-prod")
    assert spec.cloud == "gcp"
    # Endpoints whose node addresses are not real (loopback only), on any cloud: a fake
    # private address is not connected to directly, only through a proxy command.
    fake_addresses = CloudEndpoints(flag="--sandbox", loopback_only=True)
    with pytest.raises(UsageError, match="node address 10.128.0.9 of pool chat-70b is a fake"):
        orchestration.plan_work(cfg, cfg.targets(None, "gcp"), None, endpoints=fake_addresses,
                                discover=discover)
    assert len(orchestration.plan_work(cfg, cfg.targets(None, "gcp"), None,
                                       endpoints=fake_addresses, discover=discover,
                                       direct=False)) == 1


def test_gcp_running_filter_and_addresses(cfg):
    compute_v1 = pytest.importorskip("google.cloud.compute_v1",
                                     reason="google-cloud-compute not installed")
    from poolctl.clouds.gcp.ops import running_filter, running_nodes

    pool = cfg.pools[0]
    assert running_filter(cfg, pool) == ('labels.poolctl-project = "acme" AND '
                                        'labels.poolctl-pool = "chat-70b" AND status = "RUNNING"')

    def vm(ip, status="RUNNING"):
        return compute_v1.Instance(name=f"vm-{ip}", status=status, network_interfaces=[
            compute_v1.NetworkInterface(network_i_p=ip)])

    pages = [
        ("zones/us-central1-a", compute_v1.InstancesScopedList(instances=[vm("10.128.0.9")])),
        ("zones/us-central1-b", compute_v1.InstancesScopedList(
            instances=[vm("10.128.0.10"), vm("10.128.0.11", "STOPPING")])),
        ("zones/us-east1-b", compute_v1.InstancesScopedList(instances=[vm("10.142.0.2")])),
        ("zones/us-central1-c", compute_v1.InstancesScopedList()),  # a zone with none
    ]
    assert running_nodes(pages, "us-central1") == [
        ("10.128.0.9", "vm-10.128.0.9", "us-central1-a"),
        ("10.128.0.10", "vm-10.128.0.10", "us-central1-b")]


# --- SSH options: problems caught before any connection (exit 2) --------------------------


def test_ssh_options_identity(tmp_path):
    paramiko = pytest.importorskip("paramiko")
    with pytest.raises(UsageError, match="--identity .*: no such file"):
        ssh.SshOptions(identity=tmp_path / "missing")
    pub = tmp_path / "id.pub"
    pub.write_text("ssh-ed25519 "
                   "AAAAC3NzaC1lZDI1NTE5AAAAIHH+z+tCcomA5bYMr5J28P8bJeAaq6WX1lYTZ6bSTeg+\n")
    with pytest.raises(UsageError, match="not a private key"):
        ssh.SshOptions(identity=pub)
    locked = tmp_path / "id_locked"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(locked), password="s3cret")
    with pytest.raises(UsageError, match="passphrase-protected; load it into ssh-agent"):
        ssh.SshOptions(identity=locked)
    if shutil.which("ssh-keygen"):  # OpenSSH's own format, as users' keys are
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f",
                        str(tmp_path / "id_ed25519")], check=True)
        with pytest.raises(UsageError, match="passphrase-protected"):
            ssh.SshOptions(identity=tmp_path / "id_ed25519")
    plain = tmp_path / "id_plain"
    key = paramiko.RSAKey.generate(2048)
    key.write_private_key_file(str(plain))
    assert ssh.SshOptions(identity=plain).pkey.asbytes() == key.asbytes()


def test_ssh_options_other_usage(tmp_path):
    with pytest.raises(UsageError, match="--known-hosts .*: no such file"):
        ssh.SshOptions(known_hosts=tmp_path / "nope")
    with pytest.raises(UsageError, match="--timeout 0"):
        ssh.SshOptions(timeout=0)



# --- known_hosts (sshd(8) SSH_KNOWN_HOSTS FILE FORMAT) ---------------------------------------


@pytest.mark.parametrize(("patterns", "name", "expected"), [
    ("10.0.1.5", "10.0.1.5", True),
    ("10.0.*", "10.0.1.5", True),
    ("10.0.?.5", "10.0.1.5", True),
    ("10.0.?.5", "10.0.12.5", False),  # ? is one character
    ("*.internal", "NODE-1.Internal", True),  # host names compare case-insensitively
    ("10.0.*,!10.0.9.*", "10.0.9.1", False),  # a negated match excludes, whatever else hits
    ("10.0.*,!10.0.9.*", "10.0.1.1", True),
    ("!10.0.9.*", "10.0.1.1", False),  # negation alone matches nothing
    ("[10.0.1.5]:2222", "[10.0.1.5]:2222", True),
    ("[10.0.1.5]:2222", "10.0.1.5", False),  # another port is another host
    ("[10.0.*]:2222", "[10.0.1.5]:2222", True),
    ("10.0.1.5", "10.0.1.50", False),
    ("a+b.example", "a+b.example", True),  # regex characters are literal
    ("a+b.example", "aab.example", False),
])
def test_host_patterns(patterns, name, expected):
    assert ssh.host_matches(patterns, name) is expected


def test_hashed_host_names():
    import base64
    import hashlib
    import hmac

    salt = b"0123456789abcdefghij"
    digest = hmac.new(salt, b"[10.0.1.5]:2222", hashlib.sha1).digest()
    field = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    assert ssh.host_matches(field, "[10.0.1.5]:2222")
    assert not ssh.host_matches(field, "10.0.1.5")
    assert not ssh.host_matches("|1|not-base64|x", "10.0.1.5")


def test_read_known_hosts_keeps_markers_and_skips_what_openssh_skips(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("# comment\n\n"
                  "10.0.* ssh-ed25519 AAAA1 node key\n"
                  "@cert-authority *.internal ssh-ed25519 AAAA2\n"
                  "@revoked * ssh-rsa AAAA3\n"
                  "@unknown-marker * ssh-rsa AAAA4\n"
                  "just-two fields\n")
    assert ssh.read_known_hosts(kh) == [
        ssh.KnownHost(3, None, "10.0.*", "ssh-ed25519", "AAAA1"),
        ssh.KnownHost(4, "@cert-authority", "*.internal", "ssh-ed25519", "AAAA2"),
        ssh.KnownHost(5, "@revoked", "*", "ssh-rsa", "AAAA3"),
    ]


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.77.1.50", True), ("::1", True), ("localhost", True),
    ("10.0.0.5", False), ("node.internal", False), ("128.0.0.1", False), ("::2", False),
])
def test_is_loopback(host, loopback):
    assert orchestration.is_loopback(host) is loopback


def test_proxy_command_words_keep_each_value_one_argument():
    host = ssh.Host("10.0.1.5", 22, instance_id="i-0abc; rm -rf /", region="us-east-1")
    assert ssh.proxy_argv(ssh.TUNNEL_COMMAND, host) == [
        "aws", "ec2-instance-connect", "open-tunnel", "--instance-id", "i-0abc; rm -rf /",
        "--remote-port", "22", "--region", "us-east-1"]
    assert ssh.proxy_argv("relay '%h port %p' 100%%", host) == [
        "relay", "10.0.1.5 port 22", "100%"]
    vm = ssh.Host("10.128.0.9", 22, "node-1 $(id)", region="us-central1",
                  zone="us-central1-a", project="acme-prod")
    assert ssh.proxy_argv(ssh.IAP_TUNNEL_COMMAND, vm) == [
        "gcloud", "compute", "start-iap-tunnel", "node-1 $(id)", "22", "--listen-on-stdin",
        "--zone", "us-central1-a", "--project", "acme-prod"]


def test_proxy_command_needs_what_only_discovery_knows():
    pytest.importorskip("paramiko")
    with pytest.raises(ssh.SshFailure, match=r"needs %P %i %z .* of 10.0.0.5:22"):
        ssh.proxy_socket(ssh.IAP_TUNNEL_COMMAND, ssh.parse_host("10.0.0.5"))


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"access": "telnet"}, "--access telnet: use one of ssh, instance-connect, iap"),
    ({"access": "iap", "identity": Path("/k")}, "--identity: iap logs in with a key made"),
    ({"access": "iap", "user": "ubuntu"}, "--user: with --access iap poolctl logs in as your"),
    ({"access": "iap", "endpoints": LOOPBACK_ONLY},
     "--access iap with --sandbox needs --proxy-command"),
    ({"access": "instance-connect", "identity": Path("/k")}, "--identity: instance-connect"),
    ({"proxy_command": "relay 'unclosed"}, "--proxy-command: cannot split it"),
    ({"access": "instance-connect", "endpoints": SANDBOX_LIKE}, "needs --proxy-command"),
])
def test_access_options_are_checked_before_any_connection(kwargs, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        ssh.SshOptions(**kwargs)


def test_access_defaults():
    assert ssh.SshOptions().user == "ubuntu" and ssh.SshOptions().proxy_command is None
    iap = ssh.SshOptions(access="iap")
    assert iap.user is None  # OS Login's POSIX user, learnt per login
    assert iap.proxy_command == ssh.IAP_TUNNEL_COMMAND and iap.os_login is not None


# --- one command on the node: a failed SSH channel is tried once more, a timeout is not -----


class _Stream:
    def __init__(self, data: bytes, channel) -> None:
        self.data, self.channel = data, channel

    def read(self) -> bytes:
        if isinstance(self.data, BaseException):
            raise self.data
        return self.data


class _Channel:
    def __init__(self, rc: int) -> None:
        self.rc, self.closed = rc, False

    def recv_exit_status(self) -> int:
        return self.rc

    def close(self) -> None:
        self.closed = True


class _Client:
    """paramiko's SSHClient as `command_runner` uses it: each exec_command answers the next script
    entry (an exception to raise at open, or (stdout, exit status))."""

    def __init__(self, *script) -> None:
        self.script, self.calls = list(script), 0
        self.channels: list[_Channel] = []

    def exec_command(self, cmd, timeout):
        self.calls += 1
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        out, rc = step
        chan = _Channel(rc)
        self.channels.append(chan)
        return None, _Stream(out, chan), _Stream(b"", chan)


def test_a_channel_that_would_not_open_is_tried_once_more():
    client = _Client(EOFError("channel open failed"), (b"GPU0\tX\n", 0))
    res = ssh.command_runner(client, 20)("nvidia-smi topo -m")
    assert (res.rc, res.stdout, client.calls) == (0, "GPU0\tX\n", 2)


def test_a_missing_exit_status_is_tried_once_more_and_then_said():
    client = _Client((b"", -1), (b"", -1))
    res = ssh.command_runner(client, 20)("nvidia-smi topo -m")
    assert (res.rc, res.error, client.calls) == (None, "no exit status", 2)
    assert all(ch.closed for ch in client.channels)  # both sessions freed (MaxSessions)


def test_a_timeout_is_not_tried_again_and_a_real_exit_status_stands():
    chan = _Channel(0)
    hung = _Client(None)
    hung.script = []

    def exec_command(cmd, timeout):
        hung.calls += 1
        return None, _Stream(TimeoutError(), chan), _Stream(b"", chan)

    hung.exec_command = exec_command
    res = ssh.command_runner(hung, 7)("nvidia-smi topo -m")
    assert (res.rc, res.error, hung.calls) == (None, "`nvidia-smi` did not finish in 7 s", 1)
    failing = _Client((b"", 3))
    assert (ssh.command_runner(failing, 20)("nvidia-smi topo -m").rc, failing.calls) == (3, 1)
