"""The simulator against queueing theory, its invariants, and the traces it reads.

Every simulated run goes through `run()`, which checks Little's law (within 2 %) and the
replica limits (KV tokens, running sequences) before a test looks at the numbers.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

from poolctl.capacity import busiest_window, recommend, run_pool
from poolctl.config import load_config
from poolctl.errors import UsageError
from poolctl.servingmodel import ReplicaModel, replica_model
from poolctl.simulate import AWS_SCALE_IN_COOLDOWN_S, METRIC_PERIOD_S, simulate, summary
from poolctl.sizing import plan_pool
from poolctl.traces import Trace, load_trace, synthetic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"


def check_run(res, m: ReplicaModel | None = None) -> None:
    """Little's law and the replica limits, on every run."""
    q = res.req
    done = [i for i, f in enumerate(q.finish) if f == f]
    assert len(done) + sum(q.refused) == len(q.arrival)  # nothing lost
    h = res.horizon_s
    mean_in_system = res.in_system_integral / h
    lam = len(done) / h
    w = statistics.fmean(q.finish[i] - q.arrival[i] for i in done)
    assert mean_in_system == pytest.approx(lam * w, rel=0.02)
    if m is not None:
        assert res.max_kv_tokens <= m.kv_tokens
        assert res.max_running <= m.max_num_seqs


def run(trace, m, **kw):
    res = simulate(trace, m, **kw)
    check_run(res, m)
    return res


def run_p(pool, cloud, trace, **kw):
    res = run_pool(pool, cloud, trace, **kw)
    check_run(res, replica_model(pool, cloud))
    return res


@pytest.fixture(scope="module")
def pool():
    return load_config(EXAMPLE).pools[0]


@pytest.fixture(scope="module")
def model(pool):
    return replica_model(pool, "aws")


@pytest.fixture(scope="module")
def azure():
    return load_trace(AZURE)


# ------------------------------------------------------------------ queueing theory

# One replica whose every step takes exactly 1 ms: the weights stream in 1 ms, compute and
# KV reads are negligible. A request of k output tokens then holds it for k ms (its prefill
# step emits the first token), and max_num_seqs 1 makes each replica one server.
ONE_MS = ReplicaModel(
    role="mixed", tp=1, params=1e6, layers=1, hidden=1.0, weights_bytes_per_gpu=1e9,
    kv_bytes_per_token_per_gpu=0, kv_tokens=10**7, max_num_seqs=1, max_num_batched_tokens=8192,
    max_model_len=10**7, peak_flops_per_gpu=1e15, hbm_bytes_per_s=1e12, link_bytes_per_s=1e11,
    prefill_mfu=1, decode_mbu=1, link_efficiency=1, overhead_s=0,
)
OUT_MEAN = 100  # ceil(Exp(100)) tokens: geometric, CV^2 0.99 - exponential for the test


def erlang_c_wait(c: int, lam: float, s: float) -> float:
    """Mean wait in queue of M/M/c: C(c, a) / (c mu - lambda), a = lambda / mu."""
    a = lam * s
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail) / (c / s - lam)


def mmc_trace(c: int, rho: float, n: int, seed: int) -> Trace:
    s = 1e-3 / (1 - math.exp(-1 / OUT_MEAN))  # mean of ceil(Exp(100)) ms = 100.5 ms
    lam = rho * c / s
    tr = synthetic(lam, n / lam, seed, 1, OUT_MEAN)
    return Trace(tr.source, tr.arrivals, [1] * len(tr), tr.outputs)  # 1-token prompts


def fcfs_waits(arrivals, services, c):
    """The c-server first-come first-served queue, by recursion (Kiefer-Wolfowitz)."""
    free, waits = [0.0] * c, []
    for a, s in zip(arrivals, services, strict=True):
        start = max(a, heapq.heappop(free))
        waits.append(start - a)
        heapq.heappush(free, start + s)
    return waits


@pytest.mark.parametrize("c", [1, 4, 8])
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_replicas_are_exactly_a_c_server_queue(c, rho):
    # Path by path, not only on average: every wait equals the c-server FCFS recursion's on
    # the same arrivals and service times, so the simulator's mean wait IS an M/M/c sample.
    tr = mmc_trace(c, rho, 10_000, seed=5)
    res = run(tr, ONE_MS, replicas=c, balancer="queue")
    q = res.req
    sim = [q.admitted[i] - q.arrival[i] for i in range(len(tr))]
    ref = fcfs_waits(tr.arrivals, [k * 1e-3 for k in tr.outputs], c)
    assert max(abs(x - y) for x, y in zip(sim, ref, strict=True)) < 1e-9
    assert max(sim) > 0.05  # queues did form


