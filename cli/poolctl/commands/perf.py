"""poolctl perf fit: the serving model's factors fitted to a `vllm bench serve` result
(`poolctl.perffit`) or to what a deployed pool served (`runtime.livefit`); this module parses
options, renders and writes the `perf:` block."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from poolctl.cloud import Cloud
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    emit_json,
    load,
    resolve_target,
    whole,
)
from poolctl.commands.common import one_target as pick_target
from poolctl.config import Config, Pool, find_config, parse_config
from poolctl.errors import UsageError
from poolctl.files import replace_file
from poolctl.perffit import Fit, parse_results
from poolctl.perffit import fit as fit_runs
from poolctl.progress import log
from poolctl.readfile import open_regular
from poolctl.runtime.fileedit import set_scalar
from poolctl.runtime.livefit import label, pool_fit
from poolctl.servingmodel import replica_model

app = typer.Typer(help="The serving model against measurements.", no_args_is_help=True)

ResultArg = Annotated[Path | None, typer.Argument(
    help="The JSON `vllm bench serve --save-result` wrote (several runs: one per line, as "
    "--append-result writes them). Without it: the deployed pool's own histograms over "
    "--window.", show_default=False)]
MAX_WINDOW_MIN = 24 * 60


@app.command()
def fit(
    result: ResultArg = None,
    file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
    sandbox: SandboxOpt = False,
    window: Annotated[int | None, typer.Option(
        "--window", parser=whole(1, MAX_WINDOW_MIN, "minutes"), metavar="MIN",
        help="Without RESULT: fit to what the pool's engines served over the last MIN "
        "minutes (default 60), as `status --window` reads it.", show_default=False)] = None,
    tp: Annotated[int | None, typer.Option(
        "--tp", min=1, max=8, help="Tensor parallelism of the benchmarked replica when the "
        "result does not say (--metadata tensor_parallel_size=N).")] = None,
    write: Annotated[bool, typer.Option(
        "--write", help="Write the fitted factors into the pool's `perf:` block.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fit prefill_mfu, decode_mbu, step_overhead_ms and decode_us_per_seq to RESULT, or to
    the deployed pool's own latency."""
    if result is None:
        _fit_pool(file, pool, cloud, sandbox, window or 60, tp, write, json_out)
        return
    for flag, given in (("--sandbox", sandbox), ("--window", window is not None)):
        if given:
            raise UsageError(f"{flag}: reads the deployed pool; drop RESULT to fit to it, or "
                             f"drop {flag} to fit to {result}")
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
    failed = [{"run": r.label, "failed": r.failed, "completed": r.completed}
              for r in runs if r.failed]
    for x in failed:
        sys.stderr.write(f"poolctl: run {x['run']}: {x['failed']:,} request(s) failed beside "
                         f"{x['completed']:,} completed; vLLM's statistics, and this fit, "
                         "cover the completed ones (the server's log says why they failed)\n")
    log(f"perf fit: replaying {len(runs)} run{'s' if len(runs) > 1 else ''} "
        f"({sum(len(r.inputs) for r in runs):,} requests) a few hundred times; seconds to a "
        "minute")
    f = fit_runs(replicas, runs)
    written = _write(find_config(file), p.name, f.factors) if write else None
    if json_out:
        emit_json({"pool": p.name, "cloud": str(c), "runs": len(runs), "perf": f.factors,
                   "errors": f.errors, "errors_before": f.before, "failed": failed,
                   "written": written})
        return
    print(f"{p.name}/{c}: {len(runs)} run{'s' if len(runs) > 1 else ''} of {result}; "
          "error (model / measured - 1), current factors -> fitted:")
    _report(cfg, p, f, written)


def _fit_pool(file: Path | None, pool: str | None, cloud: Cloud | None, sandbox: bool,
              window: int, tp: int | None, write: bool, json_out: bool) -> None:
    """`perf fit --pool P --cloud C` without RESULT: the pool's own window."""
    if tp is not None:
        raise UsageError("--tp: the deployed pool's TP is its serving.tensor_parallel; --tp "
                         "is for a result file that does not say")
    ctx = resolve_target(file, pool, cloud, sandbox)
    p, c = ctx.target.pool, ctx.target.cloud
    log(f"perf fit: reading what {p.name}'s engines served over the last {window} min, then "
        "replaying it a few hundred times; seconds to a minute")
    lf = pool_fit(ctx.cfg, p, c, ctx.ops, 60.0 * window)
    written = _write(ctx.path, p.name, lf.fit.factors) if write else None
    r = lf.ratio
    if json_out:
        emit_json({"pool": p.name, "cloud": str(c), **lf.to_json(), "perf": lf.fit.factors,
                   "errors": lf.fit.errors, "errors_before": lf.fit.before,
                   "written": written})
        return
    w = lf.window
    print(f"{p.name}/{c}: last {window} min, {w.requests:,.0f} requests "
          f"({w.requests_per_s:.2f}/s on {lf.replicas} replicas, prompt "
          f"{w.prompt_tokens / w.requests:,.0f} and output {w.output_tokens / w.requests:,.0f} "
          "tokens on average); error (model / measured - 1), current factors -> fitted:")
    _report(ctx.cfg, p, lf.fit, written, hint=label(60.0 * window))
    print(f"the engines' steps vs the current model's, at this load: prefill x{r.prefill:.2f} "
          f"(a {r.prompt:,}-token prompt), decode x{r.decode:.2f} (a step of {r.batch} "
          f"sequences of {r.context:,} tokens)")


def _report(cfg: Config, p: Pool, f: Fit, written: str | None, hint: str = "") -> None:
    for name, errs in f.errors.items():
        before = f.before[name]
        cells = ", ".join(f"{k.replace('_', ' ')} {before[k]:+.1%} -> {v:+.1%}"
                          for k, v in errs.items())
        print(f"  {hint or 'run ' + name}: {cells}")
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
