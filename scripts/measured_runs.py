#!/usr/bin/env python3
"""The measured vLLM serving runs poolctl's serving model is checked against and fitted to.

`aiconfigurator-core` (PyPI, Apache-2.0, NVIDIA) ships `systems/silicon_sample.csv`: end-to-end
runs of real vLLM servers (`vllm/vllm-openai` images, versions in each row), each a closed
loop of `batch_size` clients sending prompts of `isl` tokens for `osl` output tokens on one
replica of `tp_size` GPUs, with the mean TTFT and TPOT the clients measured. This module
reads the rows poolctl can model (the vLLM backend, aggregated serving, H100/H200/B200 SXM,
BF16 and FP8 weights, a model with a poolctl preset) and replays each through the
simulator as `perf fit` replays a benchmark: a closed loop of the run's clients, TTFT counted
from each request's send.

    source scripts/env.sh && python scripts/measured_runs.py [--model M] [--gpu G]

prints the model's error per run and per (source, model, dtype, GPU) group.
scripts/fit_defaults.py fits the per-step engine terms to these runs;
tests/unit/test_measured_runs.py holds the errors within the issue's bounds.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.metadata
import math
import random
import statistics
import sys
from dataclasses import dataclass
from importlib import resources

from poolctl.config import parse_config
from poolctl.errors import UsageError
from poolctl.models import preset
from poolctl.perffit import Run, replay
from poolctl.servingmodel import ReplicaModel, replica_model

PACKAGE = "aiconfigurator-core"
# AIConfigurator's model path -> (poolctl preset, weight dtype)
MODELS = {
    "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen/Qwen3-235B-A22B",
    "MiniMaxAI/MiniMax-M2.5": "MiniMaxAI/MiniMax-M2.5",
}
# the CSV's precision column -> poolctl's dtype ("" is the checkpoint's own: BF16 here)
DTYPES = {"": "bfloat16", "fp8": "fp8"}
# AIConfigurator's system -> (poolctl's GPU, an AWS type carrying it)
SYSTEMS = {"h100_sxm": ("H100", "p5.48xlarge"), "h200_sxm": ("H200", "p5e.48xlarge"),
           "b200_sxm": ("B200", "p6-b200.48xlarge")}
# The serving flags of those runs are vLLM's defaults for its OpenAI server on these GPUs:
# gpu_memory_utilization 0.9, max_num_batched_tokens 8192 and max_num_seqs 1024 (vLLM
# V1's EngineArgs defaults for UsageContext.OPENAI_API_SERVER on GPUs of 70 GB and more).
GPU_MEMORY_UTILIZATION = 0.9
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024
# Two things the rows do not record, assumed alike for every run (and for the fit):
# - the requests each run sent: ten rounds of the clients, so the first round (every
#   client sending at once) weighs a tenth of the mean;
# - the spread of the lengths: vLLM's random dataset decodes random token ids and the
#   server tokenizes the text again, so prompt lengths scatter around isl; uniform within
#   +-5 % here (as `--random-range-ratio 0.05`), outputs too. This matters: with equal
#   lengths the simulated clients stay phase-locked (a round's prompts prefilled in one
#   step, for ever; TTFT 2-3x the measured one), which the measured TTFTs show real ones
#   do not; with +-20 % they drift apart further than the measured TTFTs show.
ROUNDS = 10
SPREAD = 0.05

_POOL = """\
project: measured
pools:
  - name: m
    model: {{id: {model}, dtype: {dtype}}}
    serving: {{image: vllm/vllm-openai:v0.11.0, tensor_parallel: {tp}, max_model_len: {mml},
               max_num_batched_tokens: {mnbt}, max_num_seqs: {mns},
               gpu_memory_utilization: {gmu}, kv_cache_dtype: {kvd}}}
    scaling: {{min_replicas: 1, max_replicas: 8}}
    aws: {{region: us-east-1, instance_type: {instance_type}, weights_uri: s3://measured/w/}}
"""


@dataclass(frozen=True)
class MeasuredRun:
    """One row of silicon_sample.csv: a closed loop on one replica, and what it measured."""

    id: str
    source: str  # the row's silicon_data_source (image, date, workflow)
    version: str  # vLLM's, as the row records it
    model: str  # poolctl's preset id
    dtype: str
    gpu: str
    instance_type: str
    tp: int
    isl: int
    osl: int
    clients: int
    ttft_s: float  # mean, as the clients measured it
    tpot_s: float

    @property
    def group(self) -> str:
        return f"{self.model.split('/')[-1]} {self.dtype} {self.gpu}"


def package_version() -> str:
    return importlib.metadata.version(PACKAGE)


@functools.cache
def runs() -> tuple[MeasuredRun, ...]:
    """The rows poolctl models, in file order."""
    text = resources.files("aiconfigurator_core").joinpath(
        "systems/silicon_sample.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        if (r["backend"] != "vllm" or r["mode"] != "agg" or r["model_path"] not in MODELS
                or r["system"] not in SYSTEMS or r["precision"] not in DTYPES
                or int(r["pp_size"] or 1) != 1 or int(r["attention_dp_size"] or 1) != 1
                or int(r["moe_ep_size"] or 1) != 1):
            continue
        gpu, itype = SYSTEMS[r["system"]]
        out.append(MeasuredRun(
            id=r["id"], source=r["silicon_data_source"], version=r["backend_version"],
            model=MODELS[r["model_path"]],
            dtype=DTYPES[r["precision"]], gpu=gpu, instance_type=itype,
            tp=int(r["tp_size"]), isl=int(r["isl"]), osl=int(r["osl"]),
            clients=int(r["batch_size"]), ttft_s=float(r["silicon_ttft_ms"]) / 1000,
            tpot_s=float(r["silicon_tpot_ms"]) / 1000))
    return tuple(out)


@functools.cache
def replica(model: str, dtype: str, instance_type: str, tp: int) -> ReplicaModel:
    """The replica those runs served on, as poolctl models it with the catalog's factors."""
    p = preset(model)
    assert p is not None, model
    text = _POOL.format(model=model, dtype=dtype, tp=tp, mml=p.max_context,
                        mnbt=MAX_NUM_BATCHED_TOKENS, mns=MAX_NUM_SEQS,
                        gmu=GPU_MEMORY_UTILIZATION, instance_type=instance_type,
                        kvd="fp8" if dtype == "fp8" else "auto")
    return replica_model(parse_config(text).pools[0], "aws")


def as_benchmark(run: MeasuredRun) -> Run:
    n = ROUNDS * run.clients
    rng = random.Random(run.id)  # the same lengths on every replay of the run
    inputs = [max(1, round(run.isl * rng.uniform(1 - SPREAD, 1 + SPREAD))) for _ in range(n)]
    outputs = [max(2, round(run.osl * rng.uniform(1 - SPREAD, 1 + SPREAD))) for _ in range(n)]
    return Run(run.id, run.tp, run.model, run.clients, math.inf, 1.0, inputs, outputs,
               {"ttft_mean": run.ttft_s, "tpot_mean": run.tpot_s})


def predict(rm: ReplicaModel, run: MeasuredRun) -> tuple[float, float]:
    """Mean TTFT and TPOT (s) the serving model gives for `run` on replica `rm`."""
    got = replay(rm, as_benchmark(run))
    return got["ttft_mean"], got["tpot_mean"]


def fits(run: MeasuredRun) -> bool:
    """poolctl would serve the run: the model fits in HBM with room for one sequence."""
    try:
        rm = replica(run.model, run.dtype, run.instance_type, run.tp)
    except UsageError:  # a configuration poolctl refuses (weights over HBM)
        return False
    return rm.kv_tokens >= run.isl + run.osl


def errors() -> list[tuple[MeasuredRun, float, float]]:
    """(run, TTFT error, TPOT error) as model / measured - 1 over every run poolctl serves."""
    out = []
    for run in runs():
        if not fits(run):
            continue
        ttft, tpot = predict(replica(run.model, run.dtype, run.instance_type, run.tp), run)
        out.append((run, ttft / run.ttft_s - 1, tpot / run.tpot_s - 1))
    return out


def table(errs: list[tuple[MeasuredRun, float, float]]) -> str:
    groups: dict[str, list[tuple[float, float]]] = {}
    for run, e1, e2 in errs:
        groups.setdefault(run.group, []).append((e1, e2))
    lines = [f"{'model dtype GPU':<36} {'runs':>4}  {'TTFT MAE':>8} {'bias':>7}  "
             f"{'TPOT MAE':>8} {'bias':>7}"]
    for g, es in sorted(groups.items()):
        t = [e[0] for e in es]
        p = [e[1] for e in es]
        lines.append(f"{g:<36} {len(es):>4}  {mae(t):>8.1%} {statistics.mean(t):>+7.1%}  "
                     f"{mae(p):>8.1%} {statistics.mean(p):>+7.1%}")
    t = [e[1] for e in errs]
    p = [e[2] for e in errs]
    lines.append(f"{'all':<36} {len(errs):>4}  {mae(t):>8.1%} {statistics.mean(t):>+7.1%}  "
                 f"{mae(p):>8.1%} {statistics.mean(p):>+7.1%}")
    return "\n".join(lines)


def mae(xs: list[float]) -> float:
    return statistics.mean(abs(x) for x in xs) if xs else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="only runs of this preset id (substring)")
    ap.add_argument("--gpu", help="only runs on this GPU (H100, H200, B200)")
    ap.add_argument("--each", action="store_true", help="print every run")
    args = ap.parse_args(argv)
    errs = [e for e in errors()
            if (not args.model or args.model in e[0].model)
            and (not args.gpu or args.gpu == e[0].gpu)]
    if args.each:
        for run, e1, e2 in errs:
            print(f"{run.group:<32} tp{run.tp} {run.isl:>5}/{run.osl:<5} c{run.clients:<4} "
                  f"TTFT {run.ttft_s * 1000:9.1f} ms {e1:+7.1%}  TPOT {run.tpot_s * 1000:7.2f} "
                  f"ms {e2:+7.1%}")
    print(f"{PACKAGE} {package_version()}: model / measured - 1, mean TTFT and TPOT")
    print(table(errs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
