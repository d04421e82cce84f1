"""ls and logs: the pools deployed in a region (no file needed), and a pool's logs."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated

import typer

from poolctl import runtime
from poolctl.adaptors import aws as aws_sdk
from poolctl.cloud import Cloud
from poolctl.commands.common import (
    CloudOpt,
    FileOpt,
    JsonOpt,
    PoolOpt,
    SandboxOpt,
    emit_json,
    endpoints_of,
    gcp_project_id,
    region_name,
    resolve_target,
)
from poolctl.endpoints import CloudEndpoints
from poolctl.errors import UsageError
from poolctl.inventory import LogEvent, printable, since_seconds, stream_events


def _ls_where(cloud: Cloud | None, region: str | None, project: str | None,
              endpoints: CloudEndpoints) -> tuple[Cloud, str, str | None]:
    """(cloud, region, GCP project) of `ls`, which reads no file: flags, then the clouds' own
    environment variables (and the sandbox's region)."""

    if cloud is None:
        if len(endpoints.clouds) != 1:
            raise UsageError("--cloud: ls reads no file to take the cloud from; pick one with "
                             "--cloud aws or --cloud gcp")
        cloud = next(iter(endpoints.clouds))
    endpoints.require(cloud)
    if cloud == Cloud.aws:
        region = endpoints.aws_region(region)
        if not region:
            region = aws_sdk.default_region()
        if not region:
            raise UsageError("--region: no AWS region given or configured; add --region, "
                             "e.g. --region us-east-1")
        return Cloud.aws, region, None
    region = region or os.environ.get("CLOUDSDK_COMPUTE_REGION")
    project = (project or os.environ.get("GOOGLE_CLOUD_PROJECT")
               or os.environ.get("CLOUDSDK_CORE_PROJECT"))
    if not region or not project:
        flag = "--region" if not region else "--project"
        raise UsageError(f"{flag}: ls --cloud gcp needs the project and region to list; add "
                         "--project P --region R")
    return Cloud.gcp, region, project


def ls(
    cloud: Annotated[Cloud | None, typer.Option(
        "--cloud", help="Cloud to list (AWS with --sandbox; else required: ls reads no file).",
        show_default=False)] = None,
    region: Annotated[str | None, typer.Option(
        "--region", parser=region_name, help="Region to list (default: AWS_REGION / the AWS "
        "profile's; GCP: CLOUDSDK_COMPUTE_REGION).", show_default=False)] = None,
    project: Annotated[str | None, typer.Option(
        "--project", parser=gcp_project_id, show_default=False,
        help="GCP project to list (default: GOOGLE_CLOUD_PROJECT).")] = None,
    sandbox: SandboxOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Pools deployed in a region, found by their poolctl tags/labels (no file needed)."""

    endpoints = endpoints_of(sandbox)
    c, where, gcp_project = _ls_where(cloud, region, project, endpoints)
    ops = runtime.get_ops(c, endpoints)
    rows = ops.list_pools(where, gcp_project)
    if json_out:
        emit_json({"cloud": c, "region": where, "pools": [r.to_json() for r in rows]})
        return
    if not rows:
        sys.stderr.write(f"no poolctl pools in {c} {where}\n")
        return
    # Plain columns, as `kubectl get` prints them: never cut to the terminal's width.
    table: list[tuple[str, ...]] = [
        ("PROJECT", "POOL", "GROUP", "IN SERVICE", "MIN/DESIRED/MAX", "MODEL", "IMAGE")]
    table += [(r.project, r.pool, r.group, str(r.nodes["in_service"]),
               f"{r.nodes['min']}/{r.nodes['desired']}/{r.nodes['max']}", r.model or "-",
               r.image or "-") for r in rows]
    table = [tuple(printable(v) for v in row) for row in table]  # tags are data
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True))
                         .rstrip() + "\n")


# CloudWatch Logs keeps events ten years at most (Cloud Logging less).
MAX_SINCE_S = 3650 * 86400


def logs(
    cloud: CloudOpt = None,
    file: FileOpt = None,
    pool: PoolOpt = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-F", help="Keep printing new lines until Ctrl-C.")] = False,
    since: Annotated[str, typer.Option(
        "--since", help="Start this long ago: 30s, 10m, 2h, 1d.")] = "10m",
    sandbox: SandboxOpt = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="One JSON object per line (timestamp_ms, source, message, id).")
    ] = False,
) -> None:
    """The pool's logs: its CloudWatch Logs group (AWS) or its VMs' Cloud Logging entries
    (GCP)."""

    seconds = since_seconds(since) if len(since) <= 40 else None
    if seconds is None or seconds > MAX_SINCE_S:

        raise UsageError(f"--since {since[:40]!r}: give a duration up to 3650d (the longest "
                         "any log is kept), such as 30s, 10m, 2h or 1d")
    start_ms = int((time.time() - seconds) * 1000)
    ctx = resolve_target(file, pool, cloud, sandbox)
    cfg, p, c, ops = ctx.cfg, ctx.pool, ctx.cloud, ctx.ops

    shown = 0

    def emit(ev: LogEvent) -> None:
        nonlocal shown
        shown += 1
        sys.stdout.write((json.dumps(ev.to_json()) if json_out else ev.line()) + "\n")
        sys.stdout.flush()

    # New lines show within 2 s; POOLCTL_POLL_S (tests) polls faster.
    stream_events(lambda ms: ops.log_events(cfg, p, ms), start_ms, emit,
                  min(runtime.poll_interval(), 2.0), once=not follow)
    if not follow and not shown:
        sys.stderr.write(f"{p.name}/{c}: no log lines in the last {since}\n")
