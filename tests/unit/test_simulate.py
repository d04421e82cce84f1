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
from poolctl.servingmodel import ReplicaModel, at_tp, replica_model
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
    p90 = [summary(run(tr, model, replicas=n), 2.0).ttft_s.p90 for n in (2, 3, 4, 6, 8)]
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
    assert (s.requests, s.rejected, s.completed) == (3, 2, 1)
    assert (s.requests_over_max_model_len, s.max_model_len) == (2, 16_384)


def test_recommendation_is_minimal(pool, azure):
    tr = azure.window(0, 900).scaled(2)  # 15 minutes at twice the rate
    rec = recommend(pool, "aws", tr)
    slo = pool.slo

    def meets(n):
        s = summary(run_p(pool, "aws", tr, replicas=n), slo.ttft_p90_s)
        return s.slo.met and s.utilization <= slo.target_utilization

    need = rec.min_replicas_needed
    assert meets(need) and not meets(need - 1)
    rpn = plan_pool(pool, "aws").replicas_per_node
    assert rec.min_replicas == -(-need // rpn) * rpn
    assert rec.max_replicas >= rec.min_replicas
    # scaling.predictive_target: the requests in flight per replica at that size, by Little's
    # law the throughput times the mean time in the system (both over the run's horizon,
    # the drain after the last arrival included), over the replicas
    at = rec.at_min
    assert at.mean_in_system == pytest.approx(
        at.completed / at.horizon_s * at.mean_time_in_system_s, rel=0.01)
    assert rec.predictive_target == pytest.approx(at.mean_in_system / need, abs=0.05)
    assert rec.to_json()["predictive_target"] == rec.predictive_target


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
    assert s0.autoscale is not None and s1.autoscale is not None
    assert s1.autoscale.slo_misses < s0.autoscale.slo_misses
    assert s0.autoscale.slo_misses_during_cold_starts > 0


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


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BAD = [
    ("empty.csv", "", ":1: file:"),
    ("cols.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,Cost\n", ":1: header: unknown column"),
    ("tok.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,7\n2.0,ten,7\n",
     ":3: ContextTokens:"),
    ("sort.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n"
     "2023-11-16 18:15:45.00,1,1\n", ":3: TIMESTAMP: earlier than the line before"),
    ("neg.jsonl", '{"timestamp": -5, "input_length": 1, "output_length": 1}\n',
     ":1: timestamp: -5 is negative"),
    ("out.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": -1}\n',
     ":1: output_length: -1 tokens is negative"),
    ("key.jsonl", '{"timestamp": 5, "input_len": 1, "output_length": 1}\n',
     ":1: input_len: unknown field"),
    # issue 23: each was a traceback, a hang or accepted
    ("nan.csv", f"{AZ}1.0,1,1\nnan,1,1\n", ":3: TIMESTAMP: 'nan' is neither"),
    ("inf.csv", f"{AZ}1.0,1,1\ninf,1,1\n", ":3: TIMESTAMP: 'inf' is neither"),
    ("secs.csv", f"{AZ}{'9' * 400},1,1\n", ":2: TIMESTAMP: 99999999999999999999... is too large"),
    ("inf.jsonl", '{"timestamp": Infinity, "input_length": 1, "output_length": 1}\n',
     ":1: timestamp: Infinity is not a finite number of ms"),
    ("big.jsonl", '{"timestamp": 1' + "0" * 400 + ', "input_length": 1, "output_length": 1}\n',
     ":1: timestamp: 10000000000000000000... is too large"),
    ("span.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 1e15, "input_length": 1, "output_length": 1}\n',
     ":2: timestamp: 11,574,074 days after the first request; poolctl replays at most 31"),
    ("under.csv", f"{AZ}1.0,1_000,7\n", ":2: ContextTokens: '1_000' is not a whole number"),
    ("arabic.csv", f"{AZ}1.0,12,\u0667\n", ":2: GeneratedTokens: '\u0667' is not a whole"),
    ("float.jsonl", '{"timestamp": 5, "input_length": 1.5, "output_length": 1}\n',
     ":1: input_length: 1.5 is not a whole number"),
    ("bool.jsonl", '{"timestamp": 5, "input_length": true, "output_length": 1}\n',
     ":1: input_length: true is not a whole number"),
    ("huge.csv", f"{AZ}1.0,12345678901,1\n", ":2: ContextTokens: over 1,000,000,000 tokens"),
    ("header.csv", AZ, ":1: file: the trace has no requests"),
    ("twice.csv", "TIMESTAMP,TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3,4\n",
     ":1: header: a column twice"),
    ("fields.csv", f"{AZ}1.0,1\n", ":2: row: 2 fields, the header has 3"),
    ("field.csv", f"{AZ}1.0,1,{'7' * 140_000}\n", ":2: row: not CSV (field larger than"),
    ("json.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": 1}\n{"timestamp"\n',
     ":2: line: not JSON"),
    ("list.jsonl", "[1, 2]\n", ":1: header: unknown column '[1'"),  # not JSONL: CSV
    ("deep.jsonl", "{" + '"a":[' * 100_000 + "\n", ":1: line: not JSON"),
    ("ctrl.jsonl", '{"timestamp": 5, "in\\nput": 1}\n', ":1: 'in\\nput': unknown field"),
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


def one_line(code: int, err: str, want_code: int = 2) -> str:
    """The command's single `poolctl:` line (and no traceback), exit `want_code`."""
    lines = [ln for ln in err.splitlines() if ln.startswith("poolctl:")]
    assert code == want_code and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


@pytest.mark.parametrize("kind", ["fifo", "folder", "/dev/zero"])
def test_a_trace_that_is_no_regular_file_is_refused_unread(tmp_path, monkeypatch, capsys,
                                                             kind):
    # /dev/zero never ends (MemoryError), a FIFO blocks its reader until a writer comes.
    import os

    path = tmp_path / "t"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path(kind)
    what = {"fifo": "a FIFO (named pipe)", "folder": "a folder",
            "/dev/zero": "a character device"}[kind]
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--trace", str(path), "--replicas", "1")
    assert f"--trace: {path} is {what}, not a regular file" in one_line(code, err)


def test_trace_size_lines_and_line_length_are_capped(tmp_path, monkeypatch):
    import poolctl.traces as traces

    f = tmp_path / "t.csv"
    f.write_text(AZ + "".join(f"{i},1,1\n" for i in range(10)))  # 11 lines, 40 + 10 x 6 bytes
    assert len(load_trace(f)) == 10
    monkeypatch.setattr(traces, "MAX_LINES", 10)
    with pytest.raises(UsageError, match=r"t.csv:11: file: more than 10 lines; poolctl "
                       r"replays at most 1,000,000 requests: cut the file"):
        load_trace(f)
    monkeypatch.undo()
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 99)
    with pytest.raises(UsageError, match=r"--trace: .*t.csv is 100 bytes, over the 99 bytes"):
        load_trace(f)
    monkeypatch.undo()
    monkeypatch.setattr(traces, "MAX_LINE_BYTES", 40)  # the header's length
    f.write_text(AZ + "1,1,1\n" + f"2,1,{' ' * 34}1\n" + f"3,1,{' ' * 35}1\n")  # 40, 41 bytes
    with pytest.raises(UsageError, match=r"t.csv:4: line: longer than 40 bytes"):
        load_trace(f)


