"""Validation as named checks with hints, shared by validate, plan, synth and deploy.

A check looks at one pool on one cloud (or at the pool alone) and returns findings. An
`error` finding makes `validate` exit 1 and makes every acting command refuse, changing
nothing; `warning` and `info` are printed and do not block.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from poolctl import bootscript, sizing, vllm_releases
from poolctl.catalog import InstanceType, load_catalog
from poolctl.cloud import Cloud
from poolctl.config import AwsPlacement, Config, GcpPlacement, Model, Pool, Target
from poolctl.errors import OperationFailed, PoolctlError, UsageError
from poolctl.models import did_you_mean, preset
from poolctl.node_image import recorded_node_image

if TYPE_CHECKING:
    from poolctl.models import Preset

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    pool: str
    cloud: Cloud | None
    key: str
    message: str
    hint: str
    where: str = ""  # FILE:LINE of the key, when the config was read from a file
    # A value of the file that can never serve the pool (a check declared `input=True`):
    # bad input, exit 2, where other failed rules exit 1.
    bad_input: bool = False

    def line(self) -> str:
        target = f"{self.pool}/{self.cloud}" if self.cloud else self.pool
        text = f"{self.severity}: [{self.check}] {target}: {self.key}: {self.message}; {self.hint}"
        return f"{self.where}: {text}" if self.where else text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrafficNeed:
    """What a given trace needs of a pool: replicas for its busiest window (simulated)."""

    peak_replicas: int
    source: str


@dataclass(frozen=True)
class Ctx:
    """What a check sees: the pool, its index, and for placement checks the cloud and row;
    `check_id` is the running check's (its `@check` sets it), which its findings carry."""

    cfg: Config
    pool: Pool
    index: int
    cloud: Cloud | None = None
    row: InstanceType | None = None
    traffic: TrafficNeed | None = None  # only when a command was given a trace
    check_id: str = ""
    check_input: bool = False  # the running check judges input values (its `@check`)

    def key(self, path: str) -> str:
        return f"pools[{self.index}].{path}"

    def find(self, severity: Severity, path: str, message: str, hint: str) -> Finding:
        key = self.key(path)
        return Finding(self.check_id, severity, self.pool.name, self.cloud, key, message, hint,
                       self.cfg.where(key), self.check_input and severity == "error")


