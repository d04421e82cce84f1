"""`poolctl image build` for real: Packer against the sandbox, and the provisioning script on
a loop-mounted root (issue 10).

In the sandbox Packer runs with `communicator = "none"` (test mode only): the emulator runs
no instance, so no provisioner runs there; the provisioning script is exercised on its own
below, with stand-in `docker`/`s5cmd`.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poolctl import bootscript
from tests.plugins.sandbox import REPO, poolctl_env, run_poolctl, terraform_missing

EXAMPLE = REPO / "examples" / "llama-70b-p5" / "poolctl.yaml"
PACKER = shutil.which("packer")
# Per test: the provisioning script and GCP's list/prune need no Packer.
needs_packer = pytest.mark.skipif(PACKER is None, reason="packer not on PATH (scripts/setup "
                                  "installs Debian's packer 1.6.6)")
# Each test builds its own project's images: none builds on another, any worker may run it.


def _config(tmp_path: Path, project: str) -> Path:
    f = tmp_path / "poolctl.yaml"
    f.write_text(EXAMPLE.read_text().replace("project: acme", f"project: {project}"))
    return f


def _private_subnet(ec2, project: str) -> str:
    """What the pool's stack creates and the builder looks for: a tagged private subnet."""
    tags = [{"Key": "poolctl:project", "Value": project},
            {"Key": "poolctl:pool", "Value": "chat-70b"},
            {"Key": "poolctl:role", "Value": "inference"},
            {"Key": "poolctl:tier", "Value": "private"}]
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    return ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.0.0/20", TagSpecifications=[
        {"ResourceType": "subnet", "Tags": tags}])["Subnet"]["SubnetId"]


def _leftovers(ec2, project: str) -> dict:
    """Builder instances not terminated, Packer's temporary security groups and key pairs."""
    res = ec2.describe_instances(Filters=[
        {"Name": "tag:poolctl:project", "Values": [project]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping",
                                                    "stopped"]}])["Reservations"]
    return {
        "instances": [i["InstanceId"] for r in res for i in r["Instances"]],
        "security_groups": [g["GroupName"] for g in ec2.describe_security_groups()[
            "SecurityGroups"] if g["GroupName"].startswith("packer")],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]
                      if k["KeyName"].startswith("packer")],
    }


def _records(home: Path, project: str) -> list[dict]:
    out = []
    for f in (home / "images").glob("aws-*.json"):
        rec = json.loads(f.read_text())
        if rec.get("project") == project:
            out.append(rec)
    return out


