"""A real OpenSSH sshd on 127.0.0.1 playing a p5.48xlarge node, for `poolctl nodes check`.

sshd runs as root from a temporary config: its own ed25519 host key, key-only login for the
current user, and `SetEnv PATH=<fake bin>:/usr/bin:/bin` so the session runs stub
`nvidia-smi`, `docker`, `findmnt`, `df`, `curl`, `lspci` and `fi_info` that print what a
healthy node prints. A test breaks the node by writing files into `state/` (see `FakeNode.set`);
every stub call is appended to `calls.log`, so a test can tell whether anything ran at all.

Needs root (sshd switches to the login user and wants /run/sshd) and openssh-server; without
them the fixture skips, naming which is missing.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
STUBS = ("nvidia-smi", "docker", "findmnt", "df", "curl", "lspci", "fi_info")

# One program behind every stub name (dispatch on argv[0]). Output is what the tools print on
# a p5.48xlarge (8x H100 SXM over NVSwitch, 8 local NVMe in RAID0, no EFA interface attached).
FAKE_NODE = r'''
import os, sys, time
from pathlib import Path

root = Path(os.environ["POOLCTL_FAKE_NODE"])
state = root / "state"
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(root / "calls.log", "a") as log:
    log.write(" ".join([tool, *args]) + "\n")


def flag(name):
    return (state / name).exists()


def value(name, default):
    p = state / name
    return p.read_text().strip() if p.exists() else default


def unexpected():
    sys.stderr.write(f"fake {tool}: unexpected arguments {args!r}\n")
    sys.exit(2)


gpus = int(value("gpus", "8"))
efa = flag("efa")
CACHE = "/mnt/poolctl-cache"
NICS = 4 if efa else 0

if tool == "nvidia-smi":
    # A GPU in a bad state makes nvidia-smi hang in the driver; bounded so no stub outlives
    # the test session by much.
    time.sleep(float(value("nvidia-smi-hangs", "0")))
    if args == ["--query-gpu=name,memory.total", "--format=csv,noheader"]:
        for _ in range(gpus):
            print("NVIDIA H100 80GB HBM3, 81559 MiB")
    elif args == ["topo", "-m"]:
        cols = [f"GPU{i}" for i in range(gpus)] + [f"NIC{i}" for i in range(NICS)]
        print("\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
        for i in range(gpus):
            cells = [" X " if j == i else "NV18" for j in range(gpus)]
            cells += ["PXB" if n == i // 2 else "SYS" for n in range(NICS)]
            aff, numa = ("0-47,96-143", "0") if i < 4 else ("48-95,144-191", "1")
            print(f"GPU{i}\t" + "\t".join(cells) + f"\t{aff}\t{numa}\t\tN/A")
        for n in range(NICS):
            cells = ["PXB" if n == j // 2 else "SYS" for j in range(gpus)]
            cells += [" X " if m == n else "SYS" for m in range(NICS)]
            print(f"NIC{n}\t" + "\t".join(cells))
        print()
        print("Legend:\n")
        print("  X    = Self")
        print("  SYS  = Connection traversing PCIe as well as the SMP interconnect between "
              "NUMA nodes (e.g., QPI/UPI)")
        print("  PXB  = Connection traversing multiple PCIe bridges (without traversing the "
              "PCIe Host Bridge)")
        print("  NV#  = Connection traversing a bonded set of # NVLinks")
        if NICS:
            print("\nNIC Legend:\n")
            for n in range(NICS):
                print(f"  NIC{n}: rdmap{16 + n * 16}s27")
    elif args == ["nvlink", "-s"]:
        for i in range(gpus):
            print(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3c0b8e-4e1a-7a1c-0c2d-{i:012x})")
            for link in range(18):
                print(f"\t Link {link}: 26.562 GB/s")
    else:
        unexpected()
elif tool == "lspci":
    if args != ["-nn"]:
        unexpected()
    print("00:00.0 Host bridge [0600]: Amazon.com, Inc. Device [1d0f:0200]")
    print("00:01.0 ISA bridge [0601]: Intel Corporation 82371SB PIIX3 ISA [Natoma/Triton II] "
          "[8086:7000]")
    print("00:03.0 VGA compatible controller [0300]: Amazon.com, Inc. Device [1d0f:1111]")
    print("00:04.0 Non-Volatile memory controller [0108]: Amazon.com, Inc. NVMe EBS "
          "Controller [1d0f:8061]")
    print("00:05.0 Ethernet controller [0200]: Amazon.com, Inc. Elastic Network Adapter "
          "(ENA) [1d0f:ec20]")
    for d in range(8):
        print(f"{0x80 + d * 8:02x}:00.0 Non-Volatile memory controller [0108]: Amazon.com, "
              "Inc. NVMe SSD Controller [1d0f:cd01]")
        print(f"{0x97 + d * 8:02x}:00.0 3D controller [0302]: NVIDIA Corporation GH100 "
              "[H100 SXM5 80GB] [10de:2330] (rev a1)")
    for n in range(NICS):
        print(f"{0x10 + n * 0x10:02x}:1b.0 Ethernet controller [0200]: Amazon.com, Inc. "
              "Elastic Fabric Adapter (EFA) [1d0f:efa1]")
elif tool == "fi_info":
    if args != ["-p", "efa"]:
        unexpected()
    if not efa:
        sys.stderr.write("fi_getinfo: -61 (No data available)\n")
        sys.exit(1)
    for n in range(NICS):
        print(f"provider: efa\n    fabric: efa\n    domain: rdmap{16 + n * 16}s27-rdm\n"
              "    version: 122.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA")
elif tool == "findmnt":
    if args != ["-n", "-o", "SOURCE,FSTYPE", "--mountpoint", CACHE]:
        unexpected()
    if flag("no-cache"):
        sys.exit(1)
    print("/dev/md127 xfs")
elif tool == "df":
    if args != ["-B1", "--output=target,size,avail", CACHE]:
        unexpected()
    print("Mounted on             1B-blocks           Avail")
    if flag("no-cache"):
        # The empty mount point lives on the root volume.
        print("/                   207929917440    150312738816")
    else:
        print(f"{CACHE} 30397335011328 30224942011328")
elif tool == "docker":
    if args[:4] != ["image", "inspect", "--format", "{{.Id}}"] or len(args) != 5:
        unexpected()
    if flag("no-image"):
        print()
        sys.stderr.write(f"Error: No such image: {args[4]}\n")
        sys.exit(1)
    print("sha256:4f1c9ee2b1a9a0d7c6d8d5ebc1ee5b1a4cf1a8d3e2b7f0a91c3d6e8f2a4b5c6d")
elif tool == "curl":
    if args[:7] != ["-fsS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"] \
            or len(args) != 8:
        unexpected()
    code = value("health", "200")
    if code == "down":
        sys.stdout.write("000")
        sys.stderr.write("curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: "
                         "Couldn't connect to server\n")
        sys.exit(7)
    sys.stdout.write(code)
    if code != "200":
        sys.stderr.write(f"curl: (22) The requested URL returned error: {code}\n")
        sys.exit(22)
else:
    unexpected()
'''


# AuthorizedKeysCommand: the keys EC2 Instance Connect pushed for the user, when the test
# wrote eic.json ({"endpoint": sandbox URL, "instance_id": ...}) in the node's folder.
EIC_KEYS = r'''
import json, os, sys, urllib.parse, urllib.request
conf = os.path.join(NODE_ROOT, "eic.json")
if not os.path.exists(conf):
    sys.exit(0)
c = json.load(open(conf))
q = urllib.parse.urlencode({"instance_id": c["instance_id"], "user": sys.argv[1]})
with urllib.request.urlopen(f"{c['endpoint']}/_poolctl/instance-connect?{q}", timeout=5) as r:
    print("\n".join(json.load(r)["keys"]))
'''


@dataclass
class FakeNode:
    port: int
    user: str
    root: Path
    known_hosts: Path
    identity: Path
    wrong_identity: Path
    host_key_pub: Path
    log: Path

    @property
    def state(self) -> Path:
        return self.root / "node" / "state"

    @property
    def calls_log(self) -> Path:
        return self.root / "node" / "calls.log"

    @property
    def infiniband(self) -> Path:
        return self.root / "sys" / "class" / "infiniband"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Back to a healthy node with no calls recorded."""
        shutil.rmtree(self.state, ignore_errors=True)
        self.state.mkdir(parents=True)
        shutil.rmtree(self.infiniband, ignore_errors=True)
        self.infiniband.mkdir(parents=True)
        self.calls_log.write_text("")
        (self.root / "eic.json").unlink(missing_ok=True)

    def set(self, *, gpus: int | None = None, efa: bool = False, cache: bool = True,
            image: bool = True, health: str | None = None,
            nvidia_smi_hangs_s: float = 0) -> None:
        if gpus is not None:
            (self.state / "gpus").write_text(f"{gpus}\n")
        if efa:
            (self.state / "efa").touch()
            for n in range(4):  # what the EFA driver registers, one per attached EFA
                (self.infiniband / f"rdmap{16 + n * 16}s27").mkdir()
        if not cache:
            (self.state / "no-cache").touch()
        if not image:
            (self.state / "no-image").touch()
        if health is not None:
            (self.state / "health").write_text(health)
        if nvidia_smi_hangs_s:
            (self.state / "nvidia-smi-hangs").write_text(str(nvidia_smi_hangs_s))

    def calls(self) -> list[str]:
        return [ln for ln in self.calls_log.read_text().splitlines() if ln]

    def fingerprint(self) -> str:
        """The host key's fingerprint as OpenSSH prints it."""
        out = subprocess.run(["ssh-keygen", "-lf", str(self.host_key_pub)], check=True,
                             capture_output=True, text=True).stdout
        return out.split()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name,
                    "-f", str(path)], check=True, capture_output=True)


