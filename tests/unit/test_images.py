"""Node image templates, records and the plan's start phases (issue 10).

`packer validate` runs Debian's Packer 1.6.6 on every rendered template; a current Packer
(>= 1.7, BUSL, not installable here) is covered by rendering only: its `packer {}` block and
IMDS arguments are checked as text, and the rest of that template is validated by 1.6.6.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from poolctl import images, node_image
from poolctl.cloud import Cloud
from poolctl.clouds.base import RolloutStatus, RollsBackRollouts
from poolctl.config import Pool, load_config, parse_config
from poolctl.endpoints import REAL_CLOUDS, AwsEndpoint, CloudEndpoints
from poolctl.node_image import NodeImage, recorded_node_image
from poolctl.runtime import set_scalar
from poolctl.sizing import PoolPlan, plan_pool
from tests import inproc
from tests.fakes.stack import StoodInStack, failing_apply, rollback, stand_in, start_rollout

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(REPO.glob("examples/*/poolctl.yaml"))
OLD, NEW = (1, 6, 6), (1, 11, 2)
PACKER = shutil.which("packer")
no_packer = pytest.mark.skipif(PACKER is None, reason="packer not on PATH (scripts/setup "
                               "installs Debian's packer 1.6.6)")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))


def _targets():
    for ex in EXAMPLES:
        cfg = load_config(ex)
        for pool in cfg.pools:
            for cloud in pool.clouds:
                yield pytest.param(ex, pool.name, cloud, id=f"{ex.parent.name}-{cloud}")


# What --sandbox resolves to, as far as rendering looks (no sandbox needed).
EMULATOR = CloudEndpoints(
    flag="--sandbox", clouds=frozenset({Cloud.aws}), stand_in_images=True,
    aws=AwsEndpoint("http://127.0.0.1:1", "us-east-1",
                    {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                     "aws_session_token": "testing"}))


def _render(ex: Path, pool_name: str, cloud: Cloud, version, sandbox=False):
    cfg = load_config(ex)
    pool = cfg.select(pool_name)[0]
    base = "ami-0123456789abcdef0" if cloud == "aws" else ""
    return images.render(cfg, pool, cloud, version=version, base_image=base,
                         endpoints=EMULATOR if sandbox else REAL_CLOUDS)


def _validate(folder: Path, name: str) -> subprocess.CompletedProcess:
    assert PACKER is not None  # the tests that validate skip without it (no_packer)
    return subprocess.run([PACKER, "validate", name], cwd=folder, capture_output=True,
                          text=True, timeout=120)


@no_packer
@pytest.mark.parametrize(("ex", "pool", "cloud"), list(_targets()))
def test_packer_validate_every_example(tmp_path, ex, pool, cloud):
    for sandbox in (False, True):
        r = _render(ex, pool, cloud, OLD, sandbox=sandbox and cloud == "aws")
        for name, text in r.files.items():
            (tmp_path / name).write_text(text)
        out = _validate(tmp_path, f"{cloud}.pkr.hcl")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "packer {" not in r.files[f"{cloud}.pkr.hcl"]


@no_packer
@pytest.mark.parametrize(("ex", "pool", "cloud"), list(_targets()))
def test_current_packer_gets_plugin_block(tmp_path, ex, pool, cloud):
    r = _render(ex, pool, cloud, NEW)
    text = r.files[f"{cloud}.pkr.hcl"]
    (tmp_path / "provision.sh").write_text(r.files["provision.sh"])
    plugin = "amazon" if cloud == "aws" else "googlecompute"
    assert re.search(r'required_plugins \{\n\s+' + plugin + r' = \{\n\s+source\s+= '
                     r'"github.com/hashicorp/' + plugin + '"', text)
    if cloud == "aws":
        assert 'http_tokens                 = "required"' in text
        assert 'imds_support = "v2.0"' in text
    # What 1.6.6 cannot read removed, the rest of the current template is valid HCL for it.
    rest = re.sub(r"^packer \{.*?^\}\n", "", text, flags=re.S | re.M)
    rest = re.sub(r"^  imds_support[^\n]*\n|^  metadata_options \{.*?^  \}\n", "", rest,
                  flags=re.S | re.M)
    (tmp_path / f"{cloud}.pkr.hcl").write_text(rest)
    out = _validate(tmp_path, f"{cloud}.pkr.hcl")
    assert out.returncode == 0, out.stdout + out.stderr


def test_production_template_reaches_builder_privately():
    aws = _render(EXAMPLES[0], "chat-70b", "aws", OLD).files["aws.pkr.hcl"]
    assert 'ssh_interface = "session_manager"' in aws
    assert "associate_public_ip_address = false" in aws
    assert "encrypt_boot                = true" in aws
    assert '"tag:poolctl:tier" = "private"' in aws
    assert '"poolctl:serving-image" = "vllm/vllm-openai:v0.34.0"' in aws
    # The tag the stack's plan reads to choose the boot script variant (poolctl_stacks/aws/pool.py).
    from poolctl.bootscript import boot_library

    assert f'"poolctl:boot-library" = "{boot_library("aws")["version"]}"' in aws
    assert 'communicator  = "ssh"' in aws and "custom_endpoint_ec2" not in aws
    gcp = _render(EXAMPLES[0], "chat-70b", "gcp", OLD).files["gcp.pkr.hcl"]
    for line in ("omit_external_ip = true", "use_iap          = true",
                 "use_os_login     = true", '"poolctl-serving-image" = "vllm-vllm-openai-v0-34-0"',
                 'source_image_family     = "common-cu124-ubuntu-2204-nvidia-550"',
                 'source_image_project_id = ["deeplearning-platform-release"]',
                 f'"poolctl-boot-library" = "{boot_library("gcp")["version"]}"'):
        assert line in gcp


def test_sandbox_template_is_test_mode_only():
    aws = _render(EXAMPLES[0], "chat-70b", "aws", OLD, sandbox=True).files["aws.pkr.hcl"]
    assert 'communicator               = "none"' in aws
    assert 'custom_endpoint_ec2        = "http://127.0.0.1:1"' in aws
    assert 'provisioner "shell"' not in aws


def test_hcl_string_is_literal():
    assert images.hcl_string('a${file("/etc/passwd")}%{if x}"\\') == (
        '"a$${file(\\"/etc/passwd\\")}%%{if x}\\"\\\\"')


@no_packer
def test_hostile_value_stays_literal_in_packer(tmp_path):
    """A Packer template expression in a config value reaches Packer as text: `packer
    inspect` shows it unevaluated."""
    text = EXAMPLES[0].read_text().replace("project: acme", "project: acme", 1)
    cfg = parse_config(text)
    pool = cfg.pools[0]
    hostile = '${file("/etc/hostname")}'
    r = images.render(cfg, pool, "aws", version=OLD, base_image=hostile)
    (tmp_path / "aws.pkr.hcl").write_text(r.files["aws.pkr.hcl"])
    out = subprocess.run([PACKER, "inspect", "aws.pkr.hcl"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'source_ami      = "$${file' in r.files["aws.pkr.hcl"]


# ---------------------------------------------------------------------------------------
# The file: one line, added or edited


def test_set_scalar_adds_one_line_then_edits_it():
    text = EXAMPLES[0].read_text()
    new, old, line = set_scalar(text, ("pools", 0, "aws", "ami_id"), "ami-0123456789abcdef0")
    assert old is None
    added = [ln for ln in new.splitlines() if ln not in text.splitlines()]
    assert added == ["      ami_id: ami-0123456789abcdef0"]
    assert len(new.splitlines()) == len(text.splitlines()) + 1
    assert parse_config(new).pools[0].aws.ami_id == "ami-0123456789abcdef0"
    again, old2, line2 = set_scalar(new, ("pools", 0, "aws", "ami_id"), "ami-0fedcba987654321")
    assert (old2, line2) == ("ami-0123456789abcdef0", line)
    assert len(again.splitlines()) == len(new.splitlines())


# ---------------------------------------------------------------------------------------
# Bad input: one line, the contract's exit code, nothing recorded


def _cli(tmp_path, *args, env=None):
    import os

    e = {**os.environ, "POOLCTL_HOME": str(tmp_path / "home"), **(env or {})}
    return inproc.run_argv([sys.executable, "-m", "poolctl", *args], capture_output=True,
                           text=True, env=e, timeout=120)


def _one_line(res, code: int, *needles: str) -> None:
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_pool(tmp_path):
    res = _cli(tmp_path, "image", "build", "--cloud", "aws", "-f", str(EXAMPLES[0]),
               "--pool", "nope", "--dry-run")
    _one_line(res, 2, "--pool", "nope")


def test_missing_packer(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLES[0].read_text())
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f),
               env={"POOLCTL_PACKER": str(tmp_path / "no-packer")})
    _one_line(res, 2, "POOLCTL_PACKER", "not found")
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f),
               env={"PATH": str(Path(sys.executable).parent)})
    _one_line(res, 2, "packer: not found on PATH", "apt-get install packer")
    assert f.read_text() == EXAMPLES[0].read_text()
    assert not (tmp_path / "home" / "images").exists()


@no_packer
def test_placement_without_base_image(tmp_path):
    f = tmp_path / "p.yaml"
    text = EXAMPLES[0].read_text().replace(
        "      machine_type: a3-highgpu-8g\n",
        "      machine_type: a3-highgpu-8g\n      image: projects/acme-prod/global/images/mine-1\n")
    f.write_text(text)
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f), "--dry-run")
    _one_line(res, 2, "pools[0].gcp.base_image", "no base image")
    assert f.read_text() == text


def _fake_packer(tmp_path: Path, build: str = "echo 'Build errored: boom'; exit 1") -> Path:
    """A stand-in `packer`: `version` says 1.6.6; anything else runs `build`."""
    fake = tmp_path / "packer"
    fake.write_text("#!/bin/sh\n[ \"$1\" = version ] && { echo 'Packer v1.6.6'; exit 0; }\n"
                    f"echo 'packer output line'\n{build}\n")
    fake.chmod(0o755)
    return fake


def _packer_logs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "home" / "logs").glob("*/*-image-build-*.log"))


def test_packer_failure_records_nothing(tmp_path):
    """Packer's output goes to a private log, not the terminal; its failure is one line
    naming its last error and the log (issue 23)."""
    fake = _fake_packer(tmp_path)
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLES[0].read_text())
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f),
               env={"POOLCTL_PACKER": str(fake)})
    [log] = _packer_logs(tmp_path)
    assert log.parent.name == "acme-chat-70b-gcp" and log.stat().st_mode & 0o777 == 0o600
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == (
        "poolctl: packer build failed (exit 1): Build errored: boom; Packer removed its "
        f"builder; nothing was recorded; its whole output: {log}")
    # Before it: where Packer's output goes, and nothing of that output.
    assert lines[:-1] == [f"acme-chat-70b-gcp: building {lines[0].split()[2]} in "
                          f"{tmp_path / 'home' / 'images' / 'builds' / lines[0].split()[2]}; "
                          f"Packer's output goes to {log}"]
    assert "packer output line" not in res.stderr and "Traceback" not in res.stderr
    text = log.read_text()
    assert "packer output line\nBuild errored: boom\n" in text
    assert re.search(r"^# poolctl \S+: \S*packer build -color=false -on-error=cleanup "
                     r"gcp.pkr.hcl \(in ", text, re.M)
    assert f.read_text() == EXAMPLES[0].read_text()
    assert not list((tmp_path / "home" / "images").glob("*.json"))


def test_packer_verbose_shows_its_output_too(tmp_path):
    fake = _fake_packer(tmp_path)
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLES[0].read_text())
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f), "--verbose",
               env={"POOLCTL_PACKER": str(fake)})
    assert res.returncode == 1, res.stderr
    [log] = _packer_logs(tmp_path)
    assert f"Packer's output goes to {log} (and here)" in res.stderr
    assert "  packer output line\n  Build errored: boom\n" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(
        "poolctl: packer build failed (exit 1): Build errored: boom;")
    assert "Build errored: boom" in log.read_text()


# Packer 1.6.6's own words, as it prints them with -color=false.
NO_SUBNET = """\
==> amazon-ebs.node: Prevalidating any provided VPC information
Build 'amazon-ebs.node' errored after 22 milliseconds 863 microseconds: No Subnets was \
found matching filters: {
  Filters: [{
      Name: "tag:poolctl:tier",
      Values: ["private"]
    }]
}

