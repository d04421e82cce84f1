"""4-bit weights (issue 33, part 3): bytes per parameter, the tensor-core peak they compute
at, and whether any measured run checked the factors for their dtype. Worked out by hand
from the catalog's datasheet figures."""

from __future__ import annotations

import pytest

from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.servingmodel import fitted, replica_model
from poolctl.sizing import plan_pool

POOL = """\
project: acme
pools:
  - name: q
    model: {{id: meta-llama/Llama-3.1-70B-Instruct, dtype: {dtype}}}
    serving: {{image: vllm/vllm-openai:v0.11.0, tensor_parallel: 2, max_model_len: 8192}}
    scaling: {{min_replicas: 1, max_replicas: 4}}
    aws: {{region: us-east-1, instance_type: {itype}, weights_uri: s3://acme-models/m/}}
"""
H100, B200 = "p5.48xlarge", "p6-b200.48xlarge"


def pool(dtype: str, itype: str = B200):
    return parse_config(POOL.format(dtype=dtype, itype=itype)).pools[0]


def test_fp4_weights_take_their_bits_and_their_scales():
    bf16 = plan_pool(pool("bfloat16"), Cloud.aws).weights_bytes_per_gpu
    # NVFP4: 16 four-bit values share one FP8 scale = 72 bits per 16 = 4.5 bits; MXFP4: 32
    # share one 8-bit scale = 136 bits per 32 = 4.25 bits; BF16 is 16 bits.
    assert plan_pool(pool("nvfp4"), Cloud.aws).weights_bytes_per_gpu == pytest.approx(
        bf16 * 4.5 / 16)
    assert plan_pool(pool("mxfp4"), Cloud.aws).weights_bytes_per_gpu == pytest.approx(
        bf16 * 4.25 / 16)


@pytest.mark.parametrize(("dtype", "itype", "tflops"), [
    ("nvfp4", B200, 9000),  # FP4 tensor cores: 18 PFLOPS with sparsity, 9 dense
    ("mxfp4", B200, 9000),
    ("fp8", B200, 4500),
    ("bfloat16", B200, 2250),
    ("nvfp4", H100, 989),  # no FP4 tensor cores: weight-only kernels at the BF16 rate
    ("fp8", H100, 1979),
])
def test_weights_compute_at_the_peak_of_their_precision_where_the_gpu_has_it(dtype, itype,
                                                                            tflops):
    assert replica_model(pool(dtype, itype), Cloud.aws).peak_flops_per_gpu == tflops * 1e12


@pytest.mark.parametrize(("dtype", "itype", "is_fitted"), [
    ("bfloat16", H100, True),  # measured BF16 and FP8 runs on H100 (the engine fit's scales)
    ("float16", H100, True),  # BF16's kernels
    ("fp8", H100, True),
    ("fp8", B200, True),  # B200's measured runs are FP8 only
    ("bfloat16", B200, False),
    ("nvfp4", B200, False),  # no FP4 run anywhere: the literature's share of the peak
    ("mxfp4", H100, False),
])
def test_a_pool_is_fitted_only_for_a_dtype_its_gpus_runs_measured(dtype, itype, is_fitted):
    assert fitted(pool(dtype, itype), Cloud.aws) is is_fitted
