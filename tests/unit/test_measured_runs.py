"""The serving model against measured end-to-end vLLM serving runs (issue 33).

`aiconfigurator-core` ships `systems/silicon_sample.csv`: real vLLM servers driven by closed
loops of clients, with the mean TTFT and TPOT the clients measured. scripts/measured_runs.py
replays each run poolctl can model through the simulator (TTFT from each request's send);
scripts/fit_defaults.py fitted the catalog's `serving_fit.engine` terms (the engine's time per
step outside the kernels) on the dense runs ENGINE_FIT names. The dev extra installs the
package, so CI runs these; without it they skip.

The bounds are what the model holds today, each tighter than where it started (kernel fit
alone) and each able to fail; where they are looser than issue 33 asks (TTFT 15 %), the
comment says by how much.
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

from poolctl.catalog import load_catalog

pytest.importorskip("aiconfigurator_core", reason="aiconfigurator-core (the dev extra) is not "
                    "installed: the measured runs are absent")

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


mr = _load("measured_runs")
fd = _load("fit_defaults")


@functools.cache
def errors() -> list:
    return mr.errors()


def _mae(xs) -> float:
    return statistics.mean(abs(x) for x in xs)


def _group(gpu: str, models: tuple[str, ...]) -> list:
    return [e for e in errors() if e[0].gpu == gpu and e[0].model in models]


# gpu -> (TTFT, TPOT) mean absolute error allowed over the runs the engine was fitted to
FIT_BOUNDS = {
    "H100": (0.25, 0.10),  # TTFT 23.0 %: Qwen3-32B at 4k prompts and low concurrency
    "H200": (0.15, 0.10),  # TTFT 9.0 %, TPOT 6.1 %
    "B200": (0.30, 0.10),  # TTFT 28.5 %: FP8 prefill at 0.47 of the kernels' MFU
}


@pytest.mark.parametrize("gpu", sorted(FIT_BOUNDS))
def test_the_fitted_runs_are_within_bounds(gpu):
    errs = _group(gpu, fd.ENGINE_FIT[gpu])
    assert len(errs) >= 45  # every run poolctl serves of those models (TP 1 of 70B BF16: no)
    ttft, tpot = _mae(e[1] for e in errs), _mae(e[2] for e in errs)
    bound = FIT_BOUNDS[gpu]
    assert ttft <= bound[0] and tpot <= bound[1], (gpu, ttft, tpot)


def test_the_engine_terms_improve_on_the_kernels_alone():
    # What the issue measured: with the kernel database's factors alone, TPOT is faster than
    # measured on nearly every run. With the engine's terms the bias is gone.
    for gpu in FIT_BOUNDS:
        fit = load_catalog().gpu_specs[gpu].serving_fit
        runs = fd.engine_runs(gpu)
        kernel = dict(fit.by_tp)
        bare = fd.EngineFit(step_ms=0, us_per_seq=0, source="-", runs=1)
        before = fd.engine_errors(kernel, bare, runs)
        after = fd.engine_errors(kernel, fit.engine, runs)
        assert sum(b < 0 for _, b in before) / len(before) > 0.75  # too fast, before
        assert abs(statistics.mean(b for _, b in after)) < 0.05  # unbiased after
        assert _mae(b for _, b in after) < 0.5 * _mae(b for _, b in before)
        assert _mae(a for a, _ in after) < _mae(a for a, _ in before)


def test_fp8_is_held_to_its_measured_runs():
    # Llama-3.1-70B FP8 on H100 and H200 (issue 33: within 15 %): TPOT holds; TTFT on H100
    # misses by 7 points (21.9 %).
    for gpu, ttft_bound in (("H100", 0.22), ("H200", 0.15)):
        errs = _group(gpu, ("meta-llama/Llama-3.1-70B-Instruct",))
        assert {e[0].dtype for e in errs} == {"fp8"}
        assert _mae(e[2] for e in errs) <= 0.15
        assert _mae(e[1] for e in errs) <= ttft_bound


def test_the_catalog_records_the_runs_it_was_fitted_to():
    for gpu in FIT_BOUNDS:
        e = load_catalog().gpu_specs[gpu].serving_fit.engine
        assert e is not None and e.runs == len(fd.engine_runs(gpu))
        assert f"{mr.PACKAGE} {mr.package_version()}" in e.source
        assert 0 < e.step_ms < 10 and 0 <= e.us_per_seq < 200  # physical: ms, not seconds
        assert all(0.2 <= v <= 1 for v in e.mfu_scale.values())
