"""Mixture of experts, hidden size and the closed loop (issue 33), worked out by hand."""

from __future__ import annotations

import json

import pytest

from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.errors import UsageError
from poolctl.models import estimate_params, preset, read_hf_config
from poolctl.servingmodel import replica_model
from poolctl.simulate import simulate
from poolctl.sizing import plan_pool
from poolctl.traces import Trace

POOL = """\
project: acme
pools:
  - name: m
    model: {{id: {model}{extra}}}
    serving: {{image: vllm/vllm-openai:v0.11.0, tensor_parallel: {tp}, max_model_len: 16384}}
    scaling: {{min_replicas: 1, max_replicas: 4}}
    aws: {{region: us-east-1, instance_type: p5.48xlarge, weights_uri: s3://acme-models/m/}}
"""


def pool(model: str, tp: int = 1, extra: str = ""):
    return parse_config(POOL.format(model=model, tp=tp, extra=extra)).pools[0]


# Qwen3-30B-A3B's config.json (the Hugging Face file's shape keys; aiconfigurator-core ships
# the same file): 48 layers, hidden 2048, 128 experts of width 768, 8 per token.
QWEN3_30B_A3B = {
    "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_config_json_gives_hidden_size_and_the_experts(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(QWEN3_30B_A3B))
    got = read_hf_config(f)
    assert (got["hidden_size"], got["experts"], got["experts_per_token"]) == (2048, 128, 8)
    # By hand: attention 2048 x (32 x 128 x 2 + 4 x 128 x 2) = 18.87 M a layer; an expert
    # 3 x 2048 x 768 = 4.72 M; the router 2048 x 128; norms 2 x 2048; embeddings
    # 2 x 151936 x 2048 = 622.3 M. All 128 experts: 30.53 B; 8 of them: 3.35 B (the card:
    # 30.5 B total, 3.3 B activated).
    attn = 2048 * (32 * 128 * 2 + 4 * 128 * 2)
    expert = 3 * 2048 * 768
    rest = 2048 * 128 + 2 * 2048
    embed = 2 * 151936 * 2048 + 2048
    assert got["params_b"] == round((48 * (attn + 128 * expert + rest) + embed) / 1e9, 2) == 30.53
    assert got["active_params_b"] == round((48 * (attn + 8 * expert + rest) + embed) / 1e9, 2)
    assert got["active_params_b"] == 3.35
    dense = dict(QWEN3_30B_A3B, num_experts=None, moe_intermediate_size=None)
    assert estimate_params(dense, active=True) == estimate_params(dense)


def test_hidden_size_comes_from_the_preset_not_the_heads():
    # Qwen3-32B: 64 heads x 128 = 8,192, but config.json's hidden_size is 5,120; the
    # all-reduce moves hidden_size values per token.
    p = preset("Qwen/Qwen3-32B")
    assert p is not None and p.attention_heads * p.head_dim == 8192 and p.hidden_size == 5120
    rm = replica_model(pool("Qwen/Qwen3-32B", tp=4), "aws")
    assert rm.hidden == 5120


def test_moe_weights_in_hbm_count_every_expert_and_compute_the_active_ones():
    m = pool("Qwen/Qwen3-30B-A3B")
    plan = plan_pool(m, "aws")
    assert plan.weights_bytes_per_gpu == pytest.approx(30.5e9 * 2)  # every expert, bf16
    rm = replica_model(m, "aws")
    assert rm.active_params == pytest.approx(3.35e9)
    # one expert (all layers) = (30.5 - 3.35) B / (128 - 8) = 0.22625 B params, 2 bytes each
    assert rm.expert_bytes_per_gpu == pytest.approx((30.5e9 - 3.35e9) / 120 * 2)
    # prefill FLOPs: 2 x active x tokens
    n = 4096
    assert rm.compute_s(n) == pytest.approx(
        2 * 3.35e9 * n / (rm.tp * rm.peak_flops_per_gpu * rm.prefill_mfu))


def test_moe_decode_reads_the_experts_a_batch_routes_to():
    rm = replica_model(pool("Qwen/Qwen3-30B-A3B"), "aws")
    e, b = 128, rm.expert_bytes_per_gpu
    dense = rm.weights_bytes_per_gpu - e * b
    # batch 1: 8 experts of 128; expected distinct experts of B tokens routed uniformly to
    # 8 of 128: 128 (1 - (120/128)^B): 8 at B = 1, 51.6 at 8 (0.9375^8 = 0.5967), 125.9 at 64.
    assert rm.weights_read(1) == pytest.approx(dense + 8 * b)
    assert rm.weights_read(8) == pytest.approx(dense + 128 * (1 - (120 / 128) ** 8) * b)
    assert 128 * (1 - (120 / 128) ** 8) == pytest.approx(51.62, abs=0.01)
    assert rm.weights_read(64) == pytest.approx(dense + 128 * (1 - (120 / 128) ** 64) * b)
    # at prefill sizes every expert is read: the dense model's bytes
    assert rm.weights_read(8192) == pytest.approx(rm.weights_bytes_per_gpu, rel=1e-9)
    # a decode step at batch 1 reads far less than all the weights; more sequences, more
    assert rm.decode_step_s(1, 1024) < rm.decode_step_s(8, 1024) < rm.decode_step_s(64, 1024)
    assert rm.memory_s(1024, 1) < 0.35 * rm.memory_s(1024)


def test_a_mixture_of_experts_needs_all_three_keys():
    with pytest.raises(UsageError, match="experts_per_token"):
        pool("acme/moe", extra=", params_b: 50, dtype: bfloat16, layers: 32, kv_heads: 8, "
             "head_dim: 128, experts: 16")
    with pytest.raises(UsageError, match="more than the 16 experts"):
        pool("acme/moe", extra=", params_b: 50, dtype: bfloat16, layers: 32, kv_heads: 8, "
             "head_dim: 128, experts: 16, experts_per_token: 32, active_params_b: 10")
    with pytest.raises(UsageError, match="active_params_b"):
        pool("acme/moe", extra=", params_b: 50, dtype: bfloat16, layers: 32, kv_heads: 8, "
             "head_dim: 128, experts: 16, experts_per_token: 2, active_params_b: 60")


# ---------------------------------------------------------------------- the closed loop

def _loop(n: int, clients: int, jitter: float, spread: bool = False):
    rm = replica_model(pool("meta-llama/Llama-3.1-8B-Instruct"), Cloud.aws)
    # +-5 % around 1024 and 128, spread evenly (as measured_runs.py's SPREAD)
    inputs = [1024 + (i * 37) % 103 - 51 if spread else 1024 for i in range(n)]
    outputs = [128 + (i * 7) % 13 - 6 if spread else 128 for i in range(n)]
    return simulate(Trace("loop", [0.0] * n, inputs, outputs), rm, replicas=1,
                    balancer="queue", clients=clients, send_jitter_s=jitter).req


def test_a_closed_loop_holds_its_clients_and_obeys_littles_law():
    n, c = 400, 16
    r = _loop(n, c, 0.005)
    # never more than `clients` outstanding: at each send, count the sent-not-finished
    for i in range(n):
        assert sum(1 for j in range(n) if r.sent[j] <= r.sent[i] < r.finish[j]) <= c
    # Little's law over the run: clients = throughput x time in system (send to finish),
    # exact for a closed loop that is always full; the ramp-down at the end costs a little.
    span = max(r.finish) - min(r.sent)
    in_system = sum(f - s for f, s in zip(r.finish, r.sent, strict=True))
    assert in_system / span == pytest.approx(c, rel=0.05)


def test_without_jitter_equal_requests_stay_phase_locked_and_jitter_breaks_the_lock():
    n, c = 160, 8
    locked = _loop(n, c, 0.0)
    firsts = {round(locked.first[i] - locked.sent[i], 9) for i in range(c, n)}
    # After the first round each round's requests are sent together and prefilled together:
    # at most two TTFTs (one round split at most once)
    assert len(firsts) <= 2
    drift = _loop(n, c, 0.005, spread=True)
    ttft_locked = sum(locked.first[i] - locked.sent[i] for i in range(n)) / n
    ttft_drift = sum(drift.first[i] - drift.sent[i] for i in range(n)) / n
    assert ttft_drift < 0.6 * ttft_locked