@needs_packer
def test_build_in_sandbox_records_ami_and_deploy_uses_it(sandbox, sandbox_home,
                                                         sandbox_client, tmp_path):
    ec2 = sandbox_client("ec2")
    f = _config(tmp_path, "imgok")
    before = f.read_text()
    _private_subnet(ec2, "imgok")
    t0 = time.monotonic()
    res = run_poolctl(sandbox_home, "image", "build", "--cloud", "aws", "--sandbox", "-f",
                      str(f), "--json", timeout=300)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    ami = out["image_id"]
    sys.stderr.write(f"\nimage build --sandbox wall time: {wall:.1f} s\n")
    # Packer's output is in its private log, not on the terminal (issue 23).
    [log] = re.findall(r"Packer's output goes to (\S+)$", res.stderr, re.M)
    assert Path(log).stat().st_mode & 0o777 == 0o600
    assert "==> Builds finished. The artifacts of successful builds are:" in Path(
        log).read_text()
    assert "==>" not in res.stderr and "amazon-ebs.node:" not in res.stderr
    assert ami.startswith("ami-")
    image = ec2.describe_images(ImageIds=[ami])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    assert tags["poolctl:project"] == "imgok" and tags["poolctl:pool"] == "chat-70b"
    assert tags["poolctl:role"] == "inference"
    assert tags["poolctl:serving-image"] == "vllm/vllm-openai:v0.34.0"
    # The boot library version the image carries: the stack's plan reads it (issue 10).
    assert tags["poolctl:boot-library"] == bootscript.boot_library("aws")["version"]
    # One line of the file changed: the AMI recorded at the top of the `aws:` block.
    after = f.read_text()
    assert [ln for ln in after.splitlines() if ln not in before.splitlines()] == [
        f"      ami_id: {ami}"]
    assert len(after.splitlines()) == len(before.splitlines()) + 1
    [rec] = _records(Path(sandbox_home), "imgok")
    assert rec["image_id"] == ami and rec["serving_image"] == "vllm/vllm-openai:v0.34.0"
    assert rec["packer_version"] == "1.6.6" and rec["endpoint"] == sandbox
    lib_version = bootscript.boot_library("aws")["version"]
    assert rec["boot_lib_version"] == lib_version
    assert _leftovers(ec2, "imgok") == {"instances": [], "security_groups": [],
                                        "key_pairs": []}
    # plan now says the placement's image carries the serving image.
    plan = run_poolctl(sandbox_home, "plan", "-f", str(f), "--cloud", "aws", "--json")
    entry = json.loads(plan.stdout)["pools"][0]
    assert entry["node_image"]["id"] == ami and entry["node_image"]["prepulled"] is True
    assert "hydrate" in entry["start_phases"]["cold"]
    # The following deploy launches nodes from it. A full sandbox deploy of a second pool
    # takes ~100 s: the planned launch template is checked instead (--plan-only). Without
    # the build record: the AMI's tag alone chooses the boot script, at plan time.
    (Path(sandbox_home) / "images" / f"aws-{ami}.json").unlink()
    assert _records(Path(sandbox_home), "imgok") == []
    why = terraform_missing()
    if why:
        pytest.skip(f"deploy --plan-only needs Terraform: {why}")
    dep = run_poolctl(sandbox_home, "deploy", "--cloud", "aws", "--sandbox", "--plan-only",
                      "-f", str(f), "--out", str(tmp_path / "cdktf.out"), timeout=600)
    assert dep.returncode == 0, dep.stderr[-3000:]
    work = Path(sandbox_home) / "sandbox" / "deploy" / "imgok-chat-70b-aws"
    show = subprocess.run(["terraform", "show", "-json", "tfplan"], cwd=work,
                          capture_output=True, text=True, env=poolctl_env(sandbox_home),
                          timeout=300)
    assert show.returncode == 0, show.stderr
    lts = [rc["change"]["after"] for rc in json.loads(show.stdout)["resource_changes"]
           if rc["type"] == "aws_launch_template"]
    assert [lt["image_id"] for lt in lts] == [ami]
    # Its user data sources the boot library the image carries instead of holding it.
    user_data = gzip.decompress(base64.b64decode(lts[0]["user_data"])).decode()
    assert f"POOLCTL_LIB_VERSION={lib_version}\n" in user_data
    assert "verify_weights() {" not in user_data


