"""The one model of `poolctl.yaml`, parsed once at the edge.

Everything downstream (rules, sizing, stacks, runtime operations) takes these objects, never
raw dicts. Sizes in the file are in replicas; nodes are derived in `sizing`.
"""

from __future__ import annotations

import os
import re
import stat
import typing
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Strict,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError, core_schema

from poolctl import formats, models
from poolctl.cloud import Cloud
from poolctl.errors import UsageError
from poolctl.models import did_you_mean
from poolctl.naming import name_problems

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
# Strict scalars: YAML's `true` is not 1 and `4.0` is not a count; numbers are finite.
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]  # an integer is a number too; a boolean is not
Bool = Annotated[bool, Strict()]
# Bounds that keep every number the clouds and the sizing see finite and sane.
MAX_REPLICAS = 10_000
MAX_SECONDS = 86_400
ImageRef = Annotated[str, AfterValidator(formats.image_reference)]
# Free text that reaches boot scripts, tags, labels or logs: every character prints as itself.
Text = Annotated[str, AfterValidator(formats.plain_text)]
Ipv4Cidr = Annotated[str, AfterValidator(formats.ipv4_cidr)]
UrlPath = Annotated[str, AfterValidator(formats.url_path)]


@dataclass(frozen=True)
class Shape:
    """The shape of an identifier: `formats.matches(pattern, what)` checks it (one line
    saying how it is written), and the JSON Schema carries the pattern, for editors and for
    the configs the property tests draw from it."""

    pattern: str
    what: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            formats.matches(self.pattern, self.what), handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        out = handler(schema)
        # JSON Schema patterns search (anchors make them whole), and `\d` is 0-9 in both
        out["pattern"] = "^(?:" + self.pattern.replace("\\d", "[0-9]") + ")$"
        return dict(out)


# Identifiers of a fixed shape: Annotated[str, Shape(PATTERN, WHAT)], written out (not built
# by a function) so that type checkers read them as types.
_AWS_REGION = Shape(formats.AWS_REGION, "an AWS region like us-east-1")
AwsRegion = Annotated[str, _AWS_REGION]
# Instance and machine types as the clouds name them (p5.48xlarge, m6i.xlarge; a3-highgpu-8g,
# n2-standard-4); whether poolctl knows the type is the catalog's rule.
AwsInstanceType = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{0,30}\.[a-z0-9]{1,20}", "an EC2 instance type like p5.48xlarge")]
GcpMachineType = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{0,61}[a-z0-9]", "a machine type like a3-highgpu-8g")]
GcpRegion = Annotated[str, Shape(
    r"[a-z]+-[a-z]+\d{1,2}", "a GCP region like us-central1")]
GcpZone = Annotated[str, Shape(
    r"[a-z]+-[a-z]+\d{1,2}-[a-z]", "a GCP zone like us-central1-a")]
GcpProject = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a GCP project id (6-30 lowercase letters, digits, '-')")]
VpcId = Annotated[str, Shape(
    r"vpc-[0-9a-f]{1,17}", "a VPC id like vpc-0123456789abcdef0")]
SubnetId = Annotated[str, Shape(
    r"subnet-[0-9a-f]{1,17}", "a subnet id like subnet-0123456789abcdef0")]
AmiId = Annotated[str, Shape(
    r"ami-[0-9a-f]{8,17}", "an AMI id like ami-0123456789abcdef0")]
SsmName = Annotated[str, Shape(
    r"/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*",
    "an SSM parameter name like /aws/service/.../ami-id")]
ModelId = Annotated[str, Shape(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?",
    "a model id like org/name (letters, digits, '.', '_', '-')")]
_GCE_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_GCE_API = r"(https://(www|compute)\.googleapis\.com/compute/v1/)?"
# Image projects: project ids, and the older domain-scoped ones (example.com:project).
_GCE_PROJECT = r"([a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"
# What an instance template's source image takes: an image or a family (`family/F`), bare,
# under [projects/P/]global/images/ (URLs too), or as P/NAME.
GcpImage = Annotated[str, Shape(
    rf"({_GCE_API}projects/{_GCE_PROJECT}/global/images/|global/images/)?(family/)?{_GCE_NAME}"
    rf"|{_GCE_PROJECT}/{_GCE_NAME}",
    "a Compute Engine image: NAME, family/FAMILY, or projects/PROJECT/global/images/NAME "
    "(or .../images/family/FAMILY)")]
# What `image build` starts from (poolctl.images.gcp_base): a family or an image, bare or
# under projects/P/global/images/.
GcpBaseImage = Annotated[str, Shape(
    rf"(projects/{_GCE_PROJECT}/global/images/)?(family/)?{_GCE_NAME}",
    "a Compute Engine image: family/FAMILY or NAME, optionally under "
    "projects/PROJECT/global/images/")]
GcpNetwork = Annotated[str, Shape(
    rf"{_GCE_NAME}|{_GCE_API}projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]"
    rf"/global/networks/{_GCE_NAME}",
    "a network: NAME or projects/PROJECT/global/networks/NAME")]
GcpSubnetwork = Annotated[str, Shape(
    rf"{_GCE_NAME}|{_GCE_API}projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]"
    rf"/regions/[a-z]+-[a-z]+\d{{1,2}}/subnetworks/{_GCE_NAME}",
    "a subnetwork: NAME or projects/PROJECT/regions/REGION/subnetworks/NAME")]
VpcCidr = Annotated[str, AfterValidator(lambda v: formats.ipv4_cidr(v, 16, 24))]
S3Uri = Annotated[str, AfterValidator(lambda v: formats.parse_object_prefix(v, "s3") and v)]
GsUri = Annotated[str, AfterValidator(lambda v: formats.parse_object_prefix(v, "gs") and v)]
AzId = Annotated[str, Shape(
    r"[a-z]{2,5}\d{1,2}-az\d{1,2}", "an availability zone ID like use1-az4")]
_S3_BUCKET = AfterValidator(lambda v: formats.parse_object_prefix(f"s3://{v}/", "s3") and v)
_GCS_BUCKET = AfterValidator(lambda v: formats.parse_object_prefix(f"gs://{v}/", "gs") and v)
S3Bucket = Annotated[str, _S3_BUCKET]
_KEY_PREFIX = Shape(
    r"[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*",
    "a key prefix like pools/chat (no '/' at either end)")
KeyPrefix = Annotated[str, _KEY_PREFIX]
AcmCertificateArn = Annotated[str, AfterValidator(
    lambda v: formats.acm_certificate_arn(v) and v)]
# Backend settings: literal values (Terraform refuses expressions there, naming none of
# them), then each its shape.
_TF_LITERAL = AfterValidator(formats.terraform_literal)
BackendS3Bucket = Annotated[str, _TF_LITERAL, _S3_BUCKET]
BackendGcsBucket = Annotated[str, _TF_LITERAL, _GCS_BUCKET]
BackendAwsRegion = Annotated[str, _TF_LITERAL, _AWS_REGION]
BackendKeyPrefix = Annotated[str, _TF_LITERAL, _KEY_PREFIX]
BackendDynamoDbTable = Annotated[str, _TF_LITERAL, Shape(
    r"[A-Za-z0-9_.-]{3,255}", "a DynamoDB table name (3-255 letters, digits, '_', '-', '.')")]
