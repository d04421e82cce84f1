"""`perf fit` result files drawn from `vllm bench serve --save-result`'s schema, each field
hostile now and then (issue 31): the parser and the replay the fit runs on every run either
accept a run that replays to finite, positive statistics, or refuse with one line naming the
field. Never an exception of another kind (exit 70), never a "fitted" factor from a run that
no benchmark could have written."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.errors import UsageError
from poolctl.perffit import parse_results, replay
from poolctl.servingmodel import replica_model
from tests.unit.test_perf_fit import EXAMPLE

HOSTILE: st.SearchStrategy = st.sampled_from(
    [0, -5, -1e-300, 1e-300, 1e-320, 1e300, True, False, None, "inf", "nan", "", "5", [], {},
     2**70, 0.5])
SMALL = st.integers(1, 6)


def field(good: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(good, good, good, HOSTILE)


@st.composite
def result(draw) -> dict:
    n = draw(SMALL)
    o = {
        "num_prompts": draw(field(st.just(n))),
        "completed": draw(field(st.just(n))),
        "request_rate": draw(field(st.one_of(st.just("inf"), st.floats(0.1, 50)))),
        "burstiness": draw(field(st.floats(0.1, 10))),
        "max_concurrency": draw(field(st.one_of(st.none(), st.integers(1, 8)))),
        "tensor_parallel_size": draw(field(st.sampled_from([2, "2"]))),
        "total_input_tokens": draw(field(st.just(n * 500))),
        "total_output_tokens": draw(field(st.just(n * 50))),
        "label": draw(st.text(max_size=8)),
    }
    for metric in ("ttft", "tpot"):
        for stat in ("mean", "median", "p90"):
            o[f"{stat}_{metric}_ms"] = draw(field(st.floats(1, 5000)))
    if draw(st.booleans()):  # --save-detailed
        o["input_lens"] = draw(st.lists(field(st.integers(1, 2000)), min_size=n, max_size=n))
        o["output_lens"] = draw(st.lists(field(st.integers(0, 200)), min_size=n, max_size=n))
    return o


MODEL = replica_model(load_config(EXAMPLE).pools[0], Cloud.aws)


@given(o=result())
@example(o={"completed": 1e300, "num_prompts": 10, "tensor_parallel_size": 2,
            "mean_ttft_ms": 10, "mean_tpot_ms": 5, "total_input_tokens": 10,
            "total_output_tokens": 10})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": -5,
            "mean_tpot_ms": 5, "total_input_tokens": 10, "total_output_tokens": 10})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 0, "mean_tpot_ms": 0,
            "total_input_tokens": 10, "total_output_tokens": 10})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 5, "mean_tpot_ms": 5,
            "input_lens": [10, 10], "output_lens": [0, 0]})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 5, "mean_tpot_ms": 5,
            "input_lens": [True, 10], "output_lens": [True, 3]})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 5, "mean_tpot_ms": 5,
            "total_input_tokens": 10, "total_output_tokens": 10, "burstiness": 1e-300,
            "request_rate": 1})
@example(o={"completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 5, "mean_tpot_ms": 5,
            "total_input_tokens": 10, "total_output_tokens": 10, "request_rate": 1e-320})
def test_a_result_file_is_a_plausible_run_or_one_line(o):
    try:
        runs = parse_results(json.dumps(o), "r.json")
        for run in runs:
            stats = replay(MODEL, run)
    except UsageError as e:
        assert str(e).startswith("r.json") and "\n" not in str(e), str(e)
        return
    for run in runs:
        assert 1 <= len(run.inputs) <= 500 and all(x >= 1 for x in run.outputs)
        assert all(0 < v < 86_400 for v in run.measured.values()), run.measured
    assert stats and all(math.isfinite(v) and v >= 0 for v in stats.values()), stats


@pytest.mark.parametrize(("o", "key"), [
    ({"mean_ttft_ms": -5}, "mean_ttft_ms"),
    ({"mean_ttft_ms": 0, "mean_tpot_ms": 0}, "mean_ttft_ms"),
    ({"completed": 1e300}, "completed"),
    ({"completed": True}, "completed"),
    ({"output_lens": [0, 0], "input_lens": [5, 5]}, "output_lens"),
    ({"burstiness": 1e-300, "request_rate": 1}, "burstiness"),
    ({"request_rate": 1e-320}, "request_rate"),
    ({"input_lens": [True, 5], "output_lens": [3, 3]}, "input_lens"),
])
def test_the_issues_rows_name_the_field(o, key, tmp_path, monkeypatch, capsys):
    from tests.unit.test_simulate import one_line, poolctl_main

    base = {"num_prompts": 10, "completed": 2, "tensor_parallel_size": 2, "mean_ttft_ms": 50,
            "mean_tpot_ms": 20, "total_input_tokens": 1000, "total_output_tokens": 100}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**base, **o}))
    code, _, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(EXAMPLE),
                                "--cloud", "aws")
    assert key in one_line(code, err)