==> Wait completed after 22 milliseconds 863 microseconds

==> Some builds didn't complete successfully and had errors:
--> amazon-ebs.node: No Subnets was found matching filters: {
  Filters: [{
      Name: "tag:poolctl:tier",
      Values: ["private"]
    }]
}

==> Builds finished but no artifacts were created.
"""
HCL_ERROR = """\
Error: Unsupported argument

  on aws.pkr.hcl line 3:
   3:   nope = 1

An argument named "nope" is not expected here.

"""
PROVISIONER = """\
==> amazon-ebs.node: Running local shell script: /tmp/packer-shell2514541857
    amazon-ebs.node: simulated provisioning failure
==> amazon-ebs.node: Provisioning step had errors: Running the cleanup provisioner, if present...
==> amazon-ebs.node: Terminating the source AWS instance...
Build 'amazon-ebs.node' errored after 1 second 764 milliseconds: Script exited with non-zero \
exit status: 1.Allowed exit codes are: [0]

==> Wait completed after 1 second 764 milliseconds

==> Some builds didn't complete successfully and had errors:
--> amazon-ebs.node: Script exited with non-zero exit status: 1.Allowed exit codes are: [0]

==> Builds finished but no artifacts were created."""


def test_last_error_picks_packers_own_error_line():
    def last(text: str) -> str:
        return images.last_error(text.splitlines(keepends=True))

    assert last(NO_SUBNET) == "amazon-ebs.node: No Subnets was found matching filters"
    assert last(HCL_ERROR) == "Unsupported argument"
    assert last(PROVISIONER) == ("amazon-ebs.node: Script exited with non-zero exit status: "
                                 "1.Allowed exit codes are: [0]")
    # Without the closing summary: the build's own "errored" line.
    assert last(PROVISIONER.split("\n\n")[0]) == (
        "Script exited with non-zero exit status: 1.Allowed exit codes are: [0]")
    assert last("just this\n\n") == "just this"
    assert last("") == "it printed nothing"
    assert len(last("--> " + "x" * 1000)) == 300


def _no_aws_credentials(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a machine with no AWS credentials at all: no variables, no
    files, no instance metadata; should a call go out anyway, it stays on loopback."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "HOME": str(tmp_path), "POOLCTL_HOME": str(tmp_path / "home"),
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            **extra}


def test_aws_dry_run_needs_no_credentials(tmp_path):
    """It builds nothing, so it calls nothing: it names the SSM parameter the build reads
    instead of reading it (issue 23)."""
    fake = _fake_packer(tmp_path, build="echo 'packer build ran'; exit 1")
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLES[0].read_text())
    param = load_config(f).pools[0].aws.ami_ssm_parameter
    res = inproc.run_argv([sys.executable, "-m", "poolctl", "image", "build", "--cloud", "aws",
                           "-f", str(f), "--dry-run"], capture_output=True, text=True,
                          env=_no_aws_credentials(tmp_path, POOLCTL_PACKER=str(fake)),
                          timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"dry run: no cloud call; at build time the base AMI comes from SSM parameter {param} "
        f"in us-east-1 (`ssm:{param}` below) and the builder's subnet is checked"]
    assert f'  source_ami      = "ssm:{param}"\n' in res.stdout
    assert "# ---- provision.sh\n" in res.stdout
    assert re.search(r"# would run in \S+/images/builds/acme-chat-70b-\d{8}-\d{6}: \S*packer "
                     r"build -color=false -on-error=cleanup aws.pkr.hcl", res.stdout)
    assert f.read_text() == EXAMPLES[0].read_text()
    assert not (tmp_path / "home").exists()
    # The build itself does need them: one line, before Packer runs.
    res = inproc.run_argv([sys.executable, "-m", "poolctl", "image", "build", "--cloud", "aws",
                           "-f", str(f)], capture_output=True, text=True,
                          env=_no_aws_credentials(tmp_path, POOLCTL_PACKER=str(fake)),
                          timeout=120)
    _one_line(res, 2, "no AWS credentials")
    assert not _packer_logs(tmp_path)


# ---------------------------------------------------------------------------------------
# plan: cold start from a pre-pulled image vs. a pull, worked out by hand


def _record(image_id: str, serving_image: str, cloud: Cloud = Cloud.aws) -> None:
    node_image.save_record({"cloud": cloud, "image_id": image_id, "serving_image": serving_image,
                        "base_image": "ami-0aaaaaaaaaaaaaaaa", "digest": "sha256:" + "a" * 64})


def recorded_plan(pool: Pool, cloud: Cloud) -> PoolPlan:
    """`plan`'s figures: the node image as the build records know it."""
    return plan_pool(pool, cloud, recorded_node_image(pool, cloud))


