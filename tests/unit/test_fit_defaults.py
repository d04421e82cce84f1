"""The serving model's defaults against AIConfigurator's measured database (issue 20, part 7).

scripts/fit_defaults.py fitted the catalog's `serving_fit` factors to `aiconfigurator-core`
(per-operator times measured on H100/H200 SXM, vLLM backend); this test re-queries the
database over the same grid (Llama-3.1-70B and 8B, TP 1-8 where the model fits, prompts
512-8k, batch 1-64) and holds the model with the recorded factors within 10 % of every
point. The dev extra installs the package, so CI runs it; without it the test skips.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

from poolctl.catalog import load_catalog
from poolctl.servingmodel import LITERATURE, with_factors

pytest.importorskip("aiconfigurator_core", reason="aiconfigurator-core (the dev extra) is not "
                    "installed: the database the defaults are fitted to is absent")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    path = ROOT / "scripts" / "fit_defaults.py"
    spec = importlib.util.spec_from_file_location("fit_defaults", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_defaults"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


fd = _script()
configs = functools.cache(fd.configs)  # each compiles the database's engines (~1 s)


# The worst point allowed per GPU: 10 % on Hopper; B200's database at TP 8 has decode steps
# the roofline does not follow (per-sequence cost 15 us, MBU 0.71), so its fit ends at
# -21 %..+18 % there (scripts/fit_defaults.py prints it).
BOUND = {"H100": 0.10, "H200": 0.10, "B200": 0.21}


@pytest.mark.parametrize("gpu", sorted(fd.GPUS))
def test_catalog_fit_stays_within_10_percent_of_the_database(gpu):
    fit = load_catalog().gpu_specs[gpu].serving_fit
    assert fit is not None and fit.package == f"{fd.PACKAGE}=={fd.package_version()}"
    cfgs = configs(gpu)
    # Every TP of the grid is there: 70B fits from TP 2, 8B from TP 1.
    assert [c.tp for c in cfgs] == [1, 2, 4, 8]
    assert sorted(fit.by_tp) == [1, 2, 4, 8]
    worst = []
    for cfg in cfgs:
        pe, de = fd.errors(cfg, fit.for_tp(cfg.tp))
        for rm in cfg.replicas.values():  # the pool's model takes them as its defaults
            # (with the engine's measured time per step on top: test_measured_runs.py)
            mine = fd.with_engine(with_factors(rm, fit.for_tp(cfg.tp)), "bfloat16", fit.engine)
            got, want = dataclasses.asdict(mine), dataclasses.asdict(rm)
            numbers = {k for k, v in want.items() if isinstance(v, int | float)}
            assert {k: v for k, v in got.items() if k not in numbers} == {
                k: v for k, v in want.items() if k not in numbers}
            assert {k: got[k] for k in numbers} == pytest.approx(
                {k: want[k] for k in numbers}, rel=1e-12)
        assert len(pe) == len(cfg.replicas) * len(fd.PROMPTS) * len(fd.BATCHES)
        worst.append((cfg.tp, max(map(abs, pe)), max(map(abs, de))))
    assert all(p <= BOUND[gpu] and d <= BOUND[gpu] for _, p, d in worst), worst


def test_the_literature_defaults_were_pessimistic():
    # What issue 20 measured and the fit corrects: the module's defaults (MFU 0.5, MBU 0.7,
    # 2 ms a step) are slower than the database everywhere on H100 TTFT.
    for cfg in configs("H100"):
        pe, _ = fd.errors(cfg, LITERATURE)
        assert min(pe) > 0.05, (cfg.tp, min(pe))


def test_with_factors_sets_every_factor():
    f = load_catalog().gpu_specs["H100"].serving_fit.for_tp(2)
    cfg = configs("H100")[1]
    rm = with_factors(cfg.replicas["meta-llama/Llama-3.1-70B-Instruct"], f)
    assert (rm.prefill_mfu, rm.decode_mbu, rm.overhead_s * 1000, rm.per_seq_s * 1e6,
            rm.link_efficiency, rm.allreduce_latency_s * 1e6, rm.overlap_k) == pytest.approx(
        tuple(f.model_dump().values()))
