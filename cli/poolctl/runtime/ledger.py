"""The phase ledger of a deployed pool (`poolctl nodes`, `status`): each node's boots as its
boot script logged them (poolctl.bootlog, from the node's console), and the pool's start
times by kind over every boot that served. What it reads is kept (poolctl.starts) for `plan`
and `simulate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poolctl import starts
from poolctl.bootlog import BootRecord
from poolctl.cloud import Cloud
from poolctl.clouds.base import CloudOps, Group, NodeState, ReportsBootPhases
from poolctl.config import Config, Pool
from poolctl.starts import KindStarts


@dataclass(frozen=True)
class NodeBoots:
    node: NodeState
    boots: list[BootRecord]

    @property
    def last(self) -> BootRecord | None:
        return self.boots[-1] if self.boots else None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.node.id, "state": self.node.state, "phase": self.node.phase,
                "boots": [b.to_json() for b in self.boots]}


@dataclass(frozen=True)
class PoolLedger:
    pool: str
    cloud: Cloud
    nodes: list[NodeBoots]
    starts: dict[str, KindStarts]  # kind -> figures over what was kept (poolctl.starts)

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "cloud": str(self.cloud),
                "nodes": [n.to_json() for n in self.nodes],
                "starts": {k: {"n": v.n, "p50_s": v.p50_s, "p90_s": v.p90_s}
                           for k, v in self.starts.items()}}


def pool_ledger(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                found: tuple[Group, list[NodeState]] | None = None) -> PoolLedger | None:
    """The ledger of the pool's nodes now (None: the cloud's consoles are not read); every
    boot that served is kept as a sample. `found`: the group and its nodes, when the caller
    has read them already."""
    if not isinstance(ops, ReportsBootPhases):
        return None
    if found is None:
        group = ops.find_group(cfg, pool)
        found = (group, ops.nodes(group))
    group, nodes = found
    boots = ops.boot_ledger(group, nodes)
    rows = [NodeBoots(n, boots.get(n.id, [])) for n in nodes]
    starts.record(cfg, pool, cloud, [
        (f"{r.node.id}#{i}", b.kind, b.uptime_s) for r in rows
        for i, b in enumerate(r.boots) if b.served and b.uptime_s is not None])
    return PoolLedger(pool.name, cloud, rows, starts.measured_starts(cfg, pool, cloud))