# On-Demand Capacity Reservations (EC2 API reference, CapacityReservation: cr- and 17 hex
# digits) and the resource groups of them a launch may target.
CapacityReservationId = Annotated[str, Shape(
    r"cr-[0-9a-f]{17}", "an On-Demand Capacity Reservation id like cr-0123456789abcdef0")]
ReservationGroupArn = Annotated[str, Shape(
    rf"arn:{formats.AWS_PARTITION}:resource-groups:{formats.AWS_REGION}:\d{{12}}"
    r":group/[A-Za-z0-9_.-]{1,128}",
    "a resource group ARN like arn:aws:resource-groups:us-east-1:123456789012:group/NAME")]
# A GCE reservation's name (Compute API reference, reservations: RFC 1035, 1-63 characters).
GcpReservationName = Annotated[str, Shape(
    r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", "a reservation name like p5-reserved (RFC 1035)")]
GcpCertificate = Annotated[str, Shape(
    r"((https://www\.googleapis\.com/compute/v1/)?projects/[a-z][a-z0-9-]{4,28}[a-z0-9]"
    r"/regions/[a-z]+-[a-z]+\d{1,2}/sslCertificates/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?",
    "a regional SSL certificate: NAME or projects/P/regions/R/sslCertificates/NAME")]


# A key path in the file: keys and list indexes, as pydantic's error locations.
Loc = tuple[int | str, ...]


def invalid(title: str, loc: Loc, message: str, value: object) -> ValidationError:
    """A validation error at `loc` (relative to the model raising it), so a check that needs
    several fields still names the one key to fix."""
    err = PydanticCustomError("invalid", "{message}", {"message": message})
    return ValidationError.from_exception_data(
        title, [InitErrorDetails(type=err, loc=loc, input=value)]
    )
Dtype = Literal["float32", "bfloat16", "float16", "fp8", "int8", "int4", "mxfp4"]
# Bytes per element: weights use the model dtype, the KV cache its own (see kv_cache_dtype).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "mxfp4": 4.25 / 8,  # 4-bit values plus one 8-bit scale per 32 (OCP microscaling)
}


class CoreModel(BaseModel):
    """Base of every config model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


CONFIG_JSON_MAX_CHARS = 4096  # PATH_MAX on Linux


class Model(CoreModel):
    """The served model. A preset (`poolctl catalog`) or `config_json` fills the
    architecture fields; fields written here override both."""

    id: ModelId = Field(
        description="Model id as the serving image loads it (Hugging Face style); a preset id "
        "(see `poolctl catalog`) fills the fields below."
    )
    version: Text = Field(
        default="1", min_length=1, max_length=128,
        description="Version label of the weights; `rollout start --model-version` changes it. "
        "It reaches the boot script and the nodes' logs, so it prints as written (no control "
        "or bidi characters).",
    )
    config_json: Text | None = Field(
        default=None, max_length=CONFIG_JSON_MAX_CHARS,
        description="Path (relative to this file) of the model's Hugging Face config.json: "
        "layers, heads, head_dim and dtype are read from it, params_b estimated from its "
        "shapes unless given here.",
    )
    params_b: Num | None = Field(
        default=None, gt=0, le=100_000,
        description="Parameters in billions (all experts of a mixture of experts).",
    )
    dtype: Dtype | None = Field(default=None, description="Weight dtype; sets bytes per parameter.")
    layers: Int | None = Field(
        default=None, gt=0, le=10_000, description="Transformer layers (KV cache is per layer)."
    )
    attention_heads: Int | None = Field(
        default=None, gt=0, le=10_000,
        description="Query heads (num_attention_heads); checks kv_heads.",
    )
    kv_heads: Int | None = Field(
        default=None, gt=0, le=10_000,
        description="Key/value heads (GQA groups), not query heads.",
    )
    head_dim: Int | None = Field(
        default=None, gt=0, le=65_536, description="Dimension of one attention head."
    )
    # Where each architecture field came from ("preset", "config.json" or "file").
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _fill(
        cls, data: Any, handler: ModelWrapValidatorHandler[Model], info: ValidationInfo
    ) -> Model:
        if not isinstance(data, dict):
            return handler(data)

        # lowest precedence first: the preset, then config.json, then the file's own keys
        tiers: list[tuple[str, dict[str, Any]]] = []
        mid = data.get("id")
        row = models.preset(mid) if isinstance(mid, str) else None
        if row is not None:
            tiers.append(("preset", row.model_dump(include=set(models.ARCH_FIELDS))))
        path = data.get("config_json")
        if isinstance(path, str) and path:
            # read here, before the field's own checks: its text is checked first
            base = Path((info.context or {}).get("base_dir", "."))
            shown = path if len(path) <= 100 else path[:97] + "..."
            try:
                formats.plain_text(path)
                if len(path) > CONFIG_JSON_MAX_CHARS:
                    raise ValueError(f"is over {CONFIG_JSON_MAX_CHARS} characters, not a path")
                tiers.append(("config.json", models.read_hf_config(base / path, shown)))
            except ValueError as e:
                raise invalid("Model", ("config_json",), str(e), path) from None
        tiers.append(("file", {k: data[k] for k in models.ARCH_FIELDS if k in data}))
        merged, sources = dict(data), {}
        for name, values in tiers:
            merged.update(values)
            sources.update(dict.fromkeys(values, name))
        m = handler(merged)
        missing = [k for k in models.ARCH_FIELDS
                   if k != "attention_heads" and getattr(m, k) is None]
        if missing:
            need = ", ".join(f"model.{k}" for k in missing)
            if path:
                raise invalid("Model", ("config_json",),
                              f"{path} does not give {need}; add them to the file", path)
            raise invalid("Model", ("id",),
                          f"no preset for {m.id!r}{models.suggest_model(m.id)}; use a preset id "
                          f"(`poolctl catalog`), or give {need} (or model.config_json)", m.id)
        m._sources = {k: v for k, v in sources.items() if k in models.ARCH_FIELDS}
        return m

    def source_of(self, field: str) -> str:
        """Where `field` came from: "preset", "config.json" or "file"."""
        return self._sources.get(field, "file")


class ApiKeySecrets(CoreModel):
    aws: str | None = Field(default=None, description="Secrets Manager secret ARN (AWS).")
    gcp: str | None = Field(
        default=None, description="Secret Manager secret: NAME or projects/P/secrets/NAME (GCP)."
    )


def _secret_form(v: object) -> str | None:
    """Which form of api_key_secret `v` is written in (None: neither)."""
    if isinstance(v, str):
        return "SecretName"
    return "ApiKeySecrets" if isinstance(v, dict | ApiKeySecrets) else None


class Serving(CoreModel):
    image: ImageRef = Field(
        description="Serving container image, e.g. vllm/vllm-openai:v0.11.0."
    )
    image_size_gb: Num = Field(
        default=12.0, gt=0, le=10_000,
        description="Compressed size of the serving image, for start-up estimates.",
    )
    image_prepulled: Bool = Field(
        default=False,
        description="The node image already carries the serving container (no pull at boot).",
    )
    tensor_parallel: Int = Field(
        ge=1, le=8,
        description="GPUs per replica: 1, 2, 4 or 8 (a divisor of the node's 8 GPUs; a replica "
        "never spans nodes).",
    )
    max_model_len: Int = Field(
        gt=0, le=100_000_000,
        description="Longest sequence (prompt + output) in tokens.",
    )
    gpu_memory_utilization: Num = Field(
        default=0.92, gt=0, le=1, description="Share of each GPU's HBM that vLLM may use."
    )
    max_num_batched_tokens: Int = Field(
        default=8192, gt=0, le=100_000_000,
        description="Token budget of one scheduler step (chunked prefill)."
    )
    max_num_seqs: Int = Field(
        default=256, gt=0, le=65_536,
        # vLLM's long-standing default; V1 raises it on large GPUs, so poolctl always passes
        # it: the simulator and the engine must agree on the batch limit.
        description="Most sequences one replica runs at once (vLLM --max-num-seqs); at most "
        "65,536, far past any batch a GPU decodes (vLLM's defaults are 256 to 1,024).",
    )
    kv_cache_dtype: Literal["auto", "fp8", "bfloat16", "float16"] = Field(
        default="auto",
        description="KV cache dtype; `auto` is bfloat16 for 8/4-bit weights, else the model dtype.",
    )
    reserved_gib_per_gpu: Num = Field(
        default=2.0,
        ge=0,
        le=1024,
        description="HBM held back per GPU for CUDA context, activations and CUDA graphs.",
    )
    prefix_caching: Bool = Field(
        default=True,
        # vLLM V1 turns automatic prefix caching on by default; `false` passes
        # --no-enable-prefix-caching, and `simulate` then finds no reuse.
        description="vLLM automatic prefix caching (on by default in vLLM V1): a prompt's "
        "leading blocks already cached on its replica skip prefill; false turns it off.",
    )
    balancer: Literal["lor", "sticky"] = Field(
        default="lor",
        description="How the load balancer routes requests to nodes: lor (least outstanding "
        "requests) or sticky (session affinity by a load-balancer cookie, so a conversation's "
        "turns reach the node holding its prefix cache: ALB lb_cookie stickiness, GCP "
        "GENERATED_COOKIE affinity over a RING_HASH policy). `simulate` defaults to it.",
    )
    port: Int = Field(default=8000, ge=1, le=65535, description="Port the server listens on.")
    health_path: UrlPath = Field(
        default="/health", description="HTTP path of the readiness check (starts with /)."
    )
    extra_args: list[Text] = Field(
        default_factory=list,
        description="Further vLLM arguments, passed through as given (each prints as written: "
        "no control or bidi characters).",
    )
    api_key_secret: Annotated[
        Annotated[str, Tag("SecretName")] | Annotated[ApiKeySecrets, Tag("ApiKeySecrets")],
        # One error for a value of neither form, not one per form.
        Discriminator(_secret_form, custom_error_type="secret_form",
                      custom_error_message="must be a secret (an ARN or a name) or "
                      "{aws: ARN, gcp: NAME}"),
    ] | None = Field(
        default=None,
        description="The API key clients must send, read at boot by the nodes' own identity "
        "(never in user data or metadata): a Secrets Manager secret ARN (AWS), a Secret Manager "
        "secret name (GCP), or {aws: ARN, gcp: NAME} for a pool on both.",
    )


class Scaling(CoreModel):
    min_replicas: Int = Field(
        ge=1, le=MAX_REPLICAS,
        description="Replicas always in service; at least 1: the nodes publish the queue metric "
        "the autoscaler scales on, so a pool at zero could never scale out.",
    )

    @field_validator("min_replicas", mode="before")
    @classmethod
    def _not_zero(cls, v: object) -> object:
        if v == 0 and type(v) is int:
            raise ValueError("0 leaves no node to publish the queue metric the autoscaler "
                             "scales on, so the pool could never scale out; use 1 or more")
        return v
    max_replicas: Int = Field(
        gt=0, le=MAX_REPLICAS,
        description="Upper bound on replicas in service.",
    )
    queue_target: Num = Field(
        default=4, gt=0, le=1_000_000,
        description="Waiting requests per replica (vLLM num_requests_waiting)."
    )
    scale_up_stabilization_s: Int = Field(
        default=0, ge=0, le=MAX_SECONDS,
        description="Seconds a higher recommendation must hold before scaling up."
    )
    scale_down_stabilization_s: Int = Field(
        default=900, ge=0, le=MAX_SECONDS,
        description="Seconds a lower recommendation must hold before scaling in."
    )


class WarmPool(CoreModel):
    replicas: Int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="Spare replicas kept prepared."
    )
    state: Literal["stopped", "running"] = Field(
        default="stopped",
        description="State of warm nodes: `stopped` (cheap; the local NVMe cache refills on "
        "start) or `running` (ready at full price).",
    )


class Rollout(CoreModel):
    max_surge_replicas: Int = Field(
        default=0, ge=0, le=MAX_REPLICAS,
        description="Extra replicas allowed above the pool during a rollout."
    )
    checkpoints: list[Annotated[Int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [100], min_length=1, max_length=100,
        description="Percentages of the pool replaced before each pause and health check.",
    )
    checkpoint_delay_s: Int = Field(
        default=300, ge=0, le=MAX_SECONDS,
        description="Seconds to watch health at each checkpoint."
    )


class Slo(CoreModel):
    ttft_p90_s: Num = Field(
        default=2.0, gt=0, le=MAX_SECONDS,
        description="Target p90 time to first token.",
    )
    tpot_p90_s: Num | None = Field(
        default=None, gt=0, le=MAX_SECONDS,
        description="Target p90 time per output token after the first (seconds; 0.05 is 20 "
        "tokens/s per user); unset: no token-rate target.",
    )
    target_utilization: Num = Field(
        default=0.6, gt=0, lt=1,
        description="Share of capacity in use the pool is sized for; below 1 (queueing delay "
        "grows as u/(1-u), without bound at 1).",
    )


class Perf(CoreModel):
    """Efficiency factors of the serving model (poolctl.servingmodel), or measured numbers
    that calibrate them. Unset factors take the model's defaults (each named there with its
    source)."""

    prefill_mfu: Num | None = Field(
        default=None, gt=0, le=1, description="Share of peak FLOPs prefill reaches."
    )
    decode_mbu: Num | None = Field(
        default=None, gt=0, le=1, description="Share of peak HBM bandwidth a decode step reaches."
    )
    link_efficiency: Num | None = Field(
        default=None, gt=0, le=1,
        description="Share of NVLink/PCIe bandwidth the tensor-parallel all-reduce reaches.",
    )
    step_overhead_ms: Num | None = Field(
        default=None, ge=0, le=1000,
        description="Fixed CPU/launch time of every engine step, ms (at most 1 s: engines "
        "spend well under 10 ms).",
    )
    decode_us_per_seq: Num | None = Field(
        default=None, ge=0, le=100_000,
        description="Time per decoding sequence per step beyond reading its KV cache "
        "(sampling, attention kernels), microseconds (at most 0.1 s: measured values are "
        "tens of microseconds).",
    )
    prefill_tokens_per_s: Num | None = Field(
        default=None, gt=0, le=100_000_000,
        description="Measured prefill throughput of one replica (prompts of "
        "`measured_prompt_tokens`); calibrates prefill_mfu. At most 10^8 tokens/s, some 100 "
        "times what an 8-GPU node reaches.",
    )
    decode_ms_batch1: Num | None = Field(
        default=None, gt=0, le=60_000,
        description="Measured decode step at batch 1, ms (with decode_ms_batch64, calibrates "
        "decode_mbu and decode_us_per_seq); at most a minute.",
    )
    decode_ms_batch64: Num | None = Field(
        default=None, gt=0, le=60_000,
        description="Measured decode step at batch 64, ms; at most a minute.",
    )
    measured_prompt_tokens: Int = Field(
        default=2048, gt=0, le=100_000_000,
        description="Prompt length the prefill measurement used (at most max_model_len's bound).",
    )
    measured_context_tokens: Int = Field(
        default=1024, gt=0, le=100_000_000,
        description="Context (tokens per sequence) the decode measurements ran at (at most "
        "max_model_len's bound).",
    )

    @model_validator(mode="after")
    def _pairs(self) -> Perf:
        if (self.decode_ms_batch1 is None) != (self.decode_ms_batch64 is None):
            raise ValueError("give decode_ms_batch1 and decode_ms_batch64 together (or neither)")
        if (self.decode_ms_batch1 is not None and self.decode_ms_batch64 is not None
                and self.decode_ms_batch64 <= self.decode_ms_batch1):
            raise ValueError("decode_ms_batch64 must be larger than decode_ms_batch1")
        return self


class AwsNetwork(CoreModel):
    vpc_id: VpcId | None = Field(
        default=None, description="Existing VPC (with subnet_ids); omit to create one."
    )
    subnet_ids: list[SubnetId] = Field(
        default_factory=list, max_length=64,
        description="Existing private subnets of vpc_id, in 2 or more zones (the load balancer "
        "spans them); only with vpc_id.",
    )
    vpc_cidr: VpcCidr = Field(
        default="10.40.0.0/16",
        description="IPv4 CIDR (/16 to /24) of the VPC poolctl creates when vpc_id is unset.",
    )
    availability_zones: Int = Field(
        default=2, ge=2, le=6, description="Zones the created VPC spans (one private subnet each)."
    )
    availability_zone_ids: list[AzId] = Field(
        default_factory=list,
        description="Zone IDs (e.g. use1-az4) of the created VPC's subnets, one each; they name "
        "the same zones in every account. Omit for the region's first `availability_zones` "
        "zone names (a, b, ...).",
    )
    client_cidrs: list[Ipv4Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the (internal) load balancer (IPv4 CIDRs).",
    )

    # What shapes the VPC poolctl creates: meaningless with an existing one.
    _CREATED_VPC_ONLY: ClassVar[tuple[str, ...]] = (
        "vpc_cidr", "availability_zones", "availability_zone_ids")

    @model_validator(mode="after")
    def _existing_vpc(self) -> AwsNetwork:
        """The stack uses subnet_ids only with vpc_id (and needs them then): neither may be
        ignored silently."""
        subnets = self.subnet_ids
        if subnets and self.vpc_id is None:
            raise invalid("AwsNetwork", ("subnet_ids",),
                          "given without aws.network.vpc_id, so they would be ignored and a new "
                          "VPC created; add vpc_id (the subnets' VPC) or remove subnet_ids",
                          subnets)
        if self.vpc_id is None:
            return self
        if len(set(subnets)) < 2:
            raise invalid("AwsNetwork", ("subnet_ids",),
                          f"aws.network.vpc_id {self.vpc_id} needs subnet_ids: 2 or more "
                          "different private subnets of it, in different zones (the load "
                          "balancer spans them)", subnets)
        if len(set(subnets)) < len(subnets):
            raise invalid("AwsNetwork", ("subnet_ids",), "names a subnet twice; list each once",
                          subnets)
        for key in self._CREATED_VPC_ONLY:
            if key in self.model_fields_set:
                raise invalid("AwsNetwork", (key,),
                              "shapes the VPC poolctl creates, but aws.network.vpc_id names an "
                              "existing one; remove it (or remove vpc_id and subnet_ids)",
                              getattr(self, key))
        return self

    @model_validator(mode="after")
    def _zone_ids(self) -> AwsNetwork:
        ids = self.availability_zone_ids
        if ids and (len(ids) < 2 or len(set(ids)) < len(ids)):
            raise invalid("AwsNetwork", ("availability_zone_ids",),
                          "list at least 2 different zone IDs (the load balancer needs 2)", ids)
        if ids and "availability_zones" in self.model_fields_set and (
                self.availability_zones != len(ids)):
            raise invalid("AwsNetwork", ("availability_zones",),
                          "give availability_zone_ids or availability_zones, not both "
                          "(the IDs set the zone count)", self.availability_zones)
        return self


def _reservations_form(v: object) -> str | None:
    """Which form of aws.capacity.reservations `v` is written in (None: neither)."""
    if isinstance(v, str):
        return "ReservationGroup"
    return "ReservationIds" if isinstance(v, list | tuple) else None


ReservedNodes = Annotated[Int, Field(ge=0, le=10_000)]
RESERVED_NODES_DOC = ("Nodes the reservations hold, for `plan`, `simulate` and `status`, which "
                      "ask no cloud: capacity held, and the fixed cost (a reservation is paid "
                      "whether used or not); `capacity check` reads the cloud's count.")


def _each_once(title: str, names: list[str]) -> None:
    if len(set(names)) < len(names):
        raise invalid(title, ("reservations",), "names a reservation twice; list each once",
                      names)


class AwsCapacity(CoreModel):
    reservations: Annotated[
        Annotated[list[CapacityReservationId], Tag("ReservationIds")]
        | Annotated[ReservationGroupArn, Tag("ReservationGroup")],
        # One error for a value of neither form, not one per form.
        Discriminator(_reservations_form, custom_error_type="reservations_form",
                      custom_error_message="must be a list of reservation ids (cr-...) or one "
                      "resource group ARN"),
    ] = Field(
        default_factory=list,
        description="On-Demand Capacity Reservations the pool launches into: their ids "
        "(cr-...), or the ARN of one resource group of them; omit for none.",
    )
    preference: Literal["reservations-first", "reservations-only", "none"] | None = Field(
        default=None,
        description="`reservations-first` (the default when reservations are named): the "
        "reservations, then On-Demand; `reservations-only`: a launch beyond them fails; `none`: "
        "never a reservation, not even a matching open one (On-Demand only).",
    )
    reserved_nodes: ReservedNodes = Field(default=0, description=RESERVED_NODES_DOC)
    capacity_block: CapacityReservationId | None = Field(
        default=None,
        description="A Capacity Block for ML (its Capacity Reservation id, cr-...) every node "
        "launches into, with market type capacity-block: launches succeed only while the "
        "block is active and EC2 ends its instances 30 minutes before the block ends; "
        "`warm --reserve --yes` buys one and schedules the window inside it. Instead of "
        "reservations and preference.",
    )

    @property
    def reservation_ids(self) -> list[str]:
        return [] if isinstance(self.reservations, str) else list(self.reservations)

    @property
    def group_arn(self) -> str | None:
        return self.reservations if isinstance(self.reservations, str) else None

    @property
    def mode(self) -> Literal["reservations-first", "reservations-only", "none", "open"]:
        """What launches do: the preference, else reservations-first when any are named,
        else `open` (EC2's default: a matching open reservation is used if there is one)."""
        if self.preference is not None:
            return self.preference
        return "reservations-first" if self.reservations else "open"

    @model_validator(mode="after")
    def _consistent(self) -> AwsCapacity:
        if self.capacity_block is not None and (self.reservations or self.preference):
            # A launch template targets one reservation; a block admits only its own.
            raise invalid("AwsCapacity", ("capacity_block",),
                          "is the only reservation a Capacity Block pool launches into; "
                          "remove aws.capacity.reservations and preference, or the block",
                          self.capacity_block)
        if isinstance(self.reservations, list):
            _each_once("AwsCapacity", self.reservations)
        if self.preference == "reservations-only" and not self.reservations:
            raise invalid("AwsCapacity", ("preference",),
                          "reservations-only needs aws.capacity.reservations (ids or a "
                          "resource group ARN); name them or choose reservations-first",
                          self.preference)
        if self.preference == "none" and self.reservations:
            raise invalid("AwsCapacity", ("preference",),
                          "none launches outside every reservation, so the named reservations "
                          "would be ignored; remove them or choose reservations-first",
                          self.preference)
        if self.preference == "none" and self.reserved_nodes:
            raise invalid("AwsCapacity", ("reserved_nodes",),
                          "preference none launches outside every reservation, so no node is "
                          "reserved; remove reserved_nodes or choose another preference",
                          self.reserved_nodes)
        return self


class GcpCapacity(CoreModel):
    reservations: list[GcpReservationName] | Literal["any", "none"] = Field(
        default="any",
        description="The instance template's reservation affinity: `any` (GCE's default: a "
        "matching reservation is used if there is one), `none` (never one), or the names of "
        "specific reservations in the pool's project (only they are used; a VM beyond them "
        "is not created).",
    )
    reserved_nodes: ReservedNodes = Field(default=0, description=RESERVED_NODES_DOC)

    @property
    def names(self) -> list[str]:
        return list(self.reservations) if isinstance(self.reservations, list) else []

    @model_validator(mode="after")
    def _consistent(self) -> GcpCapacity:
        if isinstance(self.reservations, list):
            if not self.reservations:
                raise invalid("GcpCapacity", ("reservations",),
                              "an empty list names no reservation; name them, or say any or "
                              "none", self.reservations)
            _each_once("GcpCapacity", self.reservations)
        if self.reservations == "none" and self.reserved_nodes:
            raise invalid("GcpCapacity", ("reserved_nodes",),
                          "reservations none uses no reservation, so no node is reserved; "
                          "remove reserved_nodes or name the reservations", self.reserved_nodes)
        return self


class AwsPlacement(CoreModel):
    region: AwsRegion = Field(description="AWS region.")
    instance_type: AwsInstanceType = Field(
        description="8-GPU NVLink instance type from the catalog."
    )
    weights_uri: S3Uri = Field(
        description="s3://bucket/prefix/ holding the weights and manifest.json (a plain prefix: "
        "no wildcards or quotes)."
    )
    ami_id: AmiId | None = Field(
        default=None,
        description="Node image; omit for the Deep Learning AMI named by `ami_ssm_parameter`.",
    )
    ami_ssm_parameter: SsmName = Field(
        default="/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        description="SSM parameter resolved at deploy time when ami_id is unset.",
    )
    root_volume_gb: Int = Field(
        default=200, ge=50, le=16_384,
        description="Encrypted gp3 root volume in GiB (OS, drivers, images), at most 16 TiB.",
    )
    volume_initialization_rate_mib_s: Int | None = Field(
        default=None, ge=100, le=300,
        description="EBS provisioned rate for volume initialization (100-300 MiB/s) of the root "
        "volume: a pre-pulled image's layers arrive at this rate instead of lazily; billed.",
    )
    image_builder_type: AwsInstanceType | None = Field(
        default=None,
        description="Instance type of the `image build` builder (a cheap CPU type: the base "
        "image carries the GPU driver); default m6i.xlarge.",
    )
    network: AwsNetwork = Field(default_factory=AwsNetwork, description="Where the pool runs.")
    capacity: AwsCapacity = Field(
        default_factory=AwsCapacity,
        description="Capacity Reservations the nodes launch into, and whether launches may "
        "go beyond them.",
    )
    fallback_instance_types: list[AwsInstanceType] = Field(
        default_factory=list, max_length=10,
        description="Types the group launches, in this order, when instance_type has no "
        "capacity (each 8 GPUs over NVLink in the catalog, holding the model); the pool then "
        "has no warm pool: AWS refuses one beside the mixed instances policy this needs.",
    )
    certificate_arn: AcmCertificateArn | None = Field(
        default=None,
        description="ACM certificate (its whole ARN, in the placement's region) for an HTTPS "
        "listener (HTTP redirects to it); omit for plain HTTP inside the VPC.",
    )
    access_logs_bucket: S3Bucket | None = Field(
        default=None,
        description="S3 bucket for the load balancer's access logs (yours: same region, SSE-S3, "
        "a policy admitting ELB log delivery); omit for none.",
    )
    access_logs_prefix: KeyPrefix | None = Field(
        default=None, description="Key prefix of the access logs in access_logs_bucket."
    )
    efa_interfaces: Int = Field(
        default=0, ge=0, le=32,
        description="EFA interfaces per node; must stay 0 for inference (rule).",
    )
    placement_group_strategy: Literal["none", "spread", "partition", "cluster"] = Field(
        default="none", description="Placement group; `cluster` is a training layout (rule)."
    )
    price_per_hour_usd: Num | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Override of the catalog's on-demand price per node.",
    )
    ssm_access: Bool = Field(
        default=False,
        description="Let operators open SSM Session Manager shells on the nodes (the role then "
        "gets the Session Manager permissions, nothing else of SSM).",
    )
    node_access: Literal["none", "instance-connect"] = Field(
        default="none",
        description="How `poolctl nodes check` reaches the nodes: `instance-connect` adds an EC2 "
        "Instance Connect Endpoint and SSH from it only (no public port, no key pair; a key is "
        "pushed per check); `none`: no SSH path is created.",
    )

    # What the cloud-neutral code asks of either placement, without `if aws ... else ...`.
    TYPE_KEY: ClassVar[str] = "instance_type"  # the key naming the node type, for messages
    STORE_SCHEME: ClassVar[str] = "s3"  # the object store weights_uri points into

    @property
    def type_name(self) -> str:
        return self.instance_type

    @property
    def fallback_types(self) -> list[str]:
        return list(self.fallback_instance_types)
    @model_validator(mode="after")
    def _certificate_in_region(self) -> AwsPlacement:
        arn = self.certificate_arn
        if arn is not None and (region := formats.acm_certificate_arn(arn)) != self.region:
            # A load balancer takes certificates of its own region only.
            raise invalid("AwsPlacement", ("certificate_arn",),
                          f"is in {region}, the pool in {self.region}; a load balancer takes "
                          f"a certificate of its own region: import or request one in "
                          f"{self.region}", arn)
        return self

    @model_validator(mode="after")
    def _block_one_type(self) -> AwsPlacement:
        if self.capacity.capacity_block is not None and self.fallback_instance_types:
            # A block holds instances of one type; a fallback type could never launch in it.
            raise invalid("AwsPlacement", ("fallback_instance_types",),
                          "a Capacity Block holds instance_type only; remove the fallback "
                          "types or aws.capacity.capacity_block", self.fallback_instance_types)
        return self

    @model_validator(mode="after")
    def _reservation_group_in_region(self) -> AwsPlacement:
        arn = self.capacity.group_arn
        if arn is not None and arn.split(":")[3] != self.region:
            # A launch targets reservation groups of its own region only.
            raise invalid("AwsPlacement", ("capacity", "reservations"),
                          f"is a resource group in {arn.split(':')[3]}, the pool in "
                          f"{self.region}; name a group of {self.region}'s reservations", arn)
        return self

    @cached_property
    def weights(self) -> formats.ObjectPrefix:
        return formats.parse_object_prefix(self.weights_uri, self.STORE_SCHEME)


