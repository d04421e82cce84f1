"""poolctl perf fit: the serving model's factors fitted to a `vllm bench serve` result
(`poolctl.perffit`); this module parses options, renders and writes the `perf:` block."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from poolctl.commands.common import CloudOpt, FileOpt, JsonOpt, PoolOpt, emit_json, load
from poolctl.commands.common import one_target as pick_target
from poolctl.config import find_config, parse_config
from poolctl.errors import UsageError
from poolctl.files import replace_file
from poolctl.perffit import fit as fit_runs
from poolctl.perffit import parse_results
from poolctl.progress import log
from poolctl.readfile import open_regular
from poolctl.runtime.fileedit import set_scalar
from poolctl.servingmodel import replica_model

app = typer.Typer(help="The serving model against measurements.", no_args_is_help=True)

ResultArg = Annotated[Path, typer.Argument(
    help="The JSON `vllm bench serve --save-result` wrote (several runs: one per line, as "
    "--append-result writes them).", show_default=False)]


@app.command()
def fit(
    result: ResultArg,
    file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
    tp: Annotated[int | None, typer.Option(
        "--tp", min=1, max=8, help="Tensor parallelism of the benchmarked replica when the "
        "result does not say (--metadata tensor_parallel_size=N).")] = None,
    write: Annotated[bool, typer.Option(
        "--write", help="Write the fitted factors into the pool's `perf:` block.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fit prefill_mfu, decode_mbu, step_overhead_ms and decode_us_per_seq to RESULT."""
    cfg = load(file)
    tgt = pick_target(cfg, pool, cloud)
    p, c = tgt.pool, tgt.cloud
    with open_regular(result, "RESULT", "give the file `vllm bench serve --save-result` "
                      "wrote", 64 * 2**20) as fh:
        raw = fh.read()
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UsageError(f"RESULT: {result} is not UTF-8 text; give the JSON `vllm bench "
                         "serve --save-result` wrote") from None
    runs = parse_results(text, str(result), default_tp=tp)
    for r in runs:
        if r.model_id and r.model_id != p.model.id and not r.model_id.endswith(
                p.model.id.split("/")[-1]):
            raise UsageError(f"{result}: model_id {r.model_id} is not pool {p.name}'s model "
                             f"{p.model.id}; pick the pool with --pool")
    replicas = []
    for r in runs:
        pt = p if r.tp == p.serving.tensor_parallel else p.model_copy(
            update={"serving": p.serving.model_copy(update={"tensor_parallel": r.tp})})
        replicas.append(replace(replica_model(pt, c), max_num_seqs=p.serving.max_num_seqs))
    log(f"perf fit: replaying {len(runs)} run{'s' if len(runs) > 1 else ''} "
        f"({sum(len(r.inputs) for r in runs):,} requests) a few hundred times; seconds to a "
        "minute")
    f = fit_runs(replicas, runs)
    written = _write(find_config(file), p.name, f.factors) if write else None
    if json_out:
        emit_json({"pool": p.name, "cloud": str(c), "runs": len(runs), "perf": f.factors,
                   "errors": f.errors, "errors_before": f.before, "written": written})
        return
    print(f"{p.name}/{c}: {len(runs)} run{'s' if len(runs) > 1 else ''} of {result}; "
          "error (model / measured - 1), current factors -> fitted:")
    for label, errs in f.errors.items():
        before = f.before[label]
        cells = ", ".join(f"{k.replace('_', ' ')} {before[k]:+.1%} -> {v:+.1%}"
                          for k, v in errs.items())
        print(f"  run {label}: {cells}")
    if written:
        print(f"wrote {written}")
        return
    idx = [q.name for q in cfg.pools].index(p.name)
    print(f"paste into pools[{idx}] ({p.name}), or run again with --write:")
    print("    perf:")
    for k, v in f.factors.items():
        print(f"      {k}: {v:g}")


def _write(target: Path, pool: str, factors: dict[str, float]) -> str:
    """The fitted factors into the pool's `perf:` block, in place: each value replaced where
    the key is written, else a line added (a `perf:` block added after `name:` when there is
    none); comments and order kept, the result re-validated before it is written."""
    text = target.read_text()
    conf = parse_config(text, str(target))
    idx = next(i for i, q in enumerate(conf.pools) if q.name == pool)
    measured = [k for k in ("prefill_tokens_per_s", "decode_ms_batch1") if getattr(
        conf.pools[idx].perf, k) is not None]
    if measured:
        raise UsageError(f"{target}: pools[{idx}].perf.{measured[0]} calibrates the same "
                         "factors; remove the measured numbers, then run --write again")
    for k, v in factors.items():  # v has 4 digits
        text, _, _ = set_scalar(text, ("pools", idx, "perf", k), f"{v:g}", str(target),
                                plain=True)
    new = parse_config(text, str(target)).pools[idx].perf
    if any(getattr(new, k) != v for k, v in factors.items()):
        raise UsageError(f"{target}: pools[{idx}].perf: cannot write the fitted factors in "
                         "place; paste the block the command prints by hand")
    replace_file(target, text)
    return f"{target}: pools[{idx}].perf ({', '.join(factors)})"
