"""`poolctl nodes check`: SSH into pool nodes and verify what the pool needs of each one.

Per node, in order: `ssh` (strict host-key checking, never trust on first use), `gpus` (count,
model and HBM of the catalog row), `nvlink` (every GPU pair over NVLink, no inactive link),
`no-efa` (no EFA / RDMA NIC: inference pools leave them off), `cache-mount` (the NVMe cache at
`naming.CACHE_MOUNT`), `cache-size` (room for the weights with the rule's headroom), `image`
(the serving image on the node) and `health` (the server answers 200 on its health path).

The command outputs are parsed by small pure functions (unit-tested on recorded output); the
SSH layer only runs commands and maps connection failures to one clear line. paramiko, boto3
and google-cloud are imported inside the functions that need them, so `poolctl --help` stays
fast.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import logging
import re
import shlex
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from poolctl import naming, sizing
from poolctl.adaptors.aws import botocore_exceptions
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError

if TYPE_CHECKING:  # paramiko loads in the functions that connect
    import paramiko

DEFAULT_USER = "ubuntu"
DEFAULT_PORT = 22
DEFAULT_TIMEOUT_S = 10.0
MAX_WORKERS = 8
# nvidia-smi reports a little less HBM than the marketing size the catalog copies
# (H100 80GB: 81559 of 81920 MiB, H200: 143771 of 144384); a wrong SKU is far below this.
HBM_TOLERANCE = 0.95
CHECK_NAMES = ("ssh", "gpus", "nvlink", "no-efa", "cache-mount", "cache-size", "image", "health")
# Test hook, like POOLCTL_NVME_DEVICES in the cache script: the sysfs root the no-efa check
# lists, so a test can give a node RDMA devices without a kernel driver.
SYSFS_ENV = "POOLCTL_SYSFS"
BOOT_HINT = "see `sudo journalctl -u poolctl-node` (the boot unit runs on every start)"
# How nodes are reached: `ssh` with the caller's keys, straight to the address (from inside
# the VPC, a VPN or a bastion); `instance-connect` (AWS): a key made for this check only,
# pushed with ec2-instance-connect:SendSSHPublicKey (valid 60 s), and SSH through the pool's
# EC2 Instance Connect Endpoint (the AWS CLI's WebSocket tunnel): no public port, no key pair.
# `iap` (GCP): a key made for this check only, imported into the caller's OS Login profile
# (expiring after OS_LOGIN_KEY_TTL_S, deleted once logged in), and SSH through Identity-Aware
# Proxy's TCP forwarding (gcloud's tunnel), logging in as the caller's OS Login POSIX user.
ACCESS_MODES = ("ssh", "instance-connect", "iap")
# The tunnels, run as SSH's ProxyCommand (stdin/stdout carry the SSH stream). %i: instance id
# (GCP: instance name), %h: address, %p: port, %r: region, %z: zone, %P: project;
# substituted into the split words, never through a shell.
TUNNEL_COMMAND = ("aws ec2-instance-connect open-tunnel --instance-id %i --remote-port %p "
                  "--region %r")
IAP_TUNNEL_COMMAND = ("gcloud compute start-iap-tunnel %i %p --listen-on-stdin --zone %z "
                      "--project %P")
DEFAULT_TUNNELS = {"instance-connect": TUNNEL_COMMAND, "iap": IAP_TUNNEL_COMMAND}
# Long enough for gcloud to open the tunnel and the node to ask OS Login for the key; the key
# is deleted as soon as the login is done, this bounds a key whose delete failed.
OS_LOGIN_KEY_TTL_S = 300


# ---------------------------------------------------------------------------------------
# What a node of a pool must look like.


@dataclass(frozen=True)
class NodeSpec:
    pool: str
    cloud: Cloud
    instance_type: str
    gpu: str
    gpus: int
    hbm_mib_per_gpu: int
    nvlink: bool
    image: str
    port: int
    health_path: str
    cache_mount: str
    cache_bytes_needed: int

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.health_path}"


def spec_for(pool: Pool, cloud: Cloud) -> NodeSpec:
    row = sizing.instance_row(pool, cloud)
    return NodeSpec(
        pool=pool.name,
        cloud=cloud,
        instance_type=row.name,
        gpu=row.gpu,
        gpus=row.gpus,
        hbm_mib_per_gpu=row.hbm_mib_per_gpu,
        nvlink=row.nvlink,
        image=pool.serving.image,
        port=pool.serving.port,
        health_path=pool.serving.health_path,
        cache_mount=naming.CACHE_MOUNT,
        # The same need as the `nvme-holds-weights` rule: the weights plus room for the next
        # version's files during a rollout.
        cache_bytes_needed=int(sizing.weights_bytes(pool) * sizing.NVME_HEADROOM),
    )


# ---------------------------------------------------------------------------------------
# Results.


@dataclass
class Check:
    name: str
    ok: bool
    observed: str
    hint: str | None = None
    short: str = ""  # the table cell; not part of --json

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "observed": self.observed, "hint": self.hint}


@dataclass
class NodeResult:
    host: str
    pool: str
    cloud: Cloud
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pool": self.pool, "cloud": self.cloud, "ok": self.ok,
                "checks": [c.to_json() for c in self.checks]}


@dataclass(frozen=True)
class CmdResult:
    """One remote command: its exit status (None when it did not finish) and output."""

    rc: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # why there is no exit status (timeout, channel closed)

    def why(self) -> str:
        if self.error:
            return self.error
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"exit {self.rc}: {text[-1] if text else 'no output'}"


def _not_found(res: CmdResult) -> bool:
    return res.rc == 127


def _fail(name: str, observed: str, hint: str, short: str = "") -> Check:
    return Check(name, False, observed, hint, short or observed)


# ---------------------------------------------------------------------------------------
# Hosts.


@dataclass(frozen=True)
class Host:
    host: str
    port: int
    instance_id: str | None = None  # found by discovery (GCP: the instance name)
    region: str | None = None
    zone: str | None = None  # GCP
    project: str | None = None  # GCP

    @property
    def label(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH (and paramiko) name this host in known_hosts."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def parse_host(text: str, default_port: int = DEFAULT_PORT) -> Host:
    """`host`, `host:port`, `[v6]:port`, or a bare IPv6 address."""
    raw = text.strip()
    host, port_text = raw, None
    if raw.startswith("["):
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d*))?", raw)
        if not m:
            raise UsageError(f"--host {text}: write HOST, HOST:PORT or [IPv6]:PORT")
        host, port_text = m[1], m[2]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    if not host or any(c.isspace() for c in host) or host.startswith("-"):
        raise UsageError(f"--host {text!r}: not a host name or address; write HOST or HOST:PORT")
    port = default_port
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"--host {text}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return Host(host, port)


# ---------------------------------------------------------------------------------------
# The remote commands. Each is run on its own channel of one SSH connection.


def commands(spec: NodeSpec) -> dict[str, str]:
    q = shlex.quote
    return {
        "gpus": "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader",
        "topo": "nvidia-smi topo -m",
        "nvlink": "nvidia-smi nvlink -s",
        "infiniband": f'ls -1 "${{{SYSFS_ENV}:-/sys}}/class/infiniband" 2>/dev/null || true',
        "lspci": "lspci -nn",
        # The DLAMI keeps libfabric's tools outside the default PATH.
        "fi_info": "PATH=$PATH:/opt/amazon/efa/bin fi_info -p efa",
        "findmnt": f"findmnt -n -o SOURCE,FSTYPE --mountpoint {q(spec.cache_mount)}",
        "df": f"df -B1 --output=target,size,avail {q(spec.cache_mount)}",
        "image": f"docker image inspect --format '{{{{.Id}}}}' {q(spec.image)}",
        "health": f"curl -fsS -o /dev/null -w '%{{http_code}}' --max-time 5 {q(spec.health_url)}",
    }


class Runner(Protocol):
    def __call__(self, cmd: str) -> CmdResult: ...


def run_checks(run: Runner, spec: NodeSpec) -> list[Check]:
    """Every check after `ssh`, given a way to run a command on the node."""
    cmd = commands(spec)
    out = {k: run(v) for k, v in cmd.items()}
    return [
        check_gpus(out["gpus"], spec),
        check_nvlink(out["topo"], out["nvlink"], spec),
        check_no_efa(out["infiniband"], out["lspci"], out["fi_info"]),
        check_cache_mount(out["findmnt"], spec),
        check_cache_size(out["df"], spec),
        check_image(out["image"], spec),
        check_health(out["health"], spec),
    ]


# ---------------------------------------------------------------------------------------
# gpus


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int


def parse_gpus(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader[,nounits]`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, mem = line.rpartition(",")
        m = re.fullmatch(r"\s*(\d+)(?:\s*MiB)?\s*", mem)
        if not sep or not m:
            raise ValueError(f"unexpected nvidia-smi line: {line.strip()!r}")
        gpus.append(Gpu(name.strip(), int(m[1])))
    return gpus


def _gpu_summary(gpus: Sequence[Gpu]) -> str:
    groups: dict[tuple[str, int], int] = {}
    for g in gpus:
        groups[(g.name, g.memory_mib)] = groups.get((g.name, g.memory_mib), 0) + 1
    return " + ".join(f"{n}x {name} ({mem} MiB)" for (name, mem), n in groups.items())


def check_gpus(res: CmdResult, spec: NodeSpec) -> Check:
    want = f"{spec.gpus}x {spec.gpu} ({spec.instance_type})"
    if _not_found(res):
        return _fail("gpus", "nvidia-smi not found",
                     "the node has no NVIDIA driver; it should run the pool's GPU image. "
                     + BOOT_HINT, "no nvidia-smi")
    if res.rc != 0:
        return _fail("gpus", f"nvidia-smi failed: {res.why()}",
                     f"the driver does not answer; check `dmesg | grep -i xid`, then replace "
                     f"the node (expected {want})", "nvidia-smi failed")
    try:
        gpus = parse_gpus(res.stdout)
    except ValueError as e:
        return _fail("gpus", str(e), f"expected {want}; run nvidia-smi on the node",
                     "unreadable")
    summary = _gpu_summary(gpus) or "no GPU"
    if len(gpus) != spec.gpus:
        return _fail("gpus", f"{len(gpus)} GPUs: {summary}",
                     f"expected {want}; a GPU fell off the bus or failed (check "
                     "`dmesg | grep -i xid` and `nvidia-smi -q`); replace the node",
                     f"{len(gpus)}/{spec.gpus}")
    model = re.compile(rf"(?<![A-Za-z0-9]){re.escape(spec.gpu)}(?![0-9])", re.I)
    wrong = [g for g in gpus if not model.search(g.name)]
    if wrong:
        return _fail("gpus", f"wrong model: {summary}",
                     f"expected {want}; the node is not of the pool's instance type",
                     "wrong model")
    floor = spec.hbm_mib_per_gpu * HBM_TOLERANCE
    small = [g for g in gpus if g.memory_mib < floor]
    if small:
        return _fail("gpus", f"too little HBM: {summary}",
                     f"expected about {spec.hbm_mib_per_gpu} MiB per GPU ({spec.instance_type}); "
                     "the node is a smaller SKU of the GPU", "small HBM")
    return Check("gpus", True, summary, None, f"{len(gpus)}x {spec.gpu}")


# ---------------------------------------------------------------------------------------
# nvlink


_GPU_LABEL = re.compile(r"GPU\d+")


def parse_topo(text: str) -> dict[tuple[str, str], str]:
    """`nvidia-smi topo -m` -> {(GPUi, GPUj): link} for every ordered pair of GPUs.

    The matrix may carry NIC columns (EFA / RDMA nodes) between the GPU columns and the
    affinity columns; those are read past. Headers like "CPU Affinity" hold a space, so only
    the device columns before them are matched by position.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header_i = next((i for i, ln in enumerate(lines)
                     if ln.split() and _GPU_LABEL.fullmatch(ln.split()[0])
                     and ln.startswith((" ", "\t"))), None)
    if header_i is None:
        raise ValueError("no GPU header row in `nvidia-smi topo -m` output")
    cols = []
    for tok in lines[header_i].split():
        if not re.fullmatch(r"(GPU|NIC)\d+", tok):
            break
        cols.append(tok)
    links: dict[tuple[str, str], str] = {}
    for ln in lines[header_i + 1:]:
        toks = ln.split()
        if not toks or not _GPU_LABEL.fullmatch(toks[0]):
            if toks and toks[0].startswith(("Legend", "NIC Legend")):
                break
            continue
        row = toks[0]
        for col, val in zip(cols, toks[1:1 + len(cols)], strict=False):
            if _GPU_LABEL.fullmatch(col) and col != row:
                links[(row, col)] = val
    return links


