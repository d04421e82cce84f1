"""Pre-pulled node images: Packer templates from `cli/poolctl/packer/`,
rendered with jinja2, built with Packer, recorded in the file and under $POOLCTL_HOME.

A node image is the pool's GPU base image plus its serving image pulled onto the root volume,
so a cold node skips the pull (it reads the layers once instead: `phase=hydrate`). The build
record (`$POOLCTL_HOME/images/<cloud>-<image>.json`) says which serving image and digest an
image carries; `plan` reads it to tell whether a placement's image is pre-pulled.

No cloud SDK at import: boto3 / google-cloud-compute load in the functions that call them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from poolctl import naming
from poolctl.bootscript import LIB_IMAGE_TAG, boot_library
from poolctl.cloud import Cloud
from poolctl.clouds.base import ImageRow, KeepsNodeImages, PreparesImageBuilds
from poolctl.clouds.registry import get_ops
from poolctl.config import AwsPlacement, Config, GcpPlacement, Loc, Pool
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.files import replace_file
from poolctl.home import open_private, private_dir, write_private
from poolctl.node_image import find_record, images_dir, save_record
from poolctl.progress import log
from poolctl.runtime import set_scalar
from poolctl.sizing import gcp_zones, instance_row
from poolctl.terraform import log_path

if TYPE_CHECKING:  # jinja2 loads only to render (plan reads records, never templates)
    import jinja2

PACKER_ENV = "POOLCTL_PACKER"
# Packer 1.7 introduced `packer { required_plugins }` (and split the builders out); 1.6.6,
# Debian's MPL-licensed release, rejects the block.
PLUGINS_FROM = (1, 7, 0)
# After SIGINT Packer terminates the builder and deletes its temporary key pair and security
# group; give it that long before giving up on it.
CLEANUP_TIMEOUT_S = 600
TAG_SERVING_IMAGE, LABEL_SERVING_IMAGE = naming.TAG_SERVING_IMAGE, naming.LABEL_SERVING_IMAGE
DEFAULT_BUILDER = {"aws": "m6i.xlarge", "gcp": "n2-standard-4"}
_FAMILY = re.compile(r"^(?:projects/(?P<project>[a-z][-a-z0-9.:]*)/global/images/)?"
                     r"family/(?P<family>[a-z][-a-z0-9]*)$")
_IMAGE = re.compile(r"^(?:projects/(?P<project>[a-z][-a-z0-9.:]*)/global/images/)?"
                    r"(?P<name>[a-z][-a-z0-9]*)$")


def hcl_string(value: Any) -> str:
    """`value` as an HCL string literal that Packer reads literally: JSON escapes (HCL's are
    the same) plus template sequences doubled, so `${...}`/`%{...}` are never evaluated."""
    return json.dumps(str(value)).replace("${", "$${").replace("%{", "%%{")


@cache
def environment() -> jinja2.Environment:

    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.PackageLoader("poolctl", "packer"),
                                    jinja2.PackageLoader("poolctl", "boot")]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
        lstrip_blocks=True, comment_start_string="{##", comment_end_string="##}",
        autoescape=False,
    )
    env.filters["hcl"] = hcl_string
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


# ---------------------------------------------------------------------------------------
# Packer


def find_packer() -> str:
    named = os.environ.get(PACKER_ENV)
    path = shutil.which(named or "packer")
    if path:
        return path
    if named:
        raise UsageError(f"{PACKER_ENV}={named}: not found; give the path of a packer binary "
                         "or unset it")
    raise UsageError("packer: not found on PATH; install it (`scripts/setup` installs Debian's "
                     "packer, or `apt-get install packer`) or set POOLCTL_PACKER")


def packer_version(binary: str) -> tuple[int, int, int]:
    try:
        out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"packer: {binary} does not run ({e}); reinstall it") from None
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if out.returncode != 0 or m is None:
        raise UsageError(f"packer: `{binary} version` said {out.stdout.strip()!r} (exit "
                         f"{out.returncode}); reinstall Packer")
    return int(m[1]), int(m[2]), int(m[3])


def needs_plugin_block(version: tuple[int, int, int]) -> bool:
    return version >= PLUGINS_FROM


# ---------------------------------------------------------------------------------------
# Rendering


@dataclass
class Rendered:
    cloud: Cloud
    image_name: str
    base_image: str
    serving_image: str
    files: dict[str, str]
    packer_version: str
    context: dict[str, Any] = field(default_factory=dict)


def _pool_key(cfg: Config, pool: Pool, cloud: Cloud) -> str:
    idx = [p.name for p in cfg.pools].index(pool.name)
    return f"pools[{idx}].{cloud}"


def _stamp(now: datetime) -> str:
    return now.strftime("%Y%m%d-%H%M%S")


def gcp_label_value(text: str) -> str:
    """GCE label values: lowercase letters, digits, '-' and '_', at most 63."""
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:63]


def gcp_base(cfg: Config, pool: Pool) -> dict[str, str]:
    """The GCE base image as Packer takes it: a family (or an image name) and its project."""
    p = pool.gcp
    assert p is not None  # render asks it only for the pool's gcp placement, checked there
    key = _pool_key(cfg, pool, Cloud.gcp)
    ref = p.base_image or p.image
    if p.base_image is None and (rec := find_record(Cloud.gcp, p.image)) is not None:
        ref = rec["base_image"]  # gcp.image is a built image: build on what it was built on
    if m := _FAMILY.match(ref):
        return {"base_family": m["family"], "base_name": "",
                "base_project": m["project"] or p.project, "base": ref}
    if p.base_image is not None and (m := _IMAGE.match(ref)):
        return {"base_family": "", "base_name": m["name"],
                "base_project": m["project"] or p.project, "base": ref}
    raise UsageError(
        f"{key}.base_image: no base image to build on: gcp.image {p.image!r} is not an image "
        "family and no build record names its base; set gcp.base_image to the GPU base "
        "(e.g. projects/deeplearning-platform-release/global/images/family/"
        "common-cu124-ubuntu-2204-nvidia-550)")


def aws_base(cfg: Config, pool: Pool, endpoints: CloudEndpoints = REAL_CLOUDS) -> str:
    """The Deep Learning Base AMI that `aws.ami_ssm_parameter` names, resolved now."""
    return _builds(Cloud.aws, endpoints).image_build_base(pool, _pool_key(cfg, pool, Cloud.aws))


def _builds(cloud: Cloud, endpoints: CloudEndpoints) -> PreparesImageBuilds:
    ops = get_ops(cloud, endpoints)
    assert isinstance(ops, PreparesImageBuilds)  # asked for AWS, whose ops prepare builds
    return ops


def _images(cloud: Cloud, endpoints: CloudEndpoints) -> KeepsNodeImages:
    ops = get_ops(cloud, endpoints)
    assert isinstance(ops, KeepsNodeImages)  # both clouds keep node images
    return ops


def render(cfg: Config, pool: Pool, cloud: Cloud, *, version: tuple[int, int, int],
           base_image: str, endpoints: CloudEndpoints = REAL_CLOUDS,
           serving_image: str | None = None, now: datetime | None = None) -> Rendered:
    """The build folder's files: `<cloud>.pkr.hcl` and `provision.sh`."""

    placement = pool.placement(cloud)
    if placement is None:
        raise UsageError(f"--cloud {cloud}: pool {pool.name!r} has no `{cloud}:` placement; "
                         f"add one or use --cloud {' / '.join(pool.clouds)}")
    now = now or datetime.now(UTC)
    image = serving_image or pool.serving.image
    base = naming.base(cfg, pool)
    stack = naming.stack_name(cfg, pool, cloud)
    modern = needs_plugin_block(version)
    gbase = gcp_base(cfg, pool) if cloud == Cloud.gcp else {}
    lib = boot_library(cloud)  # installed by provision.sh, inside a quoted heredoc
    assert "\nPOOLCTL_BOOT_LIB\n" not in lib["text"], "the heredoc would end early"
    base_image = gbase.pop("base", base_image)
    ctx: dict[str, Any] = {
        "cloud": cloud, "stack": stack, "image": image, "modern": modern,
        # An emulator runs no instance: no communicator, no provisioner (a hold or a failure
        # where they would run, for tests).
        "sandbox": endpoints.stand_in_images, "hold_s": endpoints.image_build_hold_s,
        "fail": endpoints.image_build_fails,
        "builder_type": placement.image_builder_type or DEFAULT_BUILDER[cloud],
        "description": f"poolctl {stack}: {base_image.rsplit('/', 1)[-1]} + {image}",
        "boot_lib": {k: lib[k] for k in ("path", "version", "text")},
    }
    if cloud == Cloud.aws:
        assert isinstance(placement, AwsPlacement)  # pool.placement(aws) is pool.aws
        tags = naming.aws_tags(cfg, pool)
        name = f"{base}-{_stamp(now)}"
        ctx |= {
            "region": placement.region, "base_image": base_image, "image_name": name,
            "subnet_id": (placement.network.subnet_ids or [""])[0],
            "subnet_tags": builder_subnet_tags(cfg, pool),
            "root_volume_gb": placement.root_volume_gb,
            # The stack picks the user data variant from this tag at plan time.
            "image_tags": {**tags, TAG_SERVING_IMAGE: image, "Name": name,
                           LIB_IMAGE_TAG["aws"]: lib["version"]},
            "builder_tags": {**tags, "Name": f"{base}-image-builder"},
            "endpoint": endpoints.aws.url if endpoints.aws else "",
            "credentials": dict(endpoints.aws.credentials) if endpoints.aws else {},
        }
    else:
        assert isinstance(placement, GcpPlacement)  # pool.placement(gcp) is pool.gcp
        labels = naming.gcp_labels(cfg, pool)
        name = f"{naming.short(base, 63 - 16)}-{_stamp(now)}"
        ctx |= gbase | {
            "project_id": placement.project, "image_name": name,
            "image_family": naming.short(base, 63),
            "zone": _gcp_zone(pool), "disk_gb": placement.boot_disk_gb,
            "network": placement.network, "subnetwork": placement.subnetwork or "",
            "image_labels": {**labels, LABEL_SERVING_IMAGE: gcp_label_value(image),
                             LIB_IMAGE_TAG["gcp"]: lib["version"]},  # as the AWS tag
            "builder_labels": {**labels, "poolctl-image-builder": "true"},
        }
    env = environment()
    files = {
        f"{cloud}.pkr.hcl": env.get_template(f"{cloud}.pkr.hcl.j2").render(ctx),
        "provision.sh": env.get_template("provision.sh.j2").render(ctx),
    }
    return Rendered(cloud=cloud, image_name=ctx["image_name"], base_image=base_image,
                    serving_image=image, files=files,
                    packer_version=".".join(map(str, version)), context=ctx)


