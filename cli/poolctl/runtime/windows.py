"""Launch windows (`warm --replicas N --from T --until T --running`, `warm --list`,
`warm --cancel ID`): spare nodes in service for a window, applied by the cloud at its times.

A window raises the group's minimum by N replicas' nodes at `--from` and gives them back at
`--until`; overlapping windows take the larger raise (`poolctl.windows`). The windows live in
the cloud (AWS scheduled actions, GCP scaling schedules), which applies them with nobody
watching; nothing is kept on this machine. Only nodes in service can be scheduled: neither
cloud schedules a warm pool's (standby pool's) size, so `--from` needs `--running`, and the
file's warm pool stays behind the window as it is (docs/capacity.md#launch-windows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BlockOffering,
    BuysCapacityBlocks,
    CloudOps,
    Group,
    SchedulesWindows,
)
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.runtime.quota import quota_for_nodes
from poolctl.sizing import PoolPlan, nodes_for, plan_pool
from poolctl.windows import (
    SCALE_IN_LEAD,
    Window,
    block_need,
    check_window,
    edges,
    new_id,
    raise_at,
)

NOT_RUNNING = (
    "--from/--until: a scheduled window puts its nodes in service; add --running. Neither "
    "cloud schedules a warm pool's size (AWS scheduled actions set the group's MinSize, "
    "MaxSize and DesiredCapacity; GCP scaling schedules the autoscaler's minimum), and "
    "stopped nodes hold no capacity for the launch; see docs/capacity.md#launch-windows")


@dataclass(frozen=True)
class WindowRow:
    id: str
    nodes: int
    replicas: int
    start: str | None  # ISO time; None: begun (the cloud has run its start)
    end: str
    state: str  # scheduled | active
    min_nodes: int  # the group's minimum while this window alone is open


@dataclass(frozen=True)
class WindowsResult:
    pool: str
    cloud: Cloud
    action: str  # scheduled | cancelled | list
    kept_min_nodes: int  # the minimum the group returns to after the windows
    windows: tuple[WindowRow, ...]
    message: str = ""
    window: str | None = None  # the id scheduled or cancelled
    quota: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # --reserve: the Capacity Blocks offered for the window, the one bought (its Capacity
    # Reservation id) or None, and what the window's nodes cost On-Demand for comparison.
    offerings: tuple[BlockOffering, ...] = ()
    bought: str | None = None
    on_demand_usd: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["windows"] = [asdict(w) for w in self.windows]
        d["quota"] = list(self.quota)
        d["offerings"] = [o.to_json() for o in self.offerings]
        return d


def _scheduler(ops: CloudOps, cloud: Cloud) -> SchedulesWindows:
    if not isinstance(ops, SchedulesWindows):
        raise UsageError(f"--from/--until: {cloud} has no scheduled windows in poolctl")
    return ops


def _rows(windows: list[Window], base: int, rpn: int, now: datetime) -> tuple[WindowRow, ...]:
    return tuple(WindowRow(
        id=w.id, nodes=w.nodes, replicas=w.nodes * rpn,
        start=None if w.start is None else w.start.isoformat(timespec="seconds"),
        end=w.end.isoformat(timespec="seconds"),
        state="active" if w.active(now) else "scheduled", min_nodes=base + w.nodes)
        for w in sorted(windows, key=lambda w: (w.end, w.id)))


def _current(sched: SchedulesWindows, group: Group, now: datetime
             ) -> tuple[list[Window], int, list[Window]]:
    """(windows still to end, kept minimum, ended windows the cloud still lists)."""
    windows, base = sched.scheduled_windows(group)
    live = [w for w in windows if w.end > now]
    return live, group.min_nodes if base is None else base, [w for w in windows
                                                            if w.end <= now]


def open_raise(ops: CloudOps, group: Group, now: datetime) -> tuple[list[Window], int, int]:
    """(windows still to end, the nodes an open window adds to the group's own minimum now,
    the minimum kept under the windows): what `warm` and `deploy` set the minimum around.
    ([], 0, the group's minimum) where the cloud schedules no windows."""
    if not isinstance(ops, SchedulesWindows):
        return [], 0, group.min_nodes
    live, base, _ = _current(ops, group, now)
    return live, raise_at(live, now) if ops.raises_group_minimum else 0, base


def rebase_windows(cfg: Config, pool: Pool, ops: CloudOps, base_min: int, now: datetime
                   ) -> str | None:
    """After `warm` or `deploy` set the minimum kept outside the windows to `base_min`: the
    windows rise over it and their ends return to it (they were written over the minimum of
    their scheduling). A line saying so, or None when nothing changed."""
    if not isinstance(ops, SchedulesWindows):
        return None
    group = ops.find_group(cfg, pool)
    live, base, ended = _current(ops, group, now)
    if not live or base == base_min:
        return None
    ops.write_windows(group, live, base_min, removed=ended)
    return (f"{pool.name}: {len(live)} window(s) now rise over a minimum of {base_min} "
            f"node(s) (was {base}) and return to it at their ends")


def window_line(w: WindowRow) -> str:
    when = f"from {w.start} " if w.start else ""
    return (f"window {w.id}: +{w.nodes} node(s) ({w.replicas} replicas) in service "
            f"{when}until {w.end} ({w.state}; minimum {w.min_nodes})")


def list_windows(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, now: datetime
                 ) -> WindowsResult:
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    live, base, _ = _current(sched, ops.find_group(cfg, pool), now)
    return WindowsResult(pool=pool.name, cloud=cloud, action="list", kept_min_nodes=base,
                         windows=_rows(live, base, plan.replicas_per_node, now),
                         message=f"{pool.name}: {len(live)} window(s)")


def _quota_for(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan,
               peak_min: int) -> tuple[dict[str, Any], ...]:
    """Quota for the windows' peak: their largest minimum, with running warm nodes."""
    running_warm = plan.warm_running_nodes
    lines = quota_for_nodes(cfg, pool, cloud, ops, plan, peak_min + running_warm,
                            "in service during the window", "nothing was scheduled")
    return tuple(ln.to_json() for ln in lines)


def _blocks(pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan, n: int,
            start: datetime, end: datetime) -> tuple[BuysCapacityBlocks, list[BlockOffering]]:
    """The Capacity Blocks that hold the window's nodes from its start to 30 minutes past
    its end (AWS terminates a block's instances 30 minutes before it ends), cheapest first."""
    if not isinstance(ops, BuysCapacityBlocks):
        raise UsageError(f"--reserve: {cloud} capacity for a window is not in poolctl yet "
                         "(GCP future reservations); schedule the window without --reserve")
    need = block_need(n, start, end)
    offers = ops.capacity_block_offerings(plan.region, plan.instance_type, need.count,
                                          need.hours, need.earliest, need.latest)
    fit = sorted((o for o in offers if need.covers(start, end, o.start, o.end)),
                 key=lambda o: (o.upfront_usd, o.start))
    if not fit:
        raise OperationFailed(
            f"{pool.name}: no Capacity Block of {need.count} x {plan.instance_type} for "
            f"{need.hours} h covers the window ({start.isoformat(timespec='minutes')} to "
            f"{end.isoformat(timespec='minutes')} + 30 min; blocks end at 11:30 UTC); "
            f"{len(offers)} offered for other times; nothing was bought or scheduled")
    return ops, fit


def schedule_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, replicas: int,
                    start: datetime, end: datetime, running: bool, now: datetime,
                    reserve: bool = False, yes: bool = False) -> WindowsResult:
    """Schedule `replicas` more in service from `start` to `end`; nothing is written when
    any check fails. `reserve`: look up the Capacity Blocks for it first; without `yes`
    nothing is bought and nothing scheduled (the offers are the answer)."""
    if not running:
        raise UsageError(NOT_RUNNING)
    check_window(start, end, now)
    if replicas < 1:
        raise UsageError(f"--replicas {replicas}: a window needs at least 1 replica")
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    n = nodes_for(replicas, rpn)
    group = ops.find_group(cfg, pool)
    live, base, ended = _current(sched, group, now)
    if len(live) >= sched.max_windows:
        raise UsageError(f"--from: pool {pool.name!r} has {len(live)} windows, the most "
                         f"{cloud} allows ({sched.max_windows}); cancel one with "
                         "`poolctl warm --cancel ID`")
    if base + n > group.max_nodes:
        room = max(0, group.max_nodes - base) * rpn
        raise UsageError(f"--replicas {replicas}: {n} node(s) above the kept minimum of {base} "
                         f"exceeds the group's maximum of {group.max_nodes}; ask for at most "
                         f"{room} replicas, or raise scaling.max_replicas and deploy")
    window = Window(id=new_id(), nodes=n, start=start, end=end)
    windows = [*live, window]
    peak = max(e.min_nodes for e in edges(windows, base))
    quota = _quota_for(cfg, pool, cloud, ops, plan, peak)
    on_demand = round(n * plan.price_per_node_hour_usd * (end - start).total_seconds() / 3600, 2)
    offerings: tuple[BlockOffering, ...] = ()
    bought = None
    if reserve:
        buyer, fit = _blocks(pool, cloud, ops, plan, n, start, end)
        offerings = tuple(fit)
        if not yes:
            best = fit[0]
            return WindowsResult(
                pool=pool.name, cloud=cloud, action="offered", kept_min_nodes=base,
                windows=_rows(live, base, rpn, now), quota=quota, offerings=offerings,
                on_demand_usd=on_demand,
                message=(f"{pool.name}: {len(fit)} Capacity Block(s) hold the window; the "
                         f"cheapest, {best.id}: {best.count} x {best.instance_type} in "
                         f"{best.zone} {best.start.isoformat(timespec='minutes')} to "
                         f"{best.end.isoformat(timespec='minutes')} ({best.hours} h) for "
                         f"${best.upfront_usd:,.2f} upfront (the window's {n} node(s) "
                         f"On-Demand: ${on_demand:,.2f}); nothing bought or scheduled: add "
                         "--yes to buy it and schedule the window"))
        bought = buyer.buy_capacity_block(
            plan.region, fit[0], {naming.TAG_PROJECT: cfg.project, naming.TAG_POOL: pool.name,
                                  "poolctl:window": window.id})
        # The window lives inside the block: out at its start at the earliest, in more than
        # 30 minutes before its end (EC2 then terminates what is left in it).
        start, end = max(start, fit[0].start), min(end, fit[0].end - SCALE_IN_LEAD)
        window = replace(window, start=start, end=end)
        windows = [*live, window]
    sched.write_windows(group, windows, base, removed=ended)
    rows = _rows(windows, base, rpn, now)
    rounding = (f" ({replicas} replicas rounded up to {n} node(s) of {rpn})"
                if n * rpn != replicas else "")
    block = "" if bought is None else (
        f"; bought Capacity Block {bought} (${offerings[0].upfront_usd:,.2f}, "
        f"{offerings[0].start.isoformat(timespec='minutes')} to "
        f"{offerings[0].end.isoformat(timespec='minutes')}): for the nodes to launch into "
        f"it, add `capacity_block: {bought}` under the pool's aws.capacity"
        + (" (and set warm_pool.replicas: 0: a block pool keeps no warm pool)"
           if pool.warm_pool.replicas else "") + " and run "
        f"`poolctl deploy --pool {pool.name}` before the window (every launch then targets "
        "the block; docs/capacity.md#capacity-blocks)")
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="scheduled", kept_min_nodes=base, windows=rows,
        window=window.id, quota=quota, offerings=offerings, bought=bought,
        on_demand_usd=on_demand,
        message=(f"{pool.name}: scheduled window {window.id}: minimum {base} -> {base + n} "
                 f"node(s) (+{n * rpn} replicas in service{rounding}) at "
                 f"{start.isoformat(timespec='seconds')}, back to {base} at "
                 f"{end.isoformat(timespec='seconds')}; nodes serve "
                 f"{plan.start_seconds['warm']:.0f} s (from the warm pool) to "
                 f"{plan.start_seconds['cold']:.0f} s (new) after it: start the window "
                 "that much before the launch" + block))


def cancel_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, window_id: str,
                  now: datetime) -> WindowsResult:
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    live, base, ended = _current(sched, group, now)
    gone = [w for w in live if w.id == window_id]
    if not gone:
        known = ", ".join(w.id for w in live) or "none"
        raise UsageError(f"--cancel {window_id}: no such window of pool {pool.name!r} "
                         f"(windows: {known}); `poolctl warm --list` shows them")
    rest = [w for w in live if w.id != window_id]
    sched.write_windows(group, rest, base, removed=gone + ended)
    begun = gone[0].active(now)
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="cancelled", kept_min_nodes=base,
        windows=_rows(rest, base, plan.replicas_per_node, now), window=window_id,
        message=f"{pool.name}: cancelled window {window_id}"
                + ("; it had begun: the group's minimum returns now" if begun else ""))
