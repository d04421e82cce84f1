"""Disaggregated prefill/decode replicas (`--topology disagg-node|disagg-cross`): the KV
transfer enters TTFT, decode steps never carry a prefill chunk, the split and the link
figures come from the catalog."""

from __future__ import annotations

import math

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.errors import UsageError
from poolctl.servingmodel import replica_model, topology
from poolctl.simulate import simulate, summary
from poolctl.traces import Trace, load_trace

from .test_prefix_cache import ROOT
from .test_simulate import check_run, poolctl_main

EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"


@pytest.fixture(scope="module")
def pool():
    return load_config(EXAMPLE).pools[0]


def test_links_are_the_catalogs_figures(pool):
    node = topology(pool, Cloud.aws, "disagg-node", 4, 4)
    # p5: H100 NVLink 900 GB/s both ways -> 450 one way, x the pool's link efficiency (the
    # NCCL share the serving model uses for all-reduces), 4 GPUs each moving its shard.
    eff = node.prefill.link_efficiency
    assert 0 < eff <= 1
    assert node.link_bytes_per_s == pytest.approx(4 * 450e9 * eff)
    cross = topology(pool, Cloud.aws, "disagg-cross", 4, 4)
    # 4 TCP flows x 5 Gbit/s (no cluster placement group) = 20 Gbit/s, under the primary
    # card's 100 Gbit/s shared by the node's 2 prefill instances (50): 2.5 GB/s.
    assert cross.link_bytes_per_s == pytest.approx(20e9 / 8)
    # Llama-3.1-70B: 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 327,680 B a token.
    assert cross.kv_bytes_per_token == 327_680
    assert cross.transfer_s(1000) == pytest.approx(1000 * 327_680 / 2.5e9)  # 0.131 s


def test_ttft_is_prefill_then_transfer_then_the_first_decode_step(pool):
    topo = topology(pool, Cloud.aws, "disagg-cross", 4, 4)
    p, d = topo.prefill, topo.decode
    n = 3000
    res = simulate(Trace("one", [0.0], [n], [10]), p, replicas=1, topology=topo)
    check_run(res)
    # Alone: the prefill instance's compute floor (chunks of 8,192: one step), the KV of
    # 3,000 tokens over 2.5 GB/s, then the decode side computes the last prompt token
    # (attending to the 2,999 received) reading the request's 3,001 KV slots.
    want = (p.ttft_floor_s(n) + n * 327_680 / 2.5e9
            + d.step_s(1, n + 1, d.attn_flops(1, n - 1)))
    assert res.req.first[0] == pytest.approx(want)
    topo_out = summary(res, 2.0).topology
    assert topo_out is not None and topo_out.kv_transfer_s_mean == pytest.approx(
        n * 327_680 / 2.5e9, abs=1e-5)
    assert summary(res, 2.0).to_json()["topology"]["kind"] == "disagg-cross"
    node = topology(pool, Cloud.aws, "disagg-node", 4, 4)
    fast = simulate(Trace("one", [0.0], [n], [10]), p, replicas=1, topology=node)
    assert fast.req.first[0] < res.req.first[0]  # NVLink moves it in well under a ms


def test_decode_steps_never_wait_behind_a_prefill_chunk(pool):
    """A decoding request's steps in a disaggregated replica cost at most a decode step of
    everything that can be on the decode side; an 8,000-token prompt arriving meanwhile
    adds a chunk to an aggregated replica's steps, not to these."""
    topo = topology(pool, Cloud.aws, "disagg-node", 4, 4)
    d = topo.decode
    tr = Trace("two", [0.0, 0.5], [100, 8000], [400, 2])
    res = simulate(tr, topo.prefill, replicas=1, topology=topo)
    check_run(res)
    q = res.req
    tpot = (q.finish[0] - q.first[0]) / (400 - 1)
    # The costliest step the decode side can take here: request 0 at its full 501 tokens
    # and request 1's last prompt token over its 8,001 (batch 2, both KV caches read).
    bound = d.step_s(2, 501 + 8002, d.attn_flops(1, 7999), 1)
    assert tpot <= bound
    chunk = d.step_s(8000 + 1, 8002 + 501, d.attn_flops(8000, 0), 1)
    assert chunk > 10 * bound  # what one aggregated step with the chunk costs
    agg = simulate(tr, replica_model(pool, Cloud.aws), replicas=1)
    assert (agg.req.finish[0] - agg.req.first[0]) / 399 > tpot


def test_azure_trace_runs_in_every_topology(pool):
    tr = load_trace(AZURE).window(0, 300)
    for kind in ("disagg-node", "disagg-cross"):
        topo = topology(pool, Cloud.aws, kind, 4, 4)
        res = simulate(tr, topo.prefill, replicas=2, topology=topo)
        check_run(res)  # Little's law: nothing lost in the transfers
        assert all(not math.isnan(f) for f in res.req.finish)


def test_a_saturated_link_fills_the_prefill_side_but_never_past_its_kv(pool):
    """The prefill instance holds each request's KV until it has crossed: at twice the
    trace's rate, ~4.2 GB/s of KV against a 2.5 GB/s path, the held KV reaches the prefill
    side's capacity (admission then waits), and never passes it."""
    topo = topology(pool, Cloud.aws, "disagg-cross", 4, 4)
    assert topo.prefill.kv_tokens == topo.decode.kv_tokens  # 4:4: one bound for both sides
    res = simulate(load_trace(AZURE).window(0, 600).scaled(2), topo.prefill, replicas=1,
                   topology=topo)
    check_run(res)
    assert res.max_kv_tokens <= topo.prefill.kv_tokens
    assert res.max_kv_tokens > 0.9 * topo.prefill.kv_tokens


@pytest.mark.parametrize(("args", "msg"), [
    (["--topology", "disagg-ring"], "--topology: 'disagg-ring' is not one of"),
    (["--topology", "disagg-node", "--split", "3:5"], "--split 3:5: each side is a"),
    (["--topology", "disagg-node", "--split", "4:8"], "do not divide p5.48xlarge's 8"),
    (["--topology", "disagg-node", "--split", "1:1"], "less than one max_model_len"),
    (["--topology", "disagg-node", "--split", "four"], "--split: 'four' is not PREFILL:DECODE"),
    # issue 31: a flag that does not apply is refused, not silently ignored
    (["--split", "x;rm -rf /"], "--split: 'x;rm -rf /' is not PREFILL:DECODE"),
    (["--split", "4:4"], "--split 4:4: applies to a disaggregated topology only"),
    (["--topology", "aggregated", "--split", "2:6"], "--split 2:6: applies to a disagg"),
])
def test_bad_topology_is_one_line(monkeypatch, capsys, args, msg):
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--rate", "1", "--duration", "10", "--replicas", "1",
                                *args)
    lines = [ln for ln in err.splitlines() if ln.startswith("poolctl:")]
    assert code == 2 and len(lines) == 1 and msg in lines[0], err


def test_cross_node_needs_sourced_vpc_figures(pool):
    gcp = load_config(EXAMPLE).pools[0]
    with pytest.raises(UsageError, match="no sourced VPC bandwidth for a3-highgpu-8g"):
        topology(gcp, Cloud.gcp, "disagg-cross", 4, 4)
