"""`warm --suggest`: launch windows from the pool's own history, where the cloud forecasts no
custom metric (GCP), or to see a day's shape before a predictive policy (AWS).

The pool's requests in flight, hour by hour over the last days (ReadsLoadHistory), averaged
per UTC hour of the day; each run of hours whose mean needs more nodes than the pool's minimum
at `scaling.predictive_target` per replica becomes one window (poolctl.predictive), starting
the pool's cold start ahead: measured p90 (power-on to serving, plus joining the load
balancer) where the pool has measured starts, the plan's otherwise. Nothing is scheduled:
each suggestion is the `warm --from/--until` command that would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from poolctl.cloud import Cloud
from poolctl.clouds.base import CloudOps, ReadsLoadHistory
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.predictive import MIN_HISTORY_HOURS, Suggestion, suggest_windows
from poolctl.sizing import plan_pool
from poolctl.starts import measured_starts


@dataclass(frozen=True)
class Suggested:
    pool: str
    cloud: Cloud
    days: int
    hours: int  # hours of history found
    per_node: float  # requests in flight a node is sized for
    min_nodes: int
    lead_s: float
    lead_source: str
    suggestions: list[Suggestion] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"pool": self.pool, "cloud": self.cloud, "days": self.days,
                "hours": self.hours, "in_flight_per_node": self.per_node,
                "min_nodes": self.min_nodes, "lead_s": round(self.lead_s),
                "lead_source": self.lead_source,
                "suggestions": [s.to_json() for s in self.suggestions]}


def suggest(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, days: int,
            now: datetime | None = None) -> Suggested:
    target = pool.scaling.predictive_target
    if target is None:
        raise UsageError(f"pools.{pool.name}.scaling.predictive_target: --suggest sizes the "
                         "windows by it (requests in flight per replica); set it: `poolctl "
                         "plan --traffic TRACE` prints it for your traffic")
    if not isinstance(ops, ReadsLoadHistory):
        raise UsageError(f"--suggest: poolctl reads no load history on {cloud}")
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    history = ops.load_history(group, days, plan.replicas_per_node)
    if len(history) < MIN_HISTORY_HOURS:
        raise OperationFailed(
            f"{pool.name}/{cloud}: {len(history)} hour(s) of the pool's load in the last "
            f"{days} day(s); --suggest needs {MIN_HISTORY_HOURS} (a whole day) to find its "
            "busy hours: try again once the nodes have published for a day")
    measured = measured_starts(cfg, pool, cloud).get("cold")
    register = plan.start_phases["cold"].get("register", 0.0)
    if measured is not None:
        lead, source = measured.p90_s + register, (
            f"measured cold start p90 of {measured.n} boot(s), plus joining the load balancer")
    else:
        lead, source = plan.start_seconds["cold"], "the plan's cold start (none measured yet)"
    per_node = float(target) * plan.replicas_per_node
    found = suggest_windows(history, per_node, plan.nodes.min, plan.nodes.max,
                            plan.replicas_per_node, lead, now or datetime.now(UTC))
    return Suggested(pool.name, cloud, days, len(history), per_node, plan.nodes.min, lead,
                     source, found)
