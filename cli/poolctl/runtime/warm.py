"""Warm capacity (`poolctl warm`): sizes in whole nodes, the record `deploy` keeps them from,
and the wait for the nodes to be ready.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    Group,
    KeepsWarmSizes,
    QuotaLine,
    SchedulesWindows,
    failures_line,
)
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.home import poolctl_home, write_private
from poolctl.progress import Progress, log
from poolctl.runtime.common import poll_interval, stalled_launches
from poolctl.runtime.quota import quota_check, quota_for_nodes, shortfall_line
from poolctl.runtime.windows import (
    Kind,
    open_raise,
    rebase,
)
from poolctl.sizing import (
    HeldCapacity,
    PoolPlan,
    capacity_block,
    held_capacity,
    nodes_for,
    plan_pool,
    reserved_nodes,
)

# ---------------------------------------------------------------------------------------
# Warm


@dataclass(frozen=True)
class GroupSizes:
    """A group's sizes in nodes, before or after `warm` changes them."""

    min_nodes: int
    warm_nodes: int
    desired_nodes: int


@dataclass(frozen=True)
class WarmRecord:
    """What `warm` recorded: the sizes it is in charge of, and what set them when."""

    min_nodes: int | None
    warm_nodes: int | None
    command: str = "poolctl warm"
    at: str = "?"

    @classmethod
    def from_json(cls, data: object) -> WarmRecord | None:
        """A record as any poolctl wrote it (a field it did not write: None), or None."""
        if not isinstance(data, dict):
            return None

        def size(key: str) -> int | None:
            v = data.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        return cls(min_nodes=size("min_nodes"), warm_nodes=size("warm_nodes"),
                   command=str(data.get("command", "poolctl warm")), at=str(data.get("at", "?")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NodeWait:
    id: str
    seconds: float  # from the node's first sight to ready


@dataclass(frozen=True)
class WarmWait:
    """What `warm --wait` saw: nodes ready of the target, the wait's seconds, and each node
    that became ready while it watched."""

    ready: int
    target: int
    seconds: float
    nodes: tuple[NodeWait, ...]


@dataclass
class WarmResult:
    pool: str
    cloud: Cloud
    mode: str  # warm | running | reset
    replicas_requested: int | None
    replicas_per_node: int
    nodes: int
    replicas: int
    rounded_up: bool
    before: GroupSizes
    after: GroupSizes
    changed: bool
    message: str
    rounding: str = ""  # how replicas became whole nodes, when they did not divide evenly
    quota: list[QuotaLine] = field(default_factory=list)
    wait: WarmWait | None = None
    # The spare capacity `warm` manages (warm nodes; with --running, nodes above the file's
    # minimum): {"before"|"after": {"nodes": N, "replicas": R}}.
    spare: dict[str, dict[str, int]] = field(default_factory=dict)
    # After the change: capacity held vs hoped for (stopped warm nodes without reserved room).
    capacity: HeldCapacity | None = None
    capacity_line: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["quota"] = [ln.to_json() for ln in self.quota]
        return d


def _sizes(g: Group) -> GroupSizes:
    return GroupSizes(min_nodes=g.min_nodes, warm_nodes=g.warm_min_nodes,
                      desired_nodes=g.desired_nodes)


def running_nodes(min_nodes: int, desired: int, warm_nodes: int, warm_running: bool) -> int:
    return max(min_nodes, desired) + (warm_nodes if warm_running else 0)


def warm_targets(plan: PoolPlan, group: Group, replicas: int | None, running: bool,
                 reset: bool, exact: bool = False) -> tuple[int, int, int | None, int]:
    """(min nodes, warm nodes, desired nodes or None, nodes asked for) after the change.

    At least the nodes asked for: spare capacity before a launch never shrinks by surprise,
    only with `exact` (or `reset`)."""
    if reset:
        # Give back exactly what `warm --running` added above the file's minimum.
        new_min = plan.nodes.min
        desired = max(new_min, group.desired_nodes - max(0, group.min_nodes - new_min))
        return new_min, plan.nodes.warm, desired, 0
    if replicas is None or replicas < 0:
        raise UsageError("--replicas: give the number of replicas to prepare (0 or more), "
                         "or --reset")
    n = nodes_for(replicas, plan.replicas_per_node)
    if running:
        new_min = plan.nodes.min + n
        if new_min > group.max_nodes:
            room = (group.max_nodes - plan.nodes.min) * plan.replicas_per_node
            raise UsageError(
                f"--replicas {replicas}: {n} node(s) above the minimum of {plan.nodes.min} "
                f"exceeds the group's maximum of {group.max_nodes} nodes; ask for at most "
                f"{room} replicas, or raise scaling.max_replicas and deploy")
        return (new_min if exact else max(new_min, group.min_nodes)), group.warm_min_nodes, \
            None, n
    return group.min_nodes, (n if exact else max(n, group.warm_min_nodes)), None, n


def warm(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, replicas: int | None,
         running: bool = False, reset: bool = False, exact: bool = False) -> WarmResult:
    """Prepare spare capacity: the warm pool's minimum := at least N nodes (default), or the
    group's minimum := at least the file's minimum + N nodes (`running`: in service now);
    `exact` lowers too; `reset` returns to the file's sizes. Absolute: repeating a call
    changes nothing and says so. The sizes it sets are recorded (`warm_record_path`) so that
    `deploy` keeps them until `--reset`."""
    if reset and (running or replicas is not None or exact):
        raise UsageError("--reset: give it alone (it returns to the file's sizes), "
                         "without --replicas, --running or --exact")
    placement = pool.placement(cloud)
    if not running and not reset and placement is not None and placement.fallback_types:
        # PutWarmPool refuses a group with a mixed instances policy (docs/cloud-facts.md);
        # on GCP poolctl keeps no standby pool beside instance flexibility (rule
        # fallback-warm-pool).
        key = ("aws.fallback_instance_types" if cloud == Cloud.aws
               else "gcp.fallback_machine_types")
        raise UsageError(
            f"--replicas without --running: pool {pool.name!r} grows on fallback types "
            f"({key}), so it keeps no warm pool; use --running (spare nodes in service)")
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    rpn = plan.replicas_per_node
    now = datetime.now(UTC)
    # `warm` sets the minimum kept outside the launch windows; an open window's raise stays
    # on top of it until the window's end returns the minimum to what `warm` set.
    windows, open_nodes, _ = open_raise(Kind.RUNNING, ops, group, now)
    # The same for the warm pool and an open window of warm nodes.
    warm_windows, open_warm, _ = (open_raise(Kind.WARM, ops, group, now) if plan.nodes.warm
                                  else ([], 0, group.warm_min_nodes))
    outside = replace(group, min_nodes=group.min_nodes - open_nodes,
                      warm_min_nodes=group.warm_min_nodes - open_warm)
    new_min, new_warm, new_desired, n = warm_targets(plan, outside, replicas, running, reset,
                                                     exact)
    set_min = new_min + open_nodes
    set_warm = new_warm + open_warm
    if new_desired is not None:
        new_desired = max(new_desired, set_min)
    mode = "reset" if reset else "running" if running else "warm"
    warm_running = pool.warm_pool.state == "running"
    before = _sizes(group)
    after_desired = new_desired if new_desired is not None else max(group.desired_nodes,
                                                                     set_min)
    after = GroupSizes(min_nodes=set_min, warm_nodes=set_warm, desired_nodes=after_desired)
    changed = (set_min, set_warm) != (group.min_nodes, group.warm_min_nodes) or (
        after_desired != group.desired_nodes)
    rounded = replicas is not None and n * rpn != replicas
    result = WarmResult(
        pool=pool.name, cloud=cloud, mode=mode, replicas_requested=replicas,
        replicas_per_node=rpn, nodes=n, replicas=n * rpn, rounded_up=rounded,
        before=before, after=after, changed=changed, message="",
    )
    spare_mode = "running" if running else "warm"
    result.spare = {
        k: {"nodes": nodes, "replicas": nodes * rpn} for k, nodes in (
            ("before", _spare(spare_mode, plan, outside.min_nodes, outside.warm_min_nodes)),
            ("after", _spare(spare_mode, plan, new_min, new_warm)))}
    if rounded:
        result.rounding = (f"{replicas} replicas rounded up to {n} whole node(s) of {rpn} "
                           f"replicas = {n * rpn} replicas")
        log(f"{pool.name}: {result.rounding}")

    # Quota: what runs at once after the change; new warm nodes run while they launch.
    now_running = running_nodes(group.min_nodes, group.desired_nodes, group.warm_min_nodes,
                                warm_running)
    launching = 0 if warm_running else max(0, set_warm - group.warm_min_nodes)
    then_running = running_nodes(set_min, after_desired, set_warm, warm_running) + launching
    if then_running > now_running:
        lines = quota_for_nodes(cfg, pool, cloud, ops, plan, then_running, "running at once",
                                "nothing was changed")
        result.quota = list(lines)

    label = {"warm": f"warm pool minimum {new_warm} node(s)",
             "running": f"group minimum {new_min} node(s) ({plan.nodes.min} + "
                        f"{new_min - plan.nodes.min})",
             "reset": f"the file's sizes: minimum {new_min}, warm {new_warm} node(s)"}[mode]
    if open_nodes and mode != "warm":
        label += f" (+{open_nodes} of the open launch window until its end)"
    if open_warm and mode != "running":
        label += f" (+{open_warm} warm of the open launch window until its end)"
    kept = ""
    if mode != "reset" and n * rpn < _spare(mode, plan, new_min, new_warm) * rpn:
        kept = (f" ({n * rpn} replicas asked for; {_spare(mode, plan, new_min, new_warm) * rpn} "
                "kept: warm never lowers spare capacity, --exact or --reset does)")
    if mode == "reset":  # from now on `deploy` applies the file's sizes
        warm_record_path(cfg, pool, cloud).unlink(missing_ok=True)
    result.capacity = held_capacity(
        running_nodes(set_min, after_desired, set_warm, warm_running),
        0 if warm_running else set_warm, reserved_nodes(pool, cloud),
        capacity_block(pool, cloud))
    if result.capacity.hoped_nodes and mode != "reset":
        # Said where it matters: stopped warm nodes a launch may not get back.
        result.capacity_line = (f"{pool.name}: capacity: {result.capacity.words()}; "
                                "`--running` holds it")
    if not changed:
        result.message = f"{pool.name}: already at {label}{kept}; nothing changed"
        if mode != "reset" and not load_warm_record(cfg, pool, cloud):
            _save_warm_record(cfg, pool, cloud, new_min, new_warm, replicas, running)
        return result
    ops.set_capacity(group, min_nodes=set_min, warm_nodes=set_warm, warm_running=warm_running,
                     desired_nodes=new_desired)
    if mode != "reset":
        _save_warm_record(cfg, pool, cloud, new_min, new_warm, replicas, running)
    changes = [f"{what} {getattr(before, k)} -> {getattr(after, k)} node(s) "
               f"({getattr(before, k) * rpn} -> {getattr(after, k) * rpn} replicas)"
               for what, k in (("warm", "warm_nodes"), ("minimum", "min_nodes"),
                               ("desired", "desired_nodes"))
               if getattr(before, k) != getattr(after, k)]
    result.message = f"{pool.name}: set {label}{kept}: " + ", ".join(changes)
    if windows and (line := rebase(Kind.RUNNING, cfg, pool, ops, new_min, now,
                                       kept_min=new_min)):
        result.message += f"; {line.split(': ', 1)[1]}"
    if warm_windows and (line := rebase(Kind.WARM, cfg, pool, ops, new_warm, now,
                                            kept_min=new_min)):
        result.message += f"; {line.split(': ', 1)[1]}"
    return result


def _spare(mode: str, plan: PoolPlan, min_nodes: int, warm_nodes: int) -> int:
    """Spare nodes `warm` manages in `mode`: warm nodes, or nodes above the file's minimum."""
    return warm_nodes if mode == "warm" else min_nodes - plan.nodes.min


# Sizes set by `warm`: $POOLCTL_HOME/warm/<stack>.json. The record says that `warm` is in
# charge of the group's minimum and warm sizes (and since when); their values are read from
# the live group. Not a tag on the group: Terraform owns its tags (the next apply would strip
# one), and the live sizes alone cannot tell a `warm` from an edit of the file.


def warm_record_path(cfg: Config, pool: Pool, cloud: Cloud) -> Path:

    return poolctl_home() / "warm" / f"{naming.stack_name(cfg, pool, cloud)}.json"


def load_warm_record(cfg: Config, pool: Pool, cloud: Cloud) -> WarmRecord | None:
    try:
        data = json.loads(warm_record_path(cfg, pool, cloud).read_text())
    except (OSError, ValueError):
        return None
    return WarmRecord.from_json(data)


def _save_warm_record(cfg: Config, pool: Pool, cloud: Cloud, min_nodes: int,
                      warm_nodes: int, replicas: int | None, running: bool) -> None:

    rec = WarmRecord(min_nodes=min_nodes, warm_nodes=warm_nodes,
                     command=f"poolctl warm --replicas {replicas}"
                     + (" --running" if running else ""),
                     at=datetime.now(UTC).isoformat(timespec="seconds"))
    write_private(warm_record_path(cfg, pool, cloud), json.dumps(rec.to_json(), indent=2) + "\n")


def deploy_keeps(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                 plan: PoolPlan | None = None) -> tuple[dict[str, str], list[str]]:
    """What a `deploy` passes to keep the sizes `warm` set (TF_VAR_...), and the summary
    lines saying so; nothing when `warm` set none (or `warm --reset` ran since). `plan`:
    the pool's, when the caller has it (the deploy workflow computes it once)."""
    plan = plan or plan_pool(pool, cloud)
    rec = load_warm_record(cfg, pool, cloud)
    try:
        group = ops.find_group(cfg, pool) if rec is not None or isinstance(
            ops, SchedulesWindows) else None
    except OperationFailed:
        return {}, []  # not deployed (any more): the file's sizes
    if group is None:
        return {}, []
    if rec is None:
        # No `warm`, but a window that has begun holds the group's minimum (or its warm
        # pool): keep it (its `until` returns the size kept before it).
        assert isinstance(ops, SchedulesWindows)  # else no group was looked up
        now = datetime.now(UTC)
        begun = [w for w in ops.scheduled_windows(group)[0] if w.active(now)]
        if not begun and plan.nodes.warm:
            begun = [w for w in open_raise(Kind.WARM, ops, group, now)[0] if w.active(now)]
        if not begun:
            return {}, []
        end = max(w.end for w in begun).isoformat(timespec="seconds")
        since = (f"held by launch window {', '.join(w.id for w in begun)} until {end}, "
                 "whose end returns to the file's")
    else:
        since = (f"set by `{rec.command}` at {rec.at}; "
                 f"`poolctl warm --reset` returns to the file's")
    env = (ops.kept_sizes_env(group, plan) if isinstance(ops, KeepsWarmSizes)
           else ops.rollout_apply_env(group, plan, no_surge=False))
    lines = [f"{pool.name}: keeps {what} {live} (the file says {file}; {since} {file})"
             for what, live, file in (("minimum nodes", group.min_nodes, plan.nodes.min),
                                      ("warm nodes", group.warm_min_nodes, plan.nodes.warm))
             if live != file]
    return (env, lines) if lines else ({}, [])


def deploy_windows(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                   plan: PoolPlan | None = None) -> str | None:
    """After `deploy`'s apply: launch windows scheduled over an earlier minimum rise over
    the one the deploy left (the file's, or the one `warm` keeps), so that their ends return
    to it; the line saying so, or None."""
    rec = load_warm_record(cfg, pool, cloud)
    plan = plan or plan_pool(pool, cloud)
    base = rec.min_nodes if rec and rec.min_nodes is not None else plan.nodes.min
    warm = rec.warm_nodes if rec and rec.warm_nodes is not None else plan.nodes.warm
    now = datetime.now(UTC)
    try:
        lines = [rebase(Kind.RUNNING, cfg, pool, ops, base, now, kept_min=base),
                 rebase(Kind.WARM, cfg, pool, ops, warm, now, kept_min=base) if plan.nodes.warm
                 else None]
    except OperationFailed:
        return None  # nothing deployed to look at (a plan-only run, a refused apply)
    said = [ln for ln in lines if ln]
    return "; ".join([said[0], *(ln.split(": ", 1)[1] for ln in said[1:])]) if said else None


def deploy_launches(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps,
                    since_wall: float) -> str | None:
    """After `deploy`'s apply: the one line naming launches the group failed since the
    deploy began, with nothing in flight (the apply does not wait for nodes, so this is
    its one look); None when there are none."""
    try:
        group = ops.find_group(cfg, pool)
    except OperationFailed:
        return None  # nothing deployed to look at (a plan-only run, a refused apply)
    failed = stalled_launches(ops, group, pool, cloud, since_wall)
    if not failed:
        return None
    return (f"{pool.name}/{cloud}: launches failing: {failures_line(failed)}; the group "
            "retries when capacity returns: free or reserve capacity (`poolctl capacity "
            "check`), or try later; watch with `poolctl status`")


def deploy_quota(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps) -> list[str]:
    """One line per quota the pool's peak needs fall short of, before `deploy` applies."""
    return [shortfall_line(ln) for ln in quota_check(cfg, pool, cloud, ops) if ln.shortfall > 0]


def wait_warm(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps, result: WarmResult,
              timeout: float, hint: str, sleep: Callable[[float], None] = time.sleep
              ) -> WarmWait:
    """Poll until the nodes `warm` asked for are ready: warm mode, that many settled warm
    nodes (AWS: Warmed:Stopped / Warmed:Running, launch hook completed); running mode, the
    group's minimum in service. One progress line per change, seconds per node."""
    group = ops.find_group(cfg, pool)
    if result.mode == "running":
        phase, target = "in_service", result.after.min_nodes
    else:
        phase, target = "warm", result.after.warm_nodes
    t0 = time.monotonic()
    # `warm` launched just before the wait began; its failures count from a little earlier.
    wall0 = time.time() - 30
    first_seen: dict[str, float] = {}
    ready: dict[str, float] = {}
    already: set[str] | None = None
    last = None
    interval = poll_interval(ops.endpoints)
    progress = Progress().start()  # a live line on a terminal, else one line per change
    try:
        while True:
            now = time.monotonic()
            nodes = ops.nodes(group)
            for n in nodes:
                first_seen.setdefault(n.id, now)
            done_ids = [n.id for n in nodes if n.phase == phase]
            if already is None:
                already = set(done_ids)  # ready before the wait: no time to report
            for i in done_ids:
                if i not in ready and i not in already:
                    ready[i] = round(now - first_seen[i], 1)
                    progress.note(f"{pool.name}: {i} {phase.replace('_', ' ')} after "
                                  f"{ready[i]:g} s")
            pending = sum(1 for n in nodes if n.phase == "pending")
            line = (len(done_ids), pending)
            if line != last:
                progress.update(f"{pool.name}: {len(done_ids)}/{target} "
                                f"{phase.replace('_', ' ')}, {pending} pending")
                last = line
            if len(done_ids) >= target:
                return WarmWait(ready=len(done_ids), target=target,
                                seconds=round(now - t0, 1),
                                nodes=tuple(NodeWait(i, s) for i, s in ready.items()))
            # Launches that failed since the wait began, none working after them, nothing
            # still in flight: the group will not grow by waiting (AWS retries, but only
            # when capacity returns); say why now rather than at the timeout.
            if failed := stalled_launches(ops, group, pool, cloud, wall0, nodes):
                raise OperationFailed(
                    f"{pool.name}: {failures_line(failed)}; {len(done_ids)} of {target} "
                    f"node(s) {phase.replace('_', ' ')}; the group retries when capacity "
                    "returns: free or reserve capacity (`poolctl capacity check`), or "
                    f"try later; watch with `{hint}`")
            if now - t0 >= timeout:
                raise OperationFailed(
                    f"{pool.name}: --timeout {timeout:g} s: {len(done_ids)} of {target} node(s) "
                    f"{phase.replace('_', ' ')}; the cloud keeps preparing them; "
                    f"watch with `{hint}`")
            sleep(interval)
    except KeyboardInterrupt:
        progress.stop()
        log(f"{pool.name}: interrupted; the warm operation keeps running in {cloud}; "
            f"watch it with `{hint}`")
        raise
    finally:
        progress.stop()
