"""Launch windows (`warm --replicas N --from T --until T [--running]`, `warm --list`,
`warm --cancel ID`): spare nodes for a window, applied by the cloud at its times.

With `--running` a window raises the group's minimum by N replicas' nodes at `--from` and
gives them back at `--until`; overlapping windows take the larger raise (`poolctl.windows`).
The windows live in the cloud (AWS scheduled actions, GCP scaling schedules), which applies
them with nobody watching; nothing is kept on this machine. Without `--running` (AWS) the
window raises the warm pool instead, through EventBridge Scheduler schedules calling
PutWarmPool (clouds/aws/windows.py); GCP cannot schedule a standby pool's size, so there it
is refused (docs/capacity.md#launch-windows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BlockOffering,
    BlockWindow,
    BoughtBlock,
    BuysCapacityBlocks,
    CloudOps,
    Group,
    Purchase,
    ReservesCalendarCapacity,
    RunsBlockWindows,
    SchedulesWarmWindows,
    SchedulesWindows,
)
from poolctl.clouds.registry import driver, get_ops
from poolctl.config import Config, Pool, Target
from poolctl.endpoints import CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.progress import log
from poolctl.runtime.purchases import (
    bought_blocks,
    buyer,
    now_iso,
    pending_line,
    record,
    unanswered,
    unused_line,
)
from poolctl.runtime.quota import quota_for_nodes
from poolctl.sizing import PoolPlan, nodes_for, plan_pool
from poolctl.terraform import Terraform
from poolctl.windows import (
    SCALE_IN_LEAD,
    Window,
    block_need,
    check_window,
    edges,
    raise_at,
    same_window,
    span_tag,
    window_id,
)

NOT_RUNNING = (
    "--from/--until without --running: {cloud} cannot schedule a standby pool's size (GCP "
    "scaling schedules set the autoscaler's minimum, not the MIG's targetStoppedSize); add "
    "--running to keep the window's nodes in service, or run `poolctl warm --replicas N` at "
    "the start and `poolctl warm --reset` at the end (docs/capacity.md#launch-windows)")


@dataclass(frozen=True)
class WindowRow:
    id: str
    nodes: int
    replicas: int
    start: str | None  # ISO time; None: begun (the cloud has run its start)
    end: str
    state: str  # scheduled | active
    min_nodes: int  # the group's minimum while this window alone is open
    # A window on a bought Capacity Block: the block, and the group of its own that runs
    # the window's nodes in it (the pool's group's minimum is not raised: min_nodes is it).
    capacity_block: str | None = None
    group: str | None = None
    # False: a window of warm nodes; min_nodes is then the warm pool's size while it alone is
    # open (the group's minimum is not raised).
    in_service: bool = True


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
    # Capacity Blocks bought for the pool that no window uses (an interrupted purchase, a
    # cancelled window), and purchases whose answer never came (the ledger's `buying`).
    unused_blocks: tuple[BoughtBlock, ...] = ()
    pending: tuple[Purchase, ...] = ()
    # False: the cloud's edge sizes are not what its windows make (two writers at once).
    consistent: bool = True

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["windows"] = [asdict(w) for w in self.windows]
        d["quota"] = list(self.quota)
        d["offerings"] = [o.to_json() for o in self.offerings]
        d["unused_blocks"] = [b.to_json() for b in self.unused_blocks]
        d["pending"] = [p.to_json() for p in self.pending]
        return d

    def notes(self) -> list[str]:
        """What `warm --list` and `status` say of the purchases beside the windows."""
        out = [unused_line(self.pool, self.cloud, b) for b in self.unused_blocks]
        out += [pending_line(self.pool, p) for p in self.pending]
        if not self.consistent:
            out.append(f"{self.pool}: the cloud's scheduled sizes differ from what its windows "
                       "make (two writers at once?); any `poolctl warm --from ... --until ...` "
                       "or `poolctl deploy` writes every edge again")
        return out


def _scheduler(ops: CloudOps, cloud: Cloud) -> SchedulesWindows:
    if not isinstance(ops, SchedulesWindows):
        raise UsageError(f"--from/--until: {cloud} has no scheduled windows in poolctl")
    return ops


class Kind(StrEnum):
    """The two kinds of window a pool's own group runs: nodes in service (the group's
    minimum rises: SchedulesWindows) and warm nodes (its warm pool rises:
    SchedulesWarmWindows). One set of functions takes either."""

    RUNNING = "running"
    WARM = "warm"


def _rows(windows: list[Window], base: int, rpn: int, now: datetime,
          kind: Kind = Kind.RUNNING) -> tuple[WindowRow, ...]:
    return tuple(WindowRow(
        id=w.id, nodes=w.nodes, replicas=w.nodes * rpn,
        start=None if w.start is None else w.start.isoformat(timespec="seconds"),
        end=w.end.isoformat(timespec="seconds"),
        state="active" if w.active(now) else "scheduled", min_nodes=base + w.nodes,
        in_service=kind == Kind.RUNNING)
        for w in sorted(windows, key=lambda w: (w.end, w.id)))


def _split(found: tuple[list[Window], int | None], own: int, now: datetime
           ) -> tuple[list[Window], int, list[Window]]:
    """(windows still to end, the size kept under them, ended windows the cloud still
    lists) from what the cloud read back; `own`, the group's, when no window is left."""
    windows, base = found
    return ([w for w in windows if w.end > now], own if base is None else base,
            [w for w in windows if w.end <= now])


