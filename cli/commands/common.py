"""Options every command shares, and the few rendering helpers they use."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the config model (pydantic) loads only when a command runs
    from poolctl.config import Config, Pool



class Cloud(StrEnum):
    aws = "aws"
    gcp = "gcp"


FileOpt = Annotated[
    Path | None,
    typer.Option(
        "-f", "--file", help="Config file (default ./poolctl.yaml or $POOLCTL_FILE).",
        show_default=False,
    ),
]
PoolOpt = Annotated[str | None, typer.Option("--pool", help="Act on this pool only.")]
CloudOpt = Annotated[
    Cloud | None, typer.Option("--cloud", help="Placement to act on (default: every one).")
]
CloudReq = Annotated[Cloud, typer.Option("--cloud", help="Placement to act on.")]
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


def targets(cfg: Config, pool: str | None, cloud: Cloud | None) -> list[tuple[Pool, str]]:
    return cfg.targets(pool, cloud_value(cloud))


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def console():
    from rich.console import Console

    return Console(highlight=False)


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_findings(findings, stream=None) -> None:
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