def parse_nvlink_status(text: str) -> dict[str, tuple[int, int]]:
    """`nvidia-smi nvlink -s` -> {"GPU0": (active links, inactive links)}."""
    out: dict[str, tuple[int, int]] = {}
    gpu = None
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+):", ln)
        if m:
            gpu = f"GPU{m[1]}"
            out[gpu] = (0, 0)
            continue
        m = re.match(r"\s+Link \d+:\s*(.*)", ln)
        if m and gpu is not None:
            active, inactive = out[gpu]
            if "inactive" in m[1].lower():
                out[gpu] = (active, inactive + 1)
            else:
                out[gpu] = (active + 1, inactive)
    return out


def check_nvlink(topo: CmdResult, status: CmdResult, spec: NodeSpec) -> Check:
    hint_hw = ("NVLink is down on this node: check the NVIDIA Fabric Manager "
               "(`systemctl status nvidia-fabricmanager`) and `nvidia-smi nvlink -s`; "
               "if it persists, replace the node")
    if not spec.nvlink:
        return Check("nvlink", True, f"not expected ({spec.instance_type} has no NVLink)",
                     None, "n/a")
    if _not_found(topo):
        return _fail("nvlink", "nvidia-smi not found",
                     f"the node has no NVIDIA driver. {BOOT_HINT}", "no nvidia-smi")
    if topo.rc != 0:
        return _fail("nvlink", f"nvidia-smi topo -m failed: {topo.why()}", hint_hw, "failed")
    try:
        links = parse_topo(topo.stdout)
    except ValueError as e:
        return _fail("nvlink", str(e), hint_hw, "unreadable")
    if not links:
        return _fail("nvlink", "fewer than 2 GPUs in the topology", hint_hw, "no pairs")
    pairs = sorted({tuple(sorted(p, key=lambda g: int(g[3:]))) for p in links},
                   key=lambda p: (int(p[0][3:]), int(p[1][3:])))
    not_nv = [(a, b, links[(a, b)]) for a, b in pairs if not re.fullmatch(r"NV\d+", links[(a, b)])]
    if not_nv:
        shown = ", ".join(f"{a}-{b} {v}" for a, b, v in not_nv[:4])
        more = f" and {len(not_nv) - 4} more" if len(not_nv) > 4 else ""
        return _fail("nvlink", f"{len(not_nv)} of {len(pairs)} GPU pairs not over NVLink: "
                               f"{shown}{more}", hint_hw, f"{len(not_nv)} pairs off")
    kinds = sorted({links[(a, b)] for a, b in pairs}, key=lambda v: int(v[2:]))
    observed = f"all {len(pairs)} GPU pairs over NVLink ({'/'.join(kinds)})"
    if status.rc == 0:
        per_gpu = parse_nvlink_status(status.stdout)
        inactive = {g: c for g, c in per_gpu.items() if c[1] or not c[0]}
        if inactive:
            shown = ", ".join(f"{g} {i} of {a + i} inactive" if i else f"{g} no link"
                              for g, (a, i) in list(inactive.items())[:4])
            return _fail("nvlink", f"links down: {shown}", hint_hw, "links down")
        if per_gpu:
            counts = sorted({a for a, _ in per_gpu.values()})
            observed += f"; {'/'.join(map(str, counts))} active links per GPU"
    return Check("nvlink", True, observed, None, "/".join(kinds))