class GcpPlacement(CoreModel):
    project: GcpProject = Field(description="GCP project id.")
    region: GcpRegion = Field(description="GCP region.")
    machine_type: GcpMachineType = Field(
        description="8-GPU NVLink machine type from the catalog."
    )
    fallback_machine_types: list[GcpMachineType] = Field(
        default_factory=list, max_length=10,
        description="Machine types the MIG creates VMs of, in this order, when machine_type "
        "has no capacity (the MIG's instance flexibility policy; each 8 GPUs over NVLink in "
        "the catalog, holding the model, with the primary's Local SSDs); the pool then keeps "
        "no standby pool.",
    )
    weights_uri: GsUri = Field(
        description="gs://bucket/prefix/ holding the weights and manifest.json (a plain prefix: "
        "no wildcards or quotes)."
    )
    zones: list[GcpZone] = Field(
        default_factory=list, description="Zones of the regional MIG; omit for the catalog's."
    )
    image: GcpImage = Field(
        default="projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-nvidia-550",
        description="Boot image (with GPU drivers) of the nodes: NAME, family/FAMILY, "
        "PROJECT/NAME or projects/PROJECT/global/images/[family/]NAME.",
    )
    base_image: GcpBaseImage | None = Field(
        default=None,
        description="GPU base image `image build` starts from; default: `image` when it is a "
        "family, else the base its build record names.",
    )
    image_builder_type: GcpMachineType | None = Field(
        default=None,
        description="Machine type of the `image build` builder; default n2-standard-4.",
    )
    boot_disk_gb: Int = Field(
        default=200, ge=50, le=65_536, description="Boot disk size in GB (at most 64 TB)."
    )
    network: GcpNetwork = Field(
        default="default",
        description="VPC network: NAME, or projects/HOST/global/networks/NAME (Shared VPC).",
    )
    subnetwork: GcpSubnetwork | None = Field(
        default=None,
        description="Subnetwork: NAME or projects/P/regions/REGION/subnetworks/NAME (in the "
        "placement's region); omit for auto mode.",
    )
    client_cidrs: list[Ipv4Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the internal load balancer (IPv4 CIDRs).",
    )
    certificate: GcpCertificate | None = Field(
        default=None,
        description="Regional SSL certificate (name or self link) for an HTTPS load balancer "
        "on port 443; omit for plain HTTP on port 80 inside the VPC.",
    )
    gpudirect: Bool = Field(
        default=False, description="GPUDirect-TCPX/RDMA NICs; must stay off for inference (rule)."
    )
    standby_suspended: Bool = Field(
        default=False, description="Suspend standby VMs; unsupported for GPU VMs (rule)."
    )
    capacity: GcpCapacity = Field(
        default_factory=GcpCapacity,
        description="Reservations the VMs consume (the instance template's reservation "
        "affinity).",
    )
    price_per_hour_usd: Num | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Override of the catalog's on-demand price per VM.",
    )
    node_access: Literal["none", "iap"] = Field(
        default="none",
        description="How `poolctl nodes check` reaches the nodes: `iap` lets SSH in from "
        "Identity-Aware Proxy's TCP forwarding range only (no public port; the check logs in "
        "with OS Login and a key imported per check); `none`: no SSH path is created.",
    )

    TYPE_KEY: ClassVar[str] = "machine_type"
    STORE_SCHEME: ClassVar[str] = "gs"

    @property
    def type_name(self) -> str:
        return self.machine_type

    @property
    def fallback_types(self) -> list[str]:
        return list(self.fallback_machine_types)
    @cached_property
    def weights(self) -> formats.ObjectPrefix:
        return formats.parse_object_prefix(self.weights_uri, self.STORE_SCHEME)

    @model_validator(mode="after")
    def _subnetwork_in_region(self) -> GcpPlacement:
        sub = self.subnetwork or ""
        if "/regions/" in sub and sub.split("/regions/")[1].split("/")[0] != self.region:
            raise invalid("GcpPlacement", ("subnetwork",),
                          f"names a subnetwork outside the placement's region {self.region}; "
                          f"give one in {self.region}", sub)
        return self


