"""`poolctl replay --url` against the stand-in engine: vLLM's 400 for prompts past the
model's length, prefix reuse found through HTTP, and the command's errors and Ctrl-C. (Replay
beside `simulate` runs through a whole serving pool: test_sandbox_https.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from poolctl.traces import load_trace
from tests.plugins.sandbox import run_poolctl
from tests.serving.pool import wait_for

from .standin import EXAMPLE_ARGS, standin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"
MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl"
SPEED = 4.0


@pytest.fixture(scope="module")
def engine():
    with standin(EXAMPLE_ARGS, speed=SPEED) as url:
        yield url


def _replay(home, *args):
    r = run_poolctl(home, "replay", *args, "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_prompts_past_max_model_len_are_refused_as_vllm_refuses_them(engine, tmp_path):
    out = _replay(tmp_path, "--trace", str(MOONCAKE), "--url", engine, "--speed", str(SPEED),
                  "--duration", "20s")
    # Prompts past the example's max_model_len (16,384 with the output) get HTTP 400, counted
    # from the trace itself; every other request completes.
    tr = load_trace(MOONCAKE).window(0, 20)
    too_long = sum(1 for i, o in zip(tr.inputs, tr.outputs, strict=True) if i + o > 16384)
    assert too_long > 0 and out["errors"] == {"http 400": too_long}
    assert out["completed"] == len(tr.inputs) - too_long


def test_a_traces_prefix_blocks_reach_the_engines_prefix_cache(engine, tmp_path):
    # Two requests 20 s (pool) apart, so the first has finished and every engine is idle when
    # the second arrives: both go to engine 0 (fewest outstanding, then lowest index), and the
    # second's first three 512-token blocks are the first's. Block ids no other test sends.
    trace = tmp_path / "two.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1536, "output_length": 4, '
        '"hash_ids": [7001, 7002, 7003]}\n'
        '{"timestamp": 20000, "input_length": 2048, "output_length": 4, '
        '"hash_ids": [7001, 7002, 7003, 7004]}\n')
    wait_for("the engines idle", lambda: _running(engine) == 0, timeout=120, every=0.5)
    before = _hits(engine)
    out = _replay(tmp_path, "--trace", str(trace), "--url", engine, "--speed", str(SPEED))
    assert out["errors"] == {} and out["completed"] == 2
    queries, hits = (a - b for a, b in zip(_hits(engine), before, strict=True))
    # vLLM counts every prompt token as queried (1536 + 2048) and the second prompt's cached
    # leading tokens as hits: 3 blocks x 512 (its 16-token KV blocks chain-hashed alike).
    assert (queries, hits) == (1536 + 2048, 3 * 512)


def _metrics(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return r.read().decode().splitlines()


def _running(url: str) -> float:
    """Requests running or waiting on every engine (vLLM's gauges): a replay interrupted
    before leaves its last requests to finish."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in _metrics(url)
               if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")))


def _hits(url: str) -> tuple[float, float]:
    q = h = 0.0
    for line in _metrics(url):
        if line.startswith("vllm:prefix_cache_queries_total{"):
            q += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total{"):
            h += float(line.rsplit(" ", 1)[1])
    return q, h


@pytest.mark.parametrize(("args", "says"), [
    ([], "--url URL or --sandbox: give one"),
    (["--url", "ftp://127.0.0.1:9"], "--url ftp://127.0.0.1:9: give http://"),
    (["--url", "http://127.0.0.1:9", "--speed", "0"], "--speed"),
    (["--url", "http://127.0.0.1:9", "--api-key-env", "POOLCTL_NO_SUCH_KEY"],
     "--api-key-env POOLCTL_NO_SUCH_KEY: that variable is empty or unset"),
    (["--url", "http://127.0.0.1:9"], "cannot reach http://127.0.0.1:9"),
    (["--url", "http://127.0.0.1:9", "--from", "2h"], "no request of"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, args, says):
    r = run_poolctl(tmp_path, "replay", "--trace", str(AZURE), *args)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert says in err and "\n" not in err, err


def test_ctrl_c_stops_the_replay_and_reports_what_it_measured(engine, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "poolctl", "replay", "--trace", str(AZURE),
                          "--url", engine, "--speed", str(SPEED), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # start-up, then a few seconds of requests (the hour would take 6 min)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    rep = json.loads(out)
    assert rep["interrupted"] is True and rep["not_sent"] > 10_000
    assert rep["requests"] > 0 and rep["requests"] + rep["not_sent"] == 19366
    assert set(rep["errors"]) <= {"interrupted"}