# ---------------------------------------------------------------------------------------
# no-efa


_RDMA_PCI = re.compile(
    r"Elastic Fabric Adapter|\[1d0f:efa[0-9a-f]\]|Mellanox|ConnectX|\[15b3:[0-9a-f]{4}\]|"
    r"Infiniband controller",
    re.I,
)


def parse_infiniband(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def rdma_pci_devices(lspci_text: str) -> list[str]:
    """Lines of `lspci -nn` that are EFA or RDMA NICs (ENA, the plain NIC, is not)."""
    return [ln.strip() for ln in lspci_text.splitlines() if _RDMA_PCI.search(ln)]


def efa_provider_listed(fi_info: CmdResult) -> bool:
    return fi_info.rc == 0 and bool(re.search(r"^\s*provider:\s*efa\b", fi_info.stdout, re.M))


def check_no_efa(ib: CmdResult, lspci: CmdResult, fi_info: CmdResult) -> Check:
    hint = ("inference pools run without EFA / RDMA NICs: set `aws.efa_interfaces: 0` "
            "(GCP: `gcp.gpudirect: false`), redeploy, and replace this node")
    found = []
    devices = parse_infiniband(ib.stdout) if ib.rc == 0 else []
    if devices:
        found.append(f"/sys/class/infiniband: {', '.join(devices)}")
    pci = rdma_pci_devices(lspci.stdout) if lspci.rc == 0 else []
    if pci:
        found.append(f"PCI: {'; '.join(pci[:3])}{' ...' if len(pci) > 3 else ''}")
    if efa_provider_listed(fi_info):
        found.append("fi_info -p efa lists the efa provider")
    if found:
        n = len(devices) or len(pci) or 1
        return _fail("no-efa", "; ".join(found), hint, f"{n} RDMA dev")
    notes = ["no /sys/class/infiniband device"]
    notes.append("lspci not installed" if _not_found(lspci) else "no EFA/RDMA PCI device")
    if not _not_found(fi_info):
        notes.append("fi_info -p efa finds none")
    return Check("no-efa", True, "none (" + ", ".join(notes) + ")", None, "none")


# ---------------------------------------------------------------------------------------
# cache-mount, cache-size


def parse_findmnt(text: str) -> tuple[str, str] | None:
    """`findmnt -n -o SOURCE,FSTYPE --mountpoint M` -> (source, fstype), None if unmounted."""
    for ln in text.splitlines():
        toks = ln.split()
        if len(toks) >= 2:
            return toks[0], toks[1]
    return None


def parse_df(text: str) -> tuple[str, int, int]:
    """`df -B1 --output=target,size,avail PATH` -> (mount point, size, available) in bytes."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError("no data row in df output")
    toks = lines[-1].split()
    if len(toks) < 3 or not (toks[-1].isdigit() and toks[-2].isdigit()):
        raise ValueError(f"unexpected df row: {lines[-1].strip()!r}")
    return " ".join(toks[:-2]), int(toks[-2]), int(toks[-1])


def _gb(n: float) -> str:
    return f"{n / 1e12:,.1f} TB" if n >= 1e12 else f"{n / 1e9:,.1f} GB"


def check_cache_mount(res: CmdResult, spec: NodeSpec) -> Check:
    hint = (f"the boot unit builds and mounts the cache on every start: run "
            f"`sudo /usr/local/lib/poolctl/node.sh nvme` on the node, or {BOOT_HINT}")
    if _not_found(res):
        return _fail("cache-mount", "findmnt not found", "install util-linux on the node image",
                     "no findmnt")
    mount = parse_findmnt(res.stdout) if res.rc == 0 else None
    if mount is None:
        return _fail("cache-mount", f"nothing mounted at {spec.cache_mount}", hint,
                     "not mounted")
    source, fstype = mount
    if not re.match(r"/dev/(md|nvme)", source):
        return _fail("cache-mount",
                     f"{spec.cache_mount} is {source} ({fstype}), not the local NVMe", hint,
                     source)
    return Check("cache-mount", True, f"{source} ({fstype}) at {spec.cache_mount}", None,
                 f"{source} {fstype}")


def check_cache_size(res: CmdResult, spec: NodeSpec) -> Check:
    need = (f"the weights need {_gb(spec.cache_bytes_needed)} with "
            f"{sizing.NVME_HEADROOM - 1:.0%} headroom")
    if res.rc != 0:
        return _fail("cache-size", f"df failed: {res.why()}",
                     f"fix cache-mount first; {need}", "n/a")
    try:
        target, size, avail = parse_df(res.stdout)
    except ValueError as e:
        return _fail("cache-size", str(e), f"run `df -B1 {spec.cache_mount}` on the node",
                     "unreadable")
    if target != spec.cache_mount:
        return _fail("cache-size",
                     f"not checked: {spec.cache_mount} is not mounted (df reports {target})",
                     f"fix cache-mount first; {need}", "n/a")
    observed = f"{_gb(size)} ({size:,} B), {_gb(avail)} free; {need}"
    if size < spec.cache_bytes_needed:
        return _fail("cache-size", observed,
                     "the cache is too small: run the pool on a type with more local NVMe "
                     "(`poolctl validate` checks this), or check that every NVMe device "
                     "joined the array (`cat /proc/mdstat`)", _gb(size))
    return Check("cache-size", True, observed, None, _gb(size))


# ---------------------------------------------------------------------------------------
# image, health


def check_image(res: CmdResult, spec: NodeSpec) -> Check:
    if _not_found(res):
        return _fail("image", "docker not found",
                     f"the node image must carry Docker and the NVIDIA container toolkit. "
                     f"{BOOT_HINT}", "no docker")
    if res.rc == 0 and res.stdout.strip():
        image_id = res.stdout.strip().splitlines()[0]
        return Check("image", True, f"{spec.image} present ({image_id})", None,
                     image_id.removeprefix("sha256:")[:12])
    said = res.why()
    if "permission denied" in said.lower():
        return _fail("image", f"docker refused: {said}",
                     "the SSH user may not use Docker: add it to the docker group "
                     "(`sudo usermod -aG docker USER`) or pass --user with one that may",
                     "denied")
    return _fail("image", f"{spec.image} not on the node ({said})",
                 f"the boot unit pulls it: run `sudo docker pull {spec.image}` on the node, "
                 f"or {BOOT_HINT}", "missing")


_CURL_ERRORS = {
    6: "could not resolve the host",
    7: "connection refused: nothing listens on the port",
    28: "timed out",
    52: "empty reply",
    56: "connection reset",
}


def check_health(res: CmdResult, spec: NodeSpec) -> Check:
    url = spec.health_url
    hint = ("the server is not ready: see `sudo docker logs --tail 50 poolctl-serving` and "
            "`sudo journalctl -u poolctl-node`; loading the weights takes minutes after a start")
    if _not_found(res):
        return _fail("health", "curl not found", "install curl on the node image", "no curl")
    code = res.stdout.strip()[-3:]
    if res.rc == 0 and code == "200":
        return Check("health", True, f"200 from {url}", None, "200")
    if res.rc == 22 or (code.isdigit() and code != "000"):
        return _fail("health", f"HTTP {code} from {url}", hint, code)
    why = _CURL_ERRORS.get(res.rc or -1) or res.why()
    return _fail("health", f"{url}: {why}", hint, "down")


# ---------------------------------------------------------------------------------------
# SSH: strict host keys, one clear line per way of failing.


class SshOptions:
    """How to reach the nodes. Validated once, before any connection (bad input: exit 2)."""

    def __init__(self, user: str | None = None, identity: Path | None = None,
                 known_hosts: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 access: str = "ssh", proxy_command: str | None = None,
                 endpoints: CloudEndpoints = REAL_CLOUDS):
        if access not in ACCESS_MODES:
            raise UsageError(f"--access {access}: use one of {', '.join(ACCESS_MODES)}")
        if access == "iap" and user is not None:
            raise UsageError("--user: with --access iap poolctl logs in as your OS Login user "
                             "(from your login profile); drop --user")
        user = user if user is not None or access == "iap" else DEFAULT_USER
        if user is not None and (not user or any(c.isspace() for c in user)):
            raise UsageError(f"--user {user!r}: not a user name")
        if access == "instance-connect" and identity is not None:
            raise UsageError("--identity: instance-connect logs in with a key made and pushed "
                             "for each check; drop --identity or use --access ssh")
        if access == "iap" and identity is not None:
            raise UsageError("--identity: iap logs in with a key made and imported into OS "
                             "Login for each check; drop --identity or use --access ssh")
        if proxy_command is not None:
            try:
                if not shlex.split(proxy_command):
                    raise ValueError("empty")
            except ValueError as e:
                raise UsageError(f"--proxy-command: cannot split it into arguments ({e}); "
                                 "quote it as for a shell") from None
        elif endpoints.loopback_only and access in DEFAULT_TUNNELS:
            # The default tunnels talk to the cloud's endpoints: not from the sandbox.
            raise UsageError(f"--access {access} with {endpoints.flag} needs --proxy-command: the "
                             f"default tunnel ({DEFAULT_TUNNELS[access].split(' %')[0]}) would "
                             "leave this machine; give a local command reaching the node's sshd")
        self.access = access
        self.proxy_command = proxy_command or DEFAULT_TUNNELS.get(access)
        self.os_login: OsLogin | None = OsLogin() if access == "iap" else None
        self.endpoints = endpoints  # where key pushes and OS Login calls go
        if timeout <= 0:
            raise UsageError(f"--timeout {timeout}: give a number of seconds above 0")
        self.user = user
        self.timeout = timeout
        self.identity = identity
        self.pkey = load_identity(identity) if identity is not None else None
        self.known_hosts_explicit = known_hosts is not None
        self.known_hosts = (known_hosts or Path("~/.ssh/known_hosts")).expanduser()
        if self.known_hosts_explicit and not self.known_hosts.is_file():
            raise UsageError(
                f"--known-hosts {known_hosts}: no such file; pass your known_hosts file, or "
                "create one with `ssh-keyscan HOST >> FILE` after verifying the fingerprints"
            )


def load_identity(path: Path) -> Any:
    import paramiko

    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--identity {path}: no such file; pass the private key the nodes "
                         "accept (e.g. ~/.ssh/id_ed25519)")
    try:
        return paramiko.PKey.from_path(p)
    except (paramiko.PasswordRequiredException, TypeError):
        # cryptography raises TypeError for an encrypted key loaded without a password.
        raise UsageError(f"--identity {path}: the key is passphrase-protected; load it into "
                         "ssh-agent (`ssh-add`) and omit --identity") from None
    except (paramiko.SSHException, ValueError, OSError) as e:
        raise UsageError(f"--identity {path}: not a private key paramiko can read ({e}); "
                         "pass an OpenSSH private key (not the .pub)") from None


def fingerprint(key: Any) -> str:
    """OpenSSH's form: SHA256:<base64 without padding> of the key blob."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class SshFailure(Exception):
    def __init__(self, observed: str, hint: str):
        super().__init__(observed)
        self.observed = observed
        self.hint = hint


@dataclass(frozen=True)
class KnownHost:
    """One line of a known_hosts file (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT")."""

    line: int
    marker: str | None  # "@cert-authority", "@revoked" or None
    patterns: str  # comma-separated host patterns (wildcards, !negation, |1| hashes)
    key_type: str
    key_b64: str


def read_known_hosts(path: Path) -> list[KnownHost]:
    """Every usable line; malformed ones are skipped, as OpenSSH skips them."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise SshFailure(f"cannot read {path}: {e.strerror or e}",
                         "fix or replace the known_hosts file") from None
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, "@cert-authority", "@revoked") or len(fields) < 3:
            continue
        out.append(KnownHost(n, marker, fields[0], fields[1], fields[2]))
    return out


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):  # hashed: HMAC-SHA1 of the name, keyed by the salt
        import hmac

        try:
            salt, digest = (base64.b64decode(p) for p in pattern[3:].split("|", 1))
        except (ValueError, TypeError):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), "sha1").digest(), digest)
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.I) is not None


def host_matches(patterns: str, name: str) -> bool:
    """OpenSSH's rule: some pattern matches and no negated (!) one does."""
    hit = False
    for p in patterns.split(","):
        if p.startswith("!"):
            if _pattern_matches(p[1:], name):
                return False
        elif _pattern_matches(p, name):
            hit = True
    return hit


def _pkey(entry: KnownHost) -> Any | None:
    import paramiko

    try:
        return paramiko.PKey.from_type_string(entry.key_type, base64.b64decode(entry.key_b64))
    except Exception:  # a key type paramiko does not know, or a damaged line: unusable
        return None


class HostKeyPolicy:
    """What known_hosts says of the host, beyond the plain keys paramiko compares itself:
    keys revoked (`@revoked`, for any host) and certificate authorities (`@cert-authority`)."""

    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host = host
        self.path = known_hosts
        entries = read_known_hosts(known_hosts) if known_hosts.is_file() else []
        name = host.known_hosts_name
        self.revoked = {e.key_b64: e.line for e in entries if e.marker == "@revoked"}
        self.plain = [e for e in entries if e.marker is None and e.key_b64 not in self.revoked
                      and host_matches(e.patterns, name)]
        self.cas = [e for e in entries if e.marker == "@cert-authority"
                    and host_matches(e.patterns, name)]

    def load(self, client: Any) -> None:
        """The plain keys for this host (wildcards resolved) into paramiko's table, under
        the exact name paramiko looks up."""
        keys = client.get_host_keys()
        for e in self.plain:
            key = _pkey(e)
            if key is not None:
                keys.add(self.host.known_hosts_name, key.get_name(), key)

    def revoked_failure(self, key: Any) -> SshFailure | None:
        line = self.revoked.get(key.get_base64())
        if line is None:
            return None
        return SshFailure(
            f"host key {key.get_name()} {fingerprint(key)} of {self.host.known_hosts_name} is "
            f"REVOKED in {self.path} (line {line}); refused, nothing was run",
            "the key was revoked on purpose: replace the node (or its host key), then add the "
            "new key after verifying its fingerprint on the node")

    def missing(self, key: Any) -> SshFailure:
        revoked = self.revoked_failure(key)
        if revoked is not None:
            return revoked
        port = "" if self.host.port == 22 else f"-p {self.host.port} "
        add = f"ssh-keyscan {port}{self.host.host} >> {self.path}"
        if self.cas:
            return SshFailure(
                f"{self.host.known_hosts_name} is trusted through a @cert-authority line of "
                f"{self.path} (line {self.cas[0].line}), but poolctl's SSH client (paramiko) "
                f"cannot verify host certificates; the node's own key {key.get_name()} "
                f"{fingerprint(key)} is not listed; refused, nothing was run",
                f"verify that fingerprint on the node, then add its own host key: {add}")
        return SshFailure(
            f"unknown host key {key.get_name()} {fingerprint(key)} for "
            f"{self.host.known_hosts_name}: not in {self.path}; refused, nothing was run",
            f"verify that fingerprint on the node itself (console or "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_{_key_file(key)}_key.pub`), then add it: {add}",
        )


def _reject_policy(policy: HostKeyPolicy) -> paramiko.RejectPolicy:
    import paramiko

    class Reject(paramiko.RejectPolicy):
        """RejectPolicy that says why the key was refused and how to trust it on purpose."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> NoReturn:
            raise policy.missing(key)

    return Reject()


def _key_file(key: Any) -> str:
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(
        name, "ecdsa" if name.startswith("ecdsa") else "*")


def _quiet_paramiko() -> None:
    # paramiko logs failed handshakes with tracebacks; without a handler Python's last-resort
    # handler would print them to stderr, next to the one line each failure already gets.
    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def connect(host: Host, opts: SshOptions) -> tuple[paramiko.SSHClient, str, str | None]:
    """(a connected paramiko SSHClient, the user logged in as, a note for the ssh check), or
    SshFailure with the reason and the fix."""
    import paramiko

    _quiet_paramiko()
    client = paramiko.SSHClient()
    # Read here, not by paramiko: its parser stops at @cert-authority / @revoked lines and
    # takes wildcard patterns for literal names.
    policy = HostKeyPolicy(host, opts.known_hosts)
    policy.load(client)
    client.set_missing_host_key_policy(_reject_policy(policy))
    kwargs: dict[str, Any] = {}
    key_desc = f"key {opts.identity}" if opts.identity else "ssh-agent / ~/.ssh keys"
    pkey, user, forget = opts.pkey, opts.user, None
    auth_hint = ("check --user (DLAMI: ubuntu) and --identity, and that the key's public half "
                 "is in the user's ~/.ssh/authorized_keys on the node (the pool's key pair)")
    if opts.access == "instance-connect":
        pkey = push_instance_connect_key(host, opts)
        key_desc = "a key pushed by EC2 Instance Connect"
    elif opts.access == "iap":
        assert opts.os_login is not None  # SshOptions makes one for --access iap
        pkey, user, forget = opts.os_login.import_key(host)
        key_desc = "a key imported into your OS Login profile"
        auth_hint = ("OS Login refused you: you need roles/compute.osAdminLogin (or osLogin) "
                     "on the project, and the node `enable-oslogin` with its guest agent "
                     "running")
    assert user is not None  # SshOptions gives one for every access but iap, set just above
    if pkey is not None:
        # Only the key asked for: no agent, no ~/.ssh guesses, so a wrong key fails plainly.
        kwargs = {"pkey": pkey, "allow_agent": False, "look_for_keys": False}
    who = f"{user}@{host.label}"
    try:
        if opts.proxy_command:
            kwargs["sock"] = proxy_socket(opts.proxy_command, host)
        client.connect(host.host, port=host.port, username=user, timeout=opts.timeout,
                       banner_timeout=opts.timeout, auth_timeout=opts.timeout,
                       channel_timeout=opts.timeout, **kwargs)
    except SshFailure:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        revoked = policy.revoked_failure(e.key)
        if revoked is not None:
            raise revoked from None
        raise SshFailure(
            f"host key of {host.known_hosts_name} CHANGED: got {e.key.get_name()} "
            f"{fingerprint(e.key)}, {opts.known_hosts} has {fingerprint(e.expected_key)}; "
            "refused, nothing was run",
            "a replaced node gets a new key, but so does a man in the middle: verify the new "
            f"fingerprint on the node, then `ssh-keygen -R '{host.known_hosts_name}' -f "
            f"{opts.known_hosts}` and add the new key",
        ) from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise SshFailure(f"authentication failed for {who} with {key_desc} ({e})",
                         auth_hint) from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        client.close()
        raise SshFailure(
            f"connection refused by {host.label}",
            "sshd is not running there or the port is wrong (--port, or HOST:PORT)",
        ) from None
    except TimeoutError:
        client.close()
        raise SshFailure(
            f"no answer from {host.label} within {opts.timeout:g} s",
            "the node is unreachable from here (run from inside the VPC or through a bastion; "
            "nodes have no public address) or a security group / firewall drops port "
            f"{host.port}; raise --timeout for a slow link",
        ) from None
    except socket.gaierror as e:
        client.close()
        raise SshFailure(f"cannot resolve {host.host}: {e.strerror or e}",
                         "check the host name, or pass the node's IP address") from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        client.close()
        raise SshFailure(f"ssh to {host.label} failed: {e or type(e).__name__}",
                         "check that the port is an SSH server and the node is up") from None
    finally:
        # Logged in or not, the imported key has done its work.
        note = forget() if forget is not None else None
    return client, user, note


_PLACEHOLDER = re.compile(r"%[ihprzP%]")


def _placeholders(host: Host) -> dict[str, str | None]:
    return {"%i": host.instance_id, "%h": host.host, "%p": str(host.port), "%r": host.region,
            "%z": host.zone, "%P": host.project, "%%": "%"}


def proxy_argv(template: str, host: Host) -> list[str]:
    """The proxy command's words with %i %h %p %r %z %P replaced: each value stays one
    argument whatever it holds (no shell)."""
    values = _placeholders(host)
    return [_PLACEHOLDER.sub(lambda m: values[m[0]] or "", word)
            for word in shlex.split(template)]


def proxy_socket(template: str, host: Host) -> Any:
    import paramiko

    argv = proxy_argv(template, host)
    values = _placeholders(host)
    missing = [p for p in sorted(set(_PLACEHOLDER.findall(template))) if not values[p]]
    if missing:
        raise SshFailure(f"the proxy command needs {' '.join(missing)} (instance, region, "
                         f"zone or project) of {host.label}, which only discovery knows",
                         "let poolctl find the nodes through the cloud (no --host)")
    try:
        return paramiko.ProxyCommand(shlex.join(argv))
    except paramiko.SSHException as e:  # the command cannot start
        raise SshFailure(f"proxy command `{argv[0]}` for {host.label} failed to start: {e}",
                         "install it (instance-connect: AWS CLI v2; iap: the gcloud CLI) or "
                         "fix --proxy-command") from None


def _fresh_key() -> Any:
    """A new ed25519 key for one login; the private half never leaves this process."""
    import io

    import paramiko
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()).decode()
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


