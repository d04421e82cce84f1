"""The one model of `poolctl.yaml`, parsed once at the edge.

Everything downstream (rules, sizing, stacks, runtime operations) takes these objects, never
raw dicts. Sizes in the file are in replicas; nodes are derived in `sizing`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from poolctl.errors import UsageError

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
Dtype = Literal["float32", "bfloat16", "float16", "fp8", "int8", "int4"]
# Bytes per element: weights use the model dtype, the KV cache its own (see kv_cache_dtype).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


class CoreModel(BaseModel):
    """Base of every config model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Model(CoreModel):
    id: str = Field(description="Model id as the serving image loads it (Hugging Face style).")
    version: str = Field(
        default="1",
        description="Version label of the weights; `rollout start --model-version` changes it.",
    )
    params_b: float = Field(gt=0, description="Parameters in billions.")
    dtype: Dtype = Field(description="Weight dtype; sets bytes per parameter.")
    layers: int = Field(gt=0, description="Transformer layers (KV cache is per layer).")
    kv_heads: int = Field(gt=0, description="Key/value heads (GQA groups), not query heads.")
    head_dim: int = Field(gt=0, description="Dimension of one attention head.")


class Serving(CoreModel):
    image: str = Field(description="Serving container image, e.g. vllm/vllm-openai:v0.11.0.")
    image_size_gb: float = Field(
        default=12.0, gt=0,
        description="Compressed size of the serving image, for start-up estimates.",
    )
    image_prepulled: bool = Field(
        default=False,
        description="The node image already carries the serving container (no pull at boot).",
    )
    tensor_parallel: int = Field(description="GPUs per replica: 1, 2, 4 or 8.")
    max_model_len: int = Field(gt=0, description="Longest sequence (prompt + output) in tokens.")
    gpu_memory_utilization: float = Field(
        default=0.92, gt=0, le=1, description="Share of each GPU's HBM that vLLM may use."
    )
    max_num_batched_tokens: int = Field(
        default=8192, gt=0, description="Token budget of one scheduler step (chunked prefill)."
    )
    kv_cache_dtype: Literal["auto", "fp8", "bfloat16", "float16"] = Field(
        default="auto",
        description="KV cache dtype; `auto` is bfloat16 for 8/4-bit weights, else the model dtype.",
    )
    reserved_gib_per_gpu: float = Field(
        default=2.0,
        ge=0,
        description="HBM held back per GPU for CUDA context, activations and CUDA graphs.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port the server listens on.")
    health_path: str = Field(default="/health", description="HTTP path of the readiness check.")
    extra_args: list[str] = Field(
        default_factory=list, description="Further vLLM arguments, passed through as given."
    )


class Scaling(CoreModel):
    min_replicas: int = Field(ge=0, description="Replicas always in service.")
    max_replicas: int = Field(gt=0, description="Upper bound on replicas in service.")
    queue_target: float = Field(
        default=4, gt=0, description="Waiting requests per replica (vLLM num_requests_waiting)."
    )
    scale_up_stabilization_s: int = Field(
        default=0, ge=0, description="Seconds a higher recommendation must hold before scaling up."
    )
    scale_down_stabilization_s: int = Field(
        default=900, ge=0, description="Seconds a lower recommendation must hold before scaling in."
    )


class WarmPool(CoreModel):
    replicas: int = Field(default=0, ge=0, description="Spare replicas kept prepared.")
    state: Literal["stopped", "running", "hibernated"] = Field(
        default="stopped",
        description="State of warm nodes; GPU nodes cannot hibernate (checked by a rule).",
    )


class Rollout(CoreModel):
    max_surge_replicas: int = Field(
        default=0, ge=0, description="Extra replicas allowed above the pool during a rollout."
    )
    checkpoints: list[int] = Field(
        default_factory=lambda: [100],
        description="Percentages of the pool replaced before each pause and health check.",
    )
    checkpoint_delay_s: int = Field(
        default=300, ge=0, description="Seconds to watch health at each checkpoint."
    )


class Slo(CoreModel):
    ttft_p90_s: float = Field(default=2.0, gt=0, description="Target p90 time to first token.")
    target_utilization: float = Field(
        default=0.6, gt=0, le=1, description="Share of capacity in use the pool is sized for."
    )


