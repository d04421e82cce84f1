"""Options every command shares, and the few rendering helpers they use."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from poolctl.cloud import Cloud
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints, real_clouds

if TYPE_CHECKING:  # the config model (pydantic) loads only when a command runs
    from rich.console import Console

    from poolctl.config import Config, Pool
    from poolctl.rules import Finding



FileOpt = Annotated[
    Path | None,
    typer.Option(
        "-f", "--file", help="Config file (default ./poolctl.yaml or $POOLCTL_FILE).",
        show_default=False,
    ),
]
PoolOpt = Annotated[str | None, typer.Option("--pool", help="Act on this pool only.")]
# Commands that act on a cloud take --cloud the same way: the pools' only placement by default
# (AWS with --sandbox), else it must be given (`pick_cloud`). Commands that only read the file
# (validate, plan, synth, catalog) cover every placement by default.
CloudOpt = Annotated[
    Cloud | None,
    typer.Option("--cloud", help="Placement to act on (default: the pool's only placement; "
                 "required when the selected pools have both).", show_default=False),
]
CloudAllOpt = Annotated[
    Cloud | None, typer.Option("--cloud", help="Only this placement (default: every one).",
                               show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
SandboxOpt = Annotated[
    bool, typer.Option("--sandbox", help="Target the local sandbox (poolctl sandbox start).")
]
AutoApproveOpt = Annotated[
    bool, typer.Option("--auto-approve", "--yes", "-y", help="Do not ask for confirmation.")
]


def cloud_value(cloud: Cloud | None) -> str | None:
    return cloud.value if cloud is not None else None


def load(file: Path | None) -> Config:
    from poolctl.config import load_config

    return load_config(file)


def targets(cfg: Config, pool: str | None, cloud: Cloud | None) -> list[tuple[Pool, Cloud]]:
    return cfg.targets(pool, cloud)


def endpoints_of(sandbox: bool) -> CloudEndpoints:
    """Where this command's cloud calls go, resolved once here at the edge: the real clouds,
    or with --sandbox the running sandbox (a line saying how to start it when none runs).
    Outside `poolctl sandbox ...`, this is the only code that loads the sandbox package."""
    if not sandbox:
        return real_clouds()
    from poolctl.sandbox import manager

    return manager.endpoints()


def pick_cloud(cfg: Config, pool: str | None, cloud: Cloud | None,
               endpoints: CloudEndpoints = REAL_CLOUDS) -> Cloud:
    """--cloud of a command that acts on one cloud: as given; the one cloud the endpoints
    reach (AWS with --sandbox: the sandbox emulates AWS only); else the one placement the
    selected pools have; else one line naming the choices (exit 2)."""
    if cloud is not None:
        return cloud
    if len(endpoints.clouds) == 1:
        return next(iter(endpoints.clouds))
    pools = cfg.select(pool)
    clouds = [c for c in Cloud if any(p.placement(c) for p in pools)]
    if len(clouds) == 1:
        return clouds[0]
    from poolctl.errors import UsageError

    what = f"pool {pools[0].name!r} has" if len(pools) == 1 else "the selected pools have"
    raise UsageError(f"--cloud: {what} {' and '.join(clouds)} placements; pick one with "
                     f"{' or '.join(f'--cloud {c}' for c in clouds)}")


def cloud_targets(cfg: Config, pool: str | None, cloud: Cloud | None,
                  endpoints: CloudEndpoints = REAL_CLOUDS) -> list[tuple[Pool, Cloud]]:
    """(pool, cloud) pairs of a command that acts on one cloud (`pick_cloud`), which the
    endpoints must reach."""
    picked = pick_cloud(cfg, pool, cloud, endpoints)
    endpoints.require(picked)
    return targets(cfg, pool, picked)


def one_target(cfg: Config, pool: str | None, cloud: Cloud | None,
               endpoints: CloudEndpoints = REAL_CLOUDS) -> tuple[Pool, Cloud]:
    """The single (pool, cloud) a command that changes one pool acts on."""
    tgts = cloud_targets(cfg, pool, cloud, endpoints)
    if len(tgts) != 1:
        from poolctl.errors import UsageError

        names = ", ".join(p.name for p, _ in tgts)
        raise UsageError(f"--pool: this acts on one pool, the file gives {names}; pick one "
                         "with --pool")
    return tgts[0]


def emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def print_findings(findings: Iterable[Finding], stream: TextIO | None = None) -> None:
    """Findings go to stderr, one line each, so stdout stays clean for --json."""
    stream = stream or sys.stderr
    for f in findings:
        stream.write(f.line() + "\n")


def confirm(question: str, auto_approve: bool) -> bool:
    if auto_approve:
        return True
    if not sys.stdin.isatty():
        from poolctl.errors import UsageError

        raise UsageError("--auto-approve: no terminal to confirm on; pass --auto-approve to go on")
    return typer.confirm(question, default=False)


OutOpt = Annotated[Path, typer.Option("--out", help="Synthesis output folder.")]
MirrorOpt = Annotated[
    str | None,
    typer.Option("--provider-mirror", envvar="POOLCTL_PROVIDER_MIRROR",
                 help="Install providers from this filesystem mirror (offline applies)."),
]