class OsLogin:
    """`--access iap`: one key per node login, imported into the caller's OS Login profile
    (users.importSshPublicKey, expiring after OS_LOGIN_KEY_TTL_S) and deleted after the
    login. The account is resolved once, before any connection (`prepare`)."""

    def __init__(self) -> None:
        self.ops: Any = None
        self.account: str | None = None

    def prepare(self, endpoints: CloudEndpoints = REAL_CLOUDS) -> str:
        from poolctl.clouds.gcp.ops import make_ops

        if self.ops is None:
            ops = make_ops(endpoints)
            self.account = ops.caller_account()
            self.ops = ops
        assert self.account is not None  # set with self.ops (caller_account gives a str)
        return self.account

    def import_key(self, host: Host) -> tuple[Any, str, Callable[[], str | None]]:
        """(key, POSIX user, forget): `forget()` deletes the key, returning a note when it
        could not."""
        if self.ops is None or not host.project:
            raise SshFailure(f"iap needs the instance and project of {host.label}",
                             "let poolctl find the nodes through the cloud (no --host), or "
                             "use --access ssh")
        key = _fresh_key()
        try:
            user, fp = self.ops.import_ssh_key(self.account, f"{key.get_name()} "
                                               f"{key.get_base64()} poolctl-nodes-check",
                                               host.project, OS_LOGIN_KEY_TTL_S)
        except OperationFailed as e:
            raise SshFailure(str(e), "the caller needs roles/compute.osAdminLogin (or "
                             "osLogin) and OS Login must be on in the project") from None

        def forget() -> str | None:
            try:
                self.ops.delete_ssh_key(self.account, fp)
            except OperationFailed as e:
                return f"the imported key was not deleted ({e}); it expires by itself"
            return None

        return key, user, forget


