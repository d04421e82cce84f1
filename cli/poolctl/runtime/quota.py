"""Quota: what a pool needs at once against what is granted and used, and increases to
`granted + shortfall` (never filed twice).
"""

from __future__ import annotations

from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    QuotaLine,
    QuotaRequest,
    RequestsQuota,
)
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed
from poolctl.sizing import PoolPlan, QuotaNeed, plan_pool, quota_key

# ---------------------------------------------------------------------------------------
# Quota


def scaled_needs(plan: PoolPlan, nodes: int) -> list[QuotaNeed]:
    """The plan's quota needs for `nodes` nodes running at once instead of its peak."""
    peak = plan.nodes.max + plan.nodes.surge + plan.warm_running_nodes
    return [q.scaled(nodes, peak) for q in plan.quotas]


def shared_quota_lines(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                       needs: list[QuotaNeed]) -> list[QuotaLine]:
    """`needs` of `pool` against the quotas, each summed with the peak needs of every other
    pool of the file that draws on the same quota (`quota_key`): one grant must hold them
    all, so deciding for one pool alone would promise the others' share twice. Each line
    names the pools with their needs (`needed_by_pool`, in file order)."""
    lines = ops.quota_lines(cfg, pool, needs)
    by_key = {quota_key(pool, cloud, n): ln for n, ln in zip(needs, lines, strict=True)}
    for ln in lines:
        ln.needed_by_pool = {pool.name: ln.needed}
    for other in cfg.pools:
        if other.name == pool.name or other.placement(cloud) is None:
            continue
        theirs = [n for n in plan_pool(other, cloud).quotas
                  if quota_key(other, cloud, n) in by_key]
        if not theirs:
            continue
        # Their own lines give their running share of `in_use`, which their need counts.
        for n, ln in zip(theirs, ops.quota_lines(cfg, other, theirs), strict=True):
            shared = by_key[quota_key(other, cloud, n)]
            shared.needed += ln.needed
            shared.pool_in_use += ln.pool_in_use
            shared.needed_by_pool[other.name] = ln.needed
    order = [p.name for p in cfg.pools]
    for ln in lines:
        ln.needed_by_pool = dict(sorted(ln.needed_by_pool.items(),
                                        key=lambda kv: order.index(kv[0])))
    return lines


def quota_check(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps) -> list[QuotaLine]:
    """The peak needs (max nodes + surge + running warm nodes) of the pool and of every pool
    sharing its quotas against those quotas."""
    return shared_quota_lines(cfg, pool, cloud, ops, plan_pool(pool, cloud).quotas)


def fallback_quota_lines(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps
                         ) -> list[QuotaLine]:
    """The quotas the pool's fallback types draw on beyond its own (`PoolPlan.fallback_quotas`),
    each for the pool's peak on that type; information, never a refusal: the primary type's
    quota is what the pool needs."""
    needs = plan_pool(pool, cloud).fallback_quotas
    lines = ops.quota_lines(cfg, pool, needs) if needs else []
    for need, ln in zip(needs, lines, strict=True):
        ln.fallback = need.fallback
        ln.needed_by_pool = {pool.name: ln.needed}
    return lines


def fallback_line(pool: Pool, cloud: Cloud, line: QuotaLine) -> str:
    granted = "unknown" if line.granted is None else f"{line.granted:g}"
    return (f"{pool.name}/{cloud}: fallback {line.fallback} draws on quota {line.name} in "
            f"{line.scope}: short by {line.shortfall:g} {line.unit} of the {line.needed:g} its "
            f"peak needs (granted {granted}, {line.in_use:g} in use); the pool grows on "
            f"{line.fallback} only within the grant: raise it in the console if the "
            "fallback should carry the pool")


def quota_for_nodes(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan,
                    nodes: int, what: str, undone: str) -> list[QuotaLine]:
    """The quota lines for `nodes` running at once; OperationFailed naming each shortfall
    (`what`: the nodes' purpose, `undone`: what the refusal left as it was)."""
    lines = shared_quota_lines(cfg, pool, cloud, ops, scaled_needs(plan, nodes))
    short = [ln for ln in lines if ln.shortfall > 0]
    if short:
        raise OperationFailed(
            f"{pool.name}: not enough quota for {nodes} node(s) {what}; "
            + "; ".join(shortfall_line(ln) for ln in short)
            + f"; {undone}. File an increase with `poolctl quota request --cloud {cloud}`")
    return lines


def shortfall_line(line: QuotaLine) -> str:
    others = line.in_use - line.pool_in_use
    granted = "unknown" if line.granted is None else f"{line.granted:g}"
    needs = f"needs {line.needed:g}"
    if len(line.needed_by_pool) > 1:
        needs += " for the pools sharing it, " + " + ".join(
            f"{p} {n:g}" for p, n in line.needed_by_pool.items()) + ","
    return (f"quota {line.name} in {line.scope}: short by {line.shortfall:g} {line.unit} "
            f"({needs} beside {others:g} in use by others, granted {granted})")


def quota_request(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                  lines: list[QuotaLine] | None = None) -> list[QuotaRequest]:
    """File an increase to `granted + shortfall` for each short quota; an increase already
    open is returned (already_open=True), never filed twice."""
    if not isinstance(ops, RequestsQuota):
        raise OperationFailed(f"quota request: {cloud} offers no API to request increases here; "
                              "ask in the cloud console")
    lines = quota_check(cfg, pool, cloud, ops) if lines is None else lines
    out = []
    for line in lines:
        if line.shortfall <= 0 or line.granted is None:
            continue
        out.append(ops.request_quota(line, line.granted + line.shortfall))
    return out