def test_plan_phases_prepulled_vs_pull():
    text = EXAMPLES[0].read_text()
    # Pull: 12 GB at 0.1 GB/s = 120 s. Weights 70.6e9 x 2 B = 141.2 GB over min(NIC, 100)
    # Gbit/s x 0.25 = 3.125 GB/s = 45.18 s; load max(141.2/16, 35.3 GB per GPU / 2) = 35.3 s.
    p = recorded_plan(parse_config(text).pools[0], Cloud.aws)
    assert p.start_phases["cold"] == {"boot": 120, "image": 120.0, "weights_to_nvme": 45.2,
                                      "load_to_gpu": 35.3, "engine_init": 90, "register": 30}
    assert p.start_seconds["cold"] == 440.5 and p.node_image.prepulled is False
    # Pre-pulled (a build record for the file's AMI carries the pool's serving image): no
    # pull; the 12 GB image unpacks to 24 GB read once from a lazily loaded EBS volume at
    # 135 MB/s = 177.78 s.
    with_ami = text.replace("      instance_type: p5.48xlarge\n", "      instance_type: "
                            "p5.48xlarge\n      ami_id: ami-0123456789abcdef0\n")
    _record("ami-0123456789abcdef0", "vllm/vllm-openai:v0.34.0")
    p = recorded_plan(parse_config(with_ami).pools[0], Cloud.aws)
    assert "image" not in p.start_phases["cold"] and p.start_phases["cold"]["hydrate"] == 177.8
    assert p.start_seconds["cold"] == 120 + 177.8 + 45.2 + 35.3 + 90 + 30  # 498.3
    assert p.node_image == NodeImage(id="ami-0123456789abcdef0", prepulled=True,
                                     source="build record", carries="vllm/vllm-openai:v0.34.0",
                                     digest="sha256:" + "a" * 64)
    # The stacks' view (no image given): the file alone, whatever the records say.
    assert plan_pool(parse_config(with_ami).pools[0], Cloud.aws).node_image == NodeImage(
        id="ami-0123456789abcdef0", prepulled=False, source="serving.image_prepulled")
    # With a provisioned initialization rate of 300 MiB/s: 24e9 / (300 x 2^20) = 76.29 s.
    fast = with_ami.replace("      ami_id:", "      volume_initialization_rate_mib_s: 300\n"
                            "      ami_id:")
    p = recorded_plan(parse_config(fast).pools[0], Cloud.aws)
    assert p.start_phases["cold"]["hydrate"] == 76.3
    assert p.start_seconds["cold"] == round(120 + 76.3 + 45.2 + 35.3 + 90 + 30, 1)  # 396.8
    # Warm stopped nodes keep their read root volume: neither pull nor hydrate.
    assert p.start_phases["warm_stopped"]["image"] == 0.0
    assert "hydrate" not in p.start_phases["warm_stopped"]
    # A rollout to another serving image: the AMI no longer carries it; the node pulls.
    other = with_ami.replace("vllm/vllm-openai:v0.34.0", "vllm/vllm-openai:v0.34.1")
    p = recorded_plan(parse_config(other).pools[0], Cloud.aws)
    assert p.start_phases["cold"]["image"] == 120.0 and p.node_image.prepulled is False


