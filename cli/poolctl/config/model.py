"""The one model of `poolctl.yaml`, parsed once at the edge.

Everything downstream (rules, sizing, stacks, runtime operations) takes these objects, never
raw dicts. Sizes in the file are in replicas; nodes are derived in `sizing`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from poolctl import formats, models
from poolctl.cloud import Cloud
from poolctl.config.aws import AwsBackend, AwsPlacement
from poolctl.config.gcp import GcpBackend, GcpPlacement
from poolctl.config.reader import line_of
from poolctl.config.shapes import (
    MAX_REPLICAS,
    MAX_SECONDS,
    NAME_RE,
    Bool,
    CoreModel,
    Dtype,
    ImageRef,
    Int,
    Loc,
    ModelId,
    Num,
    Text,
    UrlPath,
    invalid,
)
from poolctl.errors import UsageError
from poolctl.naming import name_problems

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
    hidden_size: Int | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Model width (hidden_size): what each all-reduce moves per token; "
        "attention_heads x head_dim when not given (which differs for e.g. Qwen3-32B).",
    )
    experts: Int | None = Field(
        default=None, gt=1, le=100_000,
        description="Mixture of experts: routed experts per layer (num_experts); all of them "
        "sit in HBM. Null for a dense model.",
    )
    experts_per_token: Int | None = Field(
        default=None, gt=0, le=100_000,
        description="Mixture of experts: experts each token is routed to (num_experts_per_tok).",
    )
    active_params_b: Num | None = Field(
        default=None, gt=0, le=100_000,
        description="Mixture of experts: parameters (billions) one token computes with; "
        "prefill FLOPs count these, decode reads the experts a batch routes to.",
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
                   if k not in models.OPTIONAL_FIELDS and getattr(m, k) is None]
        moe = [k for k in models.MOE_FIELDS if getattr(m, k) is not None]
        if moe and len(moe) < len(models.MOE_FIELDS):
            need = next(k for k in models.MOE_FIELDS if k not in moe)
            raise invalid("Model", (need,), f"a mixture of experts needs model.experts, "
                          f"model.experts_per_token and model.active_params_b together; add "
                          f"model.{need} (config.json and the model card give it)", None)
        if moe:
            assert m.experts and m.experts_per_token and m.active_params_b and m.params_b
            if m.experts_per_token > m.experts:
                raise invalid("Model", ("experts_per_token",),
                              f"{m.experts_per_token} is more than the {m.experts} experts; "
                              "check num_experts_per_tok", m.experts_per_token)
            if m.active_params_b > m.params_b:
                raise invalid("Model", ("active_params_b",),
                              f"{m.active_params_b:g} B is more than params_b "
                              f"{m.params_b:g} B; active parameters are part of the total",
                              m.active_params_b)
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
        description="Serving container image, e.g. vllm/vllm-openai:v0.34.0."
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
    predictive: Literal["off", "forecast", "forecast-and-scale"] = Field(
        default="off",
        description="Capacity ahead of demand (AWS predictive scaling on the pool's requests in "
        "flight): `forecast` only forecasts (status shows it against what happened), "
        "`forecast-and-scale` also launches nodes `predictive_buffer_s` before the forecast "
        "load. GCP's predictive autoscaling forecasts CPU only, so the GCP stack has none: "
        "`poolctl warm --suggest` proposes launch windows from the pool's history instead.",
    )
    predictive_target: Num | None = Field(
        default=None, gt=0, le=65_536,
        description="Requests in flight (running and waiting) per replica that the forecast "
        "sizes for; required with `predictive`. `plan --traffic` prints it for a trace: the "
        "mean in flight per replica at the recommended size.",
    )
    predictive_buffer_s: Int | None = Field(
        default=None, ge=0, le=3599,
        description="Seconds before the forecast load that nodes launch (AWS's scheduling "
        "buffer, less than its forecast interval of 3,600); unset: the plan's cold start. "
        "`status` says when the pool's measured starts take longer.",
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
    alarm_after_s: Int = Field(
        default=300, ge=60, le=86_400, multiple_of=60,
        description="The pool's SLO alarms fire once TTFT (or TPOT) p90 has stayed above "
        "its target this long (whole minutes, as CloudWatch evaluates per minute) and clear "
        "once it is met again.",
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
    def _predictive_target(self) -> Pool:
        s = self.scaling
        if s.predictive != "off" and s.predictive_target is None:
            raise invalid("Pool", ("scaling", "predictive_target"),
                          f"required with predictive: {s.predictive}: the requests in flight "
                          "(running and waiting) one replica serves within the SLO; `poolctl "
                          "plan --traffic TRACE` prints it for your traffic (predictive_target)",
                          None)
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
        line = line_of(self._lines, loc)
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