class Pool(CoreModel):
    name: Annotated[str, Field(pattern=NAME_RE, description="Pool name: [a-z0-9-], unique.")]
    model: Model = Field(description="The model served.")
    serving: Serving = Field(description="The serving container and its engine settings.")
    scaling: Scaling = Field(description="Autoscaling bounds and the queue target.")
    warm_pool: WarmPool = Field(default_factory=WarmPool, description="Spare prepared capacity.")
    rollout: Rollout = Field(default_factory=Rollout, description="How new versions roll out.")
    slo: Slo = Field(default_factory=Slo, description="Service-level targets for sizing.")
    perf: Perf = Field(
        default_factory=Perf, description="Serving-model efficiency factors or measured numbers."
    )
    aws: AwsPlacement | None = Field(default=None, description="AWS placement of the pool.")
    gcp: GcpPlacement | None = Field(default=None, description="GCP placement of the pool.")

    @model_validator(mode="after")
    def _has_placement(self) -> Pool:
        if self.aws is None and self.gcp is None:
            raise ValueError("a pool needs an `aws:` or a `gcp:` placement (or both)")
        return self

    @model_validator(mode="after")
    def _block_without_warm_pool(self) -> Pool:
        if self.aws is not None and self.aws.capacity.capacity_block and self.warm_pool.replicas:
            # AWS Auto Scaling guide, Capacity Blocks, limitations: "Mixed instances groups
            # and warm pools are not supported" (docs/cloud-facts.md).
            raise invalid("Pool", ("warm_pool", "replicas"),
                          "a pool on a Capacity Block (aws.capacity.capacity_block) keeps no "
                          "warm pool: AWS does not support warm pools with Capacity Blocks; "
                          "set 0 and schedule the window's nodes with `warm --from/--until "
                          "--running`", self.warm_pool.replicas)
        return self

    @model_validator(mode="after")
    def _api_key_secret_per_cloud(self) -> Pool:
        for cloud in self.clouds:
            self.api_key_secret(cloud)
        return self

    def api_key_secret(self, cloud: Cloud) -> str | None:
        """The API-key secret the `cloud` nodes read: the ARN (aws) or
        projects/P/secrets/NAME (gcp); None without one."""
        ref = self.serving.api_key_secret
        if ref is None:
            return None
        loc = ("serving", "api_key_secret") + (() if isinstance(ref, str) else (cloud,))
        raw = ref if isinstance(ref, str) else getattr(ref, cloud)
        if isinstance(ref, str) and len(self.clouds) > 1:
            raise invalid("Pool", loc, "the pool runs on aws and gcp, each reading its own "
                          "cloud's secret; write {aws: ARN, gcp: NAME}", ref)
        if raw is None:
            raise invalid("Pool", loc, f"the pool has a {cloud} placement; add its secret "
                          f"({'a Secrets Manager ARN' if cloud == 'aws' else 'a secret name'})",
                          raw)
        try:
            if cloud == Cloud.aws:
                formats.aws_secret_arn(raw)
                return raw
            # asked only for a cloud the pool has a placement on (the gcp one here)
            assert self.gcp is not None
            return formats.gcp_secret_name(raw, self.gcp.project)
        except ValueError as e:
            raise invalid("Pool", loc, str(e), raw) from None

    def placement(self, cloud: Cloud) -> AwsPlacement | GcpPlacement | None:
        return self.aws if cloud == Cloud.aws else self.gcp

    @property
    def clouds(self) -> list[Cloud]:
        return [c for c in Cloud if self.placement(c) is not None]