def _gcp_zone(pool: Pool) -> str:

    zones = gcp_zones(pool, instance_row(pool, Cloud.gcp))
    assert pool.gcp is not None  # instance_row refuses a pool without a gcp placement
    return zones[0] if zones else f"{pool.gcp.region}-a"


# Records ($POOLCTL_HOME/images/<cloud>-<image>.json): poolctl.node_image.


# ---------------------------------------------------------------------------------------
# Build


def file_key(cloud: Cloud) -> tuple[str, ...]:
    return ("aws", "ami_id") if cloud == Cloud.aws else ("gcp", "image")


def run_packer(binary: str, workdir: Path, args: list[str], env: dict[str, str], *,
               log_file: Path, verbose: bool = False) -> None:
    """Run Packer with its output appended to `log_file` (private; `verbose`: to stderr
    too). On failure: one line naming Packer's last error and the log. On Ctrl-C it gets one
    SIGINT and the time to clean up (builder instance, temporary key pair and security
    group); then the interrupt goes on. Its own process group: the terminal's SIGINT reaches
    poolctl only, and poolctl forwards exactly one."""

    cmd = [binary, *args]
    lines: list[str] = []
    with os.fdopen(open_private(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "w",
                   buffering=1) as out:
        out.write(f"\n# poolctl {datetime.now(UTC).isoformat(timespec='seconds')}: "
                  f"{shlex.join(cmd)} (in {workdir})\n")

        def sink(line: str) -> None:
            out.write(line)
            lines.append(line)
            if verbose:
                sys.stderr.write(f"  {line}")
                sys.stderr.flush()

        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink(line)
            rc = proc.wait()
        except KeyboardInterrupt:
            log("interrupted: Packer is cleaning up (builder instance, key pair, security "
                f"group); its output goes to {log_file}")
            # To its group: Packer's wrapper process ignores SIGINT and leaves the build to
            # its child, which a terminal's Ctrl-C reaches through the group.
            os.killpg(proc.pid, signal.SIGINT)
            _drain(proc, sink)
            raise
    if rc != 0:
        cleaned = "Packer removed its builder; " if args[0] == "build" else ""
        raise OperationFailed(f"packer {args[0]} failed (exit {rc}): {last_error(lines)}; "
                              f"{cleaned}nothing was recorded; its whole output: {log_file}")


# Packer's error lines, most telling first: its closing summary per build ("--> source:
# message"), a build's "errored" line, an HCL "Error:" heading, any line saying error.
_ERROR_LINES = (re.compile(r"^--> (.+)$"), re.compile(r"^Build '[^']*' errored[^:]*: (.+)$"),
                re.compile(r"^Error: (.+)$"), re.compile(r"^(.*\berror.*)$", re.I))


def last_error(lines: list[str]) -> str:
    """Packer's last error line, short: what the one line of a failed build quotes."""
    text = [ln.strip() for ln in lines if ln.strip()]
    for pattern in _ERROR_LINES:
        for line in reversed(text):
            if m := pattern.match(line):
                # A message that opens a structure ("matching filters: {") ends there.
                found = re.sub(r"[\s:{\[]+$", "", m[1])
                return found if len(found) <= 300 else found[:297] + "..."
    return text[-1][:300] if text else "it printed nothing"


def _drain(proc: subprocess.Popen[str], sink: Callable[[str], None]) -> None:
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while True:
        try:
            if proc.stdout is not None:
                for line in proc.stdout:
                    sink(line)
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return
        except KeyboardInterrupt:
            log("still cleaning up; wait for Packer (a second Ctrl-C is ignored)")
        except subprocess.TimeoutExpired:
            proc.kill()
            log("packer did not finish its cleanup in time; check for leftover "
                "`packer_*` security groups and key pairs")
            return


@dataclass
class BuildResult:
    pool: str
    cloud: Cloud
    image_id: str | None
    image_name: str
    base_image: str
    serving_image: str
    digest: str | None
    build_dir: str
    packer_version: str
    command: list[str]
    file: str | None = None
    line: int | None = None
    seconds: float | None = None
    record: str | None = None
    dry_run: bool = False
    files: dict[str, str] | None = None  # the rendered files, with --dry-run

    def to_json(self) -> dict[str, Any]:

        return asdict(self)


def build(cfg: Config, file_path: Path, pool: Pool, cloud: Cloud, *,
          endpoints: CloudEndpoints = REAL_CLOUDS,
          dry_run: bool, serving_image: str | None = None, record_in_file: bool = True,
          now: datetime | None = None, verbose: bool = False) -> BuildResult:
    """Render, check the builder's place, run Packer (its output to a private log; with
    `verbose` to stderr too), record the image. `dry_run`: render only, with no cloud call
    (what the build would look up is named instead)."""

    endpoints.require(cloud)
    placement = pool.placement(cloud)
    if placement is None:
        raise UsageError(f"--cloud {cloud}: pool {pool.name!r} has no `{cloud}:` placement; "
                         f"add one or use --cloud {' / '.join(pool.clouds)}")
    binary = find_packer()
    version = packer_version(binary)
    idx = [p.name for p in cfg.pools].index(pool.name)
    key_path: Loc = ("pools", idx, *file_key(cloud))
    # The file must take the result before anything is built (exit 2, nothing made).
    set_scalar(file_path.read_text(), key_path, "placeholder-0", source=str(file_path))
    base = ""
    if isinstance(placement, AwsPlacement):
        if dry_run:
            base = f"ssm:{placement.ami_ssm_parameter}"
            log(f"dry run: no cloud call; at build time the base AMI comes from SSM "
                f"parameter {placement.ami_ssm_parameter} in {placement.region} (`{base}` "
                "below) and the builder's subnet is checked")
        else:
            _aws_builder_subnet(cfg, pool, endpoints)
            base = aws_base(cfg, pool, endpoints)
    r = render(cfg, pool, cloud, version=version, base_image=base, endpoints=endpoints,
               serving_image=serving_image, now=now)
    workdir = images_dir() / "builds" / r.image_name
    template = f"{cloud}.pkr.hcl"
    cmd = [binary, "build", "-color=false", "-on-error=cleanup", template]
    res = BuildResult(pool=pool.name, cloud=cloud, image_id=None, image_name=r.image_name,
                      base_image=r.base_image, serving_image=r.serving_image, digest=None,
                      build_dir=str(workdir), packer_version=r.packer_version, command=cmd,
                      dry_run=dry_run)
    if dry_run:
        res.files = r.files
        return res

    private_dir(workdir)
    for name, text in r.files.items():
        write_private(workdir / name, text)
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "PACKER_NO_COLOR": "1"}
    if cloud == Cloud.aws and endpoints.aws is not None:
        env |= endpoints.aws.env(placement.region)

    stack = naming.stack_name(cfg, pool, cloud)
    packer_log = log_path(stack, "image-build")
    log(f"{stack}: building {r.image_name} in {workdir}; Packer's output goes to "
        f"{packer_log}" + (" (and here)" if verbose else ""))
    t0 = time.monotonic()
    if needs_plugin_block(version):
        run_packer(binary, workdir, ["init", template], env, log_file=packer_log,
                   verbose=verbose)
    run_packer(binary, workdir, cmd[1:], env, log_file=packer_log, verbose=verbose)
    res.seconds = round(time.monotonic() - t0, 1)
    res.image_id = _artifact(workdir, cloud, pool)
    try:
        res.digest = json.loads((workdir / "node-image.json").read_text()).get("digest")
    except (OSError, ValueError):
        res.digest = None  # the sandbox runs no provisioner
    rec = {
        "cloud": cloud, "image_id": res.image_id, "image_name": r.image_name,
        "pool": pool.name, "project": cfg.project, "stack": naming.stack_name(cfg, pool, cloud),
        "region": placement.region, "base_image": r.base_image,
        "serving_image": r.serving_image, "digest": res.digest,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "packer_version": r.packer_version,
        "endpoint": endpoints.aws.url if endpoints.aws else None, "seconds": res.seconds,
        # The start-up script sources the library from the image only for this version.
        "boot_lib_version": r.context["boot_lib"]["version"],
    }
    res.record = str(save_record(rec))
    if record_in_file:
        text = file_path.read_text()
        new_text, old, line = set_scalar(text, key_path, res.image_id, source=str(file_path))
        if new_text != text:
            replace_file(file_path, new_text)
        res.file, res.line = str(file_path), line
        log(f"{file_path}:{line}: {cloud}.{file_key(cloud)[1]}: {old or '(unset)'} -> "
            f"{res.image_id} (recorded)")
    return res


