#!/usr/bin/env python3
"""Fit the serving model's default factors per GPU type and TP to AIConfigurator's database,
and the engine's per-step time to measured end-to-end vLLM serving runs.

AIConfigurator (PyPI `aiconfigurator-core`, Apache-2.0, NVIDIA) holds per-operator times
measured on real H100/H200 SXM GPUs with the vLLM backend. Over a grid (Llama-3.1-70B and 8B,
TP 1-8 where the model fits, prompts 512-8k, batch 1-64) this script asks it for the
static-batch prefill time (TTFT of `batch` prompts prefilled together) and the decode step
time (TPOT at `batch` sequences of `prompt` tokens), fits poolctl.servingmodel's factors to
them by least squares on the log ratio, prints the errors before (the module's literature
defaults) and after, and with --write records the fitted factors in
cli/poolctl/data/instance_types.yaml (gpu_specs.<GPU>.serving_fit) with the package version.

    source scripts/env.sh && python scripts/fit_defaults.py [--write]

The kernel database times GPU kernels only; a real server adds time per step outside them
(scheduling, sampling, detokenization, Python) and its prefill reaches less than the
database's kernels. So a second fit, per GPU, on top of the kernel factors: `engine`
(step_ms, us_per_seq, and a prefill_mfu scale per weight dtype), by least squares on the
log ratio of the mean TTFT and TPOT of the measured runs in the same package
(systems/silicon_sample.csv, read by scripts/measured_runs.py; ENGINE_FIT names the runs
used per GPU), each replayed through the simulator as a closed loop of its clients.

Needs the dev extra (aiconfigurator-core and its numpy/scipy); tests/unit/test_fit_defaults.py
checks the recorded factors against the database over the same grid, and
tests/unit/test_measured_runs.py the engine terms against the measured runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import math
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from poolctl import servingmodel
from poolctl.catalog import EngineFit, ServingFactors, factors_for_tp
from poolctl.config import parse_config
from poolctl.servingmodel import (
    FACTOR_NAMES,
    LITERATURE,
    ReplicaModel,
    replica_model,
    with_factors,
)

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "cli" / "poolctl" / "data" / "instance_types.yaml"
PACKAGE = "aiconfigurator-core"

# poolctl's model preset -> AIConfigurator's model config of the same architecture
MODELS = {
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
}
# GPU -> (an AWS type carrying it, AIConfigurator's system name)
GPUS = {"H100": ("p5.48xlarge", "h100_sxm"), "H200": ("p5e.48xlarge", "h200_sxm"),
        "B200": ("p6-b200.48xlarge", "b200_sxm")}
TPS = (1, 2, 4, 8)
PROMPTS = (512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BACKEND = "vllm"

_POOL = """\
project: fit
pools:
  - name: fit
    model: {{id: {model}}}
    serving: {{image: vllm/vllm-openai:v0.11.0, tensor_parallel: {tp}, max_model_len: 16384,
               max_num_batched_tokens: 8192, max_num_seqs: 256}}
    scaling: {{min_replicas: 1, max_replicas: 8}}
    aws: {{region: us-east-1, instance_type: {instance_type}, weights_uri: s3://fit/w/}}
"""


@dataclass(frozen=True)
class Point:
    """One grid point: the database's times for `batch` prompts of `prompt` tokens."""

    model: str
    tp: int
    prompt: int
    batch: int
    prefill_s: float  # static batch: all prompts prefilled in one step
    decode_s: float  # one decode step of `batch` sequences at `prompt` tokens of context


@dataclass(frozen=True)
class Config:
    gpu: str
    tp: int
    replicas: dict[str, ReplicaModel]  # model id -> the replica at this TP
    points: list[Point]


def package_version() -> str:
    return importlib.metadata.version(PACKAGE)


def backend_version() -> str:
    """The vLLM version whose tables the database serves (its `current` slot)."""
    import yaml

    text = resources.files("aiconfigurator_core").joinpath("systems/query_versions.yaml")
    return str(yaml.safe_load(text.read_text())["defaults"][BACKEND]["current"])


def replica(model: str, gpu: str, tp: int) -> ReplicaModel:
    text = _POOL.format(model=model, tp=tp, instance_type=GPUS[gpu][0])
    return replica_model(parse_config(text).pools[0], "aws")


def configs(gpu: str) -> list[Config]:
    """The grid on `gpu`, grouped by TP; configurations whose KV cache cannot hold the
    longest prompt (70B at TP 1) are left out, as poolctl would refuse them."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    logging.disable(logging.WARNING)  # its loader logs every fallback table it reads
    out = []
    for tp in TPS:
        replicas, points = {}, []
        for model, aic_model in MODELS.items():
            rm = replica(model, gpu, tp)
            if rm.kv_tokens < max(PROMPTS):
                continue
            replicas[model] = rm
            h = EngineHandle.compile(aic_model, GPUS[gpu][1], BACKEND, tp_size=tp)
            for isl in PROMPTS:
                for bs in BATCHES:
                    points.append(Point(model, tp, isl, bs,
                                        h.predict_prefill_latency(bs, isl) / 1000,
                                        h.predict_decode_latency(bs, isl, 2) / 1000))
        if points:
            out.append(Config(gpu, tp, replicas, points))
    return out


def model_times(rm: ReplicaModel, p: Point) -> tuple[float, float]:
    """The serving model's figures for a grid point: one step holding all the prompts (as
    the database's static batch), and one decode step."""
    n = p.batch * p.prompt
    prefill = rm.step_s(n, n, p.batch * rm.attn_flops(p.prompt, 0))
    return prefill, rm.decode_step_s(p.batch, p.prompt)


def errors(cfg: Config, f: ServingFactors) -> tuple[list[float], list[float]]:
    """Relative errors (model / database - 1) of prefill and decode over `cfg`'s grid."""
    pe, de = [], []
    for p in cfg.points:
        rm = with_factors(cfg.replicas[p.model], f)
        mp, md = model_times(rm, p)
        pe.append(mp / p.prefill_s - 1)
        de.append(md / p.decode_s - 1)
    return pe, de


# Bounds of the fit (the factors' physical ranges), in FACTOR_NAMES' order.
LOWER = (0.05, 0.05, 0.0, 0.0, 0.05, 0.0, 1.0)
UPPER = (1.0, 1.0, 20.0, 1000.0, 1.0, 200.0, 50.0)
START = (0.5, 0.7, 2.0, 0.0, 0.7, 10.0, 4.0)


def factors(x: list[float]) -> ServingFactors:
    return ServingFactors(**dict(zip(FACTOR_NAMES, x, strict=True)))


def fit(cfg: Config) -> ServingFactors:
    from scipy.optimize import least_squares  # installed with aiconfigurator-core

    def residuals(x: list[float]) -> list[float]:
        f = factors(x)
        pe, de = errors(cfg, f)
        return [math.log1p(e) for e in pe + de]

    x = least_squares(residuals, START, bounds=(LOWER, UPPER)).x
    if cfg.tp == 1:  # no all-reduce at TP 1: keep the link's factors at their start values
        x[4], x[5] = START[4], START[5]
    return factors([round(float(v), 4) for v in x])


def mae(xs: list[float]) -> float:
    return sum(map(abs, xs)) / len(xs) if xs else 0.0


def spread(xs: list[float]) -> str:
    return f"{min(xs):+.1%}..{max(xs):+.1%}"


def catalog_block(fits: dict[int, ServingFactors], system: str, version: str,
                  engine: EngineFit | None = None) -> str:
    lines = ["    serving_fit:",
             f"      source: {PACKAGE} {version} (PyPI, Apache-2.0), {system} {BACKEND} "
             f"{backend_version()} tables; scripts/fit_defaults.py",
             f"      package: {PACKAGE}=={version}",
             "      by_tp:"]
    for tp, f in fits.items():
        body = ", ".join(f"{k}: {getattr(f, k):g}" for k in FACTOR_NAMES)
        lines.append(f"        {tp}: {{{body}}}")
    if engine is not None:
        scale = ", ".join(f"{k}: {v:g}" for k, v in engine.mfu_scale.items())
        lines += ["      engine:",
                  f"        step_ms: {engine.step_ms:g}",
                  f"        us_per_seq: {engine.us_per_seq:g}",
                  f"        mfu_scale: {{{scale}}}",
                  f"        source: {json.dumps(engine.source)}",
                  f"        runs: {engine.runs}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the engine's time

# The measured runs each GPU's engine terms are fitted to: dense models (a mixture of
# experts and the small Llama-3.1-8B are held out, as checks the fit never saw). A dtype a
# GPU has no runs of takes the scale of the GPU named (the same kernels' generation).
ENGINE_FIT = {
    "H100": ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B-Instruct"),
    "H200": ("meta-llama/Llama-3.1-70B-Instruct",),
    "B200": ("meta-llama/Llama-3.1-70B-Instruct",),
}
SCALE_FROM = {"H200": "H100"}


def engine_runs(gpu: str) -> list[Any]:
    mr = measured()
    return [r for r in mr.runs() if r.gpu == gpu and r.model in ENGINE_FIT[gpu]
            and mr.fits(r)]


def measured() -> Any:
    """scripts/measured_runs.py, loaded beside this script."""
    if "measured_runs" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "measured_runs", Path(__file__).with_name("measured_runs.py"))
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["measured_runs"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["measured_runs"]


def with_engine(rm: ReplicaModel, dtype: str, e: EngineFit) -> ReplicaModel:
    """A replica of the kernel fit alone (`rm`) with the engine terms `e` added, by the rule
    servingmodel.replica_model adds the catalog's with."""
    kernel = ServingFactors(
        prefill_mfu=rm.prefill_mfu, decode_mbu=rm.decode_mbu,
        step_overhead_ms=rm.overhead_s * 1000, decode_us_per_seq=rm.per_seq_s * 1e6,
        link_efficiency=rm.link_efficiency, allreduce_us=rm.allreduce_latency_s * 1e6,
        overlap_k=rm.overlap_k)
    return with_factors(rm, servingmodel.with_engine(kernel, e, dtype))


def engine_errors(kernel: dict[int, ServingFactors], e: EngineFit,
                  runs: list[Any]) -> list[tuple[float, float]]:
    """(TTFT, TPOT) errors, model / measured - 1, of `runs` with kernel and engine terms."""
    mr = measured()
    out = []
    for r in runs:
        f = servingmodel.with_engine(factors_for_tp(kernel, r.tp), e, r.dtype)
        rm = with_factors(mr.replica(r.model, r.dtype, r.instance_type, r.tp), f)
        ttft, tpot = mr.predict(rm, r)
        out.append((ttft / r.ttft_s - 1, tpot / r.tpot_s - 1))
    return out


def fit_engine(kernel: dict[int, ServingFactors], runs: list[Any],
               given: dict[str, float]) -> EngineFit:
    """step_ms, us_per_seq and a prefill_mfu scale per dtype of `runs` (those in `given`
    are kept as given), by least squares on the log ratio of mean TTFT and TPOT."""
    from scipy.optimize import least_squares

    dtypes = sorted({r.dtype for r in runs} - set(given))
    mr = measured()

    def engine(x: list[float]) -> EngineFit:
        return EngineFit(step_ms=x[0], us_per_seq=x[1],
                         mfu_scale={**given, **dict(zip(dtypes, x[2:], strict=True))},
                         source="fit", runs=len(runs))

    def residuals(x: list[float]) -> list[float]:
        return [math.log1p(v) for pair in engine_errors(kernel, engine(x), runs) for v in pair]

    start = [2.0, 30.0] + [0.8] * len(dtypes)
    lo, hi = [0.0, 0.0] + [0.2] * len(dtypes), [30.0, 500.0] + [1.0] * len(dtypes)
    x = least_squares(residuals, start, bounds=(lo, hi), diff_step=0.05, max_nfev=60).x
    models = sorted({r.model.split("/")[-1] for r in runs})
    versions = sorted({r.version for r in runs if r.version})
    known = f"vLLM {', '.join(versions)} where the rows record it" if versions else \
        "the rows record no vLLM version"
    source = (f"{mr.PACKAGE} {mr.package_version()} systems/silicon_sample.csv: {len(runs)} "
              f"measured vLLM runs ({', '.join(models)}; {known}), replayed by "
              "scripts/measured_runs.py; scripts/fit_defaults.py")
    return EngineFit(step_ms=round(float(x[0]), 4), us_per_seq=round(float(x[1]), 3),
                     mfu_scale={k: round(v, 4) for k, v in engine(list(x)).mfu_scale.items()},
                     source=source, runs=len(runs))


def write_catalog(blocks: dict[str, str]) -> None:
    text = CATALOG.read_text()
    for gpu, block in blocks.items():
        head = re.search(rf"(?m)^  {gpu}:\n", text)
        assert head, f"gpu_specs.{gpu} not in the catalog"
        nxt = re.compile(r"(?m)^  \S")  # the next GPU's row
        m = nxt.search(text, head.end())
        end = m.start() if m else len(text)
        row = re.sub(r"(?m)^    serving_fit:\n(?:      .*\n)*", "", text[head.end():end])
        text = text[:head.end()] + row + block + text[end:]
    CATALOG.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the fit in the catalog")
    args = ap.parse_args(argv)
    version = package_version()
    blocks: dict[str, str] = {}
    engines: dict[str, EngineFit] = {}
    print(f"{PACKAGE} {version}; errors are model / database - 1 over prompts "
          f"{PROMPTS[0]}-{PROMPTS[-1]}, batch {BATCHES[0]}-{BATCHES[-1]}")
    for gpu in GPUS:
        fits = {}
        for cfg in configs(gpu):
            f = fit(cfg)
            fits[cfg.tp] = f
            b_pe, b_de = errors(cfg, LITERATURE)
            a_pe, a_de = errors(cfg, f)
            print(f"{gpu} TP{cfg.tp} ({', '.join(m.split('/')[1] for m in cfg.replicas)})\n"
                  f"  before: TTFT {spread(b_pe)}  TPOT {spread(b_de)}\n"
                  f"  after:  TTFT {spread(a_pe)}  TPOT {spread(a_de)}\n"
                  f"  {f.model_dump()}")
        runs = engine_runs(gpu)
        given = ({d: v for d, v in engines[SCALE_FROM[gpu]].mfu_scale.items()
                  if d not in {r.dtype for r in runs}} if gpu in SCALE_FROM else {})
        before = engine_errors(fits, EngineFit(step_ms=0, us_per_seq=0, source="-", runs=1),
                               runs)
        e = engines[gpu] = fit_engine(fits, runs, given)
        after = engine_errors(fits, e, runs)
        print(f"{gpu} engine over {len(runs)} measured runs ({', '.join(ENGINE_FIT[gpu])})\n"
              f"  kernels only:  TTFT MAE {mae([a for a, _ in before]):.1%}  TPOT MAE "
              f"{mae([b for _, b in before]):.1%}\n"
              f"  with engine:   TTFT MAE {mae([a for a, _ in after]):.1%}  TPOT MAE "
              f"{mae([b for _, b in after]):.1%}\n"
              f"  step_ms {e.step_ms:g}, us_per_seq {e.us_per_seq:g}, mfu_scale {e.mfu_scale}")
        blocks[gpu] = catalog_block(fits, GPUS[gpu][1], version, e)
    if args.write:
        write_catalog(blocks)
        print(f"wrote serving_fit for {', '.join(blocks)} in {CATALOG.relative_to(ROOT)}")
    else:
        print("".join(blocks.values()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
