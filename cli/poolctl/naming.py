"""Names and tags shared by the stacks, the boot scripts and the runtime operations.

Runtime commands find resources by the contract's tags/labels; names only need to be unique,
readable and within each cloud's length limits.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from poolctl.cloud import Cloud

if TYPE_CHECKING:  # config validates names with name_problems below
    from poolctl.config import Config, Pool

# Contract: tags on everything poolctl creates.
TAG_PROJECT = "poolctl:project"
TAG_POOL = "poolctl:pool"
TAG_ROLE = "poolctl:role"
LABEL_PROJECT = "poolctl-project"
LABEL_POOL = "poolctl-pool"
LABEL_ROLE = "poolctl-role"
ROLE = "inference"
# On the AWS group only (GCP labels cannot hold them): what `poolctl ls` shows.
TAG_MODEL = "poolctl:model"
TAG_IMAGE = "poolctl:image"
# A launch window's own group (AWS: the nodes of a Capacity Block bought for the window) and
# the block it launches into: not the pool's group, whatever else its tags say.
TAG_WINDOW = "poolctl:window"
TAG_BLOCK = "poolctl:capacity-block"
# On a bought Capacity Block, set at purchase: the window it was bought for (FROM/UNTIL/NODES,
# so a block left without its window names the command that uses it), when and by whom.
TAG_WINDOW_SPAN = "poolctl:window-span"
# On a node image poolctl built: the serving image it pre-pulled (`--node-image latest`).
TAG_SERVING_IMAGE = "poolctl:serving-image"
LABEL_SERVING_IMAGE = "poolctl-serving-image"
TAG_BOUGHT_BY = "poolctl:bought-by"
TAG_BOUGHT_AT = "poolctl:bought-at"

# The queue metric each node publishes and the autoscaler targets.
METRIC_NAMESPACE = "poolctl"
METRIC_NAME = "RequestsWaitingPerReplica"
# What a node publishes beside the queue, per pool (boot/_node_lib.sh.j2 latency_metrics;
# docs/metrics.md): latency histograms as value/count arrays, counters' increases, gauges.
TTFT_METRIC = "TimeToFirstToken"
TPOT_METRIC = "TimePerOutputToken"
E2E_METRIC = "EndToEndLatency"
REQUESTS_METRIC = "Requests"
PROMPT_TOKENS_METRIC = "PromptTokens"
OUTPUT_TOKENS_METRIC = "GenerationTokens"
RUNNING_METRIC = "RunningRequests"
KV_USAGE_METRIC = "KvCacheUsage"
GCP_METRIC_TYPE = "custom.googleapis.com/poolctl/requests_waiting_per_replica"
# ... and on GCP (boot/_node_lib.sh.j2 gcp_metrics): Cloud Monitoring custom metrics beside
# the queue's, labelled pool=<the MIG>: CUMULATIVE distributions and counters, GAUGEs.
GCP_METRIC_PREFIX = GCP_METRIC_TYPE.rsplit("/", 1)[0] + "/"
GCP_TTFT_TYPE = GCP_METRIC_PREFIX + "time_to_first_token"
GCP_TPOT_TYPE = GCP_METRIC_PREFIX + "time_per_output_token"
GCP_E2E_TYPE = GCP_METRIC_PREFIX + "end_to_end_latency"
GCP_REQUESTS_TYPE = GCP_METRIC_PREFIX + "requests"
GCP_PROMPT_TOKENS_TYPE = GCP_METRIC_PREFIX + "prompt_tokens"
GCP_OUTPUT_TOKENS_TYPE = GCP_METRIC_PREFIX + "generation_tokens"
GCP_RUNNING_TYPE = GCP_METRIC_PREFIX + "running_requests"
GCP_KV_USAGE_TYPE = GCP_METRIC_PREFIX + "kv_cache_usage"
GCP_POOL_LABEL = "pool"
LIFECYCLE_HOOK = "poolctl-node-ready"
CACHE_MOUNT = "/mnt/poolctl-cache"


def short(name: str, limit: int) -> str:
    """`name` if it fits, else a prefix plus a stable 6-char hash (AWS LB/TG names: 32)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{name[: limit - 7].rstrip('-')}-{digest}"


def base(cfg: Config, pool: Pool) -> str:
    return f"{cfg.project}-{pool.name}"


def stack_name(cfg: Config, pool: Pool, cloud: Cloud) -> str:
    return f"{cfg.project}-{pool.name}-{cloud}"


def aws_tags(cfg: Config, pool: Pool) -> dict[str, str]:
    return {TAG_PROJECT: cfg.project, TAG_POOL: pool.name, TAG_ROLE: ROLE}


def gcp_labels(cfg: Config, pool: Pool) -> dict[str, str]:
    return {LABEL_PROJECT: cfg.project, LABEL_POOL: pool.name, LABEL_ROLE: ROLE}


# Names the stacks build from `base` (project-pool) verbatim, with the cloud's limit. Names
# that pass through `short()` (load balancers, target groups, every GCP resource) always fit;
# a test synthesizes the longest accepted names and checks every name in both stacks.
AWS_IAM_ROLE_LIMIT = 64
# EventBridge Scheduler: "Name: 1-64 characters" for schedule groups (CreateScheduleGroup).
AWS_SCHEDULE_GROUP_LIMIT = 64
WINDOWS_ROLE_SUFFIX = "-windows"
# aws.weights_load: stream: the role whose short-lived credentials the serving container gets
WEIGHTS_ROLE_SUFFIX = "-weights"
AWS_VERBATIM_NAMES = (  # (what, suffix, limit)
    ("the nodes' IAM role", "", AWS_IAM_ROLE_LIMIT),
    ("the VPC flow-log IAM role", "-vpc-flow", AWS_IAM_ROLE_LIMIT),
    ("the launch windows' IAM role", WINDOWS_ROLE_SUFFIX, AWS_IAM_ROLE_LIMIT),
    ("the streamed weights' IAM role", WEIGHTS_ROLE_SUFFIX, AWS_IAM_ROLE_LIMIT),
    ("the launch windows' schedule group", "", AWS_SCHEDULE_GROUP_LIMIT),
)
MAX_BASE_AWS = min(limit - len(suffix) for _, suffix, limit in AWS_VERBATIM_NAMES)
_RFC1035_START = re.compile(r"^[a-z]")


def name_problems(project: str, pool: str, clouds: list[Cloud]) -> list[tuple[str, str]]:
    """(field, problem) for names the clouds would reject; field is "project" or "name"."""
    out: list[tuple[str, str]] = []
    name = f"{project}-{pool}"
    if "aws" in clouds:
        for what, suffix, limit in AWS_VERBATIM_NAMES:
            if len(name + suffix) > limit:
                out.append(("name", f"{project}-{pool} makes {what} {name + suffix!r} "
                            f"{len(name + suffix)} characters, over AWS's {limit}; shorten the "
                            f"pool name (or the project) to {MAX_BASE_AWS} characters together"))
                break
        # An internal ALB's DNS name starts with `internal-`; AWS refuses LB names that do.
        if name.startswith("internal-"):
            out.append(("project", f"{project!r} makes load balancer names start with "
                        "'internal-', which AWS refuses; choose another project name"))
    if "gcp" in clouds and not _RFC1035_START.match(project):
        out.append(("project", f"{project!r} starts GCP resource names, which must start "
                    "with a letter (RFC 1035); start the project name with a letter"))
    return out
