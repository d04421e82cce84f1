"""vLLM automatic prefix caching in the simulator, the sticky balancer, and the block ids
traces carry (Mooncake `hash_ids`).

Traces here use 4-token blocks so that the hit rates can be computed by hand.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from poolctl.capacity import run_pool
from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.errors import UsageError
from poolctl.servingmodel import ReplicaModel, replica_model
from poolctl.simulate import simulate, summary
from poolctl.traces import MOONCAKE_BLOCK_TOKENS, Trace, load_trace

from .test_simulate import check_run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
B = 4  # tokens per block in the traces below


@pytest.fixture(scope="module")
def model() -> ReplicaModel:
    return replica_model(load_config(EXAMPLE).pools[0], Cloud.aws)


def apart(inputs: list[int], blocks: list[tuple[int, ...]], gap: float = 100.0) -> Trace:
    """Requests `gap` seconds apart (each done before the next: one replica, no overlap),
    2 output tokens each."""
    n = len(inputs)
    return Trace("by hand", [gap * i for i in range(n)], inputs, [2] * n, blocks, B)


def run(trace: Trace, m: ReplicaModel, **kw):
    res = simulate(trace, m, **kw)
    check_run(res, m)  # Little's law, and KV held (cached blocks included) within capacity
    return res


def test_hit_rate_on_known_repeats_is_the_hand_computed_one(model):
    tr = apart([12, 16, 8, 10, 12],
               [(1, 2, 3), (1, 2, 3, 4), (5, 6), (1, 2, 7), (1, 2, 3)])
    res = run(tr, model, replicas=1)
    # r0: 12 tokens, nothing cached.             r1: blocks 1-3 cached: 12 of 16.
    # r2: blocks 5, 6 new: 0 of 8.               r3: 10 // 4 = 2 full blocks (1, 2): 8 of 10
    #     (its third block, 7, is partial and never cached).
    # r4: all 3 blocks cached, but vLLM computes the last token again: 11 of 12.
    assert res.req.cached == [0, 12, 0, 8, 11]
    assert res.prefix_cache is not None
    assert res.prefix_cache.prompt_tokens == 12 + 16 + 8 + 10 + 12  # 58
    assert res.prefix_cache.hit_rate == pytest.approx((12 + 8 + 11) / 58)
    assert summary(res, 2.0).to_json()["prefix_cache"]["hit_rate"] == round(31 / 58, 4)


def test_hit_rate_falls_under_kv_pressure(model):
    # Sessions A, B, C of 8 blocks (32 tokens) each, in the order A B C A B C.
    a, b, c = (tuple(range(k * 10, k * 10 + 8)) for k in range(3))
    tr = apart([32] * 6, [a, b, c, a, b, c])
    roomy = run(tr, model, replicas=1).prefix_cache
    assert roomy is not None
    # Room for all: each second visit finds its 8 blocks, computes the last token again.
    assert roomy.hit_rate == pytest.approx(3 * 31 / (6 * 32))
    # 40 KV slots: one request's 33 (prompt and first token) leave 7 for cached blocks,
    # one block: by the time A comes back, B's and C's prompts have pushed A's blocks out
    # (only the last one freed, B's or C's first block, survives each admission).
    tight = run(tr, dataclasses.replace(model, kv_tokens=40), replicas=1).prefix_cache
    assert tight is not None
    assert tight.hit_rate == 0.0 and tight.evicted_blocks > 0


def test_cache_off_finds_no_hits_and_costs_the_full_prefill(model):
    tr = apart([12, 12], [(1, 2, 3), (1, 2, 3)])
    on = run(tr, model, replicas=1)
    off = run(tr, model, replicas=1, prefix_caching=False)
    assert off.prefix_cache is None and off.req.cached == [0, 0]
    assert summary(off, 2.0).to_json()["prefix_cache"] == {
        "enabled": False, "hit_rate": 0.0, "hit_tokens": 0, "prompt_tokens": None,
        "block_tokens": None, "evicted_blocks": 0}
    ttft = [f - a for f, a in zip(on.req.first, on.req.arrival, strict=True)]
    ttft_off = [f - a for f, a in zip(off.req.first, off.req.arrival, strict=True)]
    assert ttft[0] == pytest.approx(ttft_off[0])  # the first computes all 12 either way
    assert ttft[1] < ttft_off[1]


def conversations(sessions: int, turns: int, seed: int) -> Trace:
    """Multi-turn chats: turn k of a session repeats its k-1 earlier turns' blocks and adds
    4 new ones (16 tokens); sessions start at random and a turn follows the one before ~20 s
    later, so the turns of many sessions interleave."""
    rng = random.Random(seed)
    reqs: list[tuple[float, tuple[int, ...]]] = []
    next_id = 0
    for _ in range(sessions):
        t, blocks = rng.uniform(0, 60), tuple[int, ...]()
        for _ in range(turns):
            blocks = blocks + tuple(range(next_id, next_id + 4))
            next_id += 4
            reqs.append((t, blocks))
            t += rng.expovariate(1 / 20)
    reqs.sort()
    return Trace("chats", [t for t, _ in reqs], [len(b) * B for _, b in reqs],
                 [20] * len(reqs), [b for _, b in reqs], B)


def test_sticky_keeps_a_conversation_on_its_replica(model):
    tr = conversations(sessions=40, turns=6, seed=1)
    lor = run(tr, model, replicas=8, balancer="lor").prefix_cache
    sticky = run(tr, model, replicas=8, balancer="sticky").prefix_cache
    assert lor is not None and sticky is not None
    # Sticky: every turn after the first finds its whole history (the KV cache holds them
    # all): turn k of 6 reuses 4(k-1) of its 4k blocks, 16(k-1) tokens: 240 of 336 tokens
    # per session (no turn is cached whole, so none computes a token again). lor scatters
    # the turns over 8 replicas.
    assert sticky.hit_tokens == 40 * sum(16 * (k - 1) for k in range(1, 7))  # 9,600
    assert sticky.hit_rate == pytest.approx(240 / 336)
    assert sticky.hit_rate > lor.hit_rate


def test_sticky_pins_the_node_not_the_replica(model):
    """A cookie pins a node; inside it vLLM's data-parallel balancer knows no prefixes: with
    4 replicas per node a session's turns still spread over the node's replicas."""
    tr = conversations(sessions=40, turns=6, seed=1)
    per_replica = run(tr, model, replicas=8, balancer="sticky").prefix_cache
    per_node = run(tr, model, replicas=8, replicas_per_node=4, balancer="sticky").prefix_cache
    assert per_replica is not None and per_node is not None
    res = run(tr, model, replicas=8, replicas_per_node=4, balancer="sticky")
    first_node: dict[int, int] = {}
    for rid, r in enumerate(res.req.replica):
        assert r is not None and tr.blocks is not None
        assert first_node.setdefault(tr.blocks[rid][0], r // 4) == r // 4
    assert per_node.hit_rate < per_replica.hit_rate


def test_ttft_never_beats_the_prefill_floor_of_uncached_tokens(model):
    tr = conversations(sessions=40, turns=6, seed=2)
    for balancer in ("lor", "sticky"):
        q = run(tr, model, replicas=4, balancer=balancer).req
        for i in range(len(tr)):
            floor = model.ttft_floor_s(q.inputs[i], q.cached[i])
            assert q.first[i] - q.arrival[i] >= floor * (1 - 1e-9)
    # and the floor is the compute of what is not cached: 11 of 12 cached is one token's step
    assert model.ttft_floor_s(12, 11) < model.ttft_floor_s(12)
    assert model.ttft_floor_s(12, 11) == pytest.approx(
        model.step_s(1, 13, model.attn_flops(1, 11)))


def test_azure_and_synthetic_traces_carry_no_blocks():
    assert load_trace(ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv").blocks is None


def test_mooncake_blocks_are_read_as_ids_of_512_tokens(tmp_path):
    tr = load_trace(ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl")
    assert tr.blocks is not None and tr.block_tokens == MOONCAKE_BLOCK_TOKENS == 512
    assert tr.blocks[0] == tuple(range(79))  # 40,160 tokens: ceil(40160 / 512) = 79 ids
    assert tr.scaled(2).blocks == tr.blocks and tr.window(0, 0.1).blocks == tr.blocks[:3]
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, '
                 '"hash_ids": [1, "x"]}\n')
    with pytest.raises(UsageError, match=r"t.jsonl:1: hash_ids: not a list of block ids"):
        load_trace(f)
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    assert load_trace(f).blocks is None


def test_simulate_reports_the_hit_rate_per_balancer(monkeypatch, capsys, tmp_path):
    import json

    from .test_simulate import poolctl_main

    # TP 8: one replica per node, so a cookie pins the replica itself.
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text().replace("tensor_parallel: 2", "tensor_parallel: 8"))
    trace = ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl"
    got = {}
    for balancer in ("lor", "sticky"):
        code, out, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(cfg),
                                      "--cloud", "aws", "--trace", str(trace), "--replicas",
                                      "4", "--balancer", balancer, "--json")
        assert code in (0, None), err
        got[balancer] = json.loads(out)["prefix_cache"]
    assert got["lor"]["enabled"] and got["lor"]["block_tokens"] == 512
    assert got["sticky"]["hit_rate"] > got["lor"]["hit_rate"] > 0
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(cfg), "--cloud",
                                "aws", "--trace", str(trace), "--replicas", "4",
                                "--balancer", "nearest")
    assert code == 2 and "--balancer: 'nearest' is not one of lor, queue, sticky" in err


def test_run_pool_routes_as_the_file_says(tmp_path):
    """`plan --traffic` and the search size the pool with the file's serving.balancer."""
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text().replace("tensor_parallel: 2", "tensor_parallel: 8"))
    lor = load_config(cfg).pools[0]
    sticky = lor.model_copy(update={"serving": lor.serving.model_copy(
        update={"balancer": "sticky"})})
    tr = load_trace(ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl")
    rate = {name: run_pool(p, Cloud.aws, tr, replicas=4).prefix_cache
            for name, p in (("lor", lor), ("sticky", sticky))}
    explicit = run_pool(lor, Cloud.aws, tr, replicas=4, balancer="sticky").prefix_cache
    assert rate["sticky"] == explicit and rate["sticky"] != rate["lor"]


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_kv_held_stays_within_capacity_under_preemption(model, seed):
    """Tight KV (room for ~3 long turns), many interleaved chats: preemptions and evictions
    happen, and running sequences plus cached blocks never pass the capacity."""
    tr = conversations(sessions=30, turns=8, seed=seed).scaled(20)  # ~60 requests/s
    tight = dataclasses.replace(model, kv_tokens=600)
    res = run(tr, tight, replicas=2, balancer="sticky")  # check_run: max KV <= 600
    p = res.prefix_cache
    assert p is not None and 0 < p.hit_tokens < p.prompt_tokens
    assert res.preemptions > 0 and p.evicted_blocks > 0