class AwsNetwork(CoreModel):
    vpc_id: str | None = Field(default=None, description="Existing VPC; omit to create one.")
    subnet_ids: list[str] = Field(
        default_factory=list, description="Existing private subnets (with vpc_id)."
    )
    vpc_cidr: str = Field(
        default="10.40.0.0/16", description="CIDR of the VPC poolctl creates when vpc_id is unset."
    )
    availability_zones: int = Field(
        default=2, ge=2, le=6, description="Zones the created VPC spans (one private subnet each)."
    )
    client_cidrs: list[str] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the (internal) load balancer.",
    )


class AwsPlacement(CoreModel):
    region: str = Field(description="AWS region.")
    instance_type: str = Field(description="8-GPU NVLink instance type from the catalog.")
    weights_uri: str = Field(description="s3:// prefix holding the weights and manifest.json.")
    ami_id: str | None = Field(
        default=None,
        description="Node image; omit for the Deep Learning AMI named by `ami_ssm_parameter`.",
    )
    ami_ssm_parameter: str = Field(
        default="/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        description="SSM parameter resolved at deploy time when ami_id is unset.",
    )
    root_volume_gb: int = Field(
        default=200, ge=50, description="Encrypted gp3 root volume (OS, drivers, images)."
    )
    network: AwsNetwork = Field(default_factory=AwsNetwork, description="Where the pool runs.")
    certificate_arn: str | None = Field(
        default=None,
        description="ACM certificate for an HTTPS listener (HTTP redirects to it); omit for "
        "plain HTTP inside the VPC.",
    )
    efa_interfaces: int = Field(
        default=0, description="EFA interfaces per node; must stay 0 for inference (rule)."
    )
    placement_group_strategy: Literal["none", "spread", "partition", "cluster"] = Field(
        default="none", description="Placement group; `cluster` is a training layout (rule)."
    )
    price_per_hour_usd: float | None = Field(
        default=None, gt=0, description="Override of the catalog's on-demand price per node."
    )


class GcpPlacement(CoreModel):
    project: str = Field(description="GCP project id.")
    region: str = Field(description="GCP region.")
    machine_type: str = Field(description="8-GPU NVLink machine type from the catalog.")
    weights_uri: str = Field(description="gs:// prefix holding the weights and manifest.json.")
    zones: list[str] = Field(
        default_factory=list, description="Zones of the regional MIG; omit for the catalog's."
    )
    image: str = Field(
        default="projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-nvidia-550",
        description="Boot image (with GPU drivers) of the nodes.",
    )
    boot_disk_gb: int = Field(default=200, ge=50, description="Boot disk size.")
    network: str = Field(default="default", description="VPC network name.")
    subnetwork: str | None = Field(default=None, description="Subnetwork; omit for auto mode.")
    client_cidrs: list[str] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the internal load balancer.",
    )
    gpudirect: bool = Field(
        default=False, description="GPUDirect-TCPX/RDMA NICs; must stay off for inference (rule)."
    )
    standby_suspended: bool = Field(
        default=False, description="Suspend standby VMs; unsupported for GPU VMs (rule)."
    )
    price_per_hour_usd: float | None = Field(
        default=None, gt=0, description="Override of the catalog's on-demand price per VM."
    )


class Pool(CoreModel):
    name: Annotated[str, Field(pattern=NAME_RE, description="Pool name: [a-z0-9-], unique.")]
    model: Model = Field(description="The model served.")
    serving: Serving = Field(description="The serving container and its engine settings.")
    scaling: Scaling = Field(description="Autoscaling bounds and the queue target.")
    warm_pool: WarmPool = Field(default_factory=WarmPool, description="Spare prepared capacity.")
    rollout: Rollout = Field(default_factory=Rollout, description="How new versions roll out.")
    slo: Slo = Field(default_factory=Slo, description="Service-level targets for sizing.")
    aws: AwsPlacement | None = Field(default=None, description="AWS placement of the pool.")
    gcp: GcpPlacement | None = Field(default=None, description="GCP placement of the pool.")

    @model_validator(mode="after")
    def _has_placement(self) -> Pool:
        if self.aws is None and self.gcp is None:
            raise ValueError("a pool needs an `aws:` or a `gcp:` placement (or both)")
        return self

    def placement(self, cloud: str) -> AwsPlacement | GcpPlacement | None:
        return self.aws if cloud == "aws" else self.gcp

    @property
    def clouds(self) -> list[str]:
        return [c for c in ("aws", "gcp") if self.placement(c) is not None]