def _start_build(home: Path, f: Path, hold: int, fail: bool = False) -> subprocess.Popen:
    env = poolctl_env(home, POOLCTL_IMAGE_SANDBOX_HOLD_S=str(hold),
                      POOLCTL_IMAGE_SANDBOX_FAIL="1" if fail else "")
    return subprocess.Popen([sys.executable, "-m", "poolctl", "image", "build", "--cloud",
                             "aws", "--sandbox", "-f", str(f)], env=env, cwd=str(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_builder(ec2, project: str, proc: subprocess.Popen) -> str:
    for _ in range(600):
        assert proc.poll() is None, proc.communicate()
        left = _leftovers(ec2, project)
        if left["instances"]:
            return left["instances"][0]
        time.sleep(0.1)
    raise AssertionError("the builder instance never appeared")


@needs_packer
def test_interrupted_build_leaves_nothing(sandbox, sandbox_home, sandbox_client, tmp_path):
    ec2 = sandbox_client("ec2")
    f = _config(tmp_path, "imgint")
    before = f.read_text()
    _private_subnet(ec2, "imgint")
    proc = _start_build(Path(sandbox_home), f, hold=120)
    try:
        _wait_for_builder(ec2, "imgint", proc)
        assert _leftovers(ec2, "imgint")["key_pairs"]  # mid-build: Packer's key pair exists
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: Packer is cleaning up" in err and "Traceback" not in err
    assert _leftovers(ec2, "imgint") == {"instances": [], "security_groups": [],
                                         "key_pairs": []}
    assert f.read_text() == before
    assert _records(Path(sandbox_home), "imgint") == []
    tagged = ec2.describe_images(Owners=["self"], Filters=[
        {"Name": "tag:poolctl:project", "Values": ["imgint"]}])["Images"]
    assert tagged == []


@needs_packer
def test_failed_build_leaves_nothing(sandbox, sandbox_home, sandbox_client, tmp_path):
    """Provisioning fails once the builder runs (the sandbox's simulated failure; moto lets
    even a builder terminated from outside go on to an AMI): Packer cleans up, nothing is
    recorded."""
    ec2 = sandbox_client("ec2")
    f = _config(tmp_path, "imgfail")
    before = f.read_text()
    _private_subnet(ec2, "imgfail")
    proc = _start_build(Path(sandbox_home), f, hold=2, fail=True)
    try:
        _wait_for_builder(ec2, "imgfail", proc)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    # One line: Packer's last error and its log, which holds the rest of its output.
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(r"poolctl: packer build failed \(exit 1\): amazon-ebs.node: Script "
                     r"exited with non-zero exit status: 1\.Allowed exit codes are: \[0\]; "
                     r"Packer removed its builder; nothing was recorded; its whole output: "
                     r"(\S+/logs/imgfail-chat-70b-aws/\S+-image-build-\d+\.log)", last)
    assert m, err
    assert "simulated provisioning failure" in Path(m[1]).read_text()
    assert "simulated provisioning failure" not in err and "Traceback" not in err
    assert _leftovers(ec2, "imgfail") == {"instances": [], "security_groups": [],
                                          "key_pairs": []}
    assert f.read_text() == before
    assert _records(Path(sandbox_home), "imgfail") == []


@needs_packer
def test_build_before_the_first_deploy_is_one_line(sandbox, sandbox_home, sandbox_client,
                                                   tmp_path):
    """Image first, then the pool (issue 23): the pool's private subnets do not exist yet,
    so the build stops before Packer runs, in one line naming the two ways forward; a
    subnet the file names that does not exist, likewise."""
    ec2 = sandbox_client("ec2")
    f = _config(tmp_path, "imgfirst")
    before = f.read_text()
    t0 = time.monotonic()
    res = run_poolctl(sandbox_home, "image", "build", "--cloud", "aws", "--sandbox", "-f",
                      str(f), timeout=300)
    sys.stderr.write(f"\nimage build before the first deploy: {time.monotonic() - t0:.1f} s\n")
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        "poolctl: pools[0].aws.network: no subnet to build the image in: the pool's private "
        "subnets (poolctl:project=imgfirst, poolctl:pool=chat-70b, poolctl:role=inference, "
        "poolctl:tier=private) do not exist in us-east-1 before its first deploy; deploy the "
        "pool first (`poolctl deploy --cloud aws --sandbox`, then build again), or set "
        "aws.network.vpc_id and subnet_ids to a private subnet with NAT egress; Packer did "
        "not run"]
    assert f.read_text() == before
    assert not list(Path(sandbox_home).glob("logs/imgfirst-*/*-image-build-*.log"))
    assert _leftovers(ec2, "imgfirst") == {"instances": [], "security_groups": [],
                                           "key_pairs": []}
    assert _records(Path(sandbox_home), "imgfirst") == []
    # The file names a subnet that is not there.
    vpc = ec2.create_vpc(CidrBlock="10.78.0.0/16")["Vpc"]["VpcId"]
    f.write_text(before.replace("      instance_type: p5.48xlarge\n",
                                "      instance_type: p5.48xlarge\n      network:\n"
                                f"        vpc_id: {vpc}\n"
                                "        subnet_ids: [subnet-0123456789abcdef0, "
                                "subnet-0123456789abcdef1]\n"))
    named = f.read_text()
    res = run_poolctl(sandbox_home, "image", "build", "--cloud", "aws", "--sandbox", "-f",
                      str(f), timeout=300)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        "poolctl: pools[0].aws.network.subnet_ids: subnet-0123456789abcdef0 does not exist in "
        "us-east-1, so the image builder has nowhere to run; name a private subnet of "
        "aws.network.vpc_id there (with NAT egress); Packer did not run"]
    assert f.read_text() == named
    assert _leftovers(ec2, "imgfirst")["key_pairs"] == []