# What reads or writes windows: a cloud's ops, or the capability it was narrowed to.
Scheduler = CloudOps | SchedulesWindows | SchedulesWarmWindows


def current(kind: Kind, ops: Scheduler, group: Group, now: datetime
            ) -> tuple[list[Window], int, list[Window]]:
    """The windows of `kind`: (still to end, the size kept under them: the group's minimum
    or its warm pool, ended ones the cloud still lists); none where the cloud schedules no
    such windows."""
    if kind == Kind.RUNNING:
        if not isinstance(ops, SchedulesWindows):
            return [], group.min_nodes, []
        return _split(ops.scheduled_windows(group), group.min_nodes, now)
    if not isinstance(ops, SchedulesWarmWindows):
        return [], group.warm_min_nodes, []
    return _split(ops.scheduled_warm_windows(group), group.warm_min_nodes, now)


def write(kind: Kind, ops: Scheduler, group: Group, windows: list[Window], base: int,
          removed: list[Window], *, kept_min: int, running: bool) -> None:
    """Make the cloud's windows of `kind` exactly `windows` over `base` (warm windows: the
    group's kept minimum `kept_min` and the pool's warm state `running` go with them)."""
    if kind == Kind.RUNNING:
        assert isinstance(ops, SchedulesWindows)  # the caller read windows of this kind
        ops.write_windows(group, windows, base, removed=removed)
    else:
        assert isinstance(ops, SchedulesWarmWindows)  # likewise
        ops.write_warm_windows(group, windows, base, removed=removed, kept_min=kept_min,
                               running=running)


def _converge(read: Callable[[], tuple[list[Window], int, list[Window]]],
              write: Callable[[list[Window], list[Window]], None], windows: list[Window],
              removed: list[Window]) -> None:
    """Write `windows`, then read the cloud back: a window nobody here knew of (another
    poolctl wrote at the same time, from another machine: this one's lock held ours apart)
    means edges written without it, so every edge is written again over the union, until
    the read-back holds nothing new (three rounds at most)."""
    write(windows, removed)
    gone = {w.id for w in removed}
    for _ in range(3):
        live, _, ended = read()
        known = {w.id for w in windows}
        new = [w for w in live if w.id not in known and w.id not in gone]
        if not new:
            return
        windows = [*windows, *new]
        write(windows, ended)


def _duplicate(live: list[Window], window: Window) -> Window | None:
    """The window of `live` that `window` asks for again, if one is still to begin."""
    return next((w for w in live if w.start is not None
                 and (w.id == window.id or same_window(w, window))), None)


def _exists(pool: Pool, cloud: Cloud, base: int, rows: tuple[WindowRow, ...], dup: Window,
            what: str) -> WindowsResult:
    assert dup.start is not None  # a duplicate has not begun (same_window)
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="exists", kept_min_nodes=base, windows=rows,
        window=dup.id,
        message=(f"{pool.name}: window {dup.id} already schedules +{dup.nodes} node(s) "
                 f"{what} from {dup.start.isoformat(timespec='seconds')} to "
                 f"{dup.end.isoformat(timespec='seconds')} (within 5 minutes of the times "
                 "asked): nothing changed, nothing bought"))


def open_raise(kind: Kind, ops: CloudOps, group: Group, now: datetime
               ) -> tuple[list[Window], int, int]:
    """(windows of `kind` still to end, the nodes an open one adds now to the size the group
    shows, the size kept under them): what `warm` and `deploy` set the group's minimum (or
    warm pool) around. A GCP schedule raises the autoscaler beside the minimum, not in it."""
    live, base, _ = current(kind, ops, group, now)
    shows = kind == Kind.WARM or getattr(ops, "raises_group_minimum", False)
    return live, raise_at(live, now) if shows else 0, base