def push_instance_connect_key(host: Host, opts: SshOptions) -> Any:
    """A new ed25519 key, its public half pushed to the instance for `opts.user` through
    EC2 Instance Connect (the node's sshd accepts it for 60 s). The private half never leaves
    this process."""
    if not host.instance_id or not host.region:
        raise SshFailure(f"instance-connect needs the instance id of {host.label}",
                         "let poolctl find the nodes through the cloud (no --host), or use "
                         "--access ssh")
    key = _fresh_key()
    from poolctl.clouds.aws.ops import make_ops

    eic = make_ops(opts.endpoints).client("ec2-instance-connect", host.region)
    try:
        eic.send_ssh_public_key(InstanceId=host.instance_id, InstanceOSUser=opts.user,
                                SSHPublicKey=f"{key.get_name()} {key.get_base64()}")
    except botocore_exceptions.NoCredentialsError:
        raise SshFailure("no AWS credentials to push the key with",
                         "configure them (AWS_PROFILE, aws sso login ...)") from None
    except (botocore_exceptions.ClientError, botocore_exceptions.BotoCoreError) as e:
        raise SshFailure(f"ec2-instance-connect SendSSHPublicKey to {host.instance_id} "
                         f"failed: {e}",
                         "the caller needs ec2-instance-connect:SendSSHPublicKey on the "
                         "instance, and the node must be running") from None
    return key


