"""The NVMe cache script (cli/poolctl/boot/nvme-raid.sh.j2, rendered standalone) run for real, as
root, on loop devices over sparse files in tmp_path, mounted under tmp_path (never the real
cache mount point).

The life of a node's cache: first start builds it; a rerun is a no-op; a reboot keeps the
instance store, so the array / filesystem is reused (and data survives); a warm-pool stop
hands the devices back blank, so it is rebuilt. A stop is simulated by unmounting, stopping
the array and replacing each device by a fresh blank one (the backing file truncated to zero
and re-grown, then attached again).

Needs (Debian/Ubuntu packages): util-linux (losetup, blkid, wipefs, mountpoint), mdadm,
xfsprogs; a kernel with loop and md/raid0. Each test probes first and skips with the exact
reason when the machine cannot do it (containers without /dev/loop*, kernels without md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from poolctl.bootscript import render_nvme_script
from poolctl.cloud import Cloud

DEVICE_BYTES = 512 * 2**20  # mkfs.xfs wants at least 300 MB per filesystem


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def _need_root_and_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: losetup, mdadm, mkfs and mount act on block devices")
    for tool, package in (("losetup", "util-linux"), ("blkid", "util-linux"),
                          ("wipefs", "util-linux"), ("mountpoint", "util-linux"),
                          ("mkfs.xfs", "xfsprogs")):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed (apt-get install -y {package})")
    probe = sh("losetup", "-f", check=False)
    if probe.returncode != 0:
        pytest.skip(f"no free loop device: `losetup -f` said: {probe.stderr.strip()}")


def _need_md() -> None:
    if not shutil.which("mdadm"):
        pytest.skip("mdadm not installed (apt-get install -y mdadm)")
    mdstat = Path("/proc/mdstat")
    if not mdstat.exists():
        probe = sh("modprobe", "md_mod", check=False) if shutil.which("modprobe") else None
        if not mdstat.exists():
            said = probe.stderr.strip() if probe else "modprobe is not installed"
            pytest.skip(f"kernel has no md (software RAID) driver: /proc/mdstat is missing and "
                        f"`modprobe md_mod` failed: {said}")
    if "raid0" not in mdstat.read_text():
        probe = sh("modprobe", "raid0", check=False) if shutil.which("modprobe") else None
        if "raid0" not in mdstat.read_text() and probe is not None and probe.returncode != 0:
            pytest.skip(f"kernel has md but no raid0 personality: `modprobe raid0` failed: "
                        f"{probe.stderr.strip()}")


class Disks:
    """Loop devices over sparse files; undone in the finalizer whatever state a test left."""

    def __init__(self, root: Path):
        self.root = root
        self.mnt = root / "cache"
        self.files: list[Path] = []
        self.devs: list[str] = []

    def attach(self, n: int) -> list[str]:
        for i in range(n):
            f = self.root / f"nvme{i}.img"
            with f.open("wb") as fh:
                fh.truncate(DEVICE_BYTES)
            self.files.append(f)
            self.devs.append(sh("losetup", "-f", "--show", str(f)).stdout.strip())
        return self.devs

    def holders(self) -> list[str]:
        out = []
        for dev in self.devs:
            out += [h.name for h in Path(f"/sys/class/block/{Path(dev).name}/holders").glob("md*")]
        return sorted(set(out))

    def stop(self) -> None:
        """Unmount and stop the array: what a node's shutdown leaves behind."""
        if sh("mountpoint", "-q", str(self.mnt), check=False).returncode == 0:
            sh("umount", str(self.mnt))
        for md in self.holders():
            sh("mdadm", "--stop", f"/dev/{md}")

    def blank(self) -> list[str]:
        """A warm-pool stop: the same slots come back as blank devices."""
        self.stop()
        for dev in self.devs:
            sh("losetup", "-d", dev)
        self.devs = []
        for f in self.files:
            with f.open("r+b") as fh:
                fh.truncate(0)
                fh.truncate(DEVICE_BYTES)
            self.devs.append(sh("losetup", "-f", "--show", str(f)).stdout.strip())
        return self.devs

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            for dev in self.devs:
                sh("losetup", "-d", dev, check=False)