def test_plan_phases_gcp_prepulled():
    # pd-ssd reads 240 MiB/s: 24e9 / (240 x 2^20) = 95.37 s.
    text = EXAMPLES[0].read_text().replace(
        "      machine_type: a3-highgpu-8g\n",
        "      machine_type: a3-highgpu-8g\n"
        "      image: projects/acme-prod/global/images/acme-chat-70b-1\n")
    _record("projects/acme-prod/global/images/acme-chat-70b-1", "vllm/vllm-openai:v0.34.0", "gcp")
    p = recorded_plan(parse_config(text).pools[0], Cloud.gcp)
    assert p.start_phases["cold"]["hydrate"] == 95.4 and "image" not in p.start_phases["cold"]


def test_records_are_private(tmp_path):
    _record("ami-0123456789abcdef0", "x")
    f = next((tmp_path / "home" / "images").glob("*.json"))
    assert f.stat().st_mode & 0o777 == 0o600
    assert json.loads(f.read_text())["serving_image"] == "x"


def test_boot_hydrate_reads_every_layer_file(tmp_path):
    """The boot script's hydrate step hands every file of the image's overlay2 layers to the
    parallel readers (a stand-in `cat` lists what it was given)."""
    from poolctl.bootscript import environment

    env = environment()
    src = ("#!/bin/bash\nset -Eeuo pipefail\nIMAGE=repo/img:v1\n"
           + env.get_template("_lib.sh.j2").render() + env.get_template("_hydrate.sh.j2")
           .render() + "phase hydrate hydrate_image\n")
    layers = {"lower": ["a/b.so", "c"], "upper": ["d.py"], "merged": []}
    for d, files in layers.items():
        for rel in files:
            (tmp_path / d / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / d / rel).write_text("x")
    data = {"LowerDir": str(tmp_path / "lower"), "UpperDir": str(tmp_path / "upper"),
            "WorkDir": str(tmp_path / "merged")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho '{json.dumps(data)}'\n")
    (bin_dir / "cat").write_text(f"#!/bin/sh\nfor f; do echo \"$f\" >>{tmp_path}/read; done\n")
    for t in bin_dir.iterdir():
        t.chmod(0o755)
    import os

    res = subprocess.run(["bash", "-c", src], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    assert re.search(r"^poolctl: phase=hydrate seconds=\d+$", res.stderr, re.M)
    read = sorted(Path(p).relative_to(tmp_path).as_posix()
                  for p in (tmp_path / "read").read_text().split())
    assert read == ["lower/a/b.so", "lower/c", "upper/d.py"]


@no_packer
def test_dry_run_prints_files_and_command_only(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLES[0].read_text())
    res = _cli(tmp_path, "image", "build", "--cloud", "gcp", "-f", str(f), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "# ---- gcp.pkr.hcl\n" in res.stdout and "# ---- provision.sh\n" in res.stdout
    assert re.search(r"# would run in \S+/images/builds/acme-chat-70b-\d{8}-\d{6}: \S*packer "
                     r"build -color=false -on-error=cleanup gcp.pkr.hcl", res.stdout)
    assert f.read_text() == EXAMPLES[0].read_text()
    assert not (tmp_path / "home" / "images").exists()


# --- rollback of a `--node-image` rollout whose file named no image --------------------------

AMI = "ami-0fedcba9876543210"


class RollOps(RollsBackRollouts):
    """The cloud as a rollout sees it: a group with room in the quota, and whatever rollout
    `state` says (None: none yet). Stand-in for AwsOps; the Terraform run is stubbed too."""

    cloud = "aws"
    endpoints = REAL_CLOUDS

    def __init__(self, state=None):
        self.state, self.begun, self.rolled_back = state, [], 0

    def find_group(self, cfg, pool):
        from poolctl.clouds.base import Group

        return Group(cloud="aws", name="acme-chat-70b", region="us-east-1", min_nodes=1,
                     max_nodes=7, desired_nodes=1, warm_min_nodes=2, warm_state="stopped",
                     version="3")

    def rollout_state(self, group):
        return self.state

    def quota_lines(self, cfg, pool, needs):
        from poolctl.clouds.base import QuotaLine

        return [QuotaLine(n.name, n.unit, n.scope, n.needed, 10_000, in_use=0,
                          pool_in_use=0) for n in needs]

    def rollout_apply_env(self, group, plan, no_surge=False):
        return {}

    def rollout_begin(self, group, cfg, pool, plan, no_surge=False, stack_dir=None):
        from poolctl.clouds.base import RolloutState

        self.begun.append(pool.aws.ami_id)
        self.state = RolloutState(id=f"r-{len(self.begun)}", status="pending", done=False,
                                  percentage_complete=0.0)
        return self.state

    def rollout_rollback(self, group):
        self.rolled_back += 1
        self.state.status = RolloutStatus.rolling_back
        return self.state


@pytest.fixture
def rolled(tmp_path, monkeypatch):
    """`rollout start --node-image AMI` on the example, whose file names no aws.ami_id: the
    line added, the apply stubbed (what it was given is kept), the refresh begun."""
    applied = []

    def planned(cfg, targets):
        applied.append(targets[0].pool.aws.ami_id)
        return StoodInStack("acme-chat-70b-aws", str(tmp_path))

    stand_in(monkeypatch, planned)
    f = tmp_path / "poolctl.yaml"
    f.write_text(EXAMPLES[0].read_text())
    original = f.read_text()
    assert "ami_id" not in original
    cfg = load_config(f)
    ops = RollOps()
    res = start_rollout(cfg, f, cfg.pools[0], Cloud.aws, ops, node_image=AMI,
                        outdir=tmp_path / "out")
    assert (res.key, res.from_value, res.to_value) == ("aws.ami_id", None, AMI)
    assert f.read_text() != original and f"      ami_id: {AMI}\n" in f.read_text()
    return f, original, ops, applied


def _rollback(f, ops, tmp_path):
    cfg = load_config(f)
    return rollback(cfg, f, cfg.pools[0], Cloud.aws, ops, outdir=tmp_path / "out")


def test_rollback_after_the_rollout_ended_removes_the_added_line(rolled, tmp_path):
    """Ended: the default image rolled out again, the file byte for byte as before."""
    f, original, ops, applied = rolled
    ops.state.status, ops.state.done = RolloutStatus.successful, True
    out = _rollback(f, ops, tmp_path)
    assert out["how"] == "new_rollout" and (out["from"], out["to"]) == (AMI, None)
    assert f.read_text() == original
    assert applied == [AMI, None]  # the rollback's apply: no AMI, the SSM default again
    assert ops.begun == [AMI, None]
    from poolctl import runtime

    cfg = load_config(f)
    rec = runtime.load_record(cfg, cfg.pools[0], "aws")
    assert (rec.key, rec.from_value, rec.to_value, rec.action) == (
        "aws.ami_id", AMI, None, "rollback")


def test_rollback_in_progress_removes_the_added_line(rolled, tmp_path, capsys):
    f, original, ops, applied = rolled
    out = _rollback(f, ops, tmp_path)
    assert out["how"] == "cloud_rollback" and ops.rolled_back == 1
    assert f.read_text() == original
    assert applied == [AMI]  # the cloud rolls back; no second apply
    assert "aws.ami_id: ami-0fedcba9876543210 -> (line removed" in capsys.readouterr().err


def test_rollback_before_the_rollout_began_removes_the_added_line(tmp_path, monkeypatch):
    """The apply failed: only the file needs restoring."""
    from poolctl.errors import OperationFailed

    failing_apply(monkeypatch)
    f = tmp_path / "poolctl.yaml"
    f.write_text(EXAMPLES[0].read_text())
    original = f.read_text()
    cfg = load_config(f)
    with pytest.raises(OperationFailed, match="the apply did not finish"):
        start_rollout(cfg, f, cfg.pools[0], Cloud.aws, RollOps(), node_image=AMI,
                      outdir=tmp_path / "out")
    assert f.read_text() != original
    out = _rollback(f, RollOps(), tmp_path)
    assert out["how"] == "file" and f.read_text() == original


def test_rollback_leaves_a_hand_edited_line_alone(rolled, tmp_path, capsys):
    f, original, ops, applied = rolled
    f.write_text(f.read_text().replace(AMI, "ami-0aaaaaaaaaaaaaaaa"))
    edited = f.read_text()
    _rollback(f, ops, tmp_path)
    assert f.read_text() == edited
    assert "is now 'ami-0aaaaaaaaaaaaaaaa', neither" in capsys.readouterr().err


def test_unset_scalar_removes_only_a_line_of_its_own():
    from poolctl.errors import UsageError
    from poolctl.runtime import unset_scalar

    path = ("pools", 0, "aws", "ami_id")
    base = EXAMPLES[0].read_text()
    added, _, line = set_scalar(base, path, AMI)
    assert unset_scalar(added, path) == (base, AMI, line)
    assert unset_scalar(base, path) == (base, None, None)  # not written: nothing to do
    commented = added.replace(f"ami_id: {AMI}\n", f"ami_id: {AMI}  # pinned\n")
    assert unset_scalar(commented, path)[0] == base
    flow = base.replace("    aws:\n", f"    aws: {{ami_id: {AMI}}}\n    x:\n", 1)
    with pytest.raises(UsageError, match=r"aws\.ami_id: not a line of its own poolctl can "
                       "remove; delete it by hand"):
        unset_scalar(flow, path)


def test_a_no_after_the_plan_summary_puts_the_file_and_record_back(tmp_path, monkeypatch):
    """`rollout start` asks after Terraform planned the recorded file and showed its summary
    (as deploy does); a no leaves the file byte for byte and no record."""
    from poolctl import runtime
    from poolctl.errors import OperationFailed

    f = tmp_path / "poolctl.yaml"
    f.write_text(EXAMPLES[0].read_text())
    original = f.read_text()
    planned, asked = [], []

    def planned_stack(new_cfg, targets):
        # What Terraform plans: the file as recorded.
        planned.append((targets[0].pool.aws.ami_id, f"ami_id: {AMI}" in f.read_text()))
        return StoodInStack("acme-chat-70b-aws", str(tmp_path), on_apply=applied)

    def applied():
        raise AssertionError("applied after a no")

    def confirm(question):
        asked.append(question)
        return False

    stand_in(monkeypatch, planned_stack)
    cfg = load_config(f)
    ops = RollOps()
    with pytest.raises(OperationFailed, match="^acme-chat-70b-aws: not confirmed; nothing was "
                                              "changed$"):
        start_rollout(cfg, f, cfg.pools[0], Cloud.aws, ops, node_image=AMI,
                      outdir=tmp_path / "out", confirm=confirm)
    assert planned == [(AMI, True)]
    [question] = asked
    assert question.startswith(f"start rollout of acme-chat-70b-aws: aws.ami_id None -> {AMI} "
                               "(checkpoints ")
    assert question.endswith(f"recorded in {f}: apply acme-chat-70b-aws: 0 to add, 1 to "
                             "change, 0 to destroy?")
    assert f.read_text() == original
    assert runtime.load_record(cfg, cfg.pools[0], "aws") is None
    assert ops.begun == []