@dataclass(frozen=True)
class Target:
    """One pool on one of its placements: what a command, a rule and a stack act on."""

    pool: Pool
    cloud: Cloud


class AwsBackend(CoreModel):
    """Terraform's S3 backend. Terraform evaluates nothing in a backend block: every value
    is the literal itself, of the shape S3 and DynamoDB name things."""

    bucket: BackendS3Bucket = Field(description="S3 bucket holding Terraform state.")
    region: BackendAwsRegion = Field(description="Region of the state bucket.")
    key_prefix: BackendKeyPrefix = Field(
        default="poolctl", description="Key prefix of state objects (no '/' at either end)."
    )
    dynamodb_table: BackendDynamoDbTable | None = Field(
        default=None, description="Lock table; omit to lock with S3 lock files (use_lockfile)."
    )


class GcpBackend(CoreModel):
    """Terraform's GCS backend: literal values, as for AwsBackend."""

    bucket: BackendGcsBucket = Field(
        description="GCS bucket holding Terraform state (locks natively)."
    )
    prefix: BackendKeyPrefix = Field(
        default="poolctl", description="Object prefix of state (no '/' at either end)."
    )


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

    @model_validator(mode="after")
    def _cloud_names(self) -> Config:

        for i, p in enumerate(self.pools):
            for field, problem in name_problems(self.project, p.name, p.clouds):
                loc, value = (("project",), self.project) if field == "project" else (
                    ("pools", i, "name"), p.name)
                raise invalid("Config", loc, problem, value)
        return self

    # Set by parse_config: the file's name and the line of every key path, so that rule
    # findings point at a line as schema errors do.
    _source: str = PrivateAttr(default="")
    _lines: dict[Loc, int] = PrivateAttr(default_factory=dict)

    def where(self, key: str) -> str:
        """'FILE:LINE' of a key path like pools[0].serving.tensor_parallel ('' if unknown)."""
        loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", key))
        line = _line_of(self._lines, loc)
        return f"{self._source}:{line}" if line and self._source else self._source

    def select(self, pool: str | None) -> list[Pool]:
        if pool is None:
            return list(self.pools)
        for p in self.pools:
            if p.name == pool:
                return [p]
        names = ", ".join(p.name for p in self.pools)
        raise UsageError(f"--pool: no pool named {pool!r} in the file; pools are: {names}")

    def targets(self, pool: str | None, cloud: Cloud | None) -> list[Target]:
        """The (pool, cloud) targets a command acts on: `--cloud` picks the placement; pools
        without it are passed over, unless `--pool` named one explicitly."""
        out: list[Target] = []
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
                out.append(Target(p, Cloud(c)))
        if not out:
            raise UsageError(f"--cloud {cloud}: no pool in the file has a `{cloud}:` placement")
        return out