# Direct comparisons with Erlang C over the whole grid. The sample sizes follow the variance
# of a queue's mean wait, which grows like 1/(1-rho)^4 for M/M/1 (Whitt 1989): 600,000
# requests give M/M/1 at rho 0.9 a standard error of about 2.7 %; the other cases need
# far fewer. Measured with seeds 1 and 2 at 200,000 requests (600,000 for M/M/1 at 0.9):
# every case within 3.4 %.
ERLANG_GRID = [(c, rho, 600_000 if (c, rho) == (1, 0.9) else 200_000 if rho == 0.9 else 120_000)
               for c in (1, 4, 8) for rho in (0.5, 0.7, 0.9)]


@pytest.mark.parametrize(("c", "rho", "n"), ERLANG_GRID)
def test_mean_queue_wait_matches_erlang_c(c, rho, n):
    tr = mmc_trace(c, rho, n, seed=1)
    res = run(tr, ONE_MS, replicas=c, balancer="queue")
    q = res.req
    skip = len(tr) // 20  # the first 5 % start from an empty pool
    wait = statistics.fmean(q.admitted[i] - q.arrival[i] for i in range(skip, len(tr)))
    # Erlang C at the load this sample carries (its arrival rate and mean service time).
    lam = (len(tr) - 1) / (tr.arrivals[-1] - tr.arrivals[0])
    s = statistics.fmean(tr.outputs) * 1e-3
    assert wait == pytest.approx(erlang_c_wait(c, lam, s), rel=0.05)


def test_least_outstanding_balancer_waits_longer_than_a_central_queue():
    # The clouds' balancers route at arrival (join the shortest queue): a request can wait
    # behind a busy replica while another frees up, so waits exceed M/M/c's.
    tr = mmc_trace(4, 0.7, 20_000, seed=2)
    lor = run(tr, ONE_MS, replicas=4, balancer="lor").req
    central = run(tr, ONE_MS, replicas=4, balancer="queue").req
    w = lambda q: statistics.fmean(a - b for a, b in zip(q.admitted, q.arrival, strict=True))  # noqa: E731
    assert w(lor) > 1.2 * w(central)


# ------------------------------------------------------------------ the example pool


def test_more_replicas_never_raise_p90_ttft(model, azure):
    tr = azure.window(0, 1200)
    p90 = [summary(run(tr, model, replicas=n), 2.0)["ttft_s"]["p90"] for n in (2, 3, 4, 6, 8)]
    assert p90 == sorted(p90, reverse=True), p90
    assert p90[0] > 10 * p90[-1]  # the range spans overload to comfort


def test_replica_limits_bind_and_hold(pool, azure):
    # 2 replicas for 20 minutes of the trace: the KV cache fills (preemptions) and a small
    # max_num_seqs caps the batch; neither limit is ever exceeded (checked in run()).
    plan = plan_pool(pool, "aws")
    m = replica_model(pool, "aws")
    assert m.kv_tokens == plan.kv_cache_tokens_per_replica
    full = run(azure.window(0, 1200), m, replicas=2)
    assert full.preemptions > 0 and full.max_kv_tokens > 0.99 * m.kv_tokens
    small = dataclasses.replace(m, max_num_seqs=8)
    capped = run(azure.window(0, 1200), small, replicas=2)
    assert capped.max_running == 8


def test_requests_longer_than_max_model_len_are_refused(model):
    tr = Trace("t", [0.0, 0.5, 1.0], [100, 16_000, 200], [50, 385, 16_185])
    res = run(tr, model, replicas=1)
    # 16,000 + 385 = 16,385 > 16,384 and 200 + 16,185 = 16,385: refused, never simulated.
    assert res.req.refused == [False, True, True]
    assert res.req.finish[0] == res.req.finish[0] and math.isnan(res.req.finish[1])
    s = summary(res, 2.0)
    assert (s["requests"], s["rejected"], s["completed"]) == (3, 2, 1)