CheckFn = Callable[[Ctx], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    scope: Literal["pool", "placement"]
    fn: CheckFn
    input: bool = False  # its errors are bad input (exit 2), not a broken rule (exit 1)


CHECKS: list[Check] = []


def check(id: str, title: str, scope: Literal["pool", "placement"] = "placement",
          input: bool = False) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        @functools.wraps(fn)
        def run(c: Ctx) -> Iterable[Finding]:
            return fn(replace(c, check_id=id, check_input=input))

        CHECKS.append(Check(id, title, scope, run, input))
        return run

    return register


def _type_key(cloud: Cloud) -> str:
    return "aws.instance_type" if cloud == Cloud.aws else "gcp.machine_type"


def _capacity_key(cloud: Cloud) -> str:
    return "aws.capacity" if cloud == Cloud.aws else "gcp.capacity"


# The placement a placement check on that cloud looks at: run_checks runs them only for the
# clouds the pool has a placement on.
def _aws(c: Ctx) -> AwsPlacement:
    assert c.pool.aws is not None
    return c.pool.aws


def _gcp(c: Ctx) -> GcpPlacement:
    assert c.pool.gcp is not None
    return c.pool.gcp


# --------------------------------------------------------------------------- pool checks


@check("tensor-parallel", "tensor_parallel divides the node's 8 GPUs and the KV heads", "pool")
def _tp(c: Ctx) -> Iterator[Finding]:
    tp, kvh = c.pool.serving.tensor_parallel, c.pool.model.kv_heads
    assert kvh is not None  # validation fills it (config.Model) or refuses the file
    if tp not in (1, 2, 4, 8):
        yield c.find(
            "error", "serving.tensor_parallel",
            f"{tp} does not divide the node's 8 GPUs",
            "use 1, 2, 4 or 8 (a replica never spans nodes)",
        )
    elif kvh % tp and tp % kvh:
        yield c.find(
            "error", "serving.tensor_parallel",
            f"{tp} GPUs cannot split {kvh} KV heads evenly",
            "pick a tensor_parallel that divides model.kv_heads, or a multiple of it",
        )


# KV cache per token that differs from the preset's by more than this factor is a typo (a
# query-head count as kv_heads, hidden_size as head_dim), not a fine-tune: fine-tunes keep the
# architecture.
KV_PRESET_FACTOR = 2.0


@check("model-shape", "the model's heads and KV figures are consistent (and match its preset)",
       "pool")
def _model_shape(c: Ctx) -> Iterator[Finding]:

    m = c.pool.model
    # validation fills these (config.Model) or refuses the file
    assert m.layers is not None and m.kv_heads is not None and m.head_dim is not None
    if m.attention_heads and (m.kv_heads > m.attention_heads or m.attention_heads % m.kv_heads):
        yield c.find(
            "error", "model.kv_heads",
            f"{m.kv_heads} KV heads cannot serve {m.attention_heads} attention heads (each KV "
            "head serves a whole group of query heads)",
            "set kv_heads to num_key_value_heads from the model's config.json (a divisor of "
            "attention_heads)",
        )
    row = preset(m.id)
    if row is not None:
        mine = 2 * m.layers * m.kv_heads * m.head_dim
        ratio = mine / row.kv_elements_per_token()
        if not 1 / KV_PRESET_FACTOR <= ratio <= KV_PRESET_FACTOR:
            yield c.find(
                "error", f"model.{_kv_culprit(m, row)}",
                f"layers {m.layers} x kv_heads {m.kv_heads} x head_dim {m.head_dim} gives "
                f"{ratio:.1f}x the KV cache per token of {row.id} (layers {row.layers}, "
                f"kv_heads {row.kv_heads}, head_dim {row.head_dim}, from {row.source})",
                "remove layers/kv_heads/head_dim to use the preset, or correct them",
            )
        if c.pool.serving.max_model_len > row.max_context:
            yield c.find(
                "warning", "serving.max_model_len",
                f"{c.pool.serving.max_model_len} tokens is past {row.id}'s "
                f"max_position_embeddings {row.max_context}: vLLM refuses to start",
                f"lower it to {row.max_context} or less (or enable rope scaling in extra_args)",
            )
    if m.config_json and m.source_of("params_b") == "config.json":
        yield c.find(
            "info", "model.params_b",
            f"{m.params_b} B estimated from the shapes in {m.config_json}",
            "write model.params_b (the model card's count) to use the exact figure",
        )


def _kv_culprit(m: Model, row: Preset) -> str:
    """The KV field furthest from the preset, to name it as the key to fix."""
    diffs = {f: max(getattr(m, f), getattr(row, f)) / min(getattr(m, f), getattr(row, f))
             for f in ("kv_heads", "head_dim", "layers")}
    return max(diffs, key=lambda f: diffs[f])


@check("replica-bounds", "min_replicas <= max_replicas", "pool")
def _bounds(c: Ctx) -> Iterator[Finding]:
    s = c.pool.scaling
    if s.min_replicas > s.max_replicas:
        yield c.find(
            "error", "scaling.min_replicas",
            f"{s.min_replicas} is above max_replicas {s.max_replicas}",
            "lower min_replicas or raise max_replicas",
        )


@check("warm-within-max", "the warm pool is no larger than the pool can ever take in", "pool")
def _warm_within_max(c: Ctx) -> Iterator[Finding]:
    s, wp = c.pool.scaling, c.pool.warm_pool
    if wp.replicas > s.max_replicas:
        # Warm nodes serve only by joining the pool, which never grows past max_replicas.
        yield c.find(
            "error", "warm_pool.replicas",
            f"{wp.replicas} warm replicas is more than scaling.max_replicas {s.max_replicas}: "
            "warm nodes serve only by joining the pool, which never grows past its max",
            f"lower warm_pool.replicas to at most {s.max_replicas} (at most max_replicas - "
            f"min_replicas = {max(0, s.max_replicas - s.min_replicas)} can join by scaling "
            "out), or raise scaling.max_replicas",
        )


@check("batch-budget", "max_num_batched_tokens holds max_num_seqs (vLLM checks it at start)",
       "pool")
def _batch_budget(c: Ctx) -> Iterator[Finding]:
    sv = c.pool.serving
    if sv.max_num_batched_tokens < sv.max_num_seqs:
        # vLLM's SchedulerConfig refuses to start: "max_num_batched_tokens (...) must be
        # greater than or equal to max_num_seqs (...)" (each running sequence takes at least
        # one token of every step's budget).
        yield c.find(
            "error", "serving.max_num_batched_tokens",
            f"{sv.max_num_batched_tokens} is below serving.max_num_seqs {sv.max_num_seqs}: "
            "vLLM refuses to start (every running sequence needs a token of each step's budget)",
            f"raise max_num_batched_tokens to at least {sv.max_num_seqs} (8192 is usual), or "
            "lower max_num_seqs",
        )


@check("scale-down-slower", "scale in more slowly than out", "pool")
def _slow_down(c: Ctx) -> Iterator[Finding]:
    s = c.pool.scaling
    if s.scale_down_stabilization_s <= s.scale_up_stabilization_s:
        yield c.find(
            "error", "scaling.scale_down_stabilization_s",
            f"{s.scale_down_stabilization_s}s is not longer than scale-up's "
            f"{s.scale_up_stabilization_s}s; a cold replica takes minutes, so flapping is costly",
            "scale up fast (0 s) and down slow (e.g. 900 s)",
        )


@check("predictive-where-offered", "predictive scaling where the cloud forecasts the load")
def _predictive_gcp(c: Ctx) -> Iterator[Finding]:
    if c.cloud == Cloud.gcp and c.pool.scaling.predictive != "off":
        # GCE autoscaler predictive method: "OPTIMIZE_AVAILABILITY ... predictive autoscaling
        # ... only for CPU utilization" (docs/cloud-facts.md).
        yield c.find(
            "warning", "scaling.predictive",
            f"{c.pool.scaling.predictive}: GCP's predictive autoscaling forecasts CPU "
            "utilization only, not a custom metric such as the pool's queue, so the GCP stack "
            "scales on the queue alone",
            "schedule capacity ahead of the pool's busy hours with `poolctl warm --suggest "
            "--cloud gcp` (launch windows from the pool's history)",
        )


@check("utilization-target", "sized near 60 % utilization", "pool")
def _util(c: Ctx) -> Iterator[Finding]:
    u = c.pool.slo.target_utilization
    if u > 0.75:
        # M/M/1: waiting grows as rho/(1-rho): 1.5 at 0.6, 3 at 0.75, 9 at 0.9.
        yield c.find(
            "warning", "slo.target_utilization",
            f"{u} leaves little headroom: queueing delay grows as u/(1-u) = {u / (1 - u):.1f}",
            "size near 0.6 for latency SLOs",
        )


@check("rollout-checkpoints", "checkpoints rise and end at 100 %", "pool")
def _checkpoints(c: Ctx) -> Iterator[Finding]:
    cps = c.pool.rollout.checkpoints
    if not cps or any(not 1 <= p <= 100 for p in cps) or cps != sorted(set(cps)) or cps[-1] != 100:
        yield c.find(
            "error", "rollout.checkpoints",
            f"{cps} must be rising percentages in 1..100 ending at 100",
            "e.g. [25, 50, 100]",
        )


# ---------------------------------------------------------------------- placement checks


@check("nvlink-8gpu", "an 8-GPU NVLink type from the catalog")
def _nvlink(c: Ctx) -> Iterator[Finding]:
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    placement = c.pool.placement(c.cloud)
    assert placement is not None  # ... one the pool has a placement on
    name = placement.type_name
    if c.row is None:

        known = load_catalog().names(c.cloud)
        yield c.find(
            "error", _type_key(c.cloud),
            f"{name!r} is not in the catalog{did_you_mean(name, known)}",
            f"use one of: {', '.join(known)} (`poolctl catalog`)",
        )
        return
    if not c.row.nvlink or c.row.gpus != 8:
        nvlink_types = ", ".join(load_catalog().names(c.cloud))
        yield c.find(
            "error", _type_key(c.cloud),
            f"{name} has {c.row.gpus}x {c.row.gpu} without NVLink: tensor-parallel all-reduce "
            "over PCIe throttles every decode step",
            f"use an NVLink 8-GPU type: {nvlink_types}",
        )


@check("no-rdma-nics", "no EFA / GPUDirect NICs on inference nodes")
def _rdma(c: Ctx) -> Iterator[Finding]:
    if c.cloud == Cloud.aws and _aws(c).efa_interfaces:
        yield c.find(
            "error", "aws.efa_interfaces",
            f"{_aws(c).efa_interfaces} EFA interfaces asked for; replicas never span nodes",
            "set efa_interfaces: 0 (EFA is for multi-node training)",
        )
    if c.cloud == Cloud.gcp and _gcp(c).gpudirect:
        yield c.find(
            "error", "gcp.gpudirect",
            "GPUDirect-TCPX/RDMA networks asked for; replicas never span nodes",
            "set gpudirect: false",
        )


@check("no-cluster-placement", "no cluster placement group")
def _placement(c: Ctx) -> Iterator[Finding]:
    if c.cloud == Cloud.aws and _aws(c).placement_group_strategy == "cluster":
        yield c.find(
            "error", "aws.placement_group_strategy",
            "a cluster placement group packs nodes for training fabrics and caps capacity",
            "use none (default) or spread",
        )


@check("region-offered", "the type is offered in the region (and zones)")
def _region(c: Ctx) -> Iterator[Finding]:
    if c.row is None:
        return
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    p = c.pool.placement(c.cloud)
    assert p is not None  # ... one the pool has a placement on
    if p.region not in c.row.regions:
        yield c.find(
            "error", f"{c.cloud}.region",
            f"{c.row.name} is not offered in {p.region} per the catalog",
            f"use one of: {', '.join(sorted(c.row.regions))}",
        )
        return
    if c.cloud == Cloud.gcp:
        assert isinstance(p, GcpPlacement)  # the pool's gcp placement
        offered = c.row.regions[p.region]
        if not offered and not p.zones:  # the stack needs zones to spread the MIG over
            yield c.find(
                "error", "gcp.zones",
                f"the catalog lists no zones offering {c.row.name} in {p.region}",
                f"set gcp.zones to the {p.region} zones to spread the pool over",
            )
        bad = [z for z in p.zones if offered and z not in offered]
        if bad:
            yield c.find(
                "error", "gcp.zones",
                f"{c.row.name} is not offered in {', '.join(bad)}",
                f"use zones among: {', '.join(offered)}",
            )


# Secrets passed as arguments end up in user data / metadata, `ps` and the journal. Flags
# that take one, and the shapes of common tokens (Hugging Face, OpenAI-style, AWS keys).
_SECRET_FLAGS = re.compile(r"^--(api-key|hf-token|token|password|secret)(=|$)")
_SECRET_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|(AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|xox[abpr]-[A-Za-z0-9-]{10,})")


@check("no-secrets-in-args", "no API keys or tokens in serving.extra_args", "pool")
def _secret_args(c: Ctx) -> Iterator[Finding]:
    for i, arg in enumerate(c.pool.serving.extra_args):
        flag = _SECRET_FLAGS.match(arg)
        if flag or _SECRET_TOKENS.search(arg):
            # The message never repeats the value: it is probably a live secret.
            what = (f"the flag {flag.group(0).rstrip('=')}" if flag
                    else "a value shaped like a token")
            yield c.find(
                "error", f"serving.extra_args[{i}]",
                f"{what} would put a secret in the node's user data/metadata and process list",
                "store the API key in Secrets Manager / Secret Manager and set "
                "serving.api_key_secret (weights come from weights_uri, no hub token needed)",
            )


@check("vllm-release", "the serving image's vLLM has what the boot script and agent use",
       "pool")
def _vllm_release(c: Ctx) -> Iterator[Finding]:
    s = c.pool.serving
    missing = vllm_releases.lacking(s.image, prefix_caching=s.prefix_caching)
    if not missing:
        return
    have = ".".join(map(str, vllm_releases.image_release(s.image) or ()))
    newest = missing[-1]
    what = {"flag": "the boot script passes", "metric": "the node agent reads"}
    lacks = "; ".join(f"{n.name} (vLLM {n.since}+, {what[n.kind]})" for n in missing)
    yield c.find(
        "warning", "serving.image",
        f"{s.image} is vLLM {have}, which lacks {lacks}: its nodes "
        + ("fail to start the server" if any(n.kind == "flag" for n in missing)
           else "serve, but their agent reports nothing for it"),
        f"use vLLM {newest.since} or newer, e.g. {vllm_releases.releases().default_image}",
    )


@check("boot-script-size", "the boot script fits the cloud's user-data/metadata limit")
def _boot_size(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.pool.serving.tensor_parallel not in (1, 2, 4, 8):
        return
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud

    size = len(bootscript.user_data(bootscript.render_boot_script(c.cfg, c.pool, c.cloud),
                                    c.cloud))
    if problem := bootscript.size_problem(size, c.cloud):
        yield c.find(
            "error", "serving.extra_args", problem,
            "shorten serving.extra_args (large settings belong in the image or the weights "
            "folder)",
        )


def hbm_problem(pool: Pool, row: InstanceType) -> str | None:
    """Why `row`'s GPUs cannot hold a replica's weights and one max_model_len sequence."""
    w_gpu = sizing.weights_bytes(pool) / pool.serving.tensor_parallel
    one_seq = sizing.kv_bytes_per_token_per_gpu(pool) * pool.serving.max_model_len
    reserved = pool.serving.reserved_gib_per_gpu * 2**30
    usable = row.hbm_bytes_per_gpu * pool.serving.gpu_memory_utilization
    need = w_gpu + one_seq + reserved
    if need <= usable:
        return None
    return (f"needs {need / 1e9:.1f} GB per GPU (weights {w_gpu / 1e9:.1f} + one "
            f"{pool.serving.max_model_len}-token sequence {one_seq / 1e9:.1f} + reserve "
            f"{reserved / 1e9:.1f}) but {row.name} offers {usable / 1e9:.1f} GB at "
            f"gpu_memory_utilization {pool.serving.gpu_memory_utilization}")


def nvme_problem(pool: Pool, row: InstanceType) -> str | None:
    """Why `row`'s local NVMe cannot cache the weights with headroom."""
    need = sizing.weights_bytes(pool) * sizing.NVME_HEADROOM
    have = row.local_nvme.total_bytes
    if have >= need:
        return None
    return (f"{row.name} has {have / 1e9:.0f} GB of local NVMe; the weights need "
            f"{need / 1e9:.0f} GB with {sizing.NVME_HEADROOM:.0%} headroom")


@check("fits-hbm", "weights per GPU + KV of one max_model_len sequence fit in usable HBM")
def _fits(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.pool.serving.tensor_parallel not in (1, 2, 4, 8):
        return
    if problem := hbm_problem(c.pool, c.row):
        yield c.find(
            "error", "serving.tensor_parallel", problem,
            "raise tensor_parallel, lower max_model_len, quantize, or pick a type with more HBM",
        )


@check("kv-concurrency", "the KV cache holds several max_model_len sequences")
def _concurrency(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.pool.serving.tensor_parallel not in (1, 2, 4, 8):
        return
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    plan = sizing.plan_pool(c.pool, c.cloud)
    seqs = plan.max_concurrent_sequences_per_replica
    if 0 < seqs < 4:
        yield c.find(
            "warning", "serving.max_model_len",
            f"the KV cache holds only {seqs} sequences of {c.pool.serving.max_model_len} tokens "
            f"per replica ({plan.kv_cache_tokens_per_replica} tokens)",
            "raise tensor_parallel or lower max_model_len for more concurrency",
        )


@check("nvme-holds-weights", "the local NVMe cache holds the weights with headroom")
def _nvme(c: Ctx) -> Iterator[Finding]:
    if c.row is None:
        return
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    if problem := nvme_problem(c.pool, c.row):
        yield c.find("error", _type_key(c.cloud), problem, "pick a type with more local NVMe")


@check("weights-load", "weights reach the GPUs the faster way the cloud offers")
def _weights_load(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.cloud != Cloud.aws:
        return  # streaming is AWS-only (gcp.weights_load takes fetch alone)
    placement = c.pool.placement(c.cloud)
    assert placement is not None  # a placement check: run_checks gives it the cloud
    fetch = sum(sizing.weights_seconds(c.pool, c.row, "fetch"))
    stream = sum(sizing.weights_seconds(c.pool, c.row, "stream"))
    rpn = sizing.replicas_per_node(c.pool, c.row)
    if placement.weights_load == "auto":
        path = sizing.weights_path(c.pool, c.row)
        yield c.find(
            "info", "aws.weights_load",
            f"auto: the nodes {path} the weights (~{min(stream, fetch):.0f} s to GPU memory; "
            f"{'fetch' if path == 'stream' else 'stream'} ~{max(stream, fetch):.0f} s)",
            "set fetch or stream to choose yourself",
        )
    elif placement.weights_load == "stream" and stream > fetch:
        yield c.find(
            "warning", "aws.weights_load",
            f"each of the node's {rpn} replicas streams its own copy of the weights: "
            f"~{stream:.0f} s to GPU memory, where fetch takes ~{fetch:.0f} s (one copy to "
            "NVMe, then read locally)",
            "use weights_load: fetch, or fewer replicas per node (a larger tensor_parallel)",
        )
    elif placement.weights_load == "fetch" and stream < fetch - 5:
        yield c.find(
            "info", "aws.weights_load",
            f"streaming the weights would reach GPU memory in ~{stream:.0f} s, fetch takes "
            f"~{fetch:.0f} s, on every start",
            "set weights_load: stream if you trust the bucket (nothing is checked against "
            "manifest.json before the engine loads)",
        )


def _fallback_key(cloud: Cloud) -> str:
    return "aws.fallback_instance_types" if cloud == Cloud.aws else "gcp.fallback_machine_types"


@check("fallback-types", "each fallback type is an 8-GPU NVLink type of the region that holds "
       "the model (and, on GCP, the primary's Local SSDs)", input=True)
def _fallbacks(c: Ctx) -> Iterator[Finding]:
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    placement = c.pool.placement(c.cloud)
    assert placement is not None  # ... one the pool has a placement on
    key = _fallback_key(c.cloud)
    catalog = load_catalog()
    seen = {placement.type_name}
    for i, name in enumerate(placement.fallback_types):
        at = f"{key}[{i}]"
        row = catalog.get(c.cloud, name)
        if name in seen:
            problem, hint = f"{name} is listed already", "list each type once, the primary not"
        elif row is None:
            problem = f"{name!r} is not in the catalog"
            hint = f"use one of: {', '.join(catalog.names(c.cloud))} (`poolctl catalog`)"
        elif not row.nvlink or row.gpus != 8:
            problem = (f"{name} has {row.gpus}x {row.gpu} without NVLink: tensor-parallel "
                       "all-reduce over PCIe throttles every decode step")
            hint = "use an NVLink 8-GPU type"
        elif placement.region not in row.regions:
            problem = f"{name} is not offered in {placement.region} per the catalog"
            hint = f"use a type offered there, or drop {name}"
        elif p := (hbm_problem(c.pool, row) or nvme_problem(c.pool, row)):
            problem, hint = f"cannot hold the model: {p}", "use a type with more HBM and NVMe"
        elif c.cloud == Cloud.gcp and c.row is not None and row.local_nvme != c.row.local_nvme:
            # The instance flexibility policy overrides the template's machine type only
            # (google provider 6.x has no per-selection disks): one Local SSD layout.
            have, want = row.local_nvme, c.row.local_nvme
            problem = (f"{name} has {have.count} Local SSD(s) "
                       f"({'bundled' if have.bundled else 'attached'}), the instance template "
                       f"{want.count} ({'bundled' if want.bundled else 'attached'}) for "
                       f"{placement.type_name}: one template cannot create both")
            hint = "use a type with the primary's Local SSDs"
        else:
            seen.add(name)
            continue
        seen.add(name)
        yield c.find("error", at, problem, hint)


@check("fallback-warm-pool", "no warm pool beside fallback types")
def _fallback_warm_pool(c: Ctx) -> Iterator[Finding]:
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    placement = c.pool.placement(c.cloud)
    assert placement is not None  # ... one the pool has a placement on
    if not placement.fallback_types or not c.pool.warm_pool.replicas:
        return
    if c.cloud == Cloud.aws:
        # PutWarmPool: "cannot be called on an Auto Scaling group that has a mixed instances
        # policy" (docs/cloud-facts.md, warm pools), and fallbacks need one.
        why = ("AWS refuses a warm pool on a group with a mixed instances policy, which "
               "fallback types need")
        hold = "hold the primary type's capacity with aws.capacity reservations"
    else:
        # Not found documented either way for a MIG's instance flexibility policy: poolctl
        # keeps the AWS rule (docs/capacity.md#fallback-types).
        why = ("poolctl keeps no standby pool beside an instance flexibility policy (GCP does "
               "not document the pair; a stopped VM restarts as its own type anyway)")
        hold = "hold the primary type's capacity with gcp.capacity reservations"
    yield c.find(
        "error", _fallback_key(c.cloud), why,
        f"keep the warm pool and {hold} (remove the fallbacks), or set warm_pool.replicas: 0 "
        "to grow on fallbacks (`warm --running` still prepares spare nodes, in service)",
    )


@check("warm-state", "the warm pool's state is possible for the type")
def _warm(c: Ctx) -> Iterator[Finding]:
    if c.row is None:
        return
    wp = c.pool.warm_pool
    if c.cloud == Cloud.gcp and _gcp(c).standby_suspended:
        yield c.find(
            "error", "gcp.standby_suspended",
            "suspending GPU VMs is not supported", "use a stopped standby pool",
        )
    if wp.replicas and wp.state == "stopped":
        assert c.cloud is not None  # a placement check: run_checks gives it the cloud
        image = recorded_node_image(c.pool, c.cloud)
        ph = sizing.start_phases(c.pool, c.row, image)["warm_stopped"]
        yield c.find(
            "info", "warm_pool.state",
            f"stopped warm nodes lose their local NVMe: each start refetches "
            f"{sizing.weights_bytes(c.pool) / 1e9:.0f} GB (~{ph['weights_to_nvme']:.0f} s, "
            f"~{sum(ph.values()):.0f} s to serve)",
            "use state: running to keep the cache warm at full price",
        )
        held = sizing.plan_pool(c.pool, c.cloud).capacity
        if held is not None and held.hoped_nodes:
            yield c.find(
                "info", "warm_pool.state",
                f"{held.hoped_nodes} stopped warm node(s) are capacity hoped for, not held: a "
                "stopped instance gives its capacity back, so its start is a new launch that "
                "can fail for capacity exactly when the launch needs it",
                "hold it with state: running, or a reservation with room for them "
                f"({_capacity_key(c.cloud)}.reserved_nodes)",
            )


@check("whole-nodes", "replica counts are whole nodes")
def _whole(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.pool.serving.tensor_parallel not in (1, 2, 4, 8):
        return
    rpn = sizing.replicas_per_node(c.pool, c.row)
    fields = {
        "scaling.min_replicas": c.pool.scaling.min_replicas,
        "scaling.max_replicas": c.pool.scaling.max_replicas,
        "warm_pool.replicas": c.pool.warm_pool.replicas,
        "rollout.max_surge_replicas": c.pool.rollout.max_surge_replicas,
    }
    for path, n in fields.items():
        if n % rpn:
            nodes = sizing.nodes_for(n, rpn)
            yield c.find(
                "warning", path,
                f"{n} replicas is not a whole number of nodes ({rpn} replicas per node); "
                f"rounded up to {nodes} nodes = {nodes * rpn} replicas",
                f"use a multiple of {rpn}",
            )


# The placement key that turns HTTPS on, and what it takes.
TLS_KEYS = {
    "aws": ("certificate_arn", "an ACM certificate (HTTPS on 443, HTTP redirects to it)"),
    "gcp": ("certificate", "a regional SSL certificate (HTTPS on 443)"),
}


@check("tls", "clients reach the pool over HTTPS")
def _tls(c: Ctx) -> Iterator[Finding]:
    assert c.cloud is not None  # a placement check: run_checks gives it the cloud
    field, what = TLS_KEYS[c.cloud]
    if not getattr(c.pool.placement(c.cloud), field):
        yield c.find(
            "warning", f"{c.cloud}.{field}",
            "the load balancer serves plain HTTP: prompts and answers cross the VPC unencrypted",
            f"set {c.cloud}.{field} to {what}",
        )


@check("sticky-per-node", "session affinity reaches the replica holding the prefix cache")
def _sticky(c: Ctx) -> Iterator[Finding]:
    if c.row is None or c.pool.serving.balancer != "sticky":
        return
    rpn = sizing.replicas_per_node(c.pool, c.row)
    if rpn > 1:
        # The cookie names a node; vLLM's data-parallel balancer inside it picks the least
        # loaded engine, not the one with the session's prefix (docs/planning.md).
        yield c.find(
            "info", "serving.balancer",
            f"sticky routing pins a session to a node, and the node's {rpn} replicas share "
            "its turns without regard to their prefix caches",
            "simulate --balancer sticky shows the hit rate; tensor_parallel 8 (one replica "
            "per node) keeps a session on one cache",
        )


@check("traffic-peak", "max_replicas carries the given trace's peak")
def _traffic_peak(c: Ctx) -> Iterator[Finding]:
    if c.traffic is None:
        return
    s = c.pool.scaling
    if s.max_replicas < c.traffic.peak_replicas:
        yield c.find(
            "warning", "scaling.max_replicas",
            f"{s.max_replicas} cannot carry the peak of {c.traffic.source}: its busiest window "
            f"needs {c.traffic.peak_replicas} replicas to keep TTFT p90 <= "
            f"{c.pool.slo.ttft_p90_s} s",
            f"raise max_replicas to at least {c.traffic.peak_replicas}",
        )


# ---------------------------------------------------------------------------- running


def run_checks(cfg: Config, targets: list[Target],
               traffic: dict[tuple[str, Cloud], TrafficNeed] | None = None) -> list[Finding]:
    """All findings for the chosen (pool, cloud) targets; pool checks run once per pool.
    `traffic` (per pool name and cloud) is what a given trace needs; checks of it run only
    then."""
    catalog = load_catalog()
    findings: list[Finding] = []
    seen: set[str] = set()
    for t in targets:
        pool, cl = t.pool, t.cloud
        index = cfg.pools.index(pool)
        if pool.name not in seen:
            seen.add(pool.name)
            base = Ctx(cfg, pool, index)
            for chk in CHECKS:
                if chk.scope == "pool":
                    findings += chk.fn(base)
        p = pool.placement(cl)
        assert p is not None  # targets pair a pool with a cloud it has a placement on
        name = p.type_name
        need = (traffic or {}).get((pool.name, cl))
        ctx = Ctx(cfg, pool, index, cl, catalog.get(cl, name), need)
        for chk in CHECKS:
            if chk.scope == "placement":
                findings += chk.fn(ctx)
    return findings


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def exit_code(findings: list[Finding]) -> int:
    """0 without errors; 2 when one is bad input (a value that can never serve the pool);
    else 1 (a rule the file's design breaks), as the contract's exit codes have it."""
    errs = errors(findings)
    return 0 if not errs else 2 if any(f.bad_input for f in errs) else 1


def refusal(findings: list[Finding], message: str) -> PoolctlError:
    """The error a command refusing on these findings raises: UsageError (exit 2) when one
    is bad input, else OperationFailed (exit 1)."""
    return (UsageError if exit_code(findings) == 2 else OperationFailed)(message)


def refuse_invalid(cfg: Config, targets: list[Target]) -> None:
    """What synthesis runs first, whatever the road to it (commands, `cdktn synth`, a
    rollout's apply): the rules `validate` runs. The stacks and the boot script check
    nothing, so what the rules accept synthesizes and what they refuse never gets there."""

    errs = errors(run_checks(cfg, targets))
    if errs:
        first = next((f for f in errs if f.bad_input), errs[0])
        raise refusal(errs, f"{first.line()} ({len(errs)} rule(s) failed: run `poolctl "
                            "validate`); nothing was synthesized")