# ---------------------------------------------------------------------------------------
# Loading: one clear line per problem, with the key path and, where YAML has it, the line.


# A file over this size is not a pool config; refusing it bounds what YAML has to parse.
MAX_FILE_BYTES = 4 * 2**20
# Anchors and aliases may share a block between pools, but the document they expand to stays
# small: a "billion laughs" file is a few lines that expand to billions of nodes, which every
# walk over the data (validation included) would then visit.
MAX_EXPANDED_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


class _Loader(yaml.SafeLoader):
    """SafeLoader whose integers too long for int() (over 4,300 digits) stay text, so the
    schema refuses them naming their key instead of the parser failing without one."""

    # Any: an int, or the text of one too long for int() (the base class promises an int)
    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return str(node.value)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# The YAML reader, published: the in-place editor (runtime/fileedit.py) composes with it too.
LineLoader = _Loader


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse alias cycles and documents that expand past MAX_EXPANDED_NODES (counted over
    shared nodes without expanding them; iterative, so deep nesting cannot overflow)."""
    size: dict[int, int] = {}
    state: dict[int, int] = {}  # 1: being counted (on the path), 2: counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            state[key] = 2
            if size[key] > MAX_EXPANDED_NODES:
                raise UsageError(
                    f"{source}:{node.start_mark.line + 1}: its aliases (*name) expand to over "
                    f"{MAX_EXPANDED_NODES:,} values; write the values out instead of nesting "
                    "aliases")
            continue
        if state.get(key) == 2:
            continue
        if state.get(key) == 1:
            raise UsageError(f"{source}:{node.start_mark.line + 1}: an alias refers to a block "
                             "that contains it; remove the recursive alias")
        state[key] = 1
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _walk_lines(root: yaml.Node, source: str) -> dict[Loc, int]:
    """The line of every key path; refuses what YAML would resolve silently or not at all:
    a key given twice in one mapping (YAML keeps the last), two `<<` merge keys in one
    mapping (the second overrides the first), and a list or mapping as a key."""
    lines: dict[Loc, int] = {}

    def walk(node: yaml.Node, path: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            merge_line = 0
            for k, v in node.value:
                line = k.start_mark.line + 1
                if not isinstance(k, yaml.ScalarNode):
                    what = "a list" if isinstance(k, yaml.SequenceNode) else "a mapping"
                    raise UsageError(
                        f"{source}:{line}: {format_loc(path) or '(top)'}: a key is {what} "
                        "(YAML's `? ` complex key); keys are plain names, write `name: value`")
                if k.tag not in (_MERGE_TAG, _STR_TAG):
                    kind = k.tag.rsplit(":", 1)[-1]
                    raise UsageError(
                        f"{source}:{line}: {format_loc(path) or '(top)'}: the key "
                        f"{_shown(k.value)} reads as a YAML {kind}, not a name; keys are names "
                        "like `port`")
                if k.tag == _MERGE_TAG:
                    if merge_line:
                        raise UsageError(
                            f"{source}:{line}: {format_loc((*path, '<<'))}: merge key given "
                            f"twice (first on line {merge_line}), the second would override "
                            "the first; merge both in one: `<<: [*first, *second]`")
                    merge_line = line
                else:
                    if k.value in first:
                        where = format_loc((*path, k.value))
                        raise UsageError(
                            f"{source}:{line}: {where}: key given twice (first on line "
                            f"{first[k.value]}); keep one")
                    first[k.value] = line
                key = (*path, k.value)
                lines.setdefault(key, k.start_mark.line + 1)
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines.setdefault((*path, i), v.start_mark.line + 1)
                walk(v, (*path, i))

    walk(root, ())
    return lines


def _yaml_error(e: yaml.YAMLError, source: str, text: str) -> UsageError:
    mark = getattr(e, "problem_mark", None)
    where = f":{mark.line + 1}" if mark else ""
    if isinstance(e, yaml.reader.ReaderError):
        where = f":{text[: e.position].count(chr(10)) + 1}"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return UsageError(f"{source}{where}: not valid YAML ({problem}); fix the syntax")


def _read_yaml(text: str, source: str) -> tuple[object, dict[Loc, int]]:
    """The data and the line of every key path, or one UsageError line."""
    try:
        loader = _Loader(text)  # refuses control characters already
        try:
            root = loader.get_single_node()
            if root is None:
                return None, {}
            _check_expansion(root, source)
            lines = _walk_lines(root, source)
            return loader.construct_document(root), lines
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise _yaml_error(e, source, text) from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to be a pool config; flatten it") from None


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_<-]{1,64}")


def format_loc(loc: Loc) -> str:
    """A key path as messages write it: pools[0].serving.port; a key that is not a plain
    name is quoted (['a\\nb']), so a message stays one line whatever the file holds."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(part):
            out += f"[{_shown(part)}]"
        else:
            out += f".{part}" if out else part
    return out