def rebase(kind: Kind, cfg: Config, pool: Pool, ops: CloudOps, base_size: int, now: datetime,
           *, kept_min: int) -> str | None:
    """After `warm` or `deploy` set the size kept outside the windows of `kind` to
    `base_size`: the windows rise over it and their ends return to it (they were written
    over the size of their scheduling). A line saying so, or None when nothing changed."""
    if (kind == Kind.RUNNING and not isinstance(ops, SchedulesWindows)) or (
            kind == Kind.WARM and not isinstance(ops, SchedulesWarmWindows)):
        return None
    group = ops.find_group(cfg, pool)
    live, base, ended = current(kind, ops, group, now)
    if not live or base == base_size:
        return None
    write(kind, ops, group, live, base_size, ended, kept_min=kept_min,
          running=pool.warm_pool.state == "running")
    what = ("a minimum" if kind == Kind.RUNNING else "a warm pool")
    of = "" if kind == Kind.RUNNING else " of warm nodes"
    return (f"{pool.name}: {len(live)} window(s){of} now rise over {what} of {base_size} "
            f"node(s) (was {base}) and return to it at their ends")


def window_line(w: WindowRow) -> str:
    when = f"from {w.start} " if w.start else ""
    where = (f"; in Capacity Block {w.capacity_block}, group {w.group}" if w.capacity_block
             else f"; minimum {w.min_nodes}" if w.in_service else f"; warm pool {w.min_nodes}")
    return (f"window {w.id}: +{w.nodes} node(s) ({w.replicas} replicas) "
            f"{'in service' if w.in_service else 'warm'} {when}until {w.end} "
            f"({w.state}{where})")


def _block_windows(cfg: Config, pool: Pool, ops: CloudOps) -> list[BlockWindow]:
    return ops.block_windows(cfg, pool) if isinstance(ops, RunsBlockWindows) else []


def _block_rows(bws: list[BlockWindow], base: int, rpn: int, now: datetime
                ) -> tuple[WindowRow, ...]:
    return tuple(replace(row, capacity_block=bw.block, group=bw.group, min_nodes=base)
                 for bw in bws if bw.window.end > now
                 for row in _rows([bw.window], base, rpn, now))


def list_windows(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, now: datetime
                 ) -> WindowsResult:
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    live, base, _ = current(Kind.RUNNING, sched, group, now)
    warm, warm_base, _ = current(Kind.WARM, ops, group, now)
    bws = _block_windows(cfg, pool, ops)
    rows = (*_rows(live, base, plan.replicas_per_node, now),
            *_rows(warm, warm_base, plan.replicas_per_node, now, Kind.WARM),
            *_block_rows(bws, base, plan.replicas_per_node, now))
    # What the cloud holds, not what the windows should make: each row's minimum is its
    # `from` edge's as scheduled, and any edge off what the windows make is said.
    held = sched.scheduled_edges(group)
    consistent = True
    if held is not None:
        want = {(e.window, e.kind): e.min_nodes for e in edges(live, base)}
        consistent = all(held.get(k) == v for k, v in want.items())
        rows = tuple(replace(r, min_nodes=held.get((r.id, "from"), r.min_nodes))
                     if r.in_service and r.capacity_block is None else r for r in rows)
    blocks = bought_blocks(cfg, pool, ops)
    used = {bw.block for bw in bws}
    known = {b.window or "" for b in blocks} | {r.id for r in rows}
    return WindowsResult(pool=pool.name, cloud=cloud, action="list", kept_min_nodes=base,
                         windows=rows, message=f"{pool.name}: {len(rows)} window(s)",
                         unused_blocks=tuple(b for b in blocks if b.id not in used),
                         pending=tuple(unanswered(cfg, pool, cloud, known)),
                         consistent=consistent)


def _quota_for(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan,
               peak_min: int) -> tuple[dict[str, Any], ...]:
    """Quota for the windows' peak: their largest minimum, with running warm nodes."""
    running_warm = plan.warm_running_nodes
    lines = quota_for_nodes(cfg, pool, cloud, ops, plan, peak_min + running_warm,
                            "in service during the window", "nothing was scheduled")
    return tuple(ln.to_json() for ln in lines)


def _blocks(pool: Pool, cloud: Cloud, ops: CloudOps, plan: PoolPlan, n: int,
            start: datetime, end: datetime, now: datetime
            ) -> tuple[BuysCapacityBlocks, list[BlockOffering]]:
    """The Capacity Blocks that hold the window's nodes from its start to 30 minutes past
    its end (AWS terminates a block's instances 30 minutes before it ends), cheapest first."""
    if not isinstance(ops, BuysCapacityBlocks):
        raise UsageError(f"--reserve: {cloud} sells no capacity for a window that poolctl "
                         "knows; schedule the window without --reserve")
    need = block_need(n, start, end, now)
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