def _runner(client: paramiko.SSHClient, timeout: float) -> Runner:
    def run(cmd: str) -> CmdResult:
        """One command; once more on a new channel when the SSH channel itself failed (it
        would not open, dropped, or closed without an exit status: the link's trouble, not
        the node's answer). A timeout is not tried again: it would only double the wait."""
        res = run_once(cmd)
        if res.rc is None and not (res.error or "").endswith(f"did not finish in {timeout:g} s"):
            res = run_once(cmd)
        return res

    def run_once(cmd: str) -> CmdResult:
        tool = cmd.split()[0]
        chan = None
        try:
            _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
            chan = stdout.channel
            out = stdout.read().decode(errors="replace")
            err = stderr.read().decode(errors="replace")
            rc = chan.recv_exit_status()
        except TimeoutError:
            return CmdResult(None, error=f"`{tool}` did not finish in {timeout:g} s")
        except Exception as e:  # paramiko raises SSHException / EOFError on a dropped link
            return CmdResult(None, error=f"`{tool}` failed: {e or type(e).__name__}")
        finally:
            # sshd allows 10 sessions per connection (MaxSessions): free each one, hung or not.
            if chan is not None:
                chan.close()
        # -1: the server sent no exit status (the channel closed first).
        if rc < 0:
            return CmdResult(None, out, err, "no exit status")
        return CmdResult(rc, out, err)

    return run


