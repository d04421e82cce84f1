"""validate, plan, schema: the commands that read the config and never call a cloud."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from poolctl.capacity import recommend
from poolctl.cloud import Cloud
from poolctl.commands.bounds import bounded
from poolctl.commands.common import (
    CloudAllOpt,
    FileOpt,
    JsonOpt,
    MeasuredOpt,
    PoolOpt,
    console,
    emit_json,
    load,
    print_findings,
    require_valid,
    start_times,
    start_words,
    targets,
)
from poolctl.commands.plansearch import render_search, run_searches, write_changes
from poolctl.commands.traffic import DurationOpt, RateOpt, SeedOpt, TimeScaleOpt, TrafficOpt
from poolctl.commands.traffic import traffic as load_traffic
from poolctl.config import Target, json_schema
from poolctl.errors import UsageError
from poolctl.files import replace_file
from poolctl.node_image import NodeImage, recorded_node_image
from poolctl.predictive import predictive
from poolctl.rules import TrafficNeed, errors, exit_code, run_checks
from poolctl.sizing import (
    COMPILE_HIT_S,
    COMPILE_S,
    ENGINE_INIT_S,
    compile_miss_s,
    nodes_for,
    plan_pool,
    quota_totals,
)

if TYPE_CHECKING:
    from poolctl.capacity import Recommendation
    from poolctl.config import Config
    from poolctl.sizing import PoolPlan

# Simulated recommendations per (pool name, cloud) (poolctl.capacity.recommend).
Recs = dict[tuple[str, Cloud], "Recommendation"]


def validate(file: FileOpt = None, pool: PoolOpt = None, cloud: CloudAllOpt = None,
             json_out: JsonOpt = False) -> None:
    """Check the file and every rule; print each failed check with a hint."""

    cfg = load(file)
    tgts = targets(cfg, pool, cloud)
    findings = run_checks(cfg, tgts)
    errs = errors(findings)
    if json_out:
        emit_json({"ok": not errs, "findings": [f.to_json() for f in findings]})
    else:
        print_findings(findings)
        checked = ", ".join(f"{t.pool.name}/{t.cloud}" for t in tgts)
        status = "FAILED" if errs else "ok"
        sys.stderr.write(f"{status}: {len(errs)} error(s), "
                         f"{len(findings) - len(errs)} note(s) over {checked}\n")
    if errs:
        raise typer.Exit(exit_code(findings))


SearchOpt = Annotated[bool, typer.Option(
    "--search", help="With --traffic or --rate: search instance types, tensor parallelism and "
    "batching limits for the cheapest configuration meeting the SLOs.")]
WriteOpt = Annotated[bool, typer.Option(
    "--write", help="With --search: apply the chosen configuration to the file in place.")]
UnfittedOpt = Annotated[bool, typer.Option(
    "--allow-unfitted", help="With --search: rank GPUs whose serving factors no measurement "
    "fitted (the literature's figures; the table marks them) beside fitted ones. Without "
    "it, one is chosen only when no fitted GPU meets the SLOs.")]
WorkersOpt = Annotated[int, typer.Option(
    "--workers", help="With --search: processes evaluating configurations (0, the default: "
    "up to 2).",
    parser=bounded("--workers", 0, 64, "a count of processes", integer=True))]


def plan(file: FileOpt = None, pool: PoolOpt = None, cloud: CloudAllOpt = None,
         json_out: JsonOpt = False,
         traffic: TrafficOpt = None, rate: RateOpt = None, duration: DurationOpt = 3600.0,
         seed: SeedOpt = 0, time_scale: TimeScaleOpt = 1.0, search: SearchOpt = False,
         write: WriteOpt = False, workers: WorkersOpt = 0,
         allow_unfitted: UnfittedOpt = False, measured: MeasuredOpt = False) -> None:
    """Sizing, memory, quota and cost per pool and cloud; no cloud calls. With --traffic
    (or --rate), also the replicas that meet the SLO, found by simulation; with --search,
    the cheapest configuration meeting the SLOs."""

    if search and traffic is None and rate is None:
        raise UsageError("--search: give the traffic to search for with --traffic FILE or "
                         "--rate R")
    if write and not search:
        raise UsageError("--write: applies a --search's choice; add --search")
    if allow_unfitted and not search:
        raise UsageError("--allow-unfitted: changes what a --search chooses; add --search")
    cfg = load(file)
    tgts = targets(cfg, pool, cloud)
    require_valid(cfg, tgts)
    plans = [plan_pool(t.pool, t.cloud, recorded_node_image(t.pool, t.cloud)) for t in tgts]
    totals = _quota_totals(cfg, tgts)
    starts = {(t.pool.name, t.cloud): start_times(cfg, t.pool, t.cloud, measured)
              for t in tgts}
    if search:
        # A measured start is of the configuration that ran; the search's others start as
        # the catalog says.
        _plan_search(cfg, file, tgts, plans, totals, traffic, rate, duration, seed, time_scale,
                     json_out, write, workers or min(2, os.cpu_count() or 1), allow_unfitted)
        return
    recs = _recommendations(cfg, tgts, traffic, rate, duration, seed, time_scale,
                            {k: v[0] for k, v in starts.items()})
    if json_out:
        entries = [p.to_json() for p in plans]
        for e, t, pl in zip(entries, tgts, plans, strict=True):
            e["start_times"] = starts[(t.pool.name, t.cloud)][1]
            if t.cloud == Cloud.aws and (ahead := predictive(t.pool, pl)) is not None:
                e["predictive"] = ahead.to_json()
            if (t.pool.name, t.cloud) in recs:
                e["recommendation"] = recs[(t.pool.name, t.cloud)].to_json()
        emit_json({"project": cfg.project, "pools": entries, "quota_totals": totals})
        return
    render_plans(plans)
    for t, pl in zip(tgts, plans, strict=True):
        console().print(start_words(f"{t.pool.name}/{t.cloud}",
                                    starts[(t.pool.name, t.cloud)][1]), markup=False,
                        soft_wrap=True)
        if t.cloud == Cloud.aws and (ahead := predictive(t.pool, pl)) is not None:
            console().print(f"{t.pool.name}/{t.cloud}: {ahead.line()}", markup=False,
                            soft_wrap=True)
        if miss := compile_miss_s(t.pool, t.cloud):
            console().print(
                f"{t.pool.name}/{t.cloud}: compile cache shared (compile_cache_uri): "
                f"engine_init {ENGINE_INIT_S - miss:g} s instead of {ENGINE_INIT_S:g} "
                f"(torch.compile {COMPILE_S:g} s, from the cache {COMPILE_HIT_S:g} s: "
                f"docs/cloud-facts.md); the pool's first node compiles, {miss:g} s more",
                markup=False, soft_wrap=True)
    render_quota_totals(totals)
    if recs:
        render_recommendations(tgts, plans, recs)


def _plan_search(cfg: Config, file: Path | None, tgts: list[Target],
                 plans: list[PoolPlan], totals: list[dict[str, Any]], traffic: Path | None,
                 rate: float | None, duration: float, seed: int, time_scale: float,
                 json_out: bool, write: bool, workers: int, allow_unfitted: bool) -> None:
    tr = load_traffic(traffic, rate, duration, seed, 1000.0, 200.0, "exponential", time_scale,
                      flag="--traffic")
    results = run_searches(cfg, tgts, tr, workers, allow_unfitted)
    written = write_changes(file, cfg, results) if write else []
    if json_out:
        entries = [p.to_json() for p in plans]
        for e, t in zip(entries, tgts, strict=True):
            r = results[(t.pool.name, t.cloud)]
            if r.recommendation is not None:
                e["recommendation"] = r.recommendation.to_json()
            e["search"] = r.to_json()
        emit_json({"project": cfg.project, "pools": entries, "quota_totals": totals,
                   "written": written})
    else:
        for t in tgts:
            render_search(t.pool, results[(t.pool.name, t.cloud)])
    for line in written:
        sys.stderr.write(f"wrote {line}\n")


def _quota_totals(cfg: Config, tgts: list[Target]) -> list[dict[str, Any]]:
    """Each quota the selected pools draw on, summed over every pool of the file that shares
    it (same cloud, project, scope and name): the grant has to hold them together."""

    clouds = list(dict.fromkeys(t.cloud for t in tgts))
    every = [Target(p, c) for c in clouds for p in cfg.pools if p.placement(c) is not None]
    selected = {(t.pool.name, t.cloud) for t in tgts}
    return [t for t in quota_totals(every)
            if any((name, t["cloud"]) in selected for name in t["pools"])]


def render_quota_totals(totals: list[dict[str, Any]]) -> None:

    t = Table(title="quota totals (every pool of the file sharing the quota, at peak)",
              title_justify="left")
    for col in ("cloud", "scope", "quota", "needed", "pools"):
        t.add_column(col, justify="right" if col == "needed" else "left")
    for q in totals:
        scope = f"{q['project']}/{q['region']}" if q["project"] else q["region"]
        pools = " + ".join(f"{p} {n:,}" for p, n in q["needed_by_pool"].items())
        t.add_row(q["cloud"], scope, q["name"], f"{q['needed']:,} {q['unit']}", pools)
    console().print(t)


def _recommendations(cfg: Config, tgts: list[Target], traffic: Path | None,
                     rate: float | None, duration: float, seed: int, time_scale: float,
                     starts: dict[tuple[str, Cloud], dict[str, float]]) -> Recs:
    """Simulated replica counts per (pool, cloud); the traffic rule judges the file's max."""
    if traffic is None and rate is None:
        return {}

    tr = load_traffic(traffic, rate, duration, seed, 1000.0, 200.0, "exponential", time_scale,
                      flag="--traffic")
    recs = {(t.pool.name, t.cloud): recommend(t.pool, t.cloud, tr,
                                              starts=starts[(t.pool.name, t.cloud)])
            for t in tgts}
    needs = {k: TrafficNeed(r.peak_replicas_needed, tr.source) for k, r in recs.items()}
    findings = [f for f in run_checks(cfg, tgts, traffic=needs) if f.check == "traffic-peak"]
    print_findings(findings)  # warnings: the file's values stay the user's call
    return recs


