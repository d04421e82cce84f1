"""Running the checks over nodes: which hosts against which pool's expectations (given, or
found through the cloud), each node checked over one SSH connection, eight at a time, with a
progress line per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool, Target
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.formats import is_loopback
from poolctl.nodecheck.checks import Check, NodeResult, NodeSpec, run_checks, spec_for
from poolctl.nodecheck.ssh import (
    DEFAULT_PORT,
    Host,
    SshFailure,
    SshOptions,
    command_runner,
    connect,
    fingerprint,
    parse_host,
)
from poolctl.runtime import get_ops

MAX_WORKERS = 8


def check_node(host: Host, spec: NodeSpec, opts: SshOptions) -> NodeResult:
    """One node: the `ssh` check (connecting), then every other check over that connection."""
    result = NodeResult(host.label, spec.pool, spec.cloud)
    try:
        client, user, note = connect(host, opts)
    except SshFailure as f:
        result.checks.append(Check("ssh", False, f.observed, f.hint, "failed"))
        return result
    try:
        transport = client.get_transport()
        assert transport is not None  # connect returned a connected client
        key = transport.get_remote_server_key()
        observed = f"{user}@{host.label}, host key {key.get_name()} {fingerprint(key)}"
        result.checks.append(Check("ssh", True, f"{observed}; {note}" if note else observed,
                                   None, "ok"))
        result.checks.extend(run_checks(command_runner(client, opts.timeout), spec))
    finally:
        client.close()
    return result


def check_nodes(
    work: Sequence[tuple[Host, NodeSpec]],
    opts: SshOptions,
    progress: Callable[[NodeResult], None] | None = None,
    workers: int = MAX_WORKERS,
) -> list[NodeResult]:
    """Check every (host, spec) concurrently; results in the order given."""
    if not work:
        return []
    results: list[NodeResult | None] = [None] * len(work)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(work))),
                            thread_name_prefix="nodecheck") as pool:
        futures = {pool.submit(check_node, h, s, opts): i for i, (h, s) in enumerate(work)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                res = fut.result()
            except Exception as e:  # a bug must not hide the other nodes' results
                host, spec = work[i]
                res = NodeResult(host.label, spec.pool, spec.cloud,
                                 [Check("ssh", False,
                                        f"internal error: {type(e).__name__}: {e}",
                                        "report this as a poolctl bug", "error")])
            results[i] = res
            if progress is not None:  # called from this thread only: lines never interleave
                progress(res)
    return [r for r in results if r is not None]


def progress_line(res: NodeResult) -> str:
    where = f"node {res.host} ({res.pool}/{res.cloud})"
    if res.ok:
        return f"{where}: ok, {len(res.checks)} checks passed"
    if res.checks and res.checks[0].name == "ssh" and not res.checks[0].ok:
        c = res.checks[0]
        return f"{where}: FAILED ssh: {c.observed}; {c.hint}"
    failed = ", ".join(f"{c.name} ({c.short or c.observed})" for c in res.failed)
    return f"{where}: FAILED {failed}"


# ---------------------------------------------------------------------------------------
# The whole command, minus rendering.


def plan_work(
    cfg: Config,
    targets: Sequence[Target],
    hosts: Sequence[str] | None,
    default_port: int = DEFAULT_PORT,
    endpoints: CloudEndpoints = REAL_CLOUDS,
    discover: Callable[[Config, Pool, Cloud, CloudEndpoints], list[Any]] | None = None,
    direct: bool = True,
) -> list[tuple[Host, NodeSpec]]:
    """Which hosts to check against which pool's expectations. `discover` gives addresses,
    or (address, instance id) pairs. `direct`: poolctl connects to the addresses itself (no
    proxy command), so where the endpoints allow only loopback (the sandbox) they must be
    loopback ones."""
    if hosts:
        if len(targets) > 1:
            names = ", ".join(f"{t.pool.name}/{t.cloud}" for t in targets)
            raise UsageError(f"--host: the nodes could belong to {names}; pick one with "
                             "--pool NAME and --cloud aws|gcp")
        spec = spec_for(targets[0].pool, targets[0].cloud)
        unique: dict[Host, None] = {}  # the order given, each host once
        for h in hosts:
            unique.setdefault(parse_host(h, default_port))
        if endpoints.loopback_only and direct:
            outside = [h.host for h in unique if not is_loopback(h.host)]
            if outside:
                raise UsageError(
                    f"--host {outside[0]}: with {endpoints.flag} poolctl connects only to loopback "
                    "addresses (127.0.0.0/8, ::1, localhost); name the local sshd standing "
                    "for the node, e.g. --host 127.0.0.1:2222")
        return [(h, spec) for h in unique]
    for t in targets:
        endpoints.require(t.cloud)
    discover = discover or discover_nodes
    work: list[tuple[Host, NodeSpec]] = []
    for t in targets:
        pool, cloud = t.pool, t.cloud
        spec = spec_for(pool, cloud)
        # An address, or (address, instance id or name[, zone]).
        found = [(*(f if isinstance(f, tuple) else (f,)), None, None)[:3]
                 for f in discover(cfg, pool, cloud, endpoints)]
        ips = [ip for ip, _, _ in found]
        if not ips:
            where = pool.aws.region if cloud == Cloud.aws and pool.aws else (
                pool.gcp.region if pool.gcp else "")
            tag = (f"{naming.TAG_PROJECT}={cfg.project}, {naming.TAG_POOL}={pool.name}"
                   if cloud == Cloud.aws else
                   f"{naming.LABEL_PROJECT}={cfg.project}, {naming.LABEL_POOL}={pool.name}")
            raise OperationFailed(
                f"no running node of pool {pool.name} on {cloud} in {where} (by {tag}); "
                "deploy it or scale it up, or pass --host H to check a node directly")
        outside = [ip for ip in ips if not is_loopback(ip)]
        if endpoints.loopback_only and direct and outside:
            # Sandbox instances carry made-up private addresses: somebody else's, if any.
            raise UsageError(
                f"{endpoints.flag}: node address {outside[0]} of pool {pool.name} is a fake "
                "private address of the emulator, and poolctl never connects outside "
                "127.0.0.0/8 in the sandbox; pass --host with the loopback address of a local "
                "sshd standing for the node, e.g. --host 127.0.0.1:2222")
        if cloud == Cloud.aws:
            where_kw = {"region": pool.aws.region if pool.aws else None}
        else:
            assert pool.gcp is not None  # targets pair a pool with its own placements
            where_kw = {"region": pool.gcp.region, "project": pool.gcp.project}
        work.extend((Host(ip, default_port, iid, zone=zone, **where_kw), spec)
                    for ip, iid, zone in found)
    return work




def discover_nodes(cfg: Config, pool: Pool, cloud: Cloud, endpoints: CloudEndpoints
                   ) -> list[Any]:
    """The pool's running nodes, through the cloud's operations (its endpoint, credentials
    and retries, as every other command)."""
    return get_ops(cloud, endpoints).node_addresses(cfg, pool)