def check_warm_window(pool: Pool, cloud: Cloud, reserve: bool) -> None:
    """A window of warm nodes (no --running), refused before any cloud call where it cannot
    be: one line naming the flag or the key."""
    if reserve:
        raise UsageError("--reserve without --running: a Capacity Block holds running "
                         "instances (a stopped one gives its slot back); add --running")
    if SchedulesWarmWindows not in driver(cloud).capabilities:
        raise UsageError(NOT_RUNNING.format(cloud=cloud))
    placement = pool.placement(cloud)
    if placement is not None and placement.fallback_types:
        raise UsageError(f"--from without --running: pool {pool.name!r} grows on fallback "
                         "types, so it keeps no warm pool; add --running")
    if not plan_pool(pool, cloud).nodes.warm:
        raise UsageError(f"--from without --running: pool {pool.name!r} keeps no warm pool "
                         "(warm_pool.replicas: 0) for the window to raise; give it one and "
                         "deploy, or add --running")


def _schedule_warm_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                          replicas: int, start: datetime, end: datetime, now: datetime
                          ) -> WindowsResult:
    """`replicas` more warm (the pool's warm state) from `start` to `end`, set by the cloud."""
    assert isinstance(ops, SchedulesWarmWindows)  # check_warm_window ran
    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    n = nodes_for(replicas, rpn)
    group = ops.find_group(cfg, pool)
    live, base, ended = current(Kind.WARM, ops, group, now)
    _, _, kept_min = open_raise(Kind.RUNNING, ops, group, now)
    if len(live) >= ops.max_warm_windows:
        raise UsageError(f"--from: pool {pool.name!r} has {len(live)} windows of warm nodes, "
                         f"the most poolctl keeps ({ops.max_warm_windows}); cancel one with "
                         "`poolctl warm --cancel ID`")
    if kept_min + base + n > group.max_nodes:
        room = max(0, group.max_nodes - kept_min - base) * rpn
        raise UsageError(
            f"--replicas {replicas}: {n} warm node(s) beside the {base} kept and the minimum "
            f"of {kept_min} exceed the group's maximum of {group.max_nodes} (warm nodes serve "
            f"only when the group grows onto them); ask for at most {room} replicas, or "
            "raise scaling.max_replicas and deploy")
    window = Window(id=window_id("warm", n, start, end), nodes=n, start=start, end=end)
    if (dup := _duplicate(live, window)) is not None:
        return _exists(pool, cloud, kept_min, _rows(live, base, rpn, now, Kind.WARM), dup, "warm")
    windows = [*live, window]
    running = pool.warm_pool.state == "running"
    # Warm nodes launch (and run) before they stop: quota for them beside what runs.
    quota = _quota_for(cfg, pool, cloud, ops, plan,
                       max(group.desired_nodes, group.min_nodes)
                       + max(e.min_nodes for e in edges(windows, base)) - base)
    _converge(lambda: current(Kind.WARM, ops, group, now),
              lambda ws, gone: ops.write_warm_windows(group, ws, base, removed=gone,
                                                      kept_min=kept_min, running=running),
              windows, ended)
    state = "running" if running else "stopped"
    held = ("" if running else "; stopped nodes hold no capacity: each start at scale-out is "
            "a new launch that can fail for capacity (--running holds it)")
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="scheduled", kept_min_nodes=kept_min,
        windows=_rows(windows, base, rpn, now, Kind.WARM), window=window.id, quota=quota,
        message=(f"{pool.name}: scheduled window {window.id}: warm pool {base} -> {base + n} "
                 f"node(s) (+{n * rpn} replicas {state}) at "
                 f"{start.isoformat(timespec='seconds')}, back to {base} at "
                 f"{end.isoformat(timespec='seconds')}; the nodes are prepared from "
                 f"{start.isoformat(timespec='seconds')} (about "
                 f"{plan.start_seconds['cold']:.0f} s each), then serve "
                 f"{plan.start_seconds['warm']:.0f} s after a scale-out takes them{held}"))