def _aws_builder_subnet(cfg: Config, pool: Pool, endpoints: CloudEndpoints) -> None:
    """Before Packer runs: the subnet its builder launches in exists (the file's, or one of
    the pool's private subnets, which its first deploy creates)."""
    _builds(Cloud.aws, endpoints).check_image_builder(
        pool, _pool_key(cfg, pool, Cloud.aws), builder_subnet_tags(cfg, pool))


def builder_subnet_tags(cfg: Config, pool: Pool) -> dict[str, str]:
    """The tags of the pool's private subnets: what the builder's subnet filter matches."""
    return {**naming.aws_tags(cfg, pool), "poolctl:tier": "private"}


def _artifact(workdir: Path, cloud: Cloud, pool: Pool) -> str:
    try:
        builds = json.loads((workdir / "packer-manifest.json").read_text())["builds"]
        artifact: str = builds[-1]["artifact_id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise OperationFailed(f"packer: no artifact in {workdir}/packer-manifest.json; "
                              "nothing was recorded") from None
    if cloud == Cloud.aws:  # "us-east-1:ami-0123"
        return artifact.split(",")[0].split(":", 1)[-1]
    assert pool.gcp is not None  # build checked the pool's placement on this cloud (gcp)
    return f"projects/{pool.gcp.project}/global/images/{artifact}"


