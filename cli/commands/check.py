"""validate, plan, schema: the commands that read the config and never call a cloud."""

from __future__ import annotations

import json
import sys

import typer

from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    console,
    emit_json,
    load,
    print_findings,
    targets,
)


def validate(file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
             json_out: JsonOpt = False) -> None:
    """Check the file and every rule; print each failed check with a hint."""
    from poolctl.rules import errors, run_checks

    cfg = load(file)
    tgts = targets(cfg, pool, cloud)
    findings = run_checks(cfg, tgts)
    errs = errors(findings)
    if json_out:
        emit_json({"ok": not errs, "findings": [f.to_json() for f in findings]})
    else:
        print_findings(findings)
        checked = ", ".join(f"{p.name}/{c}" for p, c in tgts)
        status = "FAILED" if errs else "ok"
        sys.stderr.write(f"{status}: {len(errs)} error(s), "
                         f"{len(findings) - len(errs)} note(s) over {checked}\n")
    if errs:
        raise typer.Exit(1)


def require_valid(cfg, tgts) -> None:
    """What plan, synth and deploy run first: print findings, refuse on any error."""
    from poolctl.errors import OperationFailed
    from poolctl.rules import errors, run_checks

    findings = run_checks(cfg, tgts)
    print_findings(findings)
    errs = errors(findings)
    if errs:
        raise OperationFailed(
            f"{len(errs)} rule(s) failed (listed above); nothing was changed — fix them and "
            "run `poolctl validate`"
        )


def plan(file: FileOpt = None, pool: PoolOpt = None, cloud: CloudOpt = None,
         json_out: JsonOpt = False) -> None:
    """Sizing, memory, quota and cost per pool and cloud; no cloud calls."""
    from poolctl.sizing import plan_pool

    cfg = load(file)
    tgts = targets(cfg, pool, cloud)
    require_valid(cfg, tgts)
    plans = [plan_pool(p, c) for p, c in tgts]
    if json_out:
        emit_json({"project": cfg.project, "pools": [p.to_json() for p in plans]})
        return
    render_plans(plans)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def render_plans(plans) -> None:
    from rich.table import Table

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
             f"{n['min']} / {n['max']} / {n['warm']} ({p.warm_state}) / {n['surge']}"),
            ("replicas min / max / warm", f"{r['min']} / {r['max']} / {r['warm']}"),
            ("weights", f"{_gb(p.weights_bytes)}, {_gb(p.weights_bytes_per_gpu)} per GPU"),
            ("HBM per GPU",
             f"{_gb(p.hbm_bytes_per_gpu)}, {_gb(p.usable_hbm_bytes_per_gpu)} usable"),
            ("KV cache per token", f"{p.kv_cache_bytes_per_token:,} B "
                                   f"({p.kv_cache_bytes_per_token_per_gpu:,} B per GPU)"),
            ("KV cache per replica", f"{p.kv_cache_tokens_per_replica:,} tokens, "
                                     f"{p.max_concurrent_sequences_per_replica} full-length seqs"),
            ("decode step floor", f"{p.decode_step_floor_ms} ms (weights / HBM bandwidth)"),
            ("quota", "; ".join(f"{q['name']} {q['needed']:,} {q['unit']} ({q['scope']})"
                                for q in p.quotas)),
            ("cost per hour", f"${p.cost_per_hour_usd['min']:,.2f} min, "
                              f"${p.cost_per_hour_usd['max']:,.2f} max "
                              f"(${p.price_per_node_hour_usd:,.2f}/node)"),
            ("start, cold", _phases(p.start_phases["cold"])),
            ("start, warm " + p.warm_state,
             _phases(p.start_phases["warm_" + ("running" if p.warm_state == "running"
                                                 else "stopped")])),
        ]
        for k, v in rows:
            t.add_row(k, v)
        out.print(t)


def _phases(ph: dict) -> str:
    parts = ", ".join(f"{k} {v:.0f}" for k, v in ph.items() if v)
    return f"{sum(ph.values()):.0f} s ({parts})"


def schema(out: str = typer.Option("-", "--out", help="Write here instead of stdout.")) -> None:
    """The JSON Schema of poolctl.yaml, for editors."""
    from poolctl.config import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out == "-":
        sys.stdout.write(text)
    else:
        with open(out, "w") as fh:
            fh.write(text)