def schedule_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, replicas: int,
                    start: datetime, end: datetime, running: bool, now: datetime,
                    reserve: bool = False, yes: bool = False) -> WindowsResult:
    """Schedule `replicas` more in service (`running`), or in the warm pool, from `start` to
    `end`; nothing is written when any check fails. `reserve`: look up the Capacity Blocks
    for it first; without `yes` nothing is bought and nothing scheduled (the offers are the
    answer); with it the cheapest is bought and the window's nodes run in it, in a group of
    their own."""
    if not running:
        check_warm_window(pool, cloud, reserve)
    check_window(start, end, now)
    if replicas < 1:
        raise UsageError(f"--replicas {replicas}: a window needs at least 1 replica")
    if not running:
        return _schedule_warm_window(cfg, pool, cloud, ops, replicas, start, end, now)
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    rpn = plan.replicas_per_node
    n = nodes_for(replicas, rpn)
    group = ops.find_group(cfg, pool)
    live, base, ended = current(Kind.RUNNING, sched, group, now)
    if len(live) >= sched.max_windows:
        raise UsageError(f"--from: pool {pool.name!r} has {len(live)} windows, the most "
                         f"{cloud} allows ({sched.max_windows}); cancel one with "
                         "`poolctl warm --cancel ID`")
    if not reserve and base + n > group.max_nodes:
        room = max(0, group.max_nodes - base) * rpn
        raise UsageError(f"--replicas {replicas}: {n} node(s) above the kept minimum of {base} "
                         f"exceeds the group's maximum of {group.max_nodes}; ask for at most "
                         f"{room} replicas, or raise scaling.max_replicas and deploy")
    window = Window(id=window_id("block" if reserve else "running", n, start, end), nodes=n,
                    start=start, end=end)
    if not reserve and (dup := _duplicate(live, window)) is not None:
        return _exists(pool, cloud, base, _rows(live, base, rpn, now), dup, "in service")
    windows = [*live, window]
    peak = max(e.min_nodes for e in edges(windows, base))
    quota = _quota_for(cfg, pool, cloud, ops, plan, peak)
    on_demand = round(n * plan.price_per_node_hour_usd * (end - start).total_seconds() / 3600, 2)
    if reserve:
        return _reserve_window(cfg, pool, cloud, ops, group, plan, window, live, base, quota,
                               on_demand, yes, now)
    _converge(lambda: current(Kind.RUNNING, sched, group, now),
              lambda ws, gone: sched.write_windows(group, ws, base, removed=gone),
              windows, ended)
    rows = _rows(windows, base, rpn, now)
    rounding = (f" ({replicas} replicas rounded up to {n} node(s) of {rpn})"
                if n * rpn != replicas else "")
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="scheduled", kept_min_nodes=base, windows=rows,
        window=window.id, quota=quota, on_demand_usd=on_demand,
        message=(f"{pool.name}: scheduled window {window.id}: minimum {base} -> {base + n} "
                 f"node(s) (+{n * rpn} replicas in service{rounding}) at "
                 f"{start.isoformat(timespec='seconds')}, back to {base} at "
                 f"{end.isoformat(timespec='seconds')}; nodes serve "
                 f"{plan.start_seconds['warm']:.0f} s (from the warm pool) to "
                 f"{plan.start_seconds['cold']:.0f} s (new) after it: start the window "
                 "that much before the launch"))


def _block_for(window: Window, blocks: list[BoughtBlock], zones: list[str]
               ) -> BoughtBlock | None:
    """A bought block no window uses that holds `window`: the one bought for it (its tag:
    an interrupted run's), else any in the pool's zones with room for its nodes from its
    start to 30 minutes past its end."""
    assert window.start is not None
    fits = [b for b in blocks if b.zone in zones and b.count >= window.nodes
            and b.start <= window.start and b.end >= window.end]
    return next((b for b in fits if b.window == window.id), fits[0] if fits else None)


