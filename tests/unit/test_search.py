"""`plan --search`: the configuration search, its Pareto front and choice, `--write`; the TPOT
SLO; power; and `plan --traffic` on hostile or unreachable traffic (one line each)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

import poolctl.search as S
from poolctl.capacity import judge, run_pool, smallest_count, ttft_floor
from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.commands.plansearch import render_search, write_changes
from poolctl.config import Target, load_config
from poolctl.errors import UsageError
from poolctl.rules import errors, run_checks
from poolctl.servingmodel import replica_model
from poolctl.simulate import simulate, summary
from poolctl.sizing import plan_pool
from poolctl.traces import Trace, load_trace
from tests.unit.test_simulate import ONE_MS, one_line, poolctl_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"
MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TPOT_SLO = 0.03  # 33 tokens/s per user: A100 nodes miss it, H100 and later meet it


@pytest.fixture(scope="module")
def setup():
    """The example with a TPOT target, five minutes of the Azure trace (1,445 requests)."""
    cfg = load_config(EXAMPLE)
    pool = cfg.pools[0]
    pool = pool.model_copy(update={"slo": pool.slo.model_copy(update={"tpot_p90_s": TPOT_SLO})})
    cfg = cfg.model_copy(update={"pools": [pool]})
    return cfg, pool, load_trace(AZURE).window(0, 300)


@pytest.fixture(scope="module")
def result(setup):
    cfg, pool, tr = setup
    return S.search(cfg, pool, "aws", tr, workers=1)


def resimulate(pool, cand: S.Candidate, tr: Trace):
    v = S.variant(pool, Cloud.aws, cand.config)
    res = run_pool(v, Cloud.aws, tr, replicas=cand.replicas, stop_if_p90_over=pool.slo.ttft_p90_s)
    return summary(res, pool.slo.ttft_p90_s, pool.slo.tpot_p90_s)


# ------------------------------------------------------------------------ the search


def test_the_choice_resimulated_alone_reproduces_its_figures_and_meets_the_slos(setup, result):
    cfg, pool, tr = setup
    ch = result.chosen
    assert ch is not None and ch.meets
    s = resimulate(pool, ch, tr)
    assert s == ch.summary  # every figure, to the last rounded digit
    assert s.ttft_s.p90 <= pool.slo.ttft_p90_s and s.tpot_s.p90 <= TPOT_SLO
    assert s.utilization <= pool.slo.target_utilization
    # It is the cheapest meeting the SLOs: nothing passing is cheaper.
    assert all(c.cost_per_hour_usd >= ch.cost_per_hour_usd for c in result.candidates
               if c.meets)


def test_the_next_cheaper_candidate_on_the_front_does_not_meet_the_slos(setup, result):
    cfg, pool, tr = setup
    cheaper = [c for c in result.front if c.cost_per_hour_usd < result.chosen.cost_per_hour_usd]
    assert cheaper, "the TPOT target makes the A100 nodes cheaper but too slow"
    nxt = cheaper[-1]
    s = resimulate(pool, nxt, tr)
    assert s == nxt.summary and not judge(s, pool.slo)


def test_pareto_front_of_a_hand_built_list(setup):
    cfg, pool, tr = setup
    base = summary(simulate(Trace("t", [0.0], [10], [5]), ONE_MS, replicas=1), 1.0)
    conf = S.file_configuration(pool, "aws")

    def cand(name, price, ttft, tpot, meets=True):
        s = dataclasses.replace(base, ttft_s=dataclasses.replace(base.ttft_s, p90=ttft),
                                tpot_s=dataclasses.replace(base.tpot_s, p90=tpot))
        c = dataclasses.replace(conf, instance_type=name)
        return S.Candidate(c, 1, 1, price, s, meets)

    a = cand("a", 10, 1.0, 0.05, meets=False)
    a2 = cand("a2", 10, 1.0, 0.05)  # the same point as a: one of them stays
    b = cand("b", 20, 0.5, 0.05)
    c = cand("c", 20, 0.6, 0.04)  # same cost as b, slower first token, faster tokens
    d = cand("d", 30, 0.5, 0.05)  # b at a higher price: dominated
    e = cand("e", 40, 0.4, 0.06)  # the fastest first token, costliest
    f = cand("f", 25, 0.7, 0.05)  # dominated by b (cheaper, faster) and by c
    front = S.pareto_front([d, c, f, e, a2, b, a])
    assert [x.config.instance_type for x in front] == ["a", "b", "c", "e"]
    assert S.choose([a, b, c, d, e, f]) is b  # cheapest passing; b beats c on TTFT at $20


def test_choose_prefers_serving_every_request_over_a_cheaper_pool_refusing_some(setup):
    cfg, pool, tr = setup
    base = summary(simulate(Trace("t", [0.0], [10], [5]), ONE_MS, replicas=1), 1.0)
    conf = S.file_configuration(pool, "aws")

    def cand(name, price, refused):
        s = dataclasses.replace(base, requests_over_max_model_len=refused)
        return S.Candidate(dataclasses.replace(conf, instance_type=name), 1, 1, price, s, True)

    short = cand("short", 10, 3)  # cheaper, but refuses 3 requests for max_model_len
    fewer = cand("fewer", 15, 1)
    full = cand("full", 20, 0)
    assert S.choose([short, fewer, full]) is full
    assert S.choose([short, fewer]) is fewer  # none serves all: the fewest refused
    assert S.choose([short, cand("short2", 12, 3)]) is short  # a tie: the cheaper


def test_more_gpus_never_raise_p90_ttft_for_a_fixed_configuration(setup, result):
    cfg, pool, tr = setup
    ch = result.chosen
    p90 = [resimulate(pool, dataclasses.replace(ch, nodes=n), tr.scaled(4)).ttft_s.p90
           for n in (1, 2, 3, 4)]
    assert p90 == sorted(p90, reverse=True), p90
    # And within the search, per configuration. Near its floor the p90 moves by the
    # balancer's tie-breaking (which replica a request lands on changes with the count):
    # within 2 %, never a real rise.
    for o in result.outcomes:
        xs = [c.summary.ttft_s.p90 for c in o.candidates]
        assert all(b <= a * 1.02 for a, b in zip(xs, xs[1:], strict=False)), (o.config, xs)


def test_rule_refused_configurations_are_absent(setup, result):
    cfg, pool, tr = setup
    types = {c.config.instance_type for c in result.candidates}
    # PCIe types, and p5e (the catalog offers it in us-east-2, not the pool's us-east-1).
    assert not types & {"g5.48xlarge", "g6.48xlarge", "g6e.48xlarge", "p5e.48xlarge"}
    # TP 1 on an 80 GB H100: 141 GB of weights cannot fit (fits-hbm).
    assert not any(c.config.tensor_parallel == 1 and c.config.instance_type == "p5.48xlarge"
                   for c in result.candidates)
    assert result.refused > 0
    for o in result.outcomes:
        v = S.variant(pool, "aws", o.config)
        trial = cfg.model_copy(update={"pools": [v]})
        assert not errors(run_checks(trial, [Target(v, Cloud.aws)])), o.config
    # Every remaining type of the cloud with NVLink and 8 GPUs offered in the region appears.
    offered = {r.name for r in load_catalog().instance_types if r.cloud == "aws" and r.nvlink
               and r.gpus == 8 and "us-east-1" in r.regions}
    assert {o.config.instance_type for o in result.outcomes} == offered


def test_workers_do_not_change_the_outcome(setup, monkeypatch):
    cfg, pool, tr = setup
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    short = tr.window(0, 60)
    one = S.search(cfg, pool, "aws", short, workers=1)
    two = S.search(cfg, pool, "aws", short, workers=2)
    assert one.to_json() == two.to_json()


def test_changes_name_the_differing_keys(setup, result):
    cfg, pool, tr = setup
    ch, sz = result.chosen, result.sizes
    assert sz is not None and sz.min_replicas == result.recommendation.min_replicas
    want = {"aws.instance_type": ch.config.instance_type,
            "serving.tensor_parallel": str(ch.config.tensor_parallel),
            "serving.max_num_seqs": str(ch.config.max_num_seqs),
            "serving.max_num_batched_tokens": str(ch.config.max_num_batched_tokens),
            "scaling.min_replicas": str(sz.min_replicas),
            "scaling.max_replicas": str(sz.max_replicas),
            "warm_pool.replicas": str(sz.warm_replicas)}
    file = {"aws.instance_type": "p5.48xlarge", "serving.tensor_parallel": "2",
            "serving.max_num_seqs": "256", "serving.max_num_batched_tokens": "8192",
            "scaling.min_replicas": "4", "scaling.max_replicas": "24",
            "warm_pool.replicas": "8"}
    assert {c.key: c.new for c in result.changes} == {k: v for k, v in want.items()
                                                      if file[k] != v}


def test_write_keeps_the_files_headroom_in_nodes():
    # The example: 4..24 replicas of TP 2 at 4 a node = 1..6 nodes, 8 warm = 2 warm nodes.
    # A TP 4 choice (2 a node) recommended at 1..1 nodes, no warm: min 1 node; max
    # max(1, 1 + (6 - 1)) = 6 nodes = 12 replicas; warm max(0, 2) = 2 nodes = 4 replicas.
    assert S.keep_headroom((1, 6, 2), (1, 1, 0), 2) == S.Sizes(2, 12, 4, 5, 2)
    # A recommendation above the file's headroom wins: rec 3..10 nodes, 3 warm, 4 a node:
    # max(10, 3 + 5) = 10 nodes = 40 replicas; warm max(3, 2) = 3 nodes = 12 replicas.
    assert S.keep_headroom((1, 6, 2), (3, 10, 3), 4) == S.Sizes(12, 40, 12, 7, 3)
    # A file with no headroom and no warm pool: the recommendation as it is.
    assert S.keep_headroom((2, 2, 0), (1, 3, 1), 8) == S.Sizes(8, 24, 8, 2, 1)


def test_sizes_use_the_files_nodes_and_the_choices_replicas_per_node(setup, result):
    cfg, pool, tr = setup
    ch, rec, sz = result.chosen, result.recommendation, result.sizes
    rpn = ch.replicas_per_node
    # The example's file: 1..6 nodes, 2 warm (4 replicas of TP 2 a node).
    rec_min, rec_max, rec_warm = (-(-x // rpn) for x in (rec.min_replicas, rec.max_replicas,
                                                          rec.warm_replicas))
    top = max(rec_max, rec_min + 5)
    assert (sz.min_replicas, sz.max_replicas, sz.warm_replicas) == (
        rec_min * rpn, top * rpn, max(rec_warm, 2) * rpn)


def test_sticky_routing_is_searched_on_a_trace_with_prefix_hashes(monkeypatch):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    monkeypatch.setattr(S, "LONGER_LENS", 0)
    cfg = load_config(EXAMPLE)
    pool = cfg.pools[0]
    # The sample's prompts are long: a loose TTFT target so that configurations pass.
    pool = pool.model_copy(update={"slo": pool.slo.model_copy(update={"ttft_p90_s": 6.0})})
    cfg = cfg.model_copy(update={"pools": [pool]})
    tr = load_trace(MOONCAKE)
    assert tr.blocks is not None
    # A100 (p4d) has no measured factors; ranked beside the fitted types here, it is the
    # cheapest on 2 nodes, where routing matters
    r = S.search(cfg, pool, Cloud.aws, tr, allow_unfitted=True)
    by = {c.config.balancer for c in r.candidates}
    assert by == {"lor", "sticky"}
    # sticky runs only the front's configurations (and the choice's) again
    lor_front = {c.config for c in S.pareto_front([c for c in r.candidates
                                                    if c.config.balancer == "lor"])}
    sticky = {dataclasses.replace(c.config, balancer="lor") for c in r.candidates
              if c.config.balancer == "sticky"}
    assert sticky <= lor_front | {dataclasses.replace(r.chosen.config, balancer="lor")}
    # Every candidate of a trace with hashes reports its hit rate, and the change names
    # the balancer when sticky is chosen.
    assert all(c.hit_rate is not None and 0 <= c.hit_rate <= 1 for c in r.candidates)
    # On 2 nodes sticky routing keeps a conversation's turns on the node caching its
    # prefix, so it hits more than least-outstanding routing of the same configuration and
    # is chosen (same cost); the change names the balancer.
    ch = r.chosen
    assert ch.config.balancer == "sticky" and ch.nodes >= 2
    lor = next(c for c in r.candidates if c.nodes == ch.nodes
               and c.config == dataclasses.replace(ch.config, balancer="lor"))
    assert ch.hit_rate > lor.hit_rate
    # Without --allow-unfitted the cheapest fitted candidate meeting the SLOs is chosen
    assert not ch.fitted
    fitted = S.choose(list(r.candidates))
    assert fitted is not None and fitted.fitted and fitted.meets
    assert fitted.cost_per_hour_usd > ch.cost_per_hour_usd
    assert all(c.cost_per_hour_usd >= fitted.cost_per_hour_usd
               for c in r.candidates if c.fitted and c.meets)
    assert {"key": "serving.balancer", "old": "lor", "new": "sticky"} in [
        c.to_json() for c in r.changes]


def test_no_sticky_axis_without_prefix_hashes(result):
    # Azure traces carry no hashes: least-outstanding routing only, no hit rate.
    assert {c.config.balancer for c in result.candidates} == {"lor"}
    assert all(c.hit_rate is None for c in result.candidates)


# ------------------------------------------------------------------------ the command


def test_plan_search_write_edits_exactly_the_changed_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", (2048,))
    f = tmp_path / "poolctl.yaml"
    shutil.copy(EXAMPLE, f)
    trace = tmp_path / "t.csv"
    trace.write_text("".join(AZURE.read_text().splitlines(keepends=True)[:400]))
    before = f.read_text()
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(f), "--cloud", "aws",
                                  "--traffic", str(trace), "--search", "--write", "--json")
    assert code == 0, err
    doc = json.loads(out)
    search = doc["pools"][0]["search"]
    changes = {c["key"]: c for c in search["changes"]}
    assert changes and len(doc["written"]) == len(changes)
    after = f.read_text()
    diff = [ln for ln in difflib.ndiff(before.splitlines(), after.splitlines())
            if ln[:1] in "+-"]
    # One line out and one in per key written in the file; a key the file leaves to its
    # default gains one line.
    written = [k for k, c in changes.items() if c["old"] is not None]
    assert len([ln for ln in diff if ln[0] == "-"]) == len(written)
    assert len([ln for ln in diff if ln[0] == "+"]) == len(changes)
    for k, c in changes.items():
        assert any(ln.startswith("+ ") and ln.strip().endswith(f"{k.split('.')[-1]}: {c['new']}")
                   for ln in diff), k
    # Comments and order kept; the file reads back with the choice.
    assert after.splitlines()[:2] == before.splitlines()[:2]
    p = load_config(f).pools[0]
    chosen = search["chosen"]
    assert (p.aws.instance_type, p.serving.tensor_parallel) == (chosen["instance_type"],
                                                               chosen["tensor_parallel"])
    assert p.scaling.min_replicas == doc["pools"][0]["recommendation"]["min_replicas"]
    # A second search on the written file changes nothing.
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(f), "--cloud", "aws",
                                  "--traffic", str(trace), "--search", "--json")
    assert code == 0, err and json.loads(out)["pools"][0]["search"]["changes"] == []


def test_plan_search_table_and_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    trace = tmp_path / "t.csv"
    trace.write_text("".join(AZURE.read_text().splitlines(keepends=True)[:300]))
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--traffic", str(trace), "--search")
    assert code == 0, err
    assert "Pareto front" in out and "chosen:" in out and "search chat-70b/aws: " in err
    for args, flag in ((["--search"], "--search"), (["--write", "--rate", "1"], "--write")):
        code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), *args)
        assert flag in one_line(code, err, 2)


def test_search_with_no_configuration_meeting_the_slo_names_the_floor(monkeypatch, capsys):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    # Mooncake's long prompts: even TP 8 on B200 prefills the p90 prompt in more than 0.3 s.
    f = EXAMPLE.parent / "poolctl.yaml"
    cfg = load_config(f)
    pool = cfg.pools[0]
    strict = pool.model_copy(update={"slo": pool.slo.model_copy(update={"ttft_p90_s": 0.3})})
    cfg = cfg.model_copy(update={"pools": [strict]})
    tr = load_trace(MOONCAKE)
    with pytest.raises(S.OperationFailed) as e:
        S.search(cfg, strict, "aws", tr)
    line = str(e.value)
    assert "no configuration meets slo.ttft_p90_s 0.3 s" in line and "\n" not in line
    fast = [o for o in S.evaluate_all(strict, "aws", tr, S.configurations(cfg, strict, "aws")[0])
            if o.config.instance_type == "p6-b200.48xlarge" and o.config.tensor_parallel == 8]
    floor = fast[0].ttft_p90_floor_s
    assert 0.3 < floor < 0.5
    assert ("the fastest prefill of any candidate (p6-b200.48xlarge TP 8, seqs 256, step 8192)"
            f" takes {fast[0].p90_prompt_floor_s:.2f} s for it, so the lowest TTFT p90 possible"
            f" is {floor:.2f} s") in line
    # A quarter above the floor, rounded up to 10 ms, is met at some cost.
    loose = math.ceil(floor * 1.25 * 100) / 100
    assert f"the nearest SLO met is slo.ttft_p90_s {loose:g} s: " in line and "/h" in line
    assert "76 requests longer than max_model_len 16,384 are refused" in line


# ------------------------------------------------------------------------ TPOT, goodput

# ONE_MS (from test_simulate): every step takes 1 ms, so a request of k output tokens
# alone gets its first token after 1 ms (the prefill step) and the others 1 ms apart.


def test_goodput_counts_requests_meeting_both_slos():
    # Two requests far apart, each alone: TTFT 1 ms; TPOT 1 ms for the 11-token answer, none
    # for the 1-token one (it meets any TPOT target).
    res = simulate(Trace("t", [0.0, 10.0], [10, 10], [11, 1]), ONE_MS, replicas=1)
    s = summary(res, 0.002, 0.0005)  # TPOT target 0.5 ms: the long answer misses it
    assert s.tpot_s.p90 == pytest.approx(0.001)
    assert (s.slo.ttft_met, s.slo.tpot_met, s.slo.met, s.slo.goodput) == (True, False, False,
                                                                          0.5)
    s = summary(res, 0.002, 0.002)
    assert (s.slo.met, s.slo.goodput) == (True, 1.0)
    s = summary(res, 0.0005)  # no TPOT target; TTFT 1 ms misses 0.5 ms: nobody meets it
    assert (s.slo.tpot_met, s.slo.met, s.slo.goodput) == (True, False, 0.0)
    assert s.to_json()["slo"]["tpot_p90_s"] is None


def test_plan_names_the_decode_floor_for_an_unreachable_tpot(tmp_path, monkeypatch, capsys):
    text = EXAMPLE.read_text().replace("ttft_p90_s: 2.0", "ttft_p90_s: 2.0\n      "
                                       "tpot_p90_s: 0.005")
    f = tmp_path / "poolctl.yaml"
    f.write_text(text)
    # One TP 2 replica streams its 70.6 GB weight shard per step at 3.35 TB/s x 0.7 MBU:
    # >= 30 ms a token, far over 5 ms.
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(f), "--cloud", "aws",
                                "--rate", "1", "--duration", "60")
    line = one_line(code, err, 1)
    assert "no replica count meets slo.tpot_p90_s 0.005 s" in line and "HBM floor" in line


# ------------------------------------------------------------------------ power


def test_plan_json_gives_power_at_min_and_max_nodes(monkeypatch, capsys):
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--json")
    assert code == 0, err
    e = json.loads(out)["pools"][0]
    # 4..24 replicas of TP 2 = 1..6 p5 nodes (warm nodes stopped draw nothing) x 10.2 kW.
    assert e["power_kw"] == {"min": 10.2, "max": 61.2}
    assert "DGX H100" in e["power_source"]


def test_energy_per_million_output_tokens_is_node_hours_times_power(setup):
    cfg, pool, tr = setup
    s = summary(run_pool(pool, "aws", tr, replicas=4), 2.0)
    # One p5 node (4 replicas of TP 2) over the horizon at 10.2 kW.
    kwh = s.horizon_s / 3600 * 10.2
    out_tokens = s.output_tokens_per_s * s.horizon_s
    assert s.energy.kwh == pytest.approx(kwh, abs=1e-3)
    assert s.energy.kwh_per_1m_output_tokens == pytest.approx(kwh / out_tokens * 1e6, rel=1e-3)
    assert plan_pool(pool, "aws").power_kw == {"min": 10.2, "max": 61.2}


# ------------------------------------------------------------------------ hostile traffic

HOSTILE = [
    ("empty.csv", "", 2, ":1: file: the trace is empty"),
    ("header.csv", AZ, 2, ":1: file: the trace has no requests"),
    ("negative.csv", f"{AZ}1.0,-5,3\n", 2, ":2: ContextTokens: '-5' is not a whole number"),
    ("text.csv", f"{AZ}1.0,many,3\n", 2, ":2: ContextTokens: 'many' is not a whole number"),
    ("unsorted.csv", f"{AZ}2.0,10,3\n1.0,10,3\n", 2, ":3: TIMESTAMP: earlier than the line"),
    ("bad.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"times\n', 2,
     ":2: line: not JSON"),
]
LONG = f"{AZ}1.0,16000,385\n2.0,20000,10\n"  # 16,385 and 20,010 tokens: over 16,384


def test_plan_refuses_traffic_all_over_max_model_len(tmp_path, monkeypatch, capsys):
    f = tmp_path / "long.csv"
    f.write_text(LONG)
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--traffic", str(f))
    assert "every one of the 2 requests in" in one_line(code, err, 1)


def test_search_tries_a_longer_max_model_len_for_longer_requests(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    f = tmp_path / "long.csv"
    f.write_text(LONG)
    assert S.model_lens(16_384, load_trace(f)) == [16_384, 32_768]  # 20,010 <= 32,768
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--traffic", str(f), "--search", "--json")
    assert code == 0, err
    search = json.loads(out)["pools"][0]["search"]
    assert search["chosen"]["max_model_len"] == 32_768
    assert search["chosen"]["requests_over_max_model_len"] == 0
    assert {"key": "serving.max_model_len", "old": "16384", "new": "32768"} in search["changes"]
    # With every request refused at 16,384, no 16,384 candidate serves anything.
    assert all(c["max_model_len"] == 32_768 for c in search["candidates"])


@pytest.mark.parametrize("search", [False, True], ids=["plan", "search"])
@pytest.mark.parametrize(("name", "text", "want", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_traffic_is_one_line(tmp_path, monkeypatch, capsys, name, text, want, says,
                                     search):
    monkeypatch.setattr(S, "MAX_NUM_SEQS", ())
    monkeypatch.setattr(S, "MAX_NUM_BATCHED_TOKENS", ())
    f = tmp_path / name
    f.write_text(text)
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--traffic", str(f), *(["--search"] if search else []))
    line = one_line(code, err, want)
    assert says in line, line


def test_write_writes_the_best_aggregated_candidate_beside_a_disaggregated_choice(
        setup, result, tmp_path, capsys):
    cfg, pool, tr = setup
    f = tmp_path / "poolctl.yaml"
    shutil.copy(EXAMPLE, f)
    agg = result.deployable
    assert agg is not None and agg.config.topology == S.AGGREGATED
    disagg = dataclasses.replace(result.chosen, config=dataclasses.replace(
        result.chosen.config, topology=S.DISAGG_NODE, split=4))
    done = write_changes(f, cfg, {("chat-70b", Cloud.aws): dataclasses.replace(
        result, chosen=disagg)})
    assert len(done) == len(result.changes)
    assert "wrote the best aggregated candidate" in capsys.readouterr().err
    p = load_config(f).pools[0]
    assert (p.aws.instance_type, p.serving.tensor_parallel) == (agg.config.instance_type,
                                                               agg.config.tensor_parallel)


def test_a_cost_cap_below_one_node_simulates_nothing(setup):
    cfg, pool, tr = setup
    c = S.file_configuration(pool, Cloud.aws)
    price = plan_pool(pool, Cloud.aws).price_per_node_hour_usd  # one p5: $55.04/h
    o = S.evaluate(pool, Cloud.aws, tr, c, 1, price - 0.01)
    assert o.candidates == () and o.reason == (f"one node costs over ${price - 0.01:,.2f}/h, "
                                               "the search's cap for it")


def test_a_disaggregated_choice_names_the_aggregated_one_beside_it(setup, result, capsys):
    cfg, pool, tr = setup
    agg = result.deployable
    disagg = dataclasses.replace(result.chosen, config=dataclasses.replace(
        result.chosen.config, topology=S.DISAGG_NODE, split=4))
    render_search(pool, dataclasses.replace(result, chosen=disagg))
    out = " ".join(capsys.readouterr().out.split())
    assert (f"poolctl does not deploy disagg-node serving yet: the best aggregated candidate "
            f"is {agg.nodes} node(s) of {agg.config.label()} at ${agg.cost_per_hour_usd:,.2f}/h"
            in out) and "`--write` writes that one" in out
    assert "keeps the file's headroom: 5 node(s) above the minimum" in out  # 6 - 1 file nodes


def test_write_refuses_a_disaggregated_choice_with_no_aggregated_one(setup, result, tmp_path):
    cfg, pool, tr = setup
    f = tmp_path / "poolctl.yaml"
    shutil.copy(EXAMPLE, f)
    before = f.read_text()
    disagg = dataclasses.replace(result.chosen, config=dataclasses.replace(
        result.chosen.config, topology=S.DISAGG_NODE, split=4))
    with pytest.raises(UsageError, match="disagg-node serving, which poolctl does not "
                       "deploy yet, and no aggregated candidate meets the SLOs; nothing was "
                       "written"):
        write_changes(f, cfg, {("chat-70b", Cloud.aws): dataclasses.replace(
            result, chosen=disagg, deployable=None)})
    assert f.read_text() == before


def test_disaggregated_configurations_only_where_each_side_fits(setup, result):
    cfg, pool, tr = setup
    cat = load_catalog()
    dis = [o.config for o in result.outcomes if o.config.topology != S.AGGREGATED]
    assert {c.topology for c in dis} == {S.DISAGG_NODE, S.DISAGG_CROSS}
    assert all(c.split == 4 for c in dis if c.topology == S.DISAGG_CROSS)
    for c in dis:
        # A side is a TP degree and two of them divide the node (even splits only); each
        # holds the weights and one max_model_len sequence.
        assert c.split == c.tensor_parallel and c.split in (1, 2, 4)
        assert replica_model(S.variant(pool, Cloud.aws, c), Cloud.aws).kv_tokens >= \
            c.max_model_len
        row = next(r for r in cat.instance_types if r.name == c.instance_type)
        if c.topology == S.DISAGG_CROSS:
            assert row.vpc is not None  # a sourced per-flow figure
        # The aggregated configuration at the side's TP passed the rules.
        assert any(o.config == dataclasses.replace(c, topology=S.AGGREGATED, split=0)
                   for o in result.outcomes)
    # Disaggregated node counts stop at the priciest aggregated point of the front.
    cap = max(c.cost_per_hour_usd for c in S.pareto_front(
        [c for c in result.candidates if c.config.topology == S.AGGREGATED]))
    assert all(c.cost_per_hour_usd <= cap for c in result.candidates if c.config.split)
    # 70B in 16-bit (~141 GB) never fits one 80 GB H100: no 1:1 on p5.
    assert not [c for c in dis if c.instance_type == "p5.48xlarge" and c.split == 1]
    # A disaggregated replica of s:s holds 2s GPUs: 8 / 2s share a node.
    for cand in result.candidates:
        if cand.config.split:
            assert cand.replicas_per_node == 8 // (2 * cand.config.split)


def test_plan_names_the_nearest_slo_met_and_its_cost(tmp_path, monkeypatch, capsys):
    f = tmp_path / "poolctl.yaml"
    f.write_text(EXAMPLE.read_text().replace("ttft_p90_s: 2.0", "ttft_p90_s: 1.5"))
    pool = load_config(f).pools[0]
    tr = load_trace(MOONCAKE)
    floor = ttft_floor(replica_model(pool, Cloud.aws), tr).ttft_p90_floor_s
    assert floor > 1.5  # TP 2 cannot prefill the p90 prompt within the SLO
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(f), "--cloud", "aws",
                                "--traffic", str(MOONCAKE))
    line = one_line(code, err, 1)
    near = math.ceil(floor * 1.25 * 100) / 100  # a quarter above the floor, up to 10 ms
    m = re.search(rf"\(e\.g\. {near:g} s is met with (\d+) replicas: (\d+) node\(s\), "
                  r"\$([\d,.]+)/h\)", line)
    assert m, line
    n, nodes, usd = int(m[1]), int(m[2]), float(m[3].replace(",", ""))
    assert nodes == -(-n // 4) and usd == pytest.approx(nodes * 55.04)  # 4 TP-2 replicas/node
    loose = pool.model_copy(update={"slo": pool.slo.model_copy(update={"ttft_p90_s": near})})

    def meets(k):
        return judge(summary(run_pool(loose, Cloud.aws, tr, replicas=k), near), loose.slo)

    assert meets(n) and (n == 1 or not meets(n - 1))


@pytest.mark.parametrize("start", [1, 2, 5, 6, 7, 40, 100])
def test_smallest_count_finds_the_threshold_from_any_start(start):
    calls = []

    def probe(n):
        calls.append(n)
        return None if n < 3 else n  # counts below 3 stop early (sure failures)

    # Passes from 6 on: the answer is 6 whatever the guess, in O(log) probes.
    assert smallest_count(probe, lambda n: n >= 6, start=start, limit=64) == (6, 6)
    assert len(calls) <= 2 * (64).bit_length()
    assert smallest_count(probe, lambda n: False, start=start, limit=64) is None
