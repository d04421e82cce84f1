"""The serving model's numbers for the contract's Llama-70B example, worked out by hand."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from poolctl.config import load_config, parse_config
from poolctl.errors import UsageError
from poolctl.servingmodel import replica_model
from tests.configs import pool_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"

# Llama-3.1-70B, bf16, TP 2 on p5.48xlarge (H100 SXM), with the factors the catalog records
# for H100 at TP 2 (fitted to AIConfigurator's kernel database by scripts/fit_defaults.py;
# copied here, and test_fit_pins_the_catalog_row below holds the catalog to them) ...
KERNEL_MFU, MBU, LINK_EFF, KERNEL_OVERHEAD, KERNEL_PER_SEQ, LAT, K = \
    0.7041, 0.8676, 0.8977, 0.0, 5.1777e-6, 18.9389e-6, 3.3943
# ... and the engine's own time the catalog records for H100 (fitted to measured vLLM runs:
# 1.8949 ms a step, 38.832 us per sequence, BF16 prefill at 0.652 of the kernels' MFU).
ENGINE_STEP, ENGINE_PER_SEQ, BF16_SCALE = 1.8949e-3, 38.832e-6, 0.652
MFU = KERNEL_MFU * BF16_SCALE  # 0.45907
OVERHEAD = KERNEL_OVERHEAD + ENGINE_STEP
PER_SEQ = KERNEL_PER_SEQ + ENGINE_PER_SEQ
P = 70.6e9  # parameters
W_GPU = 70.6e9 * 2 / 2  # bytes of weights per GPU: 70.6 GB
KV_GPU = 2 * 80 * (8 // 2) * 128 * 2  # K and V, 80 layers, 4 KV heads per GPU, bf16
D = 64 * 128  # hidden size: the preset's 64 attention heads x head_dim 128 (config.json: 8192)
FLOPS = 2 * 989e12 * MFU  # 2 GPUs x dense BF16 peak x MFU
HBM = 3.35e12 * MBU  # one GPU's HBM bandwidth x MBU
LINK = 900e9 / 2 * LINK_EFF  # NVLink 4: 900 GB/s both ways, 450 one way, x efficiency


def allreduce(tokens: int) -> float:
    # 2 per layer x 80 layers; ring over 2 GPUs moves 2(2-1)/2 = 1 x the message; + latency
    return 2 * 80 * (tokens * D * 2 / LINK + LAT)


def busy(compute: float, memory: float) -> float:
    # compute and memory time of a step combined as (c^k + m^k)^(1/k): k = 3.39 sits between
    # their sum (k = 1) and the roofline's max (k -> inf)
    return (compute**K + memory**K) ** (1 / K)


@pytest.fixture(scope="module")
def model():
    return replica_model(load_config(EXAMPLE).pools[0], "aws")


def test_example_geometry(model):
    assert KV_GPU == 163_840
    assert model.kv_bytes_per_token_per_gpu == KV_GPU
    assert model.weights_bytes_per_gpu == pytest.approx(W_GPU)
    assert model.link_bytes_per_s == 450e9  # NVLink on p5, per direction


def test_fit_pins_the_catalog_row():
    from poolctl.catalog import load_catalog

    fit = load_catalog().gpu_specs["H100"].serving_fit
    f = fit.for_tp(2)
    assert (f.prefill_mfu, f.decode_mbu, f.link_efficiency, f.step_overhead_ms,
            f.decode_us_per_seq, f.allreduce_us, f.overlap_k) == pytest.approx(
        (KERNEL_MFU, MBU, LINK_EFF, KERNEL_OVERHEAD * 1e3, KERNEL_PER_SEQ * 1e6, LAT * 1e6, K),
        rel=1e-12)
    e = fit.engine
    assert (e.step_ms, e.us_per_seq, e.mfu_scale["bfloat16"]) == pytest.approx(
        (ENGINE_STEP * 1e3, ENGINE_PER_SEQ * 1e6, BF16_SCALE), rel=1e-12)


def test_prefill_tokens_per_s_by_hand(model):
    n = 2048
    compute = (2 * P * n + 2 * 80 * D * n**2) / FLOPS  # 324.52 ms, attention ~2 % of it
    memory = (W_GPU + n * KV_GPU) / HBM  # 24.41 ms: prefill is compute-bound
    step = OVERHEAD + allreduce(n) + busy(compute, memory)  # 1.89 + 16.32 + 324.53 ms
    assert compute > 8 * memory
    assert step == pytest.approx(0.34275, rel=1e-4)
    assert model.prefill_tokens_per_s(n) == pytest.approx(n / step, rel=1e-9)
    assert model.prefill_tokens_per_s(n) == pytest.approx(5975, rel=1e-3)


def test_decode_step_at_batch_1_and_64_by_hand(model):
    # Batch 1, 1,024 tokens of context: the weights dominate.
    mem1 = (W_GPU + 1024 * KV_GPU) / HBM  # 24.348 ms
    step1 = OVERHEAD + PER_SEQ + allreduce(1) + busy(2 * P / FLOPS, mem1)  # 1.939 + 3.037 + 24.348
    assert step1 == pytest.approx(0.029324, rel=1e-4)
    assert model.decode_step_s(1, 1024) == pytest.approx(step1, rel=1e-9)
    # Batch 64: 65,536 KV tokens (10.7 GB per GPU) join the weights; still memory-bound.
    mem64 = (W_GPU + 64 * 1024 * KV_GPU) / HBM  # 27.985 ms
    c64 = 64 * 2 * P / FLOPS  # 9.952 ms
    step64 = OVERHEAD + 64 * PER_SEQ + allreduce(64) + busy(c64, mem64)  # 4.712 + 3.446 + 28.228
    assert c64 < mem64
    assert step64 == pytest.approx(0.036386, rel=1e-4)
    assert model.decode_step_s(64, 1024) == pytest.approx(step64, rel=1e-9)


def test_ttft_floor_by_hand(model):
    # A 10,000-token prompt alone on a replica: chunks of max_num_batched_tokens 8,192 and
    # 1,808; the second attends to the first 8,192 tokens too; each step reads the whole
    # 10,001-token KV allocation (far below compute: prefill is compute-bound).
    mem = (W_GPU + 10_001 * KV_GPU) / HBM  # 24.85 ms
    c1 = (2 * P * 8192 + 4 * 80 * D * 8192 * (0 + 8192 / 2)) / FLOPS  # 1.3707 s
    c2 = (2 * P * 1808 + 4 * 80 * D * 1808 * (8192 + 1808 / 2)) / FLOPS  # 0.3286 s
    floor = (OVERHEAD + allreduce(8192) + busy(c1, mem)
             + OVERHEAD + allreduce(1808) + busy(c2, mem))
    assert c2 > mem
    assert floor == pytest.approx(1.77409, rel=1e-4)
    assert model.ttft_floor_s(10_000) == pytest.approx(floor, rel=1e-9)
    # Within one chunk it is the one-step prefill (reading one KV token more, a 1e-9 share of
    # the step); a 0-token prompt counts as 1 (as simulated).
    assert model.ttft_floor_s(2048) == pytest.approx(model.prefill_s(2048), rel=1e-8)
    assert model.ttft_floor_s(0) == model.ttft_floor_s(1) > 0


def test_a_gpu_without_a_fit_takes_the_literature_defaults():
    # p4d's A100 has no serving_fit in the catalog: MFU 0.5, MBU 0.7, 2 ms a step, the max.
    pool = parse_config(pool_yaml(with_gcp=False, instance_type="p4de.24xlarge")).pools[0]
    m = replica_model(pool, "aws")
    assert (m.prefill_mfu, m.decode_mbu, m.overhead_s, m.overlap_k) == (0.5, 0.7, 0.002,
                                                                        math.inf)


def test_pcie_all_reduce_costs_more_than_nvlink(model):
    pcie = dataclasses.replace(model, link_bytes_per_s=128e9 / 2)  # H100 PCIe Gen5
    assert pcie.decode_step_s(64, 1024) > model.decode_step_s(64, 1024)
    assert pcie.comm_s(8192) / model.comm_s(8192) > 3


def _with_perf(perf: str):
    text = pool_yaml(with_gcp=False).replace("    aws:\n", f"    perf:\n{perf}    aws:\n")
    return parse_config(text).pools[0]


def test_perf_factors_override_the_defaults():
    pool = _with_perf("      decode_mbu: 0.5\n      step_overhead_ms: 0\n")
    m = replica_model(pool, "aws")
    assert m.decode_mbu == 0.5 and m.overhead_s == 0
    assert m.memory_s(0) == pytest.approx(W_GPU / (3.35e12 * 0.5))
    assert m.prefill_mfu == MFU  # the others keep the catalog's


def test_calibration_reproduces_the_measurements():
    pool = _with_perf("      decode_ms_batch1: 30\n      decode_ms_batch64: 45\n"
                      "      prefill_tokens_per_s: 8000\n")
    m = replica_model(pool, "aws")
    assert m.decode_step_s(1, 1024) * 1000 == pytest.approx(30, rel=1e-9)
    assert m.decode_step_s(64, 1024) * 1000 == pytest.approx(45, rel=1e-9)
    assert m.prefill_tokens_per_s(2048) == pytest.approx(8000, rel=1e-9)
    assert 0 < m.decode_mbu < 1 and 0 < m.prefill_mfu < 1 and m.per_seq_s > 0


@pytest.mark.parametrize(("perf", "key"), [
    ("      decode_ms_batch1: 30\n      decode_ms_batch64: 30.01\n", "decode_ms_batch64"),
    ("      decode_ms_batch1: 5\n      decode_ms_batch64: 9\n", "decode_ms_batch1"),
    ("      prefill_tokens_per_s: 1000000\n", "prefill_tokens_per_s"),
])
def test_impossible_measurements_name_the_key(perf, key):
    with pytest.raises(UsageError, match=rf"perf\.{key}"):
        replica_model(_with_perf(perf), "aws")


def test_half_a_decode_measurement_is_a_schema_error():
    with pytest.raises(UsageError, match="perf"):
        _with_perf("      decode_ms_batch1: 30\n")


def test_every_catalog_gpu_has_compute_and_link_figures():
    from poolctl.catalog import load_catalog

    cat = load_catalog()
    for row in cat.instance_types:
        spec = cat.gpu_spec(row)  # KeyError if a GPU lacks its row
        assert spec.sources and spec.bf16_tflops > 0 and spec.pcie_gbytes_s > 0
        # An NVLink type's GPU has an NVLink figure; PCIe-only GPUs have none.
        assert (spec.nvlink_gbytes_s is not None) == row.nvlink, row.name
    # Dense peaks: half the datasheet's with-sparsity figures.
    assert cat.gpu_specs["H100"].bf16_tflops == pytest.approx(1979 / 2, rel=1e-3)
    assert cat.gpu_specs["H100"].fp8_tflops == pytest.approx(3958 / 2, rel=1e-3)
    assert all(len(s.sources) == 1 for s in cat.gpu_specs.values())  # no split on commas