def test_azure_trace_with_a_byte_order_mark_loads(tmp_path):
    # Excel and Notepad save CSV as "UTF-8 with BOM": read as utf-8-sig.
    f = tmp_path / "bom.csv"
    f.write_bytes(b"\xef\xbb\xbf" + AZ.encode() + b"2023-11-16 18:15:46.68,10,2\r\n"
                  b"2023-11-16 18:15:47.18,20,3\r\n")
    tr = load_trace(f)
    assert (tr.arrivals, tr.inputs, tr.outputs) == ([0.0, pytest.approx(0.5)], [10, 20], [2, 3])


def test_azure_times_without_a_zone_are_utc_whatever_the_machine_says(tmp_path, monkeypatch):
    # New York skipped 02:00-03:00 on 12 March 2023: read as local time, these two requests
    # 62 minutes apart would be 2 minutes apart.
    import time

    f = tmp_path / "dst.csv"
    f.write_text(AZ + "2023-03-12 01:59:00,1,1\n2023-03-12 03:01:00,1,1\n")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert load_trace(f).arrivals == [0.0, 62 * 60]
    finally:
        monkeypatch.undo()
        time.tzset()


# ------------------------------------------------------------------ numeric options

FLAGS = [  # (arguments, the flag named, what the line says): issue 23's cases first
    (["--time-scale", "nan"], "--time-scale", "nan is not a finite number"),
    (["--input-tokens", "nan"], "--input-tokens", "nan is not a finite number"),
    (["--input-tokens", "inf"], "--input-tokens", "inf is not a finite number"),
    (["--replicas", "10000000"], "--replicas", "10000000 is out of range; give a count of "
     "replicas, from 1 to 4,096"),
    (["--rate", "inf"], "--rate", "inf is not a finite number"),
    (["--time-scale", "1e-300"], "--time-scale", "1e-300 is out of range"),
    (["--rate", "1e7", "--duration", "3600"], "--rate", "1e7 is out of range; give requests "
     "per second, above 0 and at most 100,000"),
    (["--rate", "1000", "--duration", "3600"], "--rate/--duration",
     "1000/s for 3600 s is 3,600,000 requests; poolctl replays at most 1,000,000"),
    (["--duration", "1e9"], "--duration", "1e9 is out of range"),
    (["--output-tokens", "0"], "--output-tokens", "0 is out of range"),
    (["--rate", "1_000"], "--rate", "'1_000' is not a number in digits 0-9"),
    (["--rate", "\u0661\u0662"], "--rate", "is not a number in digits 0-9"),
    (["--seed", "-1"], "--seed", "-1 is out of range"),
    (["--seed", "9" * 5000], "--seed", "(5,000 characters) is out of range"),
    (["--warm", "-2", "--autoscale"], "--warm", "-2 is out of range"),
    (["--time-scale", "0.001", "--duration", "3600"], "--time-scale 0.001",
     "days; poolctl replays at most 31 days: raise --time-scale"),  # ~3,600 s x 1,000
]