def render_recommendations(tgts: list[Target], plans: list[PoolPlan], recs: Recs
                           ) -> None:

    out = console()
    for tgt, pl in zip(tgts, plans, strict=True):
        p, c = tgt.pool, tgt.cloud
        r = recs[(p.name, c)].to_json()
        price = pl.price_per_node_hour_usd
        tpot = f", TPOT p90 {p.slo.tpot_p90_s} s" if p.slo.tpot_p90_s is not None else ""
        t = Table(title=f"{p.name} on {c}: replicas for the traffic (SLO TTFT p90 "
                        f"{p.slo.ttft_p90_s} s{tpot}, utilization <= "
                        f"{p.slo.target_utilization})",
                  title_justify="left")
        t.add_column("")
        t.add_column("file")
        t.add_column("recommended")
        rpn = pl.replicas_per_node

        def cost(n: int, rpn: int = rpn, price: float = price) -> str:
            return f"{n} (${nodes_for(n, rpn) * price:,.2f}/h)"

        t.add_row("min_replicas", cost(p.scaling.min_replicas), cost(r["min_replicas"]))
        t.add_row("max_replicas", cost(p.scaling.max_replicas), cost(r["max_replicas"]))
        t.add_row("warm replicas", str(p.warm_pool.replicas), str(r["warm_replicas"]))
        t.add_row("TTFT p90 (autoscaled)", "", f"{r['ttft_p90_s']} s (floor "
                  f"{r['ttft_p90_floor_s']} s)")
        t.add_row("TPOT p90 (autoscaled)", "", f"{r['tpot_p90_s']} s (floor "
                  f"{r['tpot_p90_floor_s']} s)")
        t.add_row("goodput (both SLOs)", "", f"{r['goodput']:.1%}")
        t.add_row("utilization at min", "", f"{r['utilization']:.2f}")
        usd = r["usd_per_1m_output_tokens"]
        t.add_row("USD per 1M output tokens", "", "-" if usd is None else f"${usd:,.3f}")
        t.add_row("scaling.predictive_target", str(p.scaling.predictive_target or ""),
                  "-" if r["predictive_target"] is None
                  else f"{r['predictive_target']:g} in flight per replica")
        t.add_row("requests over max_model_len", "",
                  f"{r['requests_over_max_model_len']:,} of {r['requests']:,} (refused: "
                  f"prompt + output > {r['max_model_len']:,})")
        out.print(t)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def render_plans(plans: list[PoolPlan]) -> None:

    out = console()
    for p in plans:
        t = Table(title=f"{p.pool} on {p.cloud} ({p.region})", show_header=False,
                  title_justify="left")
        t.add_column(style="bold")
        t.add_column()
        n, r = p.nodes, p.replicas
        rows = [
            ("node", f"{p.instance_type}: {p.gpus_per_node}x {p.gpu}"),
            ("replica", f"TP {p.tensor_parallel}, {p.replicas_per_node} per node"),
            ("nodes min / max / warm / surge",
             f"{n.min} / {n.max} / {n.warm} ({p.warm_state}) / {n.surge}"),
            ("replicas min / max / warm", f"{r.min} / {r.max} / {r.warm}"),
            ("weights", f"{_gb(p.weights_bytes)}, {_gb(p.weights_bytes_per_gpu)} per GPU"),
            ("HBM per GPU",
             f"{_gb(p.hbm_bytes_per_gpu)}, {_gb(p.usable_hbm_bytes_per_gpu)} usable"),
            ("KV cache per token", f"{p.kv_cache_bytes_per_token:,} B "
                                   f"({p.kv_cache_bytes_per_token_per_gpu:,} B per GPU)"),
            ("KV cache per replica", f"{p.kv_cache_tokens_per_replica:,} tokens, "
                                     f"{p.max_concurrent_sequences_per_replica} full-length seqs"),
            ("decode step floor", f"{p.decode_step_floor_ms} ms (weights / HBM bandwidth)"),
            ("quota", "; ".join(f"{q.name} {q.needed:,} {q.unit} ({q.scope})"
                                for q in p.quotas) + "".join(
                f"; on fallback {q.fallback}: {q.name} {q.needed:,} {q.unit}"
                for q in p.fallback_quotas)),
            ("cost per hour", f"${p.cost_per_hour_usd['min']:,.2f} min, "
                              f"${p.cost_per_hour_usd['max']:,.2f} max "
                              f"(${p.price_per_node_hour_usd:,.2f}/node)"),
            *_capacity_rows(p),
            ("power", "-" if p.power_kw is None else
             f"{p.power_kw['min']:,.1f} kW min, {p.power_kw['max']:,.1f} kW max (at the "
             "node's maximum system power)"),
            ("node image", _node_image(p.node_image, p.cloud)),
            ("start, cold", _phases(p.start_phases["cold"])),
            ("start, warm " + p.warm_state,
             _phases(p.start_phases["warm_" + ("running" if p.warm_state == "running"
                                                 else "stopped")])),
        ]
        for k, v in rows:
            t.add_row(k, v)
        out.print(t)