@cache
def _union_tags() -> frozenset[str]:
    """What pydantic inserts into error locations for a member of a union: the model's
    class name, or the tag of a discriminated one (Serving.api_key_secret)."""
    names, todo = {"SecretName", "ReservationIds", "ReservationGroup"}, [CoreModel]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(names)


def _clean_loc(err: ErrorDetails) -> Loc:
    """The key path of an error, without pydantic's union tags. The last part of an unknown
    key's path is the key itself, whatever it is called."""
    loc = err["loc"]
    keep = len(loc) - 1 if err["type"] == "extra_forbidden" else len(loc)
    return tuple(p for i, p in enumerate(loc)
                 if isinstance(p, int) or i >= keep or p not in _union_tags())


def _file_flag(path: str | os.PathLike[str] | None) -> str:
    """What named the config file, for messages."""
    return "POOLCTL_FILE" if path is None and os.environ.get("POOLCTL_FILE") else "-f/--file"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as a message shows it: as written, or quoted when it holds a character that
    does not print as itself (a newline in a name must not split the message)."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return text if formats.hidden_character(text) is None else repr(text)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not a config file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder; pass the config file in it (-f FOLDER/poolctl.yaml)"
    kind = next((what for test, what in _KINDS if test(mode)), "a special file")
    return f"is not a regular file ({kind}); pass the config file itself"