def test_recommendation_is_minimal(pool, azure):
    tr = azure.window(0, 900).scaled(2)  # 15 minutes at twice the rate
    rec = recommend(pool, "aws", tr)
    slo = pool.slo

    def meets(n):
        s = summary(run_p(pool, "aws", tr, replicas=n), slo.ttft_p90_s)
        return s["slo"]["met"] and s["utilization"] <= slo.target_utilization

    need = rec["min_replicas_needed"]
    assert meets(need) and not meets(need - 1)
    rpn = plan_pool(pool, "aws").replicas_per_node
    assert rec["min_replicas"] == -(-need // rpn) * rpn
    assert rec["max_replicas"] >= rec["min_replicas"]
    assert rec["min_replicas"] <= rec["max_replicas"]


def test_warm_nodes_start_faster_than_cold(pool):
    # A step from 1 to 40 requests/s: the queue builds, the first metric sample after it
    # scales out, and the new nodes serve after the warm (stopped) start instead of cold.
    calm = synthetic(1.0, 120, 3, 1000, 200)
    rush = synthetic(40.0, 480, 4, 1000, 200)
    tr = Trace("step", calm.arrivals + [120 + t for t in rush.arrivals],
               calm.inputs + rush.inputs, calm.outputs + rush.outputs)
    plan = plan_pool(pool, "aws")
    cold = sum(plan.start_phases["cold"].values())
    warm = sum(plan.start_phases["warm_stopped"].values())
    assert warm < cold

    def first_growth(res):
        return next(t for t, s, _ in res.timeline if s > res.timeline[0][1])

    no_warm = run_p(pool, "aws", tr, autoscale=True, warm_replicas=0)
    with_warm = run_p(pool, "aws", tr, autoscale=True, warm_replicas=8)
    tick = 180  # the first sample after the rush (ticks at 60, 120, 180 s) sees a queue
    assert first_growth(no_warm) == pytest.approx(tick + cold)
    assert first_growth(with_warm) == pytest.approx(tick + warm)
    s0, s1 = summary(no_warm, 2.0), summary(with_warm, 2.0)
    assert s1["autoscale"]["slo_misses"] < s0["autoscale"]["slo_misses"]
    assert s0["autoscale"]["slo_misses_during_cold_starts"] > 0


def test_scale_in_policy_matches_the_aws_stack():
    text = (ROOT / "stacks" / "poolctl_stacks" / "aws" / "scaling.py").read_text()
    assert re.search(r"^SCALE_IN_COOLDOWN_S = (\d+)", text, re.M).group(1) == str(
        AWS_SCALE_IN_COOLDOWN_S)
    assert "period=60" in text and METRIC_PERIOD_S == 60


def test_busiest_window():
    tr = Trace("t", [0, 1, 2, 50, 50.5, 51, 51.5, 90], [1] * 8, [1] * 8)
    assert busiest_window(tr, 10) == (41.5, 51.5)


# ------------------------------------------------------------------ traces


def test_azure_trace_loads(azure):
    assert len(azure) == 19_366
    assert azure.arrivals[0] == 0 and 3400 < azure.span_s < 3600
    assert (azure.inputs[0], azure.outputs[0]) == (374, 44)  # the file's first row


def test_mooncake_trace_loads(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 1000, "input_length": 10, "output_length": 3, '
                 '"hash_ids": [1]}\n\n{"timestamp": 2500, "input_length": 7, '
                 '"output_length": 2}\n')
    tr = load_trace(f)
    assert (tr.arrivals, tr.inputs, tr.outputs) == ([0.0, 1.5], [10, 7], [3, 2])


BAD = [
    ("empty.csv", "", ":1: file:"),
    ("cols.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,Cost\n", ":1: header: unknown column"),
    ("tok.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,7\n2.0,ten,7\n",
     ":3: ContextTokens:"),
    ("sort.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n"
     "2023-11-16 18:15:45.00,1,1\n", ":3: TIMESTAMP: earlier than the line before"),
    ("neg.jsonl", '{"timestamp": -5, "input_length": 1, "output_length": 1}\n',
     ":1: timestamp: -0.005 is negative"),
    ("out.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": -1}\n',
     ":1: output_length: -1 tokens is negative"),
    ("key.jsonl", '{"timestamp": 5, "input_len": 1, "output_length": 1}\n',
     ":1: input_len: unknown field"),
]


