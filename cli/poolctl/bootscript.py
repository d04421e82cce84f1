"""The node start-up script: EC2 user data / GCE startup-script, rendered from the jinja2
templates in `cli/poolctl/boot/*.sh.j2`.

One bash file per pool and cloud. Run once by cloud-init / the GCE agent, it installs itself
with a systemd unit that runs on every start (warm-pool nodes started from Stopped come back
with a blank instance store) and a 15 s timer that publishes the queue metric. Each step logs
`poolctl: phase=<name> seconds=<n>` so start-up time can be read from the journal or the
console output. See the templates for the steps and the reasons behind them.

Weights: `weights_uri` holds the files the server loads plus `manifest.json`:

    {"files": {"rel/path": {"sha256": "<hex digest>", "bytes": <size>}}}

Paths are relative to `weights_uri`, `/`-separated; every listed file must match or the boot
fails (ABANDON on AWS). `poolctl weights manifest DIR` (`poolctl.weights`) writes it.

The boot library (`_node_lib.sh.j2`: every function that depends on the cloud only) is
either inline (the whole script) or, on a node image `poolctl image build` made, installed at
`LIB_DIR/LIB_FILE`: user data then keeps the pool's parts only (the image variant) and
sources the library after checking its version. The stacks carry both variants and let
Terraform pick at plan time from the node image's `LIB_IMAGE_TAG` (the library version the
image holds): the synthesized JSON depends on the file and poolctl only, never on local
build records, and an image without this very library gets the whole script.

Templates use `{## ... ##}` for jinja comments, not `{# #}`: bash's `${#array[@]}` would open
one. Config values enter the script only through the `q` filter (shell quoting).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shlex
from functools import cache
from typing import Any

import jinja2

from poolctl import formats, naming, sizing, vllm_releases
from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.config import Config, GcpPlacement, Pool
from poolctl.errors import printable
from poolctl.histograms import FINE_BUCKETS

# EC2 caps user data at 16 KB before base64 (EC2 user guide, "Run commands at launch");
# Compute Engine caps one metadata value, the startup-script, at 256 KB (GCE docs, "About VM
# metadata", limits).
AWS_USER_DATA_LIMIT = 16 * 1024
BOOT_SCRIPT_LIMITS = {"aws": AWS_USER_DATA_LIMIT, "gcp": 256 * 1024}
BOOT_SCRIPT_NAMES = {"aws": "EC2's user-data", "gcp": "GCE's startup-script metadata"}
# Where `poolctl image build` installs the boot library in a node image.
LIB_DIR = "/opt/poolctl/lib"
LIB_FILE = "boot.sh"
LIB_VERSION_TAG = "# poolctl-boot-lib-version: "
# The node image's tag (AWS) / label (GCP) naming the library version it carries, set by
# `image build`. GCE label keys take lowercase letters, digits, '-' and '_' only.
LIB_IMAGE_TAG = {"aws": "poolctl:boot-library", "gcp": "poolctl-boot-library"}
# Model load + vLLM's KV-cache profiling + CUDA graph capture; a 70B model is ready in
# 4-8 min (docs/cloud-facts.md, "Start-up time"), so 30 min only catches a node that will
# never serve.
READY_TIMEOUT_S = 1800
# What the script's `fail` writes (boot/_lib.sh.j2) before it exits: read back from a node's
# console by `status` (clouds/aws/ops.py) and from a sandbox node's log.
FAILED = "poolctl: FAILED: "
FAILED_LINE_MAX = 300

_ECR = re.compile(r"^(?P<host>\d{12}\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?)/")
_GAR = re.compile(r"^(?P<host>[a-z0-9-]+-docker\.pkg\.dev)/")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("poolctl", "boot"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        comment_start_string="{##",
        comment_end_string="##}",
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def _registry(image: str, cloud: Cloud) -> dict[str, str]:
    """How the node logs in to the image's registry with its own identity (never a stored
    password): ECR on AWS, Artifact Registry on GCP; public registries need nothing."""
    if cloud == Cloud.aws and (m := _ECR.match(image)):
        return {"registry_login": "ecr", "registry": m["host"], "registry_region": m["region"]}
    if cloud == Cloud.gcp and (m := _GAR.match(image)):
        return {"registry_login": "gar", "registry": m["host"]}
    return {"registry_login": "none"}


@cache
def boot_library(cloud: Cloud) -> dict[str, str]:
    """The boot library for `cloud` as a node image carries it: its file's text (a header
    naming its version, the sha256 of its body), the version, where it goes."""
    body = environment().get_template("_node_lib.sh.j2").render(cloud=cloud)
    # Named after the cloud: a bare hex digest reads as a secret to scanners.
    version = f"{cloud}-{hashlib.sha256(body.encode()).hexdigest()[:12]}"
    # SC2153: the values (STATE, ...) are set by the start-up script that sources it.
    text = (f"# shellcheck shell=bash disable=SC2153\n"
            f"# poolctl boot library ({cloud}): the functions of the node start-up script,\n"
            f"# sourced by it on nodes whose image poolctl built. Generated by poolctl from\n"
            f"# cli/poolctl/boot/_node_lib.sh.j2; do not edit.\n{LIB_VERSION_TAG}{version}\n{body}")
    return {"dir": LIB_DIR, "file": LIB_FILE, "path": f"{LIB_DIR}/{LIB_FILE}",
            "version": version, "text": text}



def histogram_buckets(image: str) -> str:
    """`--custom-histogram-buckets`'s JSON for the image's vLLM ("" when it lacks the flag):
    poolctl's TTFT and TPOT edges, so that the pool's percentiles read back within 10 %."""
    if not vllm_releases.fine_edges(image):
        return ""
    return json.dumps({family: list(edges) for family, edges in FINE_BUCKETS.items()},
                      separators=(",", ":"))


def context(cfg: Config, pool: Pool, cloud: Cloud, from_image: bool = False
            ) -> dict[str, Any]:
    """Every value the templates need for this pool and cloud, and nothing they do not use
    (a test removes each key in turn and expects the render to fail). `from_image`: source
    the boot library from the node image (the image variant) instead of holding it.

    It checks nothing: `cfg.targets` picks placements that exist, and the rules (`validate`,
    and `poolctl_stacks.app` before it synthesizes) refuse a type outside the catalog and a
    tensor_parallel that does not divide its GPUs."""
    placement = pool.placement(cloud)
    assert placement is not None  # see above: the callers pass a placement that exists
    type_name = placement.type_name
    row = load_catalog().get(cloud, type_name)
    assert row is not None  # see above: the rules refuse a type outside the catalog
    s = pool.serving
    secret = pool.api_key_secret(cloud)
    ctx: dict[str, Any] = {
        "cloud": cloud,
        "project": cfg.project,
        "pool_name": pool.name,
        "base": naming.base(cfg, pool),
        "cache_mount": naming.CACHE_MOUNT,
        "nvme_expected": row.local_nvme.count,
        "model_id": pool.model.id,
        "model_version": pool.model.version,
        # Parsed by the config model; a trailing slash: `prefix/*` and `cp --recursive
        # prefix/` then copy the folder's content, and s3://b/llama never matches s3://b/llama-2/.
        "weights_uri": placement.weights.uri,
        "weights_subdir": f"{_slug(pool.model.id)}/{_slug(pool.model.version)}",
        "image": s.image,
        "gpus": row.gpus,
        "tp": s.tensor_parallel,
        "dp": row.gpus // s.tensor_parallel,
        "max_model_len": s.max_model_len,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_num_seqs": s.max_num_seqs,
        "prefix_caching": s.prefix_caching,
        "histogram_buckets": histogram_buckets(s.image),
        "port": s.port,
        "health_path": s.health_path,
        "extra_args": list(s.extra_args),
        # The secret's name only: the node reads the key itself at boot (see start_serving).
        "api_key_secret": None if secret is None else {
            "id": secret,
            **({"region": formats.aws_secret_arn(secret)} if cloud == Cloud.aws else {}),
        },
        "ready_timeout_s": READY_TIMEOUT_S,
        "compile_cache": compile_cache(pool, cloud, row.gpu),
        "boot_lib": None,
        "weights_role": None,  # AWS sets it when the placement streams the weights
        **_registry(s.image, cloud),
    }
    if cloud == Cloud.aws:
        ctx |= {
            "region": placement.region,
            # aws.weights_load: stream: the role the container's credentials come from
            "weights_role": (naming.base(cfg, pool) + naming.WEIGHTS_ROLE_SUFFIX
                             if sizing.weights_path(pool, row) == "stream" else None),
            "lifecycle_hook": naming.LIFECYCLE_HOOK,
            "metric_namespace": naming.METRIC_NAMESPACE,
            "metric_name": naming.METRIC_NAME,
        }
    else:
        assert isinstance(placement, GcpPlacement)  # the placement of a cloud not aws
        ctx |= {"gcp_project": placement.project, "metric_type": naming.GCP_METRIC_TYPE,
                # the MIG's name (the stack's), which the metrics' pool label carries
                "mig": naming.short(naming.base(cfg, pool), 63)}
    if from_image:
        lib = boot_library(cloud)
        ctx["boot_lib"] = {k: lib[k] for k in ("dir", "file", "version")}
    return ctx


def compile_cache(pool: Pool, cloud: Cloud, gpu: str) -> dict[str, str] | None:
    """Where the pool's nodes share vLLM's torch.compile cache (the placement's
    compile_cache_uri): one tar per key of what the cache depends on, so that a pool with a
    new image, model, TP, GPU type or engine setting builds its own (vLLM checks its own
    hash of the config and the code inside, too: docs.vllm.ai, torch.compile integration,
    "Compilation Cache")."""
    placement = pool.placement(cloud)
    assert placement is not None  # asked for a placement the pool has
    prefix = placement.compile_cache
    if prefix is None:
        return None
    s = pool.serving
    parts = [s.image, pool.model.id, pool.model.version, gpu, s.tensor_parallel,
             s.max_model_len, s.max_num_batched_tokens, s.max_num_seqs,
             s.gpu_memory_utilization, s.kv_cache_dtype, s.prefix_caching, *s.extra_args]
    key = hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:16]
    return {"uri": f"{prefix.uri}{_slug(pool.model.id)}-tp{s.tensor_parallel}-{key}.tar"}


def render_boot_script(cfg: Config, pool: Pool, cloud: Cloud, from_image: bool = False
                       ) -> str:
    """The boot script, whatever its size; by default the whole one, the worst case, which
    the `boot-script-size` rule measures."""
    return environment().get_template("node.sh.j2").render(
        context(cfg, pool, cloud, from_image))


def user_data(script: str, cloud: Cloud) -> bytes:
    """What the cloud is given for `script`: on AWS gzip-compressed (cloud-init decompresses
    gzip user data before it runs it: cloud-init docs, "User data formats", compression),
    which keeps a script of ~17 KB under the 16 KB cap at ~6 KB; on GCP the text, which a
    startup-script must be. Deterministic (no time stamp), so synthesis is repeatable."""
    raw = script.encode()
    if cloud == "aws":
        return gzip.compress(raw, compresslevel=9, mtime=0)
    return raw


def size_problem(size: int, cloud: Cloud) -> str | None:
    """`size`: of what the cloud is given (user_data)."""
    limit = BOOT_SCRIPT_LIMITS[cloud]
    if size <= limit:
        return None
    what = "compressed boot script" if cloud == "aws" else "boot script"
    return f"the {what} is {size} bytes, over {BOOT_SCRIPT_NAMES[cloud]} limit of {limit}"


def render_nvme_script(
    cloud: Cloud, nvme_expected: int, cache_mount: str = naming.CACHE_MOUNT
) -> str:
    """The NVMe cache step on its own (for `nodes check`, repairs and tests)."""
    return environment().get_template("nvme-raid.sh.j2").render(
        cloud=cloud, nvme_expected=nvme_expected, cache_mount=cache_mount, standalone=True
    )


def failed_line(log: str) -> str | None:
    """The last failure the boot script logged, without its prefix (None: none)."""
    hits = [ln.split(FAILED, 1)[1].strip() for ln in log.splitlines() if FAILED in ln]
    return printable(hits[-1])[:FAILED_LINE_MAX] if hits else None