def find_config(path: str | os.PathLike[str] | None) -> Path:
    """The config file: `path`, else $POOLCTL_FILE, else ./poolctl.yaml; a regular file
    (a folder, a FIFO or a device is refused here, before anything reads it)."""
    flag = _file_flag(path)
    if path is None:
        path = os.environ.get("POOLCTL_FILE") or "poolctl.yaml"
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(
            f"{flag}: {shown_path(p)} not found; run in a folder with poolctl.yaml, "
            "or pass -f PATH (or set POOLCTL_FILE)"
        ) from None
    except OSError as e:
        raise UsageError(f"{flag}: {shown_path(p)} cannot be read ({e.strerror}); check the "
                         "path and its permissions") from None
    except ValueError:  # a NUL byte: only an environment or a caller can pass one
        raise UsageError(f"{flag}: {shown_path(p)} is not a usable path; check it") from None
    if problem := _not_regular(mode):
        raise UsageError(f"{flag}: {shown_path(p)} {problem}")
    return p


def parse_config(text: str, source: str = "poolctl.yaml") -> Config:
    data, lines = _read_yaml(text, source)
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with `project` and `pools` at the top")
    try:
        # model.config_json is relative to the file that names it
        cfg = Config.model_validate(data, context={"base_dir": Path(source).parent})
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = _clean_loc(err)
            line = _line_of(lines, loc)
            where = f"{source}:{line}" if line else source
            msgs.append(f"{where}: {format_loc(loc) or '(top)'}: {_hint(err)}")
        raise UsageError("\n".join(msgs)) from None
    cfg._source, cfg._lines = source, lines
    return cfg


def _line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of `loc`, or of its nearest parent written in the file."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _shown(value: object) -> str:
    """A value as error messages quote it: repr, cut short (it may be huge or hostile)."""
    if isinstance(value, bool):
        return str(value).lower()  # as YAML writes it
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."


# pydantic's error kinds, in plain words ({...} from the error's context).
_PLAIN = {
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be {le} or less",
    "finite_number": "must be a finite number",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text (quote it)",
    "list_type": "must be a list ([a, b] or '- ' lines)",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "takes at most {max_length} item(s)",
    "string_too_short": "must be at least {min_length} character(s)",
    "string_too_long": "must be at most {max_length} characters",
}


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The config model class that holds the key at `loc` (for the keys it allows)."""
    cls: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if cls else None
        if field is None:
            return None
        stack, cls = [field.annotation], None
        while stack:  # the first model class inside list[...] / X | None / Annotated[...]
            t = stack.pop(0)
            if isinstance(t, type) and issubclass(t, BaseModel):
                cls = t
                break
            stack += list(typing.get_args(t))
    return cls


def _hint(err: ErrorDetails) -> str:

    kind, value = err["type"], err.get("input")
    got = f"; got {_shown(value)}" if "input" in err else ""
    if kind == "extra_forbidden":
        loc = _clean_loc(err)
        cls = _model_at(loc)
        maybe = did_you_mean(str(loc[-1]), list(cls.model_fields)) if cls else ""
        return f"unknown key{maybe}; remove it or fix its spelling (keys: `poolctl schema`)"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        maybe = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        return f"must be one of {expected}{maybe}{got}"
    if kind == "string_pattern_mismatch":
        return f"{_shown(value)} must be lowercase letters, digits and '-' (max 40)"
    if kind in ("int_type", "float_type") and isinstance(value, bool):
        return f"must be a number, not true/false{got}"
    if kind in _PLAIN:
        # a float field's bound reads as written in the model (1000, not 1000.0)
        ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v
               for k, v in err.get("ctx", {}).items()}
        return _PLAIN[kind].format(**ctx) + got
    msg = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
    if kind == "invalid" and (_shown(value) in msg or str(value) in msg):
        return msg  # the message quotes the value already
    return msg + got


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    flag = _file_flag(path)
    p = find_config(path)
    source = shown_path(path or p)
    try:
        # O_NONBLOCK: were the file swapped for a FIFO since find_config, the open would wait
        # for a writer; fstat then says what was opened, and only a regular file is read.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{flag}: {source} cannot be read ({e.strerror}); check the path "
                         "and its permissions") from None
    with os.fdopen(fd, "rb") as fh:
        if problem := _not_regular(os.fstat(fd).st_mode):
            raise UsageError(f"{flag}: {source} {problem}")
        try:
            raw = fh.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise UsageError(f"{flag}: {source} cannot be read ({e.strerror}); check the "
                             "file") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(f"{source}: over {MAX_FILE_BYTES // 2**20} MiB, too large for a pool "
                         "config; check that -f names the right file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UsageError(f"{source}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save "
                         "the file as UTF-8") from None
    return parse_config(text, source=source)


def json_schema() -> dict[str, Any]:
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "poolctl.yaml"
    return schema
