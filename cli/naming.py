"""Names and tags shared by the stacks, the boot scripts and the runtime operations.

Runtime commands find resources by the contract's tags/labels; names only need to be unique,
readable and within each cloud's length limits.
"""

from __future__ import annotations

import hashlib

from poolctl.config import Config, Pool

# Contract: tags on everything poolctl creates.
TAG_PROJECT = "poolctl:project"
TAG_POOL = "poolctl:pool"
TAG_ROLE = "poolctl:role"
LABEL_PROJECT = "poolctl-project"
LABEL_POOL = "poolctl-pool"
LABEL_ROLE = "poolctl-role"
ROLE = "inference"

# The queue metric each node publishes and the autoscaler targets.
METRIC_NAMESPACE = "poolctl"
METRIC_NAME = "RequestsWaitingPerReplica"
GCP_METRIC_TYPE = "custom.googleapis.com/poolctl/requests_waiting_per_replica"
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


def stack_name(cfg: Config, pool: Pool, cloud: str) -> str:
    return f"{cfg.project}-{pool.name}-{cloud}"


def aws_tags(cfg: Config, pool: Pool) -> dict[str, str]:
    return {TAG_PROJECT: cfg.project, TAG_POOL: pool.name, TAG_ROLE: ROLE}


def gcp_labels(cfg: Config, pool: Pool) -> dict[str, str]:
    return {LABEL_PROJECT: cfg.project, LABEL_POOL: pool.name, LABEL_ROLE: ROLE}
