"""The checks of `poolctl nodes check`: what a node of a pool must look like, the commands run
on it, and the pure functions that parse their output and judge it (unit-tested on recorded
output; no SSH here: `run_checks` takes any way of running a command).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from poolctl import naming, sizing
from poolctl.cloud import Cloud
from poolctl.config import Pool

# nvidia-smi reports a little less HBM than the marketing size the catalog copies
# (H100 80GB: 81559 of 81920 MiB, H200: 143771 of 144384); a wrong SKU is far below this.
HBM_TOLERANCE = 0.95
CHECK_NAMES = ("ssh", "gpus", "nvlink", "no-efa", "cache-mount", "cache-size", "image", "health")
# Test hook, like POOLCTL_NVME_DEVICES in the cache script: the sysfs root the no-efa check
# lists, so a test can give a node RDMA devices without a kernel driver.
SYSFS_ENV = "POOLCTL_SYSFS"
BOOT_HINT = "see `sudo journalctl -u poolctl-node` (the boot unit runs on every start)"


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
