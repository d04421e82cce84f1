"""poolctl image build / list / prune: pre-pulled node images built with Packer."""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict
from typing import Annotated

import typer

from poolctl import images
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    console,
    emit_json,
    resolve_target,
    whole,
)

app = typer.Typer(help="Pre-pulled node images built with Packer (see images/README.md).",
                  no_args_is_help=True)


@app.command("build")
def build(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the rendered files and the command only.")
    ] = False,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Show Packer's own output too (it always goes to a log file "
        "under $POOLCTL_HOME/logs).")] = False,
) -> None:
    """Build the pool's node image (base image + serving image pulled) and record it in the
    placement (`aws.ami_id` / `gcp.image`) and under $POOLCTL_HOME/images.

    On AWS the builder runs in the file's subnet or one of the pool's private subnets (its
    first deploy creates them): where there is none, the build stops before Packer runs."""

    ctx = resolve_target(file, pool, cloud, sandbox)
    res = images.build(ctx.cfg, ctx.path, ctx.pool, ctx.cloud, endpoints=ctx.endpoints,
                       dry_run=dry_run, verbose=verbose)
    if json_out:
        emit_json(res.to_json())
    elif dry_run:
        for name, text in (res.files or {}).items():
            sys.stdout.write(f"# ---- {name}\n{text}")
        # Plain write: a command line must not be wrapped at the terminal's width.
        sys.stdout.write(f"# would run in {res.build_dir}: {shlex.join(res.command)}\n")
    else:
        console().print(f"{ctx.pool.name}: built {res.image_id} ({res.serving_image}"
                        f"{', ' + res.digest if res.digest else ''}) in {res.seconds:g} s")


@app.command("list")
def list_(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """The pool's images, newest first, and what uses each."""

    ctx = resolve_target(file, pool, cloud, sandbox)
    p, c = ctx.pool, ctx.cloud
    rows = images.list_images(ctx.cfg, p, c, ctx.endpoints)
    if json_out:
        emit_json({"pool": p.name, "cloud": c, "images": [asdict(r) for r in rows]})
        return
    out = console()
    if not rows:
        out.print(f"{p.name}: no images built by poolctl in {c}")
    for r in rows:
        use = "; ".join(r.in_use) or "unused"
        out.print(f"{r.id}  {r.created}  {r.serving_image or '?'}  [{use}]")


@app.command("prune")
def prune(
    keep: Annotated[int, typer.Option("--keep", parser=whole(0, 10_000, "a number of images"),
                                      metavar="N", help="Unused images to keep.")],
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Deregister all but the KEEP newest unused images (with their snapshots); images in use
    (the file, launch template versions, instances) are never deleted."""

    ctx = resolve_target(file, pool, cloud, sandbox)
    out = images.prune(ctx.cfg, ctx.pool, ctx.cloud, ctx.endpoints, keep)
    if json_out:
        emit_json(out)
    else:
        console().print(f"{ctx.pool.name}: deleted {len(out['deleted'])}, kept {len(out['kept'])}")