def check_node(host: Host, spec: NodeSpec, opts: SshOptions) -> NodeResult:
    result = NodeResult(host.label, spec.pool, spec.cloud)
    try:
        client, user, note = connect(host, opts)
    except SshFailure as f:
        result.checks.append(_fail("ssh", f.observed, f.hint, "failed"))
        return result
    try:
        transport = client.get_transport()
        assert transport is not None  # connect returned a connected client
        key = transport.get_remote_server_key()
        observed = f"{user}@{host.label}, host key {key.get_name()} {fingerprint(key)}"
        result.checks.append(Check("ssh", True, f"{observed}; {note}" if note else observed,
                                   None, "ok"))
        result.checks.extend(run_checks(_runner(client, opts.timeout), spec))
    finally:
        client.close()
    return result


def check_nodes(
    work: Sequence[tuple[Host, NodeSpec]],
    opts: SshOptions,
    progress: Callable[[NodeResult], None] | None = None,
    workers: int = MAX_WORKERS,
) -> list[NodeResult]:
    """Check every (host, spec) concurrently; results in the order given."""
    if not work:
        return []
    results: list[NodeResult | None] = [None] * len(work)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(work))),
                            thread_name_prefix="nodecheck") as pool:
        futures = {pool.submit(check_node, h, s, opts): i for i, (h, s) in enumerate(work)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                res = fut.result()
            except Exception as e:  # a bug must not hide the other nodes' results
                host, spec = work[i]
                res = NodeResult(host.label, spec.pool, spec.cloud,
                                 [_fail("ssh", f"internal error: {type(e).__name__}: {e}",
                                        "report this as a poolctl bug", "error")])
            results[i] = res
            if progress is not None:  # called from this thread only: lines never interleave
                progress(res)
    return [r for r in results if r is not None]


def progress_line(res: NodeResult) -> str:
    where = f"node {res.host} ({res.pool}/{res.cloud})"
    if res.ok:
        return f"{where}: ok, {len(res.checks)} checks passed"
    if res.checks and res.checks[0].name == "ssh" and not res.checks[0].ok:
        c = res.checks[0]
        return f"{where}: FAILED ssh: {c.observed}; {c.hint}"
    failed = ", ".join(f"{c.name} ({c.short or c.observed})" for c in res.failed)
    return f"{where}: FAILED {failed}"


# ---------------------------------------------------------------------------------------
# The whole command, minus rendering.


def plan_work(
    cfg: Config,
    targets: Sequence[tuple[Pool, Cloud]],
    hosts: Sequence[str] | None,
    default_port: int = DEFAULT_PORT,
    endpoints: CloudEndpoints = REAL_CLOUDS,
    discover: Callable[[Config, Pool, Cloud, CloudEndpoints], list[Any]] | None = None,
    direct: bool = True,
) -> list[tuple[Host, NodeSpec]]:
    """Which hosts to check against which pool's expectations. `discover` gives addresses,
    or (address, instance id) pairs. `direct`: poolctl connects to the addresses itself (no
    proxy command), so where the endpoints allow only loopback (the sandbox) they must be
    loopback ones."""
    if hosts:
        if len(targets) > 1:
            names = ", ".join(f"{p.name}/{c}" for p, c in targets)
            raise UsageError(f"--host: the nodes could belong to {names}; pick one with "
                             "--pool NAME and --cloud aws|gcp")
        pool, cloud = targets[0]
        spec = spec_for(pool, cloud)
        unique: dict[Host, None] = {}  # the order given, each host once
        for h in hosts:
            unique.setdefault(parse_host(h, default_port))
        if endpoints.loopback_only and direct:
            outside = [h.host for h in unique if not is_loopback(h.host)]
            if outside:
                raise UsageError(
                    f"--host {outside[0]}: with {endpoints.flag} poolctl connects only to loopback "
                    "addresses (127.0.0.0/8, ::1, localhost); name the local sshd standing "
                    "for the node, e.g. --host 127.0.0.1:2222")
        return [(h, spec) for h in unique]
    for _, cloud in targets:
        endpoints.require(cloud)
    discover = discover or _discover
    work: list[tuple[Host, NodeSpec]] = []
    for pool, cloud in targets:
        spec = spec_for(pool, cloud)
        # An address, or (address, instance id or name[, zone]).
        found = [(*(f if isinstance(f, tuple) else (f,)), None, None)[:3]
                 for f in discover(cfg, pool, cloud, endpoints)]
        ips = [ip for ip, _, _ in found]
        if not ips:
            where = pool.aws.region if cloud == Cloud.aws and pool.aws else (
                pool.gcp.region if pool.gcp else "")
            tag = (f"{naming.TAG_PROJECT}={cfg.project}, {naming.TAG_POOL}={pool.name}"
                   if cloud == Cloud.aws else
                   f"{naming.LABEL_PROJECT}={cfg.project}, {naming.LABEL_POOL}={pool.name}")
            raise OperationFailed(
                f"no running node of pool {pool.name} on {cloud} in {where} (by {tag}); "
                "deploy it or scale it up, or pass --host H to check a node directly")
        outside = [ip for ip in ips if not is_loopback(ip)]
        if endpoints.loopback_only and direct and outside:
            # Sandbox instances carry made-up private addresses: somebody else's, if any.
            raise UsageError(
                f"{endpoints.flag}: node address {outside[0]} of pool {pool.name} is a fake "
                "private address of the emulator, and poolctl never connects outside "
                "127.0.0.0/8 in the sandbox; pass --host with the loopback address of a local "
                "sshd standing for the node, e.g. --host 127.0.0.1:2222")
        if cloud == Cloud.aws:
            where_kw = {"region": pool.aws.region if pool.aws else None}
        else:
            assert pool.gcp is not None  # targets pair a pool with its own placements
            where_kw = {"region": pool.gcp.region, "project": pool.gcp.project}
        work.extend((Host(ip, default_port, iid, zone=zone, **where_kw), spec)
                    for ip, iid, zone in found)
    return work


def is_loopback(host: str) -> bool:
    """An address of this machine by its literal form (names other than localhost are not
    resolved: what they resolve to may change)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _discover(cfg: Config, pool: Pool, cloud: Cloud, endpoints: CloudEndpoints
              ) -> list[Any]:
    """The pool's running nodes, through the cloud's operations (its endpoint, credentials
    and retries, as every other command)."""
    from poolctl.runtime import get_ops

    return get_ops(cloud, endpoints).node_addresses(cfg, pool)