def _reserve_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, group: Group,
                    plan: PoolPlan, window: Window, live: list[Window], base: int,
                    quota: tuple[dict[str, Any], ...], on_demand: float, yes: bool,
                    now: datetime) -> WindowsResult:
    """`--reserve`: the Capacity Blocks in the pool's zones that hold the window; with `yes`
    the cheapest is bought and a group of the window's own runs its nodes in it, scaled by
    the cloud at the window's start and end. The pool's group is not touched.

    Never bought twice: a window already running in a block (the same command run again)
    is said and left; a block bought for the pool that no window uses and that holds this
    one (an interrupted run's, found by its tags) is offered first and used with `yes`.
    Every purchase is in the ledger (runtime/purchases.py) before the call that makes it."""
    assert window.start is not None  # a window being scheduled has its start
    start, end, n, rpn = window.start, window.end, window.nodes, plan.replicas_per_node
    if isinstance(ops, ReservesCalendarCapacity):
        return _calendar_window(cfg, pool, cloud, ops, group, plan, window, live, base, quota,
                                on_demand, yes, now)
    if not isinstance(ops, RunsBlockWindows):
        raise UsageError(f"--reserve: {cloud} cannot run a window's nodes in a block yet")
    rows = _rows(live, base, rpn, now)
    running = ops.block_windows(cfg, pool)
    for bw in running:
        if bw.window.id == window.id and bw.window.start is None and start > now:
            # This window's group without its actions: a run stopped between the two.
            # Finish it in its block (each step of the group's making is idempotent).
            mine = next((b for b in ops.pool_blocks(cfg, pool) if b.id == bw.block), None)
            if mine is not None:
                return _open_in_block(cfg, pool, cloud, ops, group, plan, window, rows, base,
                                      quota, on_demand, mine.offering(), (mine.offering(),),
                                      "found with its window half made by an earlier run",
                                      now)
        if bw.window.end > now and (dup := _duplicate([bw.window], window)) is not None:
            return replace(_exists(pool, cloud, base, (*rows, *_block_rows([bw], base, rpn, now)),
                                   dup, f"in Capacity Block {bw.block}"), bought=bw.block)
    zones = ops.block_zones(group)
    used = {bw.block for bw in running}
    held = _block_for(window, [b for b in ops.pool_blocks(cfg, pool) if b.id not in used],
                      zones)
    if held is not None:
        offer = held.offering()
        if not yes:
            return WindowsResult(
                pool=pool.name, cloud=cloud, action="offered", kept_min_nodes=base,
                windows=rows, quota=quota, offerings=(offer,), on_demand_usd=on_demand,
                message=(f"{unused_line(pool.name, cloud, held)}; it holds this window: add "
                         "--yes to schedule the window in it (nothing is bought)"))
        return _open_in_block(cfg, pool, cloud, ops, group, plan, window, rows, base, quota,
                              on_demand, offer, (offer,),
                              f"found, bought {held.bought_at or 'earlier'} by "
                              f"{held.bought_by or 'poolctl'}, no window used it", now)
    buyer_ops, fit = _blocks(pool, cloud, ops, plan, n, start, end, now)
    usable = [o for o in fit if o.zone in zones]
    if not usable:
        raise OperationFailed(
            f"{pool.name}: the Capacity Blocks that hold the window are in "
            f"{', '.join(sorted({o.zone for o in fit}))}, where the pool's group has no subnet "
            f"(its zones: {', '.join(zones)}); nothing was bought or scheduled")
    best = usable[0]
    if not yes:
        return WindowsResult(
            pool=pool.name, cloud=cloud, action="offered", kept_min_nodes=base, windows=rows,
            quota=quota, offerings=tuple(usable), on_demand_usd=on_demand,
            message=(f"{pool.name}: {len(usable)} Capacity Block(s) hold the window; the "
                     f"cheapest, {best.id}: {best.count} x {best.instance_type} in "
                     f"{best.zone} {best.start.isoformat(timespec='minutes')} to "
                     f"{best.end.isoformat(timespec='minutes')} ({best.duration}) for "
                     f"${best.upfront_usd:,.2f} upfront (the window's {n} node(s) "
                     f"On-Demand: ${on_demand:,.2f}); nothing bought or scheduled: add "
                     "--yes to buy it and schedule the window"))
    by, at = buyer(), now_iso()
    tags = {**naming.aws_tags(cfg, pool), naming.TAG_WINDOW: window.id,
            naming.TAG_WINDOW_SPAN: span_tag(window), naming.TAG_BOUGHT_BY: by[:256],
            naming.TAG_BOUGHT_AT: at}
    step = Purchase(at=at, by=by, state="buying", project=cfg.project, pool=pool.name,
                    cloud=str(cloud), region=plan.region, kind="capacity-block",
                    window=window.id, offering=best.id, nodes=best.count,
                    start=best.start.isoformat(timespec="minutes"),
                    end=best.end.isoformat(timespec="minutes"), upfront_usd=best.upfront_usd)
    record(step)
    try:
        block = buyer_ops.buy_capacity_block(plan.region, best, tags)
    except OperationFailed as e:
        record(replace(step, at=now_iso(), state="failed", error=str(e)[:500]))
        raise
    record(replace(step, at=now_iso(), state="bought", reservation=block))
    return _open_in_block(cfg, pool, cloud, ops, group, plan, window, rows, base, quota,
                          on_demand, replace(best, id=block), tuple(usable),
                          f"bought for ${best.upfront_usd:,.2f}", now)