# ---------------------------------------------------------------------------------------
# The provisioning script on a loop-mounted root


DIGEST = "vllm/vllm-openai@sha256:" + "4f1c9ee2" * 8
STANDIN_DOCKER = """#!/bin/bash
# Stand-in docker: `pull` stores the image as a layer folder, `image inspect` reports it.
set -eu
store="$POOLCTL_ROOT/var/lib/docker/overlay2/l1/diff"
case "$1 $2" in
  "pull -q") echo "pull $3" >>"$STANDIN_LOG"; mkdir -p "$store"; echo layer >"$store/f";;
  "image inspect") [[ -f $store/f ]] || exit 1
    echo "DIGEST";;
  *) echo "unexpected docker $*" >>"$STANDIN_LOG"; exit 2;;
esac
""".replace("DIGEST", DIGEST)


@pytest.fixture
def image_root(tmp_path):
    """A loop-mounted ext4 root when root and loop devices are available, else a plain
    folder (the script only needs paths under POOLCTL_ROOT)."""
    mnt = tmp_path / "root"
    mnt.mkdir()
    disk = tmp_path / "root.img"
    loop = None
    if os.geteuid() == 0 and shutil.which("losetup") and shutil.which("mkfs.ext4"):
        with open(disk, "wb") as fh:
            fh.truncate(64 << 20)
        ok = subprocess.run(["mkfs.ext4", "-q", "-F", str(disk)], capture_output=True)
        probe = subprocess.run(["losetup", "-f", "--show", str(disk)], capture_output=True,
                               text=True)
        if ok.returncode == 0 and probe.returncode == 0:
            loop = probe.stdout.strip()
            if subprocess.run(["mount", loop, str(mnt)], capture_output=True).returncode:
                subprocess.run(["losetup", "-d", loop])
                loop = None
    yield mnt, loop
    if loop:
        subprocess.run(["umount", str(mnt)])
        subprocess.run(["losetup", "-d", loop])