@pytest.fixture
def disks(tmp_path):
    _need_root_and_tools()
    d = Disks(tmp_path)
    yield d
    d.cleanup()


def run_nvme(tmp_path: Path, disks: Disks, expected: int) -> subprocess.CompletedProcess:
    script = tmp_path / "nvme-raid.sh"
    script.write_text(render_nvme_script(Cloud.aws, expected))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "POOLCTL_NVME_DEVICES": " ".join(disks.devs),
           "POOLCTL_CACHE_MOUNT": str(disks.mnt)}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode == 0:
        assert re.search(r"^poolctl: phase=nvme seconds=\d+$", r.stderr, re.M), r.stderr
    return r


def mounted(disks: Disks) -> tuple[str, str]:
    out = sh("findmnt", "-n", "-o", "SOURCE,FSTYPE", "--mountpoint", str(disks.mnt),
             check=False).stdout.split()
    return (out[0], out[1]) if out else ("", "")


def test_single_device_builds_reuses_and_rebuilds(tmp_path, disks):
    (dev,) = disks.attach(1)

    r = run_nvme(tmp_path, disks, expected=1)
    assert r.returncode == 0, r.stderr
    assert "formatting" in r.stderr
    assert mounted(disks) == (dev, "xfs")
    (disks.mnt / "sentinel").write_text("kept")

    r = run_nvme(tmp_path, disks, expected=1)
    assert r.returncode == 0, r.stderr
    assert "is mounted already" in r.stderr and "formatting" not in r.stderr

    disks.stop()  # reboot: the instance store keeps its data
    r = run_nvme(tmp_path, disks, expected=1)
    assert r.returncode == 0, r.stderr
    assert "mounted the existing xfs" in r.stderr and "formatting" not in r.stderr
    assert (disks.mnt / "sentinel").read_text() == "kept"

    (dev,) = disks.blank()  # warm-pool stop/start: blank device
    r = run_nvme(tmp_path, disks, expected=1)
    assert r.returncode == 0, r.stderr
    assert "formatting" in r.stderr
    assert mounted(disks) == (dev, "xfs")
    assert not (disks.mnt / "sentinel").exists()


def test_raid0_builds_reuses_and_rebuilds(tmp_path, disks):
    _need_md()
    devs = disks.attach(2)

    r = run_nvme(tmp_path, disks, expected=2)
    assert r.returncode == 0, r.stderr
    assert "creating RAID0 over 2 devices" in r.stderr
    (md,) = disks.holders()
    assert mounted(disks) == (f"/dev/{md}", "xfs")
    sysfs = Path(f"/sys/block/{md}/md")
    assert (sysfs / "level").read_text().strip() == "raid0"
    assert (sysfs / "raid_disks").read_text().strip() == "2"
    # Striped over both: more than one device's worth of space (less the md metadata).
    assert int(Path(f"/sys/block/{md}/size").read_text()) * 512 > 1.9 * DEVICE_BYTES
    (disks.mnt / "sentinel").write_text("kept")

    r = run_nvme(tmp_path, disks, expected=2)
    assert r.returncode == 0 and "is mounted already" in r.stderr, r.stderr

    sh("umount", str(disks.mnt))  # reboot where udev already assembled the array
    r = run_nvme(tmp_path, disks, expected=2)
    assert r.returncode == 0, r.stderr
    assert f"reusing active array /dev/{md}" in r.stderr and "formatting" not in r.stderr
    assert (disks.mnt / "sentinel").read_text() == "kept"

    disks.stop()  # reboot where nothing assembled it
    r = run_nvme(tmp_path, disks, expected=2)
    assert r.returncode == 0, r.stderr
    assert "assembled the existing array" in r.stderr and "formatting" not in r.stderr
    assert (disks.mnt / "sentinel").read_text() == "kept"

    devs = disks.blank()  # warm-pool stop/start: both devices blank
    r = run_nvme(tmp_path, disks, expected=2)
    assert r.returncode == 0, r.stderr
    assert "creating RAID0 over 2 devices: " + " ".join(devs) in r.stderr
    assert "formatting" in r.stderr
    assert not (disks.mnt / "sentinel").exists()
    assert mounted(disks)[1] == "xfs"