def poolctl_main(monkeypatch, capsys, *args):
    from poolctl.app import main

    monkeypatch.setattr(sys, "argv", ["poolctl", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.parametrize(("name", "text", "where"), BAD, ids=[b[0] for b in BAD])
def test_bad_trace_is_one_line_naming_file_line_field(tmp_path, monkeypatch, capsys, name,
                                                      text, where):
    f = tmp_path / name
    f.write_text(text)
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--trace", str(f), "--replicas", "4")
    lines = [ln for ln in err.splitlines() if ln.startswith("poolctl:")]
    assert code == 2 and len(lines) == 1, err
    assert f"{f}{where}" in lines[0] and "Traceback" not in err


# ------------------------------------------------------------------ the commands


def test_simulate_json_and_requests_csv(tmp_path, monkeypatch, capsys):
    csv_path = tmp_path / "req.csv"
    code, out, err = poolctl_main(
        monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud", "aws", "--rate", "3",
        "--duration", "300", "--replicas", "4", "--json", "--requests-out", str(csv_path))
    assert code == 0, err
    s = json.loads(out)
    for k in ("requests", "rejected", "duration_s", "arrival_rate_per_s", "mean_in_system",
              "mean_time_in_system_s", "utilization"):
        assert k in s
    assert set(s["cost"]) >= {"node_hours", "usd", "usd_per_1m_output_tokens",
                              "usd_per_request"}
    assert s["replicas"] == {"min": 4, "max": 4, "mean": 4.0}
    # The serving model's figures to calibrate against (hand-checked in test_servingmodel).
    assert s["model"]["decode_step_ms"]["batch_1"] == pytest.approx(33.787, abs=1e-3)
    # Little's law on the command's own figures.
    lam = s["completed"] / s["horizon_s"]
    assert s["mean_in_system"] == pytest.approx(lam * s["mean_time_in_system_s"], rel=0.02)
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "arrival_s,replica,input_tokens,output_tokens,first_token_s,finish_s"
    assert len(rows) == s["requests"] + 1
    # The CSV alone reproduces the TTFT p90 (independent check of the numbers).
    ttft = sorted(float(r.split(",")[4]) - float(r.split(",")[0]) for r in rows[1:])
    pos = (len(ttft) - 1) * 0.9
    lo = math.floor(pos)
    p90 = ttft[lo] + (ttft[lo + 1] - ttft[lo]) * (pos - lo)
    assert p90 == pytest.approx(s["ttft_s"]["p90"], abs=1e-4)
    # One node (4 replicas) for the horizon, at the catalog's price.
    plan = plan_pool(load_config(EXAMPLE).pools[0], "aws")
    assert s["cost"]["usd"] == pytest.approx(
        s["horizon_s"] / 3600 * plan.price_per_node_hour_usd, abs=0.01)


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--rate",
                                "1", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "pip install 'poolctl[plot]'" in err


def test_plan_traffic_json_has_a_recommendation(monkeypatch, capsys):
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--rate", "2", "--duration", "300", "--json")
    assert code == 0, err
    rec = json.loads(out)["pools"][0]["recommendation"]
    assert set(rec) >= {"min_replicas", "max_replicas", "warm_replicas", "ttft_p90_s",
                        "utilization", "usd_per_1m_output_tokens"}


def test_bad_flags_exit_2(monkeypatch, capsys):
    for args in (["--replicas", "2", "--autoscale"], ["--time-scale", "0"], []):
        code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE),
                                    "--rate" if args != [] else "--replicas", "1", *args)
        assert code == 2, (args, err)


def test_synthetic_needs_positive_rate():
    with pytest.raises(UsageError, match="--rate"):
        synthetic(0, 10, 0, 1, 1)


@pytest.mark.parametrize(("cloud", "spacing"), [("aws", AWS_SCALE_IN_COOLDOWN_S), ("gcp", 900)])
def test_scale_in_is_slow_and_one_node_at_a_time(pool, cloud, spacing):
    # A 5-minute rush, then a trickle: the pool grows, then shrinks one node per step, the
    # first step after the queue stayed low for the 900 s stabilization window, the next
    # ones a cooldown apart (AWS: the simple policy's 300 s; GCP: one VM per window).
    rush = synthetic(40.0, 300, 6, 1000, 200)
    calm = synthetic(0.5, 5400, 7, 1000, 200)
    tr = Trace("rush", rush.arrivals + [300 + t for t in calm.arrivals],
               rush.inputs + calm.inputs, rush.outputs + calm.outputs)
    res = run_p(pool, cloud, tr, autoscale=True, warm_replicas=0)
    serving = [(t, s) for t, s, _ in res.timeline]
    peak = max(s for _, s in serving)
    steps = [(t, s) for (t, s), (_, s0) in zip(serving[1:], serving, strict=False) if s < s0]
    downs, sizes = [t for t, _ in steps], [s for _, s in steps]
    assert peak > 1 and sizes == list(range(peak - 1, peak - 1 - len(downs), -1))
    assert len(downs) == peak - 1  # back to min (1 node) within the trickle
    assert all(b - a == pytest.approx(spacing) for a, b in zip(downs, downs[1:], strict=False))
    last_up = max(t for (t, s), (_, s0) in zip(serving[1:], serving, strict=False) if s > s0)
    assert downs[0] - last_up >= 900


def test_plot_draws_a_png(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the optional [plot] extra")
    png = tmp_path / "sim.png"
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--rate", "2", "--duration", "300", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