def test_provision_script_pulls_records_and_cleans(tmp_path, image_root):
    from poolctl import images
    from poolctl.config import load_config

    root, loop = image_root
    sys.stderr.write(f"\nprovision.sh root: {'loop device ' + loop if loop else 'plain dir'}\n")
    cfg = load_config(EXAMPLE)
    r = images.render(cfg, cfg.pools[0], "aws", version=(1, 6, 6),
                      base_image="ami-0123456789abcdef0")
    script = tmp_path / "provision.sh"
    script.write_text(r.files["provision.sh"])
    if shutil.which("shellcheck"):
        sc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert sc.returncode == 0, sc.stdout
    # A builder's leftovers, as the base image and the build leave them.
    for rel, text in {"etc/machine-id": "0123456789abcdef\n",
                      "var/lib/dbus/machine-id": "0123456789abcdef\n",
                      "etc/ssh/ssh_host_ed25519_key": "KEY", "root/.ssh/authorized_keys": "k",
                      "home/ubuntu/.ssh/authorized_keys": "k", "root/.docker/config.json": "{}",
                      "home/ubuntu/.bash_history": "ls", "var/lib/cloud/instances/i-1/x": "x",
                      "var/log/syslog": "boot log", "var/log/syslog.1": "old",
                      "var/log/apt/history.log.2.gz": "z", "tmp/packer-x": "x",
                      "etc/hostname": "keep-me\n"}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STANDIN_DOCKER)
    (bin_dir / "s5cmd").write_text("#!/bin/sh\necho \"s5cmd $*\" >>\"$STANDIN_LOG\"\n")
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho \"apt-get $*\" >>\"$STANDIN_LOG\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "standin.log"
    env = {**os.environ, "POOLCTL_ROOT": str(root), "STANDIN_LOG": str(log),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    prep = subprocess.run(["bash", str(script), "prepare"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert prep.returncode == 0, prep.stderr
    assert "pull vllm/vllm-openai:v0.34.0" in log.read_text()
    rec = json.loads((root / "etc/poolctl/node-image.json").read_text())
    assert rec["serving_image"] == "vllm/vllm-openai:v0.34.0"
    assert rec["digest"] == DIGEST
    assert "poolctl: phase=pull seconds=" in prep.stderr
    # The boot library, byte for byte what the start-up script of this pool's nodes checks
    # and sources (its version line first), world-readable, root-owned like the rest.
    lib = bootscript.boot_library("aws")
    installed = root / "opt/poolctl/lib/boot.sh"
    assert installed.read_text() == lib["text"]
    assert f"# poolctl-boot-lib-version: {lib['version']}\n" in installed.read_text()
    assert oct(installed.stat().st_mode & 0o777) == "0o644"
    assert not (root / "opt/poolctl/lib/boot.sh.tmp").exists()
    assert f"poolctl: boot library: /opt/poolctl/lib/boot.sh version {lib['version']}" \
        in prep.stderr
    user_data = bootscript.render_boot_script(cfg, cfg.pools[0], "aws", from_image=True)
    assert f"POOLCTL_LIB_VERSION={lib['version']}\n" in user_data
    clean = subprocess.run(["bash", str(script), "clean"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert clean.returncode == 0, clean.stderr
    gone = ["var/lib/dbus/machine-id", "etc/ssh/ssh_host_ed25519_key",
            "root/.ssh/authorized_keys", "home/ubuntu/.ssh/authorized_keys",
            "root/.docker/config.json", "home/ubuntu/.bash_history", "var/lib/cloud/instances",
            "var/log/syslog.1", "var/log/apt/history.log.2.gz", "tmp/packer-x"]
    assert [g for g in gone if (root / g).exists()] == []
    assert (root / "etc/machine-id").read_text() == ""  # empty: systemd makes a new one
    assert (root / "var/log/syslog").read_text() == ""
    assert (root / "etc/hostname").read_text() == "keep-me\n"
    assert (root / "var/lib/docker/overlay2/l1/diff/f").exists()  # the layers stay
    assert (root / "etc/poolctl/node-image.json").exists()
    assert (root / "opt/poolctl/lib/boot.sh").read_text() == lib["text"]  # clean keeps it
    assert "apt-get" not in log.read_text()  # mdadm, xfsprogs, curl, python3 were present


@needs_packer
def test_list_and_prune_keep_what_is_used(sandbox, sandbox_home, sandbox_client, tmp_path):
    """Three builds: the file uses the newest; `prune --keep 1` keeps it and the newest
    unused one, deregisters the oldest with its snapshots."""
    ec2 = sandbox_client("ec2")
    f = _config(tmp_path, "imgprune")
    _private_subnet(ec2, "imgprune")
    built = []
    for _ in range(3):
        res = run_poolctl(sandbox_home, "image", "build", "--cloud", "aws", "--sandbox", "-f",
                          str(f), "--json", timeout=300)
        assert res.returncode == 0, res.stderr
        built.append(json.loads(res.stdout)["image_id"])
        time.sleep(1.1)  # image names and creation dates are per second
    ls = run_poolctl(sandbox_home, "image", "list", "--cloud", "aws", "--sandbox", "-f", str(f),
                     "--json")
    assert ls.returncode == 0, ls.stderr
    rows = json.loads(ls.stdout)["images"]
    assert [r["id"] for r in rows] == built[::-1]
    assert rows[0]["in_use"] == ["aws.ami_id in the file"]
    assert rows[1]["in_use"] == rows[2]["in_use"] == []
    snaps = rows[2]["snapshots"]
    pr = run_poolctl(sandbox_home, "image", "prune", "--keep", "1", "--cloud", "aws",
                     "--sandbox", "-f", str(f), "--json")
    assert pr.returncode == 0, pr.stderr
    out = json.loads(pr.stdout)
    assert [d["id"] for d in out["deleted"]] == [built[0]]
    assert sorted(out["kept"]) == sorted(built[1:])
    left = ec2.describe_images(Owners=["self"], Filters=[
        {"Name": "tag:poolctl:project", "Values": ["imgprune"]}])["Images"]
    assert sorted(i["ImageId"] for i in left) == sorted(built[1:])
    assert snaps  # moto gives each AMI its root snapshot
    have = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert not set(snaps) & have


@needs_packer
@pytest.mark.skipif(terraform_missing() is not None,
                    reason=f"rollouts apply through Terraform: {terraform_missing()}")
def test_rollout_to_the_latest_node_image(deployed_pool, sandbox, sandbox_home,
                                          sandbox_client, tmp_path):
    """`image build` for the deployed example, then `rollout start --node-image latest` on a
    file that does not name an AMI yet: the line is added, the refresh rolls every node to
    the new launch template version, which launches from the built AMI."""
    from tests.ops.test_runtime_aws import booting
    from tests.plugins.sandbox import sandbox_admin

    ec2, asg = sandbox_client("ec2"), sandbox_client("autoscaling")
    if not ec2.describe_subnets(Filters=[{"Name": "tag:poolctl:project", "Values": ["acme"]},
                                         {"Name": "tag:poolctl:tier", "Values": ["private"]}]
                                )["Subnets"]:
        _private_subnet(ec2, "acme")  # the boto3 stand-in of the deployed pool has no tier tag
    sandbox_admin(sandbox, "POST", "/_poolctl/quotas",
                  {"quotas": {"L-417A185B": 100_000}, "region": "us-east-1"})
    (tmp_path / "build").mkdir()
    build_file = tmp_path / "build" / "poolctl.yaml"
    shutil.copy(EXAMPLE, build_file)
    res = run_poolctl(sandbox_home, "image", "build", "--cloud", "aws", "--sandbox", "-f",
                      str(build_file), "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    ami = json.loads(res.stdout)["image_id"]
    pool_file = tmp_path / "poolctl.yaml"
    shutil.copy(EXAMPLE, pool_file)
    before = pool_file.read_text()
    with booting(sandbox):
        res = run_poolctl(sandbox_home, "rollout", "start", "--cloud", "aws", "--node-image",
                          "latest", "--no-surge", "--yes", "--json", "-f", str(pool_file),
                          "--sandbox", "--out", str(tmp_path / "cdktf.out"), timeout=900,
                          POOLCTL_POLL_S="0.05")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)
    assert (r["key"], r["from"], r["to"]) == ("aws.ami_id", None, ami)
    assert r["final"]["status"] == "successful"
    added = [ln for ln in pool_file.read_text().splitlines() if ln not in before.splitlines()]
    assert added == [f"      ami_id: {ami}"]
    g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["acme-chat-70b"]
                                         )["AutoScalingGroups"][0]
    version = g["LaunchTemplate"]["Version"]
    data = ec2.describe_launch_template_versions(
        LaunchTemplateId=g["LaunchTemplate"]["LaunchTemplateId"], Versions=[version]
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["ImageId"] == ami
    assert {i["LaunchTemplate"]["Version"] for i in g["Instances"]
            if i["LifecycleState"] == "InService"} == {version}
    # Its rollback (the line removed, the default image rolled out again) is a further
    # Terraform apply (55.7 s here): tests/unit/test_images.py covers every branch of it with
    # the apply stubbed.
    # --image X --build-image: a node image for X first (aws.ami_id edited), then the rollout
    # of serving.image; the new launch template version launches from the new AMI.
    with booting(sandbox):
        res = run_poolctl(sandbox_home, "rollout", "start", "--cloud", "aws", "--image",
                          "vllm/vllm-openai:v0.34.1", "--build-image", "--no-surge", "--yes",
                          "--json", "-f", str(pool_file), "--sandbox", "--out",
                          str(tmp_path / "cdktf.out"), timeout=900, POOLCTL_POLL_S="0.05")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)
    assert (r["key"], r["from"], r["to"]) == ("serving.image", "vllm/vllm-openai:v0.34.0",
                                              "vllm/vllm-openai:v0.34.1")
    assert r["final"]["status"] == "successful"
    ami2 = next(ln.split(": ")[1] for ln in pool_file.read_text().splitlines()
                if ln.strip().startswith("ami_id:"))
    assert ami2 != ami
    tags = {t["Key"]: t["Value"] for t in ec2.describe_images(ImageIds=[ami2])["Images"][0]["Tags"]}
    assert tags["poolctl:serving-image"] == "vllm/vllm-openai:v0.34.1"
    g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["acme-chat-70b"]
                                         )["AutoScalingGroups"][0]
    data = ec2.describe_launch_template_versions(
        LaunchTemplateId=g["LaunchTemplate"]["LaunchTemplateId"],
        Versions=[g["LaunchTemplate"]["Version"]])["LaunchTemplateVersions"][0]
    assert data["LaunchTemplateData"]["ImageId"] == ami2
    plan = run_poolctl(sandbox_home, "plan", "-f", str(pool_file), "--cloud", "aws", "--json")
    assert json.loads(plan.stdout)["pools"][0]["node_image"]["prepulled"] is True


# ---------------------------------------------------------------------------------------
# GCP: list / prune / latest against the Compute Engine fake (tests/fakes/gce.py), through
# the real google-cloud-compute client and the real CLI.

GCP_PROJECT = "acme-prod"
V0, V1 = "acme-chat-70b-20251201090000000000000000", "acme-chat-70b-20260105090000000000000001"
SERVING = {"old": "vllm-vllm-openai-v0-11-0", "new": "vllm-vllm-openai-v0-11-1"}


@pytest.fixture
def gce(tmp_path):
    pytest.importorskip("google.cloud.compute_v1",
                        reason="google-cloud-compute is not installed (pip install -e .[gcp])")
    from tests.fakes.gce import FakeGce

    fake = FakeGce().start()  # lists page by 2: every caller follows nextPageToken
    yield fake
    fake.stop()
    assert fake.errors == []  # every answer and request matched compute_v1's messages


def _gcp_pool(gce, tmp_path) -> tuple[Path, dict[str, str]]:
    """The example pool deployed (MIG on template V1, V0 kept for a rollback) and six node
    images, oldest first: G unused, A under V0, B under V1, D unused, C named by the file's
    gcp.image, F unused; A, B, D, G carry v0.11.0 (the file's serving image), C and F v0.11.1.
    One image of another pool (E) must never show."""
    from datetime import UTC, datetime, timedelta

    from poolctl import naming
    from poolctl.config import parse_config
    from tests.configs import pool_yaml

    names = {k: f"acme-chat-70b-2026010{i}-090000" for i, k in enumerate("GABDCF", 1)}
    f = tmp_path / "poolctl.yaml"
    f.write_text(pool_yaml(extra_gcp="      image: projects/acme-prod/global/images/"
                                     f"{names['C']}\n"))
    cfg = parse_config(f.read_text())
    labels = naming.gcp_labels(cfg, cfg.pools[0])
    gce.deploy_pool(project=GCP_PROJECT, region="us-central1", name="acme-chat-70b",
                    labels=labels, zones=["us-central1-a", "us-central1-b", "us-central1-c"],
                    template=V1, older_templates=(V0,))
    link = f"https://www.googleapis.com/compute/v1/projects/{GCP_PROJECT}/global/images/"
    for tpl, image in ((V0, "A"), (V1, "B")):
        disk = gce.templates[(GCP_PROJECT, tpl)]["properties"]["disks"][0]
        disk["initializeParams"]["sourceImage"] = link + names[image]
    t0 = datetime(2026, 1, 1, 9, tzinfo=UTC)
    for i, k in enumerate("GABDCF"):
        serving = SERVING["new" if k in "CF" else "old"]
        gce.add_image(GCP_PROJECT, names[k], family="acme-chat-70b",
                      labels={**labels, "poolctl-serving-image": serving},
                      created=t0 + timedelta(hours=i))
    gce.add_image(GCP_PROJECT, "acme-other-20260101-090000",
                  labels={**labels, "poolctl-pool": "other"}, created=t0)
    return f, names


def test_gcp_list_prune_and_latest(gce, tmp_path, sandbox_home):
    f, names = _gcp_pool(gce, tmp_path)
    env = {"POOLCTL_GCE_ENDPOINT": gce.endpoint}
    ident = {k: f"projects/{GCP_PROJECT}/global/images/{v}" for k, v in names.items()}
    ls = run_poolctl(sandbox_home, "image", "list", "--cloud", "gcp", "-f", str(f), "--json",
                     **env)
    assert ls.returncode == 0, ls.stderr
    rows = json.loads(ls.stdout)["images"]
    assert [r["id"] for r in rows] == [ident[k] for k in "FCDBAG"]  # newest first
    assert {r["name"]: r["in_use"] for r in rows} == {
        names["F"]: [], names["C"]: ["gcp.image in the file"], names["D"]: [],
        names["B"]: [f"instance template {V1}"], names["A"]: [f"instance template {V0}"],
        names["G"]: []}
    assert [r["serving_image"] for r in rows] == [SERVING["new"]] * 2 + [SERVING["old"]] * 4

    # latest: the newest carrying the pool's serving image (v0.11.0), used or not: D.
    from poolctl import images
    from poolctl.config import load_config
    from poolctl.endpoints import CloudEndpoints

    endpoints = CloudEndpoints(gce_url=gce.endpoint)
    cfg = load_config(f)
    assert images.latest_image(cfg, cfg.pools[0], "gcp", endpoints) == ident["D"]

    # --keep 1: of the unused F, D, G the newest (F) stays; in-use C, B, A are never touched.
    pr = run_poolctl(sandbox_home, "image", "prune", "--keep", "1", "--cloud", "gcp", "-f",
                     str(f), "--json", **env)
    assert pr.returncode == 0, pr.stderr
    out = json.loads(pr.stdout)
    assert [d["id"] for d in out["deleted"]] == [ident["D"], ident["G"]]
    assert sorted(out["kept"]) == sorted(ident[k] for k in "CBAF")
    assert sorted(n for (p, n) in gce.images) == sorted(
        [names[k] for k in "FCBA"] + ["acme-other-20260101-090000"])
    deletes = [r for r in gce.requests if r["method"] == "DELETE"]
    assert [r["path"].rsplit("/", 1)[1] for r in deletes] == [names["D"], names["G"]]
    assert all(r["query"].get("requestId") for r in deletes)  # a retried delete is one
    # Now the newest image carrying v0.11.0 is B, which the MIG runs.
    assert images.latest_image(cfg, cfg.pools[0], "gcp", endpoints) == ident["B"]

    # No image carries the serving image: `rollout start --node-image latest` says so in one
    # line, before it edits or calls anything else.
    f.write_text(f.read_text().replace("vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.12.0"))
    before = f.read_text()
    mutations = [r for r in gce.requests if r["method"] != "GET"]
    res = run_poolctl(sandbox_home, "rollout", "start", "--cloud", "gcp", "--node-image",
                      "latest", "--yes", "-f", str(f), **env)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "poolctl: --node-image latest: no image built for pool 'chat-70b' carries "
        "vllm/vllm-openai:v0.12.0; build one with `poolctl image build --cloud gcp`"]
    assert f.read_text() == before
    assert [r for r in gce.requests if r["method"] != "GET"] == mutations
