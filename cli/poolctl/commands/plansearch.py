"""`plan --search`: the configuration search's table, its progress, and `--write`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich import box
from rich.table import Table

from poolctl.cloud import Cloud
from poolctl.commands.common import console
from poolctl.config import Config, Pool, Target, find_config, parse_config
from poolctl.errors import UsageError
from poolctl.files import replace_file
from poolctl.runtime.fileedit import set_scalar
from poolctl.search import AGGREGATED, Candidate, SearchResult, search
from poolctl.traces import Trace


def run_searches(cfg: Config, tgts: list[Target], trace: Trace, workers: int,
                 allow_unfitted: bool = False) -> dict[tuple[str, Cloud], SearchResult]:
    out: dict[tuple[str, Cloud], SearchResult] = {}
    for tgt in tgts:
        p, c = tgt.pool, tgt.cloud
        t0 = time.monotonic()

        def progress(n: int, total: int, what: str, p: Pool = p, c: Cloud = c,
                     t0: float = t0) -> None:
            sys.stderr.write(f"search {p.name}/{c}: {n}/{total} type and TP groups "
                             f"({what} done, {time.monotonic() - t0:.0f} s)\n")
            sys.stderr.flush()

        out[(p.name, c)] = search(cfg, p, c, trace, workers=workers, progress=progress,
                                  allow_unfitted=allow_unfitted)
    return out


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


TOPOLOGY_SHORT = {AGGREGATED: "agg", "disagg-node": "P/D node", "disagg-cross": "P/D cross"}


def _row(c: Candidate, mark: str, lens: bool, hits: bool) -> list[str]:
    s = c.summary
    return [mark, c.config.instance_type, TOPOLOGY_SHORT.get(c.config.topology,
                                                              c.config.topology),
            c.config.shape, f"{c.config.max_num_seqs}/{c.config.max_num_batched_tokens}",
            *([c.config.balancer, _f(c.hit_rate, ".0%")] if hits else []),
            *([f"{c.config.max_model_len:,}", f"{s.requests_over_max_model_len:,}"]
              if lens else []),
            f"{c.nodes}", f"{c.cost_per_hour_usd:,.2f}",
            _f(s.cost.usd_per_1m_output_tokens, ",.2f"),
            f"{_ms(s.ttft_s.p50)}/{_ms(s.ttft_s.p90)}",
            f"{_ms(s.tpot_s.p50)}/{_ms(s.tpot_s.p90)}",
            f"{s.slo.goodput:.1%}", _f(s.energy.kwh_per_1m_output_tokens, ",.1f"),
            "yes" if c.meets else "no", "measured" if c.fitted else "unfitted"]


def render_search(pool: Pool, r: SearchResult) -> None:

    out = console()
    if not out.is_terminal:  # a file or a pipe: room for the table's columns
        out.width = max(out.width, 132)
    slo = pool.slo
    tpot = f", TPOT p90 {slo.tpot_p90_s} s" if slo.tpot_p90_s is not None else ""
    t = Table(title=f"{r.pool} on {r.cloud}: Pareto front of {len(r.candidates)} candidates "
                    f"({r.configurations} configurations; SLO TTFT p90 {slo.ttft_p90_s} s"
                    f"{tpot}, utilization <= {slo.target_utilization}); TTFT and TPOT as p50/p90",
              title_justify="left", box=box.SIMPLE_HEAD)
    # max_model_len and the requests refused for it, when the search tried longer ones
    lens = len({c.config.max_model_len for c in r.candidates}) > 1
    # the balancer and the prefix cache's hit rate, when the trace has prefix hashes
    hits = any(c.hit_rate is not None for c in r.candidates)
    for col in ("", "type", "topology", "TP", "seqs/step",
                *(("balancer", "hits") if hits else ()),
                *(("max len", "refused") if lens else ()),
                "nodes", "$/h", "$/1M out", "TTFT ms", "TPOT ms", "goodput", "kWh/1M", "SLOs",
                "factors"):
        t.add_column(col, justify="left" if col in ("", "type", "SLOs", "factors") else "right",
                     no_wrap=col in ("type", "topology", "seqs/step"))
    rows = list(r.front)
    if r.deployable is not None and r.deployable not in rows:
        rows.append(r.deployable)  # beside a disaggregated choice, off the front
    for c in sorted(rows, key=Candidate.key):
        mark = ("chosen" if c == r.chosen else "write" if c == r.deployable else
                "file" if c == r.file_candidate() else "")
        t.add_row(*_row(c, mark, lens, hits))
    out.print(t)
    ch, f = r.chosen, r.file_candidate()
    assert ch is not None  # search() raises when nothing meets the SLOs
    usd = ch.summary.cost.usd_per_1m_output_tokens
    line = (f"chosen: {ch.nodes} node(s) of {ch.config.label()} (topology {ch.config.topology})"
            f" at ${ch.cost_per_hour_usd:,.2f}/h, ${_f(usd, ',.3f')} per 1M output tokens")
    if f is not None:
        fu = f.summary.cost.usd_per_1m_output_tokens
        line += (f"; the file's configuration ({f.config.label()}) needs {f.nodes} node(s) at "
                 f"${f.cost_per_hour_usd:,.2f}/h, ${_f(fu, ',.3f')} per 1M output tokens")
    else:
        line += "; the file's configuration meets the SLOs at no node count searched"
    out.print(line)
    cheaper = [c for c in r.candidates if c.meets and not c.fitted and c.key() < ch.key()]
    if ch.fitted and cheaper:
        u = min(cheaper, key=Candidate.key)
        out.print(f"not chosen: {u.nodes} node(s) of {u.config.label()} at "
                  f"${u.cost_per_hour_usd:,.2f}/h meets the SLOs by factors no measured run "
                  f"of its GPU with these weights checked; --allow-unfitted ranks it")
    elif not ch.fitted:
        out.print("chosen on factors no measured run of its GPU with these weights checked "
                  "(`poolctl perf fit` with a benchmark of it does)")
    d = r.deployable
    if ch.config.topology != AGGREGATED:
        out.print(f"poolctl does not deploy {ch.config.topology} serving yet: "
                  + ("no aggregated candidate meets the SLOs, so `--write` refuses" if d is None
                     else f"the best aggregated candidate is {d.nodes} node(s) of "
                     f"{d.config.label()} at ${d.cost_per_hour_usd:,.2f}/h, "
                     f"${_f(d.summary.cost.usd_per_1m_output_tokens, ',.3f')} per 1M output "
                     "tokens; `--write` writes that one"))
        if d is None:
            return
    if not r.changes:
        out.print("poolctl.yaml: nothing to change (the file already has the choice)")
        return
    out.print("poolctl.yaml lines that would change (`--write` applies them):")
    for change in r.changes:
        old = change.old if change.old is not None else "(default)"
        out.print(f"  {change.key}: {old} -> {change.new}")
    if r.sizes is not None:
        out.print(f"  (keeps the file's headroom: {r.sizes.headroom_nodes} node(s) above the "
                  f"minimum, {r.sizes.warm_nodes} warm node(s))")


def write_changes(file: Path | None, cfg: Config, results: dict[tuple[str, Cloud], SearchResult]
                  ) -> list[str]:
    """Apply every search's changes to the config file in place, one line each (comments
    and order kept); all or nothing. Returns one line per change made."""
    names = [name for name, _ in results]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--write: pool {twice[0]} was searched on two clouds, whose choices "
                         "may differ; give --cloud")
    for (name, c), r in results.items():
        if r.chosen is not None and r.chosen.config.topology != AGGREGATED and \
                r.deployable is None:
            raise UsageError(f"--write: {name}/{c}: the choice is {r.chosen.config.topology} "
                             "serving, which poolctl does not deploy yet, and no aggregated "
                             "candidate meets the SLOs; nothing was written")
    path = find_config(file)
    text = path.read_text()
    done: list[str] = []
    for (name, _), r in results.items():
        idx = [p.name for p in cfg.pools].index(name)
        for ch in r.changes:
            loc: tuple[int | str, ...] = ("pools", idx, *ch.key.split("."))
            # Numbers and type names: plain scalars, as the file writes them.
            text, _, line = set_scalar(text, loc, ch.new, source=str(path), plain=True)
            done.append(f"{path}:{line}: {name}: {ch.key}: "
                        f"{ch.old if ch.old is not None else '(default)'} -> {ch.new}")
    parse_config(text, source=str(path))  # the edited file still reads (or nothing written)
    if done:
        replace_file(path, text)
    for (name, c), r in results.items():
        if r.chosen is not None and r.deployable is not None and r.deployable != r.chosen:
            sys.stderr.write(f"poolctl: {name}/{c}: wrote the best aggregated candidate "
                             f"({r.deployable.config.label()}), not the {r.chosen.config.topology}"
                             " choice, which poolctl does not deploy yet\n")
    for (name, c), r in results.items():
        other = Cloud.gcp if c == Cloud.aws else Cloud.aws
        pool = next(p for p in cfg.pools if p.name == name)
        shared = [ch.key for ch in r.changes if ch.key.split(".")[0] in ("serving", "scaling",
                                                                         "warm_pool")]
        if shared and pool.placement(other) is not None:
            # serving, scaling and warm_pool are the pool's, not one placement's.
            sys.stderr.write(f"poolctl: warning: {name}: {', '.join(shared)} also apply to its "
                             f"{other} placement; run `poolctl plan --cloud {other}` (or "
                             f"--search) to check it\n")
    return done