def _capacity_rows(p: PoolPlan) -> list[tuple[str, str]]:
    """Held vs hoped-for capacity and the fixed/marginal split of the cost."""
    h, c = p.capacity, p.cost_split_usd
    if h is None or c is None:
        return []
    idle = (f", {c.reserved_idle_nodes} of them reserved and idle at the minimum (scaling "
            "into them costs nothing more)" if c.reserved_idle_nodes else "")
    cost = (f"${c.fixed_per_hour:,.2f}/h fixed ({c.fixed_nodes} node(s){idle}); "
            f"${c.marginal_per_node_hour:,.2f}/h per On-Demand node beyond, "
            f"${c.marginal_at_max_per_hour:,.2f}/h more at max")
    return [("capacity", h.words()), ("cost fixed / marginal", cost)]


def _node_image(img: NodeImage | None, cloud: Cloud) -> str:
    where = (img and img.id) or "the base image"
    if img is not None and img.prepulled:
        return f"{where}: serving image pre-pulled ({img.source})"
    if img is not None and img.carries:
        return f"{where}: carries {img.carries}, not the serving image: pulled at boot"
    return f"{where}: serving image pulled at boot (`poolctl image build --cloud {cloud}`)"


def _phases(ph: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.0f}" for k, v in ph.items() if v)
    return f"{sum(ph.values()):.0f} s ({parts})"