@pytest.mark.parametrize(("args", "flag", "says"), FLAGS,
                         ids=[" ".join(a)[:30] for a, _, _ in FLAGS])
def test_numeric_options_are_bounded_one_line_each(monkeypatch, capsys, args, flag, says):
    rate = [] if "--rate" in args else ["--rate", "1"]
    code, _, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE), "--cloud",
                                "aws", *rate, *args)
    line = one_line(code, err)
    assert line.startswith(f"poolctl: {flag}") and says in line, line


def test_plan_numeric_options_are_bounded(monkeypatch, capsys):
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--rate", "nan")
    assert one_line(code, err).startswith("poolctl: --rate: nan is not a finite number")


# ------------------------------------------------------------------ feasibility

MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl"


def test_ttft_never_beats_the_prefill_floor_and_meets_it_alone(model, azure):
    tr = azure.window(0, 600)
    q = run(tr, model, replicas=2).req
    floors = [model.ttft_floor_s(p) for p in q.inputs]
    late = [q.first[i] - q.arrival[i] - floors[i] for i in range(len(tr))
            if not q.refused[i]]
    assert min(late) >= -1e-9 and max(late) > 1  # a queue formed, no TTFT below its floor
    # With a replica per request each one is alone: its TTFT is its floor, to the rounding.
    q = run(Trace("t", [0.0, 0.1, 0.2], [100, 9000, 16_000], [5, 5, 5]), model,
            replicas=3).req
    assert [f - a for f, a in zip(q.first, q.arrival, strict=True)] == pytest.approx(
        [model.ttft_floor_s(p) for p in (100, 9000, 16_000)], rel=1e-12)


def test_the_floor_p90_is_what_many_replicas_reach(pool, model):
    from poolctl.capacity import ttft_floor

    tr = load_trace(MOONCAKE)
    fl = ttft_floor(model, tr)
    # 200 requests over ~58 s, 76 longer than max_model_len 16,384 (prompt + output).
    assert (len(tr), fl.over_max_model_len, fl.served) == (200, 76, 124)
    s = summary(run(tr, model, replicas=len(tr)), 2.0)
    assert s.ttft_s.p90 == pytest.approx(fl.ttft_p90_floor_s, abs=1e-4)