def _wait_banner(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-2.0-OpenSSH"):
                    return True
        except OSError:
            time.sleep(0.05)
    return False


def start_sshd(root: Path, extra_addresses: tuple[str, ...] = ()) -> Iterator[FakeNode]:
    """Generator for a fixture: yields a FakeNode whose sshd runs until the generator ends.

    sshd listens on 127.0.0.1 and on `extra_addresses` (more loopback addresses, 127.0.0.0/8,
    standing for other nodes); known_hosts holds the host key under each of them.
    """
    if os.geteuid() != 0:
        pytest.skip("sshd must run as root (it switches to the login user); CI runs as root")
    if not SSHD.is_file() or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server not installed: apt-get install -y openssh-server")
    # sshd's privilege-separation directory; the Debian service creates it, we do not use it.
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)

    user = getpass.getuser()
    for name in ("host_key", "client_key", "wrong_key"):
        _keygen(root / name)
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    bin_dir = root / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "fake-node"
    prog.write_text(f"#!{sys.executable}\n{FAKE_NODE}")
    prog.chmod(0o755)
    for tool in STUBS:
        (bin_dir / tool).symlink_to(prog)

    # sshd runs an AuthorizedKeysCommand only from a path no one else can write, /tmp and
    # its children excluded: a root-owned folder under /run, removed at the end.
    keys_dir = Path(tempfile.mkdtemp(prefix="poolctl-test-sshd-", dir="/run"))
    keys_cmd = keys_dir / "eic-keys"
    keys_cmd.write_text(f"#!{sys.executable}\nNODE_ROOT = {str(root)!r}\n{EIC_KEYS}")
    keys_cmd.chmod(0o755)

    log = root / "sshd.log"
    for _ in range(3):  # the free port can be taken between probe and bind
        port = _free_port()
        cfg = root / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {port}",
            *(f"ListenAddress {a}" for a in ("127.0.0.1", *extra_addresses)),
            f"HostKey {root / 'host_key'}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            # The node side of EC2 Instance Connect: keys pushed for the instance, read from
            # the sandbox (on EC2 from the instance metadata) when `eic.json` names them.
            f"AuthorizedKeysCommand {keys_cmd} %u",
            "AuthorizedKeysCommandUser root",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {user}",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "PrintMotd no",
            f"SetEnv PATH={bin_dir}:/usr/bin:/bin POOLCTL_SYSFS={root / 'sys'} "
            f"POOLCTL_FAKE_NODE={root / 'node'}",
            "",
        ]))
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(cfg)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        if _wait_banner(port, proc):
            break
        proc.kill()
        proc.wait()
    else:
        shutil.rmtree(keys_dir, ignore_errors=True)
        pytest.skip(f"sshd did not start: {log.read_text(errors='replace')[-400:]}")

    host_pub = root / "host_key.pub"
    key_type, key_b64 = host_pub.read_text().split()[:2]
    known = root / "known_hosts"
    known.write_text("".join(f"[{a}]:{port} {key_type} {key_b64}\n"
                             for a in ("127.0.0.1", *extra_addresses)))
    node = FakeNode(port=port, user=user, root=root, known_hosts=known,
                    identity=root / "client_key", wrong_identity=root / "wrong_key",
                    host_key_pub=host_pub, log=log)
    node.reset()
    try:
        yield node
    finally:
        shutil.rmtree(keys_dir, ignore_errors=True)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