def schema(out: str = typer.Option("-", "--out", help="Write here instead of stdout."),
           force: bool = typer.Option(False, "--force", help="Replace a file at --out that "
                                      "is not a poolctl schema.")) -> None:
    """The JSON Schema of poolctl.yaml, for editors."""

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out == "-":
        sys.stdout.write(text)
    else:
        write_schema(Path(out), text, force)


# A schema file poolctl wrote is small; anything bigger is not one (and is not read whole).
_SCHEMA_MAX_BYTES = 4 << 20


def _is_poolctl_schema(path: Path) -> bool:
    """Whether `path` holds what `poolctl schema` writes: the file is then poolctl's to
    replace (a newer schema), and anything else is the user's."""
    try:
        if path.stat().st_size > _SCHEMA_MAX_BYTES:
            return False
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("title") == "poolctl.yaml" and "$schema" in doc


def write_schema(out: Path, text: str, force: bool) -> None:
    """`schema --out FILE`: refused, one line naming --out, unless FILE is a new file in an
    existing folder or a schema poolctl wrote (or --force); then replaced all at once."""

    if out.is_dir():
        raise UsageError(f"--out: {out} is a folder; give a file name, e.g. "
                         f"{out / 'poolctl.schema.json'}")
    if not out.parent.is_dir():
        raise UsageError(f"--out: {out.parent} is not a folder; create it, or give a file in "
                         "an existing folder")
    if out.exists() and not out.is_file():
        raise UsageError(f"--out: {out} is not a regular file (a device, FIFO or socket); "
                         "give a file name")
    if (out.exists() or out.is_symlink()) and not force and not _is_poolctl_schema(out):
        raise UsageError(f"--out: {out} exists and is not a poolctl schema; give another file, "
                         "or pass --force to replace it")
    try:
        replace_file(out, text, follow_link=False)
    except OSError as e:
        raise UsageError(f"--out: cannot write {out} ({e.strerror or type(e).__name__}); give "
                         "a file in a folder you can write in") from None
