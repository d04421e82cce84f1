"""The sandbox's stand-in for `vllm serve` (poolctl.sandbox.vllm), as a client sees it over
HTTP: vLLM's API, errors and metric names, and timing that is poolctl's serving model run in
wall time (checked against `simulate` on a slice of the shared Azure trace)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.servingmodel import replica_model

from .standin import EXAMPLE_ARGS, MODEL, call, standin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-conv.csv"
AZURE_IN_REPO = ROOT / "tests" / "data" / "traces"


@pytest.fixture(scope="module")
def engine():
    with standin(EXAMPLE_ARGS, speed=10.0) as url:
        yield url


def test_a_streamed_completion_counts_words_as_tokens_and_runs_to_max_tokens(engine):
    status, raw = call(engine, "/v1/completions", {
        "model": MODEL, "prompt": "one two three four five six seven", "max_tokens": 12,
        "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len(text.split()) == 12  # one filler word a token
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "total_tokens": 19,
                                   "completion_tokens": 12}
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "length" and set(finals[:-1]) <= {None}
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)


def test_chat_and_token_id_prompts(engine):
    status, raw = call(engine, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "hi there"}], "max_tokens": 3})
    assert status == 200
    body = json.loads(raw)
    # 2 + 2 words, plus 4 template tokens per message (server.CHAT_TOKENS_PER_MESSAGE)
    assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}
    assert body["choices"][0]["message"]["role"] == "assistant"
    status, raw = call(engine, "/v1/completions", {"prompt": [1001, 1002, 1003],
                                                    "max_tokens": 2})
    assert status == 200 and json.loads(raw)["usage"]["prompt_tokens"] == 3


def test_vllms_errors(engine):
    status, raw = call(engine, "/v1/completions", {"prompt": "a b", "max_tokens": 16383})
    body = json.loads(raw)
    assert status == 400 and body["type"] == "BadRequestError" and body["code"] == 400
    assert ("maximum context length is 16384 tokens. However, you requested 16385 tokens "
            "(2 in the messages, 16383 in the completion)") in body["message"]
    status, raw = call(engine, "/v1/completions", {"model": "other", "prompt": "a"})
    assert status == 404 and json.loads(raw)["message"] == "The model `other` does not exist."
    status, raw = call(engine, "/v1/completions", {"prompt": "a", "max_tokens": 0})
    assert status == 400
    status, _ = call(engine, "/v1/models")
    assert status == 200


def test_metrics_carry_vllms_names_and_count_what_was_served(engine):
    before = _metrics(engine)
    for n in (3, 5):
        assert call(engine, "/v1/completions", {"prompt": "w " * n, "max_tokens": 4})[0] == 200
    after = _metrics(engine)

    def total(m, name):
        return sum(v for k, v in m.items() if k.startswith(name + "{"))

    assert total(after, "vllm:request_success_total") - total(
        before, "vllm:request_success_total") == 2
    assert total(after, "vllm:prompt_tokens_total") - total(before, "vllm:prompt_tokens_total") == 8
    assert total(after, "vllm:generation_tokens_total") - total(
        before, "vllm:generation_tokens_total") == 8
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:request_time_per_output_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):
        engines = {k for k in after if k.startswith(name + "{")}
        assert len(engines) == 4, (name, engines)  # one series per data-parallel engine


def _metrics(url: str) -> dict[str, float]:
    status, raw = call(url, "/metrics")
    assert status == 200
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def test_an_api_key_guards_v1_only():
    with standin(EXAMPLE_ARGS, speed=50.0, VLLM_API_KEY="sandbox-key-1") as url:
        assert call(url, "/v1/models")[0] == 401
        assert json.loads(call(url, "/v1/completions", {"prompt": "a"})[1]) == {
            "error": "Unauthorized"}
        assert call(url, "/v1/models", key="wrong")[0] == 401
        assert call(url, "/v1/models", key="sandbox-key-1")[0] == 200
        assert call(url, "/health")[0] == 200 and call(url, "/metrics")[0] == 200


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--model", MODEL, "--enable-turbo-mode"], {},
     "vllm serve: error: unrecognized arguments: --enable-turbo-mode"),
    (["--model", MODEL], {"POOLCTL_NODE_ADDRESS": "10.0.0.5"}, "127.0.0.0/8 only"),
    (["--model", MODEL], {"POOLCTL_NODE_INSTANCE_TYPE": "m5.large"}, "m5.large"),
])
def test_a_line_or_node_it_cannot_serve_exits_at_once_and_says_why(argv, env, says):
    r = subprocess.run([sys.executable, "-m", "poolctl.sandbox.vllm", *argv],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_one_request_takes_the_models_prefill_and_decode_steps(engine, tmp_path):
    """A lone request: TTFT is one prefill step of its prompt, the rest one decode step per
    token (batch 1), as poolctl's model times them; the engine's own histogram (pool time,
    no HTTP) holds that to the microsecond, the client within its overhead x speed."""
    m = replica_model(load_config(EXAMPLE).pools[0], Cloud.aws)
    prompt, out = 2000, 50
    want_ttft = m.step_s(prompt, prompt + 1, m.attn_flops(prompt, 0), 0)
    # decode: steps with context prompt+1 ... prompt+out-1 (+1 slot each), batch 1
    want_decode = sum(m.step_s(1, prompt + 1 + k, 0.0, 1) for k in range(out - 1))
    before = _metrics(engine)
    status, _ = call(engine, "/v1/completions", {"prompt": "x " * prompt, "max_tokens": out})
    assert status == 200
    after = _metrics(engine)

    def delta(name):
        return sum(v for k, v in after.items() if k.startswith(name + "{")) - sum(
            v for k, v in before.items() if k.startswith(name + "{"))

    assert delta("vllm:time_to_first_token_seconds_sum") == pytest.approx(want_ttft, rel=1e-6)
    assert delta("vllm:e2e_request_latency_seconds_sum") == pytest.approx(
        want_ttft + want_decode, rel=1e-6)
