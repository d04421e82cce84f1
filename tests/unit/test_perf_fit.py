"""poolctl perf fit: the serving model's factors from `vllm bench serve --save-result` files
(issue 20, part 6). Files made from the model itself with known factors are fitted back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config, parse_config
from poolctl.perffit import Run, replay
from poolctl.servingmodel import replica_model
from tests.unit.test_simulate import one_line, poolctl_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
TRUE = {"prefill_mfu": 0.55, "decode_mbu": 0.75, "step_overhead_ms": 1.5,
        "decode_us_per_seq": 20.0}


def _result(m, concurrency: int, prompt: int, output: int, n: int = 48) -> dict:
    """One run as `vllm bench serve --save-result --metadata tensor_parallel_size=2` writes
    it (benchmarks/serve.py field names), its statistics from the model `m`."""
    run = Run("x", 2, None, concurrency, float("inf"), 1.0, [prompt] * n, [output] * n, {})
    got = replay(m, run)
    o = {"date": "20261204-120000", "endpoint_type": "openai", "backend": "vllm",
         "label": f"c{concurrency}-{prompt}", "model_id": "meta-llama/Llama-3.1-70B-Instruct",
         "tokenizer_id": "meta-llama/Llama-3.1-70B-Instruct", "num_prompts": n,
         "request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency,
         "tensor_parallel_size": "2", "duration": 60.0, "completed": n, "failed": 0,
         "total_input_tokens": n * prompt, "total_output_tokens": n * output,
         "request_throughput": 1.0, "output_throughput": 1.0}
    for metric in ("ttft", "tpot"):
        o[f"mean_{metric}_ms"] = got[f"{metric}_mean"] * 1000
        o[f"median_{metric}_ms"] = got[f"{metric}_median"] * 1000
        o[f"p90_{metric}_ms"] = got[f"{metric}_p90"] * 1000
        o[f"std_{metric}_ms"] = 0.0
    return o


@pytest.fixture(scope="module")
def results() -> str:
    base = replica_model(load_config(EXAMPLE).pools[0], Cloud.aws)
    m = dataclasses.replace(base, prefill_mfu=0.55, decode_mbu=0.75, overhead_s=1.5e-3,
                            per_seq_s=20e-6)
    # Batch 1 and 16 at 1,000-token prompts, 4 long prompts, 32 short: each factor shows.
    runs = [_result(m, 1, 1000, 100), _result(m, 16, 1000, 200), _result(m, 4, 4000, 50),
            _result(m, 32, 500, 300)]
    return "".join(json.dumps(o) + "\n" for o in runs)  # --append-result: one per line


def test_fit_recovers_the_factors_the_results_were_made_with(tmp_path, monkeypatch, capsys,
                                                              results):
    f = tmp_path / "result.jsonl"
    f.write_text(results)
    code, out, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f",
                                  str(EXAMPLE), "--cloud", "aws", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["runs"] == 4
    for k, want in TRUE.items():
        assert data["perf"][k] == pytest.approx(want, rel=0.02), k
    for errs in data["errors"].values():
        assert max(abs(e) for e in errs.values()) < 0.01
    # The catalog's defaults (fitted to AIConfigurator) are off for this made-up replica.
    assert max(abs(e) for r in data["errors_before"].values() for e in r.values()) > 0.05


def test_write_adds_the_perf_block_and_keeps_comments(tmp_path, monkeypatch, capsys, results):
    f = tmp_path / "result.jsonl"
    f.write_text(results)
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text())
    code, out, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(cfg),
                                  "--cloud", "aws", "--write")
    assert code == 0, err
    text = cfg.read_text()
    assert text.startswith(EXAMPLE.read_text().splitlines()[0])  # the comment kept
    perf = parse_config(text).pools[0].perf
    assert perf.prefill_mfu == pytest.approx(0.55, rel=0.02)
    assert perf.step_overhead_ms == pytest.approx(1.5, rel=0.02)
    # The written block is what the model then uses: the runs' errors vanish.
    m = replica_model(parse_config(text).pools[0], Cloud.aws)
    assert m.decode_mbu == pytest.approx(0.75, rel=0.02)


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda o: o.pop("completed"), "completed"),
    (lambda o: o.pop("tensor_parallel_size"), "tensor_parallel_size"),
    (lambda o: o.pop("mean_ttft_ms"), "mean_ttft_ms"),
    (lambda o: o.update(mean_tpot_ms="fast"), "mean_tpot_ms"),
    (lambda o: o.update(tensor_parallel_size="two"), "tensor_parallel_size"),
])
def test_a_bad_result_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys, results,
                                                 mutate, key):
    o = json.loads(results.splitlines()[0])
    mutate(o)
    f = tmp_path / "r.json"
    f.write_text(json.dumps(o))
    code, _, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(EXAMPLE),
                                "--cloud", "aws")
    assert key in one_line(code, err)


def test_not_json_is_one_line(tmp_path, monkeypatch, capsys):
    f = tmp_path / "r.json"
    f.write_text("{not json")
    code, _, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(EXAMPLE),
                                "--cloud", "aws")
    assert "not JSON" in one_line(code, err)
