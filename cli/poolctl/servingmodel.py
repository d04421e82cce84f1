"""How long one replica's engine step takes: a roofline model over the catalog and the config.

Pure arithmetic, no SDKs. One engine step (vLLM continuous batching with chunked prefill)
processes `tokens` new tokens (prefill chunks plus one token per decoding sequence) and reads
the KV cache of every scheduled sequence:

    step = overhead + per-seq x decoding sequences + all-reduce(tokens) + busy(compute, memory)
    compute = (2 * active params * tokens + attention FLOPs) / (TP * peak FLOPs * prefill_mfu)
    memory  = (weights read + KV bytes read) / (HBM bandwidth * decode_mbu)      (per GPU)

A mixture of experts keeps every expert in HBM but computes with the active parameters
only, and a step reads the experts its tokens are routed to: under uniform routing of
`tokens` tokens to k of E experts, E (1 - (1 - k/E)^tokens) of them per layer (a few at batch
1, all of them at large batch or in prefill), besides the dense layers.

overhead and per-seq are the sum of two fits: the GPU kernels' fixed and per-sequence
times (fitted to AIConfigurator's kernel database, `serving_fit.by_tp`) and the engine's own
time per step outside the kernels (scheduling, sampling, detokenization, Python; fitted to
measured end-to-end vLLM runs, `serving_fit.engine`).

Prefill is compute-bound (attention's quadratic term counts for long prompts), decode is
memory-bound: each step streams the GPU's weight shard and the running sequences' KV cache
from HBM once. Tensor parallelism adds two all-reduces per layer over NVLink (or PCIe on a
PCIe-only type), so the link shows up in the numbers.

busy(c, m) = (c^k + m^k)^(1/k): the roofline's max for large k, their sum for k = 1.
The defaults: the factors the catalog records per GPU and TP (`serving_fit`, fitted to
AIConfigurator's measured database by scripts/fit_defaults.py), else the literature's figures
below, each with its source. A pool's `perf:` block overrides them, or gives measured numbers
from which `calibrated` solves them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from poolctl.catalog import EngineFit, GpuSpec, ServingFactors, load_catalog
from poolctl.cloud import Cloud
from poolctl.config import FP4_DTYPES, Pool
from poolctl.errors import UsageError
from poolctl.sizing import instance_row, plan_pool

# Share of peak tensor FLOPs a large prefill batch reaches in vLLM: Sarathi-Serve (OSDI 2024)
# and Vidur (MLSys 2024) profile prefill at roughly 40-60 % MFU on A100/H100; the middle.
PREFILL_MFU = 0.5
# Share of peak HBM bandwidth a decode step reaches: Databricks, "LLM Inference Performance
# Engineering: Best Practices" (2023) measures 55-75 % MBU for 7B-70B models; near the top.
DECODE_MBU = 0.7
# Share of the link's one-way bandwidth NCCL's ring all-reduce reaches (nccl-tests bus
# bandwidth on NVSwitch systems is ~70-80 % of the link peak).
LINK_EFFICIENCY = 0.7
# Fixed latency of one small NCCL all-reduce on NVLink (nccl-tests, 8 B-64 KB messages).
ALLREDUCE_LATENCY_S = 10e-6
# CPU side of one engine step (scheduling, sampling, kernel launches with CUDA graphs):
# vLLM V1's design notes put it at a few ms before its overlap work; 2 ms.
STEP_OVERHEAD_S = 0.002
# Per decoding sequence and step beyond its KV reads (sampling, attention kernels' fixed
# costs): no published figure to default to, so 0 until calibrated from measurements.
DECODE_PER_SEQ_S = 0.0
# Activations cross the all-reduce in bf16.
ACTIVATION_BYTES = 2
# Hidden size when the config does not give attention heads: N ~ 12 L d^2 (4 d^2 attention +
# 8 d^2 MLP per layer; Kaplan et al. 2020, "Scaling Laws for Neural Language Models").
PARAMS_PER_LAYER_D2 = 12


@dataclass(frozen=True)
class ReplicaModel:
    """Step-time coefficients of one replica (one copy of the model over TP GPUs).

    `role` names what the replica does; today every replica prefills and decodes ("mixed").
    A disaggregated pool would add "prefill" and "decode" replicas with their own models.
    """

    role: str
    tp: int
    params: float  # all of them (every expert)
    layers: int
    hidden: float
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_tokens: int  # KV cache capacity, plan's kv_cache_tokens_per_replica
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    peak_flops_per_gpu: float
    hbm_bytes_per_s: float  # peak, per GPU
    link_bytes_per_s: float  # one-way, per GPU
    prefill_mfu: float
    decode_mbu: float
    link_efficiency: float
    overhead_s: float
    per_seq_s: float = DECODE_PER_SEQ_S
    allreduce_latency_s: float = ALLREDUCE_LATENCY_S
    # How compute and memory time combine in one step: (c^k + m^k)^(1/k); inf is the
    # roofline's max (perfect overlap), 1 their sum.
    overlap_k: float = math.inf
    # Mixture of experts (0 for a dense model): parameters a token computes with, routed
    # experts per layer, experts per token, and one expert's bytes (all layers) per GPU.
    active_params: float = 0.0
    experts: int = 0
    experts_per_token: int = 0
    expert_bytes_per_gpu: float = 0.0

    def weights_read(self, tokens: float) -> float:
        """Weight bytes per GPU one step of `tokens` tokens reads: all of them for a dense
        model; for a mixture of experts the dense part and the experts the tokens are
        routed to (expected distinct experts under uniform routing)."""
        if not self.experts:
            return self.weights_bytes_per_gpu
        e, k = self.experts, self.experts_per_token
        touched = e * (1 - (1 - k / e) ** max(1.0, float(tokens)))
        return float(self.weights_bytes_per_gpu - (e - touched) * self.expert_bytes_per_gpu)

    # ---- the three parts of a step
    def compute_s(self, tokens: float, attn_flops: float = 0.0) -> float:
        flops = 2 * (self.active_params or self.params) * tokens + attn_flops
        return flops / (self.tp * self.peak_flops_per_gpu * self.prefill_mfu)

    def memory_s(self, kv_tokens_read: float, tokens: float = math.inf) -> float:
        nbytes = self.weights_read(tokens) + kv_tokens_read * self.kv_bytes_per_token_per_gpu
        return nbytes / (self.hbm_bytes_per_s * self.decode_mbu)

    def comm_s(self, tokens: float) -> float:
        if self.tp == 1:
            return 0.0
        # Two all-reduces per layer (attention and MLP outputs); a ring moves 2(TP-1)/TP of
        # the message through each GPU's link.
        msg = tokens * self.hidden * ACTIVATION_BYTES
        one = 2 * (self.tp - 1) / self.tp * msg / (self.link_bytes_per_s * self.link_efficiency)
        return 2 * self.layers * (one + self.allreduce_latency_s)

    def attn_flops(self, chunk: float, offset: float) -> float:
        """QK^T and AV of `chunk` new tokens attending to `offset` earlier ones (causal)."""
        return 4 * self.layers * self.hidden * chunk * (offset + chunk / 2)

    def step_s(self, tokens: float, kv_tokens_read: float, attn_flops: float = 0.0,
               decode_seqs: int = 0) -> float:
        return (self.overhead_s + self.per_seq_s * decode_seqs + self.comm_s(tokens)
                + self._busy(self.compute_s(tokens, attn_flops),
                             self.memory_s(kv_tokens_read, tokens)))

    def _busy(self, c: float, m: float) -> float:
        k = self.overlap_k
        if math.isinf(k):
            return max(c, m)
        hi = max(c, m)  # scaled so that the powers stay in range
        return hi * ((c / hi) ** k + (m / hi) ** k) ** (1 / k) if hi > 0 else 0.0

    # ---- the figures plan and the README quote
    def prefill_s(self, n: int) -> float:
        """One n-token prompt alone in one step (no chunking)."""
        return self.step_s(n, n, self.attn_flops(n, 0))

    def prefill_tokens_per_s(self, n: int) -> float:
        return n / self.prefill_s(n)

    def ttft_floor_s(self, prompt: int, cached: int = 0) -> float:
        """The fastest first token of a `prompt`-token request: alone on an idle replica,
        prefilled in chunks of `max_num_batched_tokens` as the simulator's engine does (each
        step reads the request's whole KV allocation, prompt + 1). Sharing a replica only adds
        to it (more tokens per step, smaller chunks, waits), so no replica count brings a
        request's TTFT below it: the prefill compute floor. `cached` leading tokens found in
        the prefix cache are not computed (the rest still attends to them)."""
        prompt = max(1, prompt)
        t, done = 0.0, min(max(0, cached), prompt - 1)
        while done < prompt:
            c = min(prompt - done, self.max_num_batched_tokens)
            t += self.step_s(c, prompt + 1, self.attn_flops(c, done))
            done += c
        return t

    def decode_step_s(self, batch: int, context: int) -> float:
        """One decode step of `batch` sequences holding `context` tokens each (attention's
        FLOPs in decode are a few % of the weights' and left out)."""
        return self.step_s(batch, batch * context, decode_seqs=batch)


# The defaults of a GPU the catalog has no fit for (overlap_k: the roofline's max).
LITERATURE = ServingFactors(
    prefill_mfu=PREFILL_MFU, decode_mbu=DECODE_MBU, step_overhead_ms=STEP_OVERHEAD_S * 1000,
    decode_us_per_seq=DECODE_PER_SEQ_S * 1e6, link_efficiency=LINK_EFFICIENCY,
    allreduce_us=ALLREDUCE_LATENCY_S * 1e6, overlap_k=math.inf)

# ServingFactors' fields, in the order scripts/fit_defaults.py fits them.
FACTOR_NAMES = tuple(ServingFactors.model_fields)


def with_engine(f: ServingFactors, e: EngineFit, dtype: str) -> ServingFactors:
    """The kernel factors `f` with the engine's measured time added: its time per step and
    per running sequence, and the share of the kernels' prefill MFU a server reaches with
    `dtype` weights (a dtype the fit has no runs of keeps the kernels' MFU)."""
    return f.model_copy(update={
        "step_overhead_ms": f.step_overhead_ms + e.step_ms,
        "decode_us_per_seq": f.decode_us_per_seq + e.us_per_seq,
        "prefill_mfu": min(1.0, f.prefill_mfu * e.mfu_scale.get(dtype, 1.0))})


def with_factors(rm: ReplicaModel, f: ServingFactors) -> ReplicaModel:
    """`rm` with every efficiency factor taken from `f` (a catalog row's fit)."""
    return replace(rm, prefill_mfu=f.prefill_mfu, decode_mbu=f.decode_mbu,
                   overhead_s=f.step_overhead_ms / 1000, per_seq_s=f.decode_us_per_seq / 1e6,
                   link_efficiency=f.link_efficiency,
                   allreduce_latency_s=f.allreduce_us / 1e6, overlap_k=f.overlap_k)


def slowed(rm: ReplicaModel, factor: float) -> ReplicaModel:
    """`rm` with every step `factor` times as long: each of a step's terms (fixed and
    per-sequence time, all-reduce latency and bandwidth, compute, memory) scales by it, and
    their combination is homogeneous, so step_s() is exactly `factor` x. The sandbox's
    engine slowdown (a GPU that does worse than the model believes)."""
    return replace(rm, prefill_mfu=rm.prefill_mfu / factor, decode_mbu=rm.decode_mbu / factor,
                   link_efficiency=rm.link_efficiency / factor,
                   overhead_s=rm.overhead_s * factor, per_seq_s=rm.per_seq_s * factor,
                   allreduce_latency_s=rm.allreduce_latency_s * factor)


def figures(rm: ReplicaModel) -> dict[str, Any]:
    """The numbers to compare with a measured replica (and to calibrate `perf:` from)."""
    return {
        "prefill_tokens_per_s": round(rm.prefill_tokens_per_s(2048), 1),
        "decode_step_ms": {"batch_1": round(rm.decode_step_s(1, 1024) * 1000, 3),
                           "batch_64": round(rm.decode_step_s(64, 1024) * 1000, 3)},
        "kv_tokens": rm.kv_tokens,
        "factors": {"prefill_mfu": round(rm.prefill_mfu, 4), "decode_mbu": round(rm.decode_mbu, 4),
                    "link_efficiency": rm.link_efficiency,
                    "step_overhead_ms": round(rm.overhead_s * 1000, 4),
                    "decode_us_per_seq": round(rm.per_seq_s * 1e6, 3)},
    }


def hidden_size(pool: Pool) -> float:
    """The model's width: config.json's hidden_size where the preset or the file gives it
    (Qwen3-32B: 5,120, not its 64 heads x 128), else heads x head_dim, else from the size."""
    m = pool.model
    if m.hidden_size:
        return m.hidden_size
    heads: int | None = getattr(m, "attention_heads", None)
    # validation fills these (config.Model) or refuses the file
    assert m.head_dim is not None and m.params_b is not None and m.layers is not None
    if heads:
        return heads * m.head_dim
    return math.sqrt(m.params_b * 1e9 / (PARAMS_PER_LAYER_D2 * m.layers))


def compute_dtype(pool: Pool, spec: GpuSpec) -> str:
    """What the replica's matrix products run in on this GPU: FP8 or FP4 weights on tensor
    cores of that precision; anything else (and those without such cores: weight-only
    kernels) at the BF16 rate."""
    dtype = pool.model.dtype or "bfloat16"
    if dtype == "fp8" and spec.fp8_tflops:
        return "fp8"
    if dtype in FP4_DTYPES and spec.fp4_tflops:
        return "fp4"
    return "bfloat16"


def peak_tflops(pool: Pool, spec: GpuSpec) -> float:
    return {"fp8": spec.fp8_tflops, "fp4": spec.fp4_tflops}.get(
        compute_dtype(pool, spec)) or spec.bf16_tflops


def fitted(pool: Pool, cloud: Cloud) -> bool:
    """The pool's GPU has factors fitted to measurements in the catalog (kernel database
    and measured serving runs) for the dtype its weights compute in: the engine fit has
    runs of that dtype (its prefill scale). Otherwise the model runs on the literature's
    figures, or on factors no run of that dtype checked (FP4 on B200, BF16 on B200: only
    FP8 runs were measured there)."""
    row = instance_row(pool, cloud)
    spec = load_catalog().gpu_spec(row)
    fit = spec.serving_fit
    if fit is None or fit.engine is None:
        return False
    return weight_dtype(pool) in fit.engine.mfu_scale


def weight_dtype(pool: Pool) -> str:
    """The weights' dtype as the engine fit keys it: FP16 runs BF16's kernels."""
    dtype = pool.model.dtype or "bfloat16"
    return "bfloat16" if dtype == "float16" else dtype


def replica_model(pool: Pool, cloud: Cloud) -> ReplicaModel:
    """The pool's replica on `cloud`, with the `perf:` block applied."""
    row = instance_row(pool, cloud)
    spec = load_catalog().gpu_spec(row)
    plan = plan_pool(pool, cloud)
    peak = peak_tflops(pool, spec)
    link = spec.nvlink_gbytes_s if row.nvlink and spec.nvlink_gbytes_s else spec.pcie_gbytes_s
    s, perf = pool.serving, pool.perf
    # validation fills these (config.Model) or refuses the file
    assert pool.model.params_b is not None and pool.model.layers is not None

    def pick(v: float | None, d: float) -> float:
        return d if v is None else v

    # Defaults: the factors fitted to measurements of this GPU at this TP (the catalog's
    # serving_fit), else the literature's figures above; `perf:` overrides each.
    fit = spec.serving_fit.for_tp(s.tensor_parallel) if spec.serving_fit else LITERATURE
    if spec.serving_fit and spec.serving_fit.engine:
        fit = with_engine(fit, spec.serving_fit.engine, weight_dtype(pool))
    m = pool.model
    moe: dict[str, Any] = {}
    if m.experts and m.experts_per_token and m.active_params_b and m.params_b:
        # one expert's parameters, all layers: total - active = (E - k) experts
        expert = (m.params_b - m.active_params_b) * 1e9 / (m.experts - m.experts_per_token)
        moe = {"active_params": m.active_params_b * 1e9, "experts": m.experts,
               "experts_per_token": m.experts_per_token,
               "expert_bytes_per_gpu": plan.weights_bytes_per_gpu * expert / (m.params_b * 1e9)}
    rm = ReplicaModel(
        role="mixed",
        tp=s.tensor_parallel,
        params=pool.model.params_b * 1e9,
        layers=pool.model.layers,
        hidden=hidden_size(pool),
        weights_bytes_per_gpu=plan.weights_bytes_per_gpu,
        kv_bytes_per_token_per_gpu=plan.kv_cache_bytes_per_token_per_gpu,
        kv_tokens=plan.kv_cache_tokens_per_replica,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=s.max_model_len,
        peak_flops_per_gpu=peak * 1e12,
        hbm_bytes_per_s=row.hbm_tbps_per_gpu * 1e12,
        link_bytes_per_s=link * 1e9 / 2,  # the catalog's figure is bidirectional
        prefill_mfu=pick(perf.prefill_mfu, fit.prefill_mfu),
        decode_mbu=pick(perf.decode_mbu, fit.decode_mbu),
        link_efficiency=pick(perf.link_efficiency, fit.link_efficiency),
        overhead_s=pick(perf.step_overhead_ms, fit.step_overhead_ms) / 1000,
        per_seq_s=pick(perf.decode_us_per_seq, fit.decode_us_per_seq) / 1e6,
        allreduce_latency_s=fit.allreduce_us / 1e6,
        overlap_k=fit.overlap_k,
        **moe,
    )
    return calibrated(rm, pool)


def calibrated(rm: ReplicaModel, pool: Pool) -> ReplicaModel:
    """Solve the efficiency factors from measured numbers in `perf:`, if any.

    Decode at batch 1 and 64 (memory-bound, context c tokens each), overhead and all-reduce
    from the model: batch 1 streams the weights plus c KV tokens, batch 64 the weights plus
    64 c, at HBM bandwidth x MBU, and each sequence adds a fixed cost s. Two equations give
    s and MBU (closed form below). A measured prefill rate then gives MFU. The calibrated
    model reproduces the measurements.
    """
    perf, key = pool.perf, f"pools.{pool.name}.perf"
    if perf.decode_ms_batch1 is not None or perf.prefill_tokens_per_s is not None:
        rm = replace(rm, overlap_k=math.inf)  # the closed forms below solve the roofline's max
    if perf.decode_ms_batch1 is not None:
        assert perf.decode_ms_batch64 is not None  # config.Perf takes the two together
        c = perf.measured_context_tokens
        d1, d64 = perf.decode_ms_batch1 / 1000, perf.decode_ms_batch64 / 1000
        bw = rm.hbm_bytes_per_s
        mem1 = (rm.weights_read(1) + c * rm.kv_bytes_per_token_per_gpu) / bw
        mem64 = (rm.weights_read(64) + 64 * c * rm.kv_bytes_per_token_per_gpu) / bw
        r = mem64 / mem1
        # d1  = o + s      + comm1  + mem1 / mbu
        # d64 = o + 64 s   + comm64 + r mem1 / mbu   =>  eliminate mem1 / mbu:
        a1 = d1 - rm.overhead_s - rm.comm_s(1)
        per_seq = (d64 - rm.overhead_s - rm.comm_s(64) - r * a1) / (64 - r)
        if per_seq < 0:
            raise UsageError(
                f"{key}.decode_ms_batch64: {perf.decode_ms_batch64} ms vs {perf.decode_ms_batch1}"
                f" ms at batch 1 is less than reading {63 * c} more KV tokens takes; check the "
                "measurement or measured_context_tokens"
            )
        mbu = mem1 / (a1 - per_seq) if a1 > per_seq else math.inf
        if not 0 < mbu <= 1:
            raise UsageError(
                f"{key}.decode_ms_batch1: {perf.decode_ms_batch1} ms is faster than streaming "
                f"the {rm.weights_bytes_per_gpu / 1e9:.1f} GB weight shard at the GPU's HBM "
                "bandwidth (plus step_overhead_ms); check the measurement"
            )
        rm = replace(rm, decode_mbu=mbu, per_seq_s=per_seq)
    if perf.prefill_tokens_per_s is not None:
        n = perf.measured_prompt_tokens
        compute = n / perf.prefill_tokens_per_s - rm.overhead_s - rm.comm_s(n)
        flops = 2 * (rm.active_params or rm.params) * n + rm.attn_flops(n, 0)
        mfu = flops / (rm.tp * rm.peak_flops_per_gpu * compute) if compute > 0 else math.inf
        if not 0 < mfu <= 1 or compute < rm.memory_s(n, n):
            raise UsageError(
                f"{key}.prefill_tokens_per_s: {perf.prefill_tokens_per_s:g} tokens/s on "
                f"{n}-token prompts is beyond this replica's peak compute (or not "
                "compute-bound); check the measurement or measured_prompt_tokens"
            )
        rm = replace(rm, prefill_mfu=mfu)
    return rm


# ------------------------------------------------------------------------------ topology

# aggregated: every replica prefills and decodes (vLLM's default). disagg-node: a replica's
# prefill and decode run on different GPUs of one node, the KV cache crossing NVLink.
# disagg-cross: on different nodes, the KV cache crossing the VPC network over TCP (no EFA).
TOPOLOGIES = ("aggregated", "disagg-node", "disagg-cross")


@dataclass(frozen=True)
class Topology:
    """A disaggregated replica: a prefill instance of `prefill.tp` GPUs hands each request's
    KV cache to a decode instance of `decode.tp` GPUs over a path of `link_bytes_per_s`
    (one prefill instance's share; its transfers queue on it)."""

    kind: str
    prefill: ReplicaModel
    decode: ReplicaModel
    kv_bytes_per_token: float  # whole model: every layer, K and V, all TP shards
    link_bytes_per_s: float
    link: str  # how the figure was reached, for the output

    @property
    def gpus(self) -> int:
        return self.prefill.tp + self.decode.tp

    def transfer_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.link_bytes_per_s


def at_tp(pool: Pool, tp: int) -> Pool:
    """The pool at tensor parallelism `tp` (its other keys kept)."""
    return pool.model_copy(update={"serving": pool.serving.model_copy(
        update={"tensor_parallel": tp})})


def topology(pool: Pool, cloud: Cloud, kind: str, prefill_gpus: int,
             decode_gpus: int) -> Topology:
    """The pool's model split `prefill_gpus`:`decode_gpus` (each a TP degree), with the KV
    path of `kind` ("disagg-node" or "disagg-cross"). Bad splits are one UsageError line."""
    row = instance_row(pool, cloud)
    flag = f"--split {prefill_gpus}:{decode_gpus}"
    if kind not in TOPOLOGIES[1:]:
        raise UsageError(f"--topology: {kind!r} is not one of {', '.join(TOPOLOGIES)}")
    for n in (prefill_gpus, decode_gpus):
        if n not in (1, 2, 4, 8):
            raise UsageError(f"{flag}: each side is a tensor-parallel degree: 1, 2, 4 or 8")
    if row.gpus % (prefill_gpus + decode_gpus):
        raise UsageError(f"{flag}: {prefill_gpus + decode_gpus} GPUs per replica do not divide "
                         f"{row.name}'s {row.gpus}; e.g. --split 4:4")
    sides = []
    for side, n in (("prefill", prefill_gpus), ("decode", decode_gpus)):
        m = replica_model(at_tp(pool, n), cloud)
        if m.kv_tokens < m.max_model_len:
            raise UsageError(f"{flag}: the {side} side's {n} GPU(s) leave KV room for "
                             f"{max(0, m.kv_tokens):,} tokens, less than one max_model_len "
                             f"sequence ({m.max_model_len:,}); give it more GPUs")
        sides.append(replace(m, role=side))
    p, d = sides
    kv_token = p.kv_bytes_per_token_per_gpu * p.tp
    if kind == "disagg-node":
        spec = load_catalog().gpu_spec(row)
        link = spec.nvlink_gbytes_s if row.nvlink and spec.nvlink_gbytes_s else spec.pcie_gbytes_s
        # Each of the narrower side's GPUs moves its share over its own link, one way.
        lanes = min(prefill_gpus, decode_gpus)
        bw = lanes * link * 1e9 / 2 * p.link_efficiency
        how = f"{lanes} x {link / 2:g} GB/s one-way GPU links x {p.link_efficiency:g}"
    else:
        vpc = row.vpc
        if vpc is None:
            raise UsageError(f"--topology disagg-cross: the catalog has no sourced VPC "
                             f"bandwidth for {row.name}; use --topology disagg-node")
        # One TCP flow per prefill GPU (each TP rank sends its shard), each capped per flow;
        # the node's primary card is shared by the prefill instances on it.
        per_node = row.gpus // prefill_gpus
        gbps = min(prefill_gpus * vpc.flow_gbps, vpc.instance_gbps / per_node)
        bw = gbps * 1e9 / 8
        how = (f"min({prefill_gpus} flows x {vpc.flow_gbps:g} Gbit/s, {vpc.instance_gbps:g} "
               f"Gbit/s / {per_node} prefill instances per node) = {gbps:g} Gbit/s")
    return Topology(kind=kind, prefill=p, decode=d, kv_bytes_per_token=kv_token,
                    link_bytes_per_s=bw, link=how)