def test_plan_names_the_floor_when_no_replica_count_meets_the_slo(tmp_path, monkeypatch, capsys,
                                                                   pool, model):
    from poolctl.capacity import ttft_floor

    # Mooncake's long prompts on TP 2: the p90 prompt alone takes longer than a 1.5 s SLO
    # (1.80 s with the catalog's H100 factors; TP 4, at its own fitted factors, to 1.02 s).
    tr = load_trace(MOONCAKE)
    fl = ttft_floor(model, tr)
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text().replace("ttft_p90_s: 2.0", "ttft_p90_s: 1.5"))
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(cfg), "--cloud",
                                "aws", "--traffic", str(MOONCAKE))
    line = one_line(code, err, want_code=1)
    assert fl.ttft_p90_floor_s > 1.5 and fl.p90_prompt > 10_000
    need = math.ceil(fl.ttft_p90_floor_s * 100) / 100
    assert (f"no replica count meets slo.ttft_p90_s 1.5 s on {MOONCAKE}: its p90 prompt is "
            f"{fl.p90_prompt:,.0f} tokens (of 124 requests within max_model_len; 76 longer "
            "than max_model_len are refused)") in line
    assert f"the lowest TTFT p90 possible with this configuration is {fl.ttft_p90_floor_s:.2f}" \
        in line
    assert f"raise slo.ttft_p90_s to at least {need:g} s" in line
    # TP 4 as the file would build it: TP 4's fitted factors, not TP 2's with the shards
    # halved (the catalog fits H100's prefill MFU per TP, so the two floors differ).
    tp4 = replica_model(at_tp(pool, 4), "aws")
    assert tp4.prefill_mfu != model.prefill_mfu
    f4 = ttft_floor(tp4, tr).ttft_p90_floor_s
    halved = dataclasses.replace(model, tp=4,
                                 weights_bytes_per_gpu=model.weights_bytes_per_gpu / 2,
                                 kv_bytes_per_token_per_gpu=model.kv_bytes_per_token_per_gpu / 2)
    assert f"{ttft_floor(halved, tr).ttft_p90_floor_s:.2f}" != f"{f4:.2f}"
    assert f4 < 1.5 and f"raise serving.tensor_parallel to 4 (its floor: {f4:.2f} s)" in line


def test_plan_refuses_a_trace_longer_than_max_model_len(tmp_path, monkeypatch, capsys):
    f = tmp_path / "long.csv"
    f.write_text(AZ + "1.0,16000,385\n2.0,20000,10\n")  # 16,385 and 20,010 > 16,384
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                "aws", "--traffic", str(f))
    assert ("chat-70b/aws: every one of the 2 requests in " + str(f) + " is longer than "
            "serving.max_model_len 16,384 (prompt + output): nothing to size for; raise "
            "max_model_len (the shortest request has 16,385 tokens)") in one_line(code, err, 1)


def test_plan_counts_the_requests_over_max_model_len(tmp_path, monkeypatch, capsys):
    tr = synthetic(2.0, 300, 0, 1000, 200)
    f = tmp_path / "t.csv"
    rows = [f"{t:.6f},{i},{o}" for t, i, o in zip(tr.arrivals, tr.inputs, tr.outputs,
                                                     strict=True)]
    rows[5] = f"{tr.arrivals[5]:.6f},16000,385"  # 16,385 tokens: refused
    f.write_text(AZ + "\n".join(rows) + "\n")
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--traffic", str(f), "--json")
    assert code == 0, err
    rec = json.loads(out)["pools"][0]["recommendation"]
    assert (rec["requests"], rec["requests_over_max_model_len"]) == (len(tr), 1)
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(EXAMPLE), "--cloud",
                                  "aws", "--traffic", str(f))
    assert code == 0, err
    assert re.search(rf"requests over max_model_len\s*│\s*│\s*1 of {len(tr)} \(refused", out)


def test_simulate_json_is_json_when_the_model_overflows(monkeypatch, capsys):
    # A step overhead of 1e308 ms (validated, or not, by the config): every time is inf and
    # the means NaN or inf. JSON has neither: they are null.
    import poolctl.servingmodel as sm

    real = sm.replica_model
    # (patched where the simulate command and poolctl.capacity took the name)
    for where in ("poolctl.commands.simulate", "poolctl.capacity"):
        monkeypatch.setattr(f"{where}.replica_model",
                            lambda p, c: dataclasses.replace(real(p, c), overhead_s=1e305))

    def strict(name):
        raise AssertionError(f"{name} in the JSON")

    code, out, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(EXAMPLE),
                                  "--cloud", "aws", "--rate", "1", "--duration", "60",
                                  "--replicas", "1", "--json")
    assert code == 0, err
    s = json.loads(out, parse_constant=strict)
    assert s["queue_wait_s"]["mean"] is None and s["mean_in_system"] is None


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
    assert s["model"]["decode_step_ms"]["batch_1"] == pytest.approx(29.324, abs=1e-3)
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
