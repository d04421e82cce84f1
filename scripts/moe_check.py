#!/usr/bin/env python3
"""How far poolctl's kernel model is from AIConfigurator's static estimates on mixtures of
experts (issue 33: MoE within 15 % over TP 1-8, batch 1-64, prompts 512-8k).

For each MoE model both poolctl (a preset in cli/poolctl/data/models.yaml) and
AIConfigurator (`aiconfigurator-core`, a model config it ships) know, on one GPU type, per TP:
the mean and worst relative error (poolctl / database - 1) of the static-batch prefill and of
one decode step, over scripts/fit_defaults.py's grid. The experts are split by tensor
parallelism (vLLM without --enable-expert-parallel: moe_tp = TP, moe_ep = 1); `--ep` asks the
database for expert parallelism instead (moe_ep = TP), which poolctl does not model yet, to
show what it changes. The per-step engine time is left out on both sides (it adds the same
to each). Numbers, not assertions: nothing here is fitted to these models.

    source scripts/env.sh && python scripts/moe_check.py [--gpu H100] [--ep]

Needs the dev extra (aiconfigurator-core).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fit_defaults as fd  # noqa: E402  (the grid, the pool text, the model's step times)

# poolctl's preset -> AIConfigurator's model config of the same architecture
MOE = {
    "Qwen/Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "mistralai/Mixtral-8x22B-Instruct-v0.1": "mistralai/Mixtral-8x22B-v0.1",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
    "MiniMaxAI/MiniMax-M2.5": "MiniMaxAI/MiniMax-M2.5",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", choices=sorted(fd.GPUS), default="H100")
    ap.add_argument("--ep", action="store_true", help="the database with expert parallelism")
    args = ap.parse_args(argv)
    from aiconfigurator_core.sdk.engine import EngineHandle

    logging.disable(logging.WARNING)
    print(f"{'model':40} {'TP':>2} {'points':>6}  {'prefill mean':>12} {'worst':>7}  "
          f"{'decode mean':>11} {'worst':>7}")
    for model, aic in MOE.items():
        for tp in fd.TPS:
            try:
                rm = fd.replica(model, args.gpu, tp)
            except Exception as e:  # a preset poolctl refuses at this TP (does not fit)
                print(f"{model:40} {tp:2}  poolctl: {str(e)[:70]}")
                continue
            if rm.kv_tokens < max(fd.PROMPTS):
                print(f"{model:40} {tp:2}  poolctl: no KV room for {max(fd.PROMPTS)} tokens")
                continue
            moe = {"moe_tp_size": 1, "moe_ep_size": tp} if args.ep else {
                "moe_tp_size": tp, "moe_ep_size": 1}
            try:
                h = EngineHandle.compile(aic, fd.GPUS[args.gpu][1], fd.BACKEND, tp_size=tp,
                                         **moe)
            except Exception as e:  # not in the database (offline: no download)
                print(f"{model:40} {tp:2}  database: {str(e)[:70]}")
                break
            pe, de = [], []
            for isl in fd.PROMPTS:
                for bs in fd.BATCHES:
                    try:
                        p = fd.Point(model, tp, isl, bs, h.predict_prefill_latency(bs, isl) / 1000,
                                     h.predict_decode_latency(bs, isl, 2) / 1000)
                    except Exception:  # a point the database has no table for
                        continue
                    mp, md = fd.model_times(rm, p)
                    pe.append(mp / p.prefill_s - 1)
                    de.append(md / p.decode_s - 1)
            if pe:
                print(f"{model:40} {tp:2} {len(pe):6}  {statistics.mean(pe):+12.1%} "
                      f"{max(map(abs, pe)):7.1%}  {statistics.mean(de):+11.1%} "
                      f"{max(map(abs, de)):7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