def _open_in_block(cfg: Config, pool: Pool, cloud: Cloud, ops: RunsBlockWindows, group: Group,
                   plan: PoolPlan, window: Window, rows: tuple[WindowRow, ...], base: int,
                   quota: tuple[dict[str, Any], ...], on_demand: float, held: BlockOffering,
                   offerings: tuple[BlockOffering, ...], bought: str, now: datetime
                   ) -> WindowsResult:
    """The window's group in the block `held` (its id the Capacity Reservation's)."""
    assert window.start is not None
    n, rpn, block = window.nodes, plan.replicas_per_node, held.id
    # Inside the block: out at its start at the earliest, in more than 30 minutes before its
    # end (EC2 then terminates what is left in it).
    window = replace(window, start=max(window.start, held.start),
                     end=min(window.end, held.end - SCALE_IN_LEAD))
    tags = naming.aws_tags(cfg, pool)
    try:
        bw = ops.open_block_window(group, window, block, held.zone, tags)
    except OperationFailed as e:
        raise OperationFailed(
            f"{pool.name}: Capacity Block {block} {bought} (Capacity Blocks cannot be "
            f"cancelled), but the window's group was not made: {e}; run the same command "
            "again to finish with it (it is found by its tags, not bought again)") from None
    assert window.start is not None
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="scheduled", kept_min_nodes=base,
        windows=(*rows, *_block_rows([bw], base, rpn, now)), window=window.id,
        quota=quota, offerings=offerings, bought=block, on_demand_usd=on_demand,
        message=(f"{pool.name}: Capacity Block {block} {bought} ({held.count} x "
                 f"{held.instance_type} in {held.zone}, "
                 f"{held.start.isoformat(timespec='minutes')} to "
                 f"{held.end.isoformat(timespec='minutes')}); window {window.id}: {n} node(s) "
                 f"({n * rpn} replicas) in service in it from "
                 f"{window.start.isoformat(timespec='seconds')} to "
                 f"{window.end.isoformat(timespec='seconds')} (at the latest 35 min before "
                 f"the block ends), run by group {bw.group}; the pool's group and its "
                 f"minimum of {base} stay as they are, nothing to undo afterwards"))


def _calendar_window(cfg: Config, pool: Pool, cloud: Cloud, ops: ReservesCalendarCapacity,
                     group: Group, plan: PoolPlan, window: Window, live: list[Window],
                     base: int, quota: tuple[dict[str, Any], ...], on_demand: float,
                     yes: bool, now: datetime) -> WindowsResult:
    """`--reserve` where the cloud takes requests for future capacity (GCP calendar mode):
    its advice for the window; with `yes` the request for the first, then the window's
    schedule, whose nodes consume the reservation it brings."""
    assert window.start is not None and isinstance(ops, SchedulesWindows)
    placement = pool.placement(cloud)
    if placement is not None and placement.capacity.reservations != "any":
        key = f"{cloud}.capacity.reservations"
        raise UsageError(f"--reserve: {key} is {placement.capacity.reservations!r}: the "
                         "window's VMs consume a reservation made for it only with `any`; "
                         f"set {key}: any and deploy, or schedule without --reserve")
    rpn = plan.replicas_per_node
    if (dup := _duplicate(live, window)) is not None:
        return _exists(pool, cloud, base, _rows(live, base, rpn, now), dup,
                       "in service (its reservation requested)")
    offers = ops.calendar_offers(pool, window.nodes, window.start, window.end)
    if not offers:
        raise OperationFailed(
            f"{pool.name}: {cloud} advises no calendar-mode reservation of {window.nodes} x "
            f"{plan.instance_type} covering the window "
            f"({window.start.isoformat(timespec='minutes')} to "
            f"{window.end.isoformat(timespec='minutes')}); nothing was requested or scheduled")
    best = offers[0]
    price = (f"billed by {cloud} while it runs, at calendar-mode prices (the window's "
             f"{window.nodes} node(s) On-Demand: ${on_demand:,.2f})")
    if not yes:
        return WindowsResult(
            pool=pool.name, cloud=cloud, action="offered", kept_min_nodes=base,
            windows=_rows(live, base, rpn, now), quota=quota, offerings=tuple(offers),
            on_demand_usd=on_demand,
            message=(f"{pool.name}: {cloud} can hold {best.count} x {best.instance_type} in "
                     f"{best.zone} from {best.start.isoformat(timespec='minutes')} to "
                     f"{best.end.isoformat(timespec='minutes')}, {price}; nothing requested "
                     "or scheduled: add --yes to submit the request (it cannot be cancelled "
                     "once submitted) and schedule the window"))
    step = Purchase(at=now_iso(), by=buyer(), state="buying", project=cfg.project,
                    pool=pool.name, cloud=str(cloud), region=plan.region,
                    kind="future-reservation", window=window.id, offering=best.id,
                    nodes=best.count, start=best.start.isoformat(timespec="minutes"),
                    end=best.end.isoformat(timespec="minutes"), upfront_usd=0.0)
    record(step)
    try:
        name, state = ops.reserve_calendar(pool, best, window.id)
    except OperationFailed as e:
        record(replace(step, at=now_iso(), state="failed", error=str(e)[:500]))
        raise
    record(replace(step, at=now_iso(), state="bought", reservation=name))
    windows = [*live, window]
    _converge(lambda: current(Kind.RUNNING, ops, group, now),
              lambda ws, gone: ops.write_windows(group, ws, base, removed=gone),
              windows, [])
    return WindowsResult(
        pool=pool.name, cloud=cloud, action="scheduled", kept_min_nodes=base,
        windows=_rows(windows, base, rpn, now), window=window.id, quota=quota,
        offerings=(best,), bought=name, on_demand_usd=on_demand,
        message=(f"{pool.name}: submitted future reservation {name} ({best.count} x "
                 f"{best.instance_type} in {best.zone}, "
                 f"{best.start.isoformat(timespec='minutes')} to "
                 f"{best.end.isoformat(timespec='minutes')}, {price}): {state or 'submitted'}"
                 f" (Google reviews the request); scheduled window {window.id}: minimum "
                 f"{base} -> {base + window.nodes} node(s) from "
                 f"{window.start.isoformat(timespec='seconds')} to "
                 f"{window.end.isoformat(timespec='seconds')}; its VMs consume the "
                 "reservation once it exists, and run On-Demand if it was declined"))