class AwsBackend(CoreModel):
    bucket: str = Field(description="S3 bucket holding Terraform state.")
    region: str = Field(description="Region of the state bucket.")
    key_prefix: str = Field(default="poolctl", description="Key prefix of state objects.")
    dynamodb_table: str | None = Field(
        default=None, description="Lock table; omit to lock with S3 lock files (use_lockfile)."
    )


class GcpBackend(CoreModel):
    bucket: str = Field(description="GCS bucket holding Terraform state (locks natively).")
    prefix: str = Field(default="poolctl", description="Object prefix of state.")


class Backend(CoreModel):
    aws: AwsBackend | None = Field(default=None, description="S3 state for AWS stacks.")
    gcp: GcpBackend | None = Field(default=None, description="GCS state for GCP stacks.")


class Config(CoreModel):
    project: Annotated[str, Field(pattern=NAME_RE, description="Prefix for names and tags.")]
    pools: list[Pool] = Field(min_length=1, description="The pools, one model each.")
    backend: Backend = Field(
        default_factory=Backend, description="Terraform state; local files when unset."
    )

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: list[Pool]) -> list[Pool]:
        seen: set[str] = set()
        for p in pools:
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} is used twice; names must be unique")
            seen.add(p.name)
        return pools

    def select(self, pool: str | None) -> list[Pool]:
        if pool is None:
            return list(self.pools)
        for p in self.pools:
            if p.name == pool:
                return [p]
        names = ", ".join(p.name for p in self.pools)
        raise UsageError(f"--pool: no pool named {pool!r} in the file; pools are: {names}")

    def targets(self, pool: str | None, cloud: str | None) -> list[tuple[Pool, str]]:
        """(pool, cloud) pairs a command acts on: `--cloud` picks the placement; pools
        without it are passed over, unless `--pool` named one explicitly."""
        out = []
        for p in self.select(pool):
            clouds = [cloud] if cloud else p.clouds
            for c in clouds:
                if p.placement(c) is None:
                    if pool is not None:
                        raise UsageError(
                            f"--cloud {c}: pool {p.name!r} has no `{c}:` placement; "
                            f"add one or use --cloud {' / '.join(p.clouds)}"
                        )
                    continue
                out.append((p, c))
        if not out:
            raise UsageError(f"--cloud {cloud}: no pool in the file has a `{cloud}:` placement")
        return out


# ---------------------------------------------------------------------------------------
# Loading: one clear line per problem, with the key path and, where YAML has it, the line.


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key, by key path."""


def _compose_lines(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = (*path, k.value)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines[(*path, i)] = v.start_mark.line + 1
                walk(v, (*path, i))

    try:
        root = yaml.compose(text, Loader=_LineLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _clean_loc(loc: tuple) -> tuple:
    # pydantic inserts union-member tags (e.g. 'AwsPlacement') into locations; drop them.
    return tuple(p for p in loc if isinstance(p, int) or not str(p)[:1].isupper())


def find_config(path: str | os.PathLike | None) -> Path:
    if path is None:
        path = os.environ.get("POOLCTL_FILE") or "poolctl.yaml"
    p = Path(path)
    if not p.is_file():
        raise UsageError(
            f"-f/--file: {p} not found; run in a folder with poolctl.yaml, "
            "or pass -f PATH (or set POOLCTL_FILE)"
        )
    return p


def parse_config(text: str, source: str = "poolctl.yaml") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{source}{where}: not valid YAML ({problem}); fix the syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with `project` and `pools` at the top")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = _compose_lines(text)
        msgs = []
        for err in e.errors():
            loc = _clean_loc(err["loc"])
            line = None
            for n in range(len(loc), 0, -1):
                if loc[:n] in lines:
                    line = lines[loc[:n]]
                    break
            where = f"{source}:{line}" if line else source
            msgs.append(f"{where}: {format_loc(loc) or '(top)'}: {_hint(err)}")
        raise UsageError("\n".join(msgs)) from None


def _hint(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling (see `poolctl schema`)"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "literal_error":
        return f"{err['msg'].lower()}; got {err.get('input')!r}"
    if kind == "string_pattern_mismatch":
        return f"{err.get('input')!r} must be lowercase letters, digits and '-' (max 40)"
    msg = err["msg"]
    msg = re.sub(r"^Value error, ", "", msg)
    return f"{msg}; got {err.get('input')!r}" if "input" in err else msg


def load_config(path: str | os.PathLike | None = None) -> Config:
    p = find_config(path)
    return parse_config(p.read_text(), source=str(path or p))


def json_schema() -> dict:
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "poolctl.yaml"
    return schema