# ---------------------------------------------------------------------------------------
# List and prune (the cloud's view; the file and the deployed pool say what is in use)


def list_images(cfg: Config, pool: Pool, cloud: Cloud,
                endpoints: CloudEndpoints = REAL_CLOUDS) -> list[ImageRow]:
    rows = _images(cloud, endpoints).node_images(cfg, pool)
    return sorted(rows, key=lambda r: (r.created, r.id), reverse=True)


def latest_image(cfg: Config, pool: Pool, cloud: Cloud,
                 endpoints: CloudEndpoints = REAL_CLOUDS) -> str:
    """`--node-image latest`: the newest image built for the pool that carries its serving
    image."""
    want = pool.serving.image if cloud == Cloud.aws else gcp_label_value(pool.serving.image)
    for row in list_images(cfg, pool, cloud, endpoints):
        if row.serving_image == want:
            return row.id
    raise UsageError(f"--node-image latest: no image built for pool {pool.name!r} carries "
                     f"{pool.serving.image}; build one with `poolctl image build --cloud "
                     f"{cloud}`")


def prune(cfg: Config, pool: Pool, cloud: Cloud, endpoints: CloudEndpoints, keep: int
          ) -> dict[str, Any]:
    """Deregister all but the `keep` newest images (and their snapshots); an image in use is
    never deleted and does not count against `keep`."""
    if keep < 0:
        raise UsageError(f"--keep {keep}: give 0 or more images to keep")
    rows = list_images(cfg, pool, cloud, endpoints)
    spare = [r for r in rows if not r.in_use]
    gone, kept = spare[keep:], [r.id for r in rows if r.in_use] + [r.id for r in spare[:keep]]
    deleted = []
    images = _images(cloud, endpoints)
    for r in gone:
        images.delete_node_image(pool, r)
        deleted.append({"id": r.id, "name": r.name, "snapshots": r.snapshots})
        log(f"{pool.name}: deleted {r.id} ({r.name}){' and ' if r.snapshots else ''}"
            f"{', '.join(r.snapshots)}")
    return {"pool": pool.name, "cloud": cloud, "kept": kept, "deleted": deleted}