def cancel_window(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, window_id: str,
                  now: datetime) -> WindowsResult:
    sched = _scheduler(ops, cloud)
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    live, base, ended = current(Kind.RUNNING, sched, group, now)
    for bw in _block_windows(cfg, pool, ops):
        if bw.window.id == window_id:
            assert isinstance(ops, RunsBlockWindows)  # it listed the window
            ops.close_block_window(group, bw)
            return WindowsResult(
                pool=pool.name, cloud=cloud, action="cancelled", kept_min_nodes=base,
                windows=_rows(live, base, plan.replicas_per_node, now), window=window_id,
                message=(f"{pool.name}: cancelled window {window_id}: deleted its group "
                         f"{bw.group} ({bw.in_service} node(s) in service); Capacity Block "
                         f"{bw.block} stays bought (Capacity Blocks cannot be cancelled)"))
    warm, warm_base, warm_ended = current(Kind.WARM, ops, group, now)
    if any(w.id == window_id for w in warm):
        assert isinstance(ops, SchedulesWarmWindows)  # it listed the window
        rest = [w for w in warm if w.id != window_id]
        gone = [w for w in warm if w.id == window_id]
        ops.write_warm_windows(group, rest, warm_base, removed=gone + warm_ended,
                               kept_min=base, running=pool.warm_pool.state == "running")
        return WindowsResult(
            pool=pool.name, cloud=cloud, action="cancelled", kept_min_nodes=base,
            windows=_rows(rest, warm_base, plan.replicas_per_node, now, Kind.WARM),
            window=window_id,
            message=f"{pool.name}: cancelled window {window_id}" + (
                f"; it had begun: the warm pool returns to {warm_base} node(s) now"
                if gone[0].active(now) else ""))
    gone = [w for w in live if w.id == window_id]
    if not gone:
        known = ", ".join(w.id for w in [*live, *warm]) or "none"
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


def destroy_before_apply(cfg: Config, targets: list[Target], endpoints: CloudEndpoints
                         ) -> Callable[[Terraform], bool] | None:
    """`destroy`'s step before Terraform's: the pools' window groups (Capacity Block
    windows) are poolctl's, not Terraform's, and use the pool's subnets, security group and
    target groups, so they go first."""
    runners = {naming.stack_name(cfg, t.pool, t.cloud): (t, get_ops(t.cloud, endpoints))
               for t in targets if RunsBlockWindows in driver(t.cloud).capabilities}
    if not runners:
        return None

    def before_apply(tf: Terraform) -> bool:
        if tf.label not in runners:
            return False
        t, ops = runners[tf.label]
        assert isinstance(ops, RunsBlockWindows)  # picked above
        try:
            group = ops.find_group(cfg, t.pool)
        except OperationFailed:
            return False  # no pool group left: nothing of the windows either
        for bw in ops.block_windows(cfg, t.pool):
            ops.close_block_window(group, bw)
            log(f"window {bw.window.id}: deleted its group {bw.group} (Capacity Block "
                f"{bw.block} stays bought)")
        return False

    return before_apply
