"""Runtime operations on a deployed pool, cloud-neutral: quota, warm, status, rollout.

What differs per cloud sits behind `poolctl.clouds.base.CloudOps`; this module never imports
a cloud SDK (`get_ops` loads the cloud's module lazily). Every operation returns a record
whose `to_json()` is what the command prints with `--json`; progress goes to stderr.

Arithmetic in one place:
- replicas become whole nodes, rounded UP (`nodes_for`), and the result says so;
- quota "needed" is what can run at once: nodes in service + running warm nodes (+ surge in a
  rollout, + warm nodes while they launch); stopped warm nodes do not count;
- an increase asks for `granted + shortfall`: enough for `needed` beside what others use.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poolctl import naming
from poolctl.clouds.base import (
    CloudOps,
    Group,
    NodeState,
    PoolStatus,
    QuotaLine,
    QuotaRequest,
    RolloutState,
)
from poolctl.config import Config, Pool, parse_config
from poolctl.errors import NotConfirmed, OperationFailed, UsageError
from poolctl.progress import Progress, log
from poolctl.sizing import PoolPlan, nodes_for, plan_pool, quota_key
from poolctl.terraform import forget_dead_synth_kernel

if TYPE_CHECKING:
    import yaml

# Seconds between polls while waiting; the sandbox's clock moves per call, so tests set it low.
POLL_ENV = "POOLCTL_POLL_S"
DEFAULT_POLL_S = 15.0
# The sandbox's nodes boot in seconds (plan / its boot speedup) and a rollout moves one step
# per look: a wait against it polls each second.
SANDBOX_POLL_S = 1.0
ROLLOUT_DONE_OK = {"Successful"}


def poll_interval(sandbox: bool = False) -> float:
    raw = os.environ.get(POLL_ENV)
    if not raw:
        return SANDBOX_POLL_S if sandbox else DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{POLL_ENV}={raw}: not a number of seconds; unset it or give e.g. 15"
                         ) from None
    return max(0.0, value)


def get_ops(cloud: str, sandbox: bool, *, contact_email: str | None = None) -> CloudOps:
    """The cloud's CloudOps; its SDK loads only here. `contact_email`: Cloud Quotas (GCP)
    requires one on increase requests; AWS Service Quotas takes none."""
    if cloud == "aws":
        from poolctl.clouds import aws

        return aws.make_ops(sandbox=sandbox)
    if cloud == "gcp":
        if sandbox:
            raise UsageError("--sandbox: the sandbox emulates AWS only; use --cloud aws")
        from poolctl.clouds import gcp

        return gcp.make_ops(sandbox=sandbox, contact_email=contact_email)
    raise UsageError(f"--cloud {cloud}: unknown cloud; use aws or gcp")


def watch_hint(cloud: str, file: str | os.PathLike | None, pool: Pool, sandbox: bool,
               what: str = "status") -> str:
    parts = ["poolctl", *what.split(), "--cloud", cloud]
    if file:
        parts += ["-f", str(file)]
    parts += ["--pool", pool.name]
    if sandbox:
        parts.append("--sandbox")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------
# Quota


def scaled_needs(plan: PoolPlan, nodes: int) -> list[dict]:
    """The plan's quota needs for `nodes` nodes running at once instead of its peak."""
    peak = plan.nodes["max"] + plan.nodes["surge"] + (
        plan.nodes["warm"] if plan.warm_state == "running" else 0)
    out = []
    for q in plan.quotas:
        per_node = q["needed"] / peak if peak else 0
        out.append({**q, "needed": int(round(per_node * nodes))})
    return out


def shared_quota_lines(cfg: Config, pool: Pool, cloud: str, ops: CloudOps,
                       needs: list[dict]) -> list[QuotaLine]:
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


def quota_check(cfg: Config, pool: Pool, cloud: str, ops: CloudOps) -> list[QuotaLine]:
    """The peak needs (max nodes + surge + running warm nodes) of the pool and of every pool
    sharing its quotas against those quotas."""
    return shared_quota_lines(cfg, pool, cloud, ops, plan_pool(pool, cloud).quotas)


def shortfall_line(line: QuotaLine) -> str:
    others = line.in_use - line.pool_in_use
    granted = "unknown" if line.granted is None else f"{line.granted:g}"
    needs = f"needs {line.needed:g}"
    if len(line.needed_by_pool) > 1:
        needs += " for the pools sharing it, " + " + ".join(
            f"{p} {n:g}" for p, n in line.needed_by_pool.items()) + ","
    return (f"quota {line.name} in {line.scope}: short by {line.shortfall:g} {line.unit} "
            f"({needs} beside {others:g} in use by others, granted {granted})")


def quota_request(cfg: Config, pool: Pool, cloud: str, ops: CloudOps,
                  lines: list[QuotaLine] | None = None) -> list[QuotaRequest]:
    """File an increase to `granted + shortfall` for each short quota; an increase already
    open is returned (already_open=True), never filed twice."""
    if "quota_request" in ops.unsupported:
        raise OperationFailed(f"quota request: {cloud} offers no API to request increases here; "
                              "ask in the cloud console")
    lines = quota_check(cfg, pool, cloud, ops) if lines is None else lines
    out = []
    for line in lines:
        if line.shortfall <= 0 or line.granted is None:
            continue
        out.append(ops.request_quota(line, line.granted + line.shortfall))
    return out


# ---------------------------------------------------------------------------------------
# Warm


@dataclass
class WarmResult:
    pool: str
    cloud: str
    mode: str  # warm | running | reset
    replicas_requested: int | None
    replicas_per_node: int
    nodes: int
    replicas: int
    rounded_up: bool
    before: dict[str, int]
    after: dict[str, int]
    changed: bool
    message: str
    rounding: str = ""  # how replicas became whole nodes, when they did not divide evenly
    quota: list[dict] = field(default_factory=list)
    wait: dict[str, Any] | None = None
    # The spare capacity `warm` manages (warm nodes; with --running, nodes above the file's
    # minimum): {"before"|"after": {"nodes": N, "replicas": R}}.
    spare: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def _sizes(g: Group) -> dict[str, int]:
    return {"min_nodes": g.min_nodes, "warm_nodes": g.warm_min_nodes,
            "desired_nodes": g.desired_nodes}


def running_nodes(min_nodes: int, desired: int, warm_nodes: int, warm_running: bool) -> int:
    return max(min_nodes, desired) + (warm_nodes if warm_running else 0)


def warm_targets(plan: PoolPlan, group: Group, replicas: int | None, running: bool,
                 reset: bool, exact: bool = False) -> tuple[int, int, int | None, int]:
    """(min nodes, warm nodes, desired nodes or None, nodes asked for) after the change.

    At least the nodes asked for: spare capacity before a launch never shrinks by surprise,
    only with `exact` (or `reset`)."""
    if reset:
        # Give back exactly what `warm --running` added above the file's minimum.
        new_min = plan.nodes["min"]
        desired = max(new_min, group.desired_nodes - max(0, group.min_nodes - new_min))
        return new_min, plan.nodes["warm"], desired, 0
    if replicas is None or replicas < 0:
        raise UsageError("--replicas: give the number of replicas to prepare (0 or more), "
                         "or --reset")
    n = nodes_for(replicas, plan.replicas_per_node)
    if running:
        new_min = plan.nodes["min"] + n
        if new_min > group.max_nodes:
            room = (group.max_nodes - plan.nodes["min"]) * plan.replicas_per_node
            raise UsageError(
                f"--replicas {replicas}: {n} node(s) above the minimum of {plan.nodes['min']} "
                f"exceeds the group's maximum of {group.max_nodes} nodes; ask for at most "
                f"{room} replicas, or raise scaling.max_replicas and deploy")
        return (new_min if exact else max(new_min, group.min_nodes)), group.warm_min_nodes, \
            None, n
    return group.min_nodes, (n if exact else max(n, group.warm_min_nodes)), None, n


def warm(cfg: Config, pool: Pool, cloud: str, ops: CloudOps, replicas: int | None,
         running: bool = False, reset: bool = False, exact: bool = False) -> WarmResult:
    """Prepare spare capacity: the warm pool's minimum := at least N nodes (default), or the
    group's minimum := at least the file's minimum + N nodes (`running`: in service now);
    `exact` lowers too; `reset` returns to the file's sizes. Absolute: repeating a call
    changes nothing and says so. The sizes it sets are recorded (`warm_record_path`) so that
    `deploy` keeps them until `--reset`."""
    if reset and (running or replicas is not None or exact):
        raise UsageError("--reset: give it alone (it returns to the file's sizes), "
                         "without --replicas, --running or --exact")
    if pool.warm_pool.state == "hibernated" and "warm_hibernated" in ops.unsupported:
        raise UsageError(f"pools.{pool.name}.warm_pool.state: hibernated is not supported for "
                         f"{cloud} GPU nodes; use stopped or running")
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    rpn = plan.replicas_per_node
    new_min, new_warm, new_desired, n = warm_targets(plan, group, replicas, running, reset,
                                                     exact)
    mode = "reset" if reset else "running" if running else "warm"
    warm_running = pool.warm_pool.state == "running"
    before = _sizes(group)
    after_desired = new_desired if new_desired is not None else max(group.desired_nodes,
                                                                     new_min)
    after = {"min_nodes": new_min, "warm_nodes": new_warm, "desired_nodes": after_desired}
    changed = (new_min, new_warm) != (group.min_nodes, group.warm_min_nodes) or (
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
            ("before", _spare(spare_mode, plan, group.min_nodes, group.warm_min_nodes)),
            ("after", _spare(spare_mode, plan, new_min, new_warm)))}
    if rounded:
        result.rounding = (f"{replicas} replicas rounded up to {n} whole node(s) of {rpn} "
                           f"replicas = {n * rpn} replicas")
        log(f"{pool.name}: {result.rounding}")

    # Quota: what runs at once after the change; new warm nodes run while they launch.
    now_running = running_nodes(group.min_nodes, group.desired_nodes, group.warm_min_nodes,
                                warm_running)
    launching = 0 if warm_running else max(0, new_warm - group.warm_min_nodes)
    then_running = running_nodes(new_min, after_desired, new_warm, warm_running) + launching
    if then_running > now_running:
        lines = shared_quota_lines(cfg, pool, cloud, ops, scaled_needs(plan, then_running))
        result.quota = [ln.to_json() for ln in lines]
        short = [ln for ln in lines if ln.shortfall > 0]
        if short:
            raise OperationFailed(
                f"{pool.name}: not enough quota for {then_running} node(s) running at once; "
                + "; ".join(shortfall_line(ln) for ln in short)
                + f"; nothing was changed. File an increase with `poolctl quota request "
                  f"--cloud {cloud}`")

    label = {"warm": f"warm pool minimum {new_warm} node(s)",
             "running": f"group minimum {new_min} node(s) ({plan.nodes['min']} + "
                        f"{new_min - plan.nodes['min']})",
             "reset": f"the file's sizes: minimum {new_min}, warm {new_warm} node(s)"}[mode]
    kept = ""
    if mode != "reset" and n * rpn < _spare(mode, plan, new_min, new_warm) * rpn:
        kept = (f" ({n * rpn} replicas asked for; {_spare(mode, plan, new_min, new_warm) * rpn} "
                "kept: warm never lowers spare capacity, --exact or --reset does)")
    if mode == "reset":  # from now on `deploy` applies the file's sizes
        warm_record_path(cfg, pool, cloud).unlink(missing_ok=True)
    if not changed:
        result.message = f"{pool.name}: already at {label}{kept}; nothing changed"
        if mode != "reset" and not load_warm_record(cfg, pool, cloud):
            _save_warm_record(cfg, pool, cloud, new_min, new_warm, replicas, running)
        return result
    ops.set_capacity(group, min_nodes=new_min, warm_nodes=new_warm, warm_running=warm_running,
                     desired_nodes=new_desired)
    if mode != "reset":
        _save_warm_record(cfg, pool, cloud, new_min, new_warm, replicas, running)
    changes = [f"{what} {before[k]} -> {after[k]} node(s) ({before[k] * rpn} -> "
               f"{after[k] * rpn} replicas)"
               for what, k in (("warm", "warm_nodes"), ("minimum", "min_nodes"),
                               ("desired", "desired_nodes")) if before[k] != after[k]]
    result.message = f"{pool.name}: set {label}{kept}: " + ", ".join(changes)
    return result


def _spare(mode: str, plan: PoolPlan, min_nodes: int, warm_nodes: int) -> int:
    """Spare nodes `warm` manages in `mode`: warm nodes, or nodes above the file's minimum."""
    return warm_nodes if mode == "warm" else min_nodes - plan.nodes["min"]


# Sizes set by `warm`: $POOLCTL_HOME/warm/<stack>.json. The record says that `warm` is in
# charge of the group's minimum and warm sizes (and since when); their values are read from
# the live group. Not a tag on the group: Terraform owns its tags (the next apply would strip
# one), and the live sizes alone cannot tell a `warm` from an edit of the file.


def warm_record_path(cfg: Config, pool: Pool, cloud: str) -> Path:
    from poolctl.home import poolctl_home

    return poolctl_home() / "warm" / f"{naming.stack_name(cfg, pool, cloud)}.json"


def load_warm_record(cfg: Config, pool: Pool, cloud: str) -> dict | None:
    try:
        data = json.loads(warm_record_path(cfg, pool, cloud).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _save_warm_record(cfg: Config, pool: Pool, cloud: str, min_nodes: int, warm_nodes: int,
                      replicas: int | None, running: bool) -> None:
    from poolctl.home import write_private

    rec = {"min_nodes": min_nodes, "warm_nodes": warm_nodes,
           "command": f"poolctl warm --replicas {replicas}" + (" --running" if running else ""),
           "at": datetime.now(UTC).isoformat(timespec="seconds")}
    write_private(warm_record_path(cfg, pool, cloud), json.dumps(rec, indent=2) + "\n")


def deploy_keeps(cfg: Config, pool: Pool, cloud: str, ops: CloudOps
                 ) -> tuple[dict[str, str], list[str]]:
    """What a `deploy` passes to keep the sizes `warm` set (TF_VAR_...), and the summary
    lines saying so; nothing when `warm` set none (or `warm --reset` ran since)."""
    rec = load_warm_record(cfg, pool, cloud)
    if rec is None:
        return {}, []
    try:
        group = ops.find_group(cfg, pool)
    except OperationFailed:
        return {}, []  # not deployed (any more): the file's sizes
    plan = plan_pool(pool, cloud)
    keep = getattr(ops, "kept_sizes_env", None)
    env = keep(group, plan) if keep else ops.rollout_apply_env(group, plan, no_surge=False)
    since = (f"set by `{rec.get('command', 'poolctl warm')}` at {rec.get('at', '?')}; "
             f"`poolctl warm --reset` returns to the file's")
    lines = [f"{pool.name}: keeps {what} {live} (the file says {file}; {since} {file})"
             for what, live, file in (("minimum nodes", group.min_nodes, plan.nodes["min"]),
                                      ("warm nodes", group.warm_min_nodes, plan.nodes["warm"]))
             if live != file]
    return (env, lines) if lines else ({}, [])


def deploy_quota(cfg: Config, pool: Pool, cloud: str, ops: CloudOps) -> list[str]:
    """One line per quota the pool's peak needs fall short of, before `deploy` applies."""
    return [shortfall_line(ln) for ln in quota_check(cfg, pool, cloud, ops) if ln.shortfall > 0]


def wait_warm(cfg: Config, pool: Pool, cloud: str, ops: CloudOps, result: WarmResult,
              timeout: float, hint: str, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Poll until the nodes `warm` asked for are ready: warm mode, that many settled warm
    nodes (AWS: Warmed:Stopped / Warmed:Running, launch hook completed); running mode, the
    group's minimum in service. One progress line per change, seconds per node."""
    group = ops.find_group(cfg, pool)
    if result.mode == "running":
        phase, target = "in_service", result.after["min_nodes"]
    else:
        phase, target = "warm", result.after["warm_nodes"]
    t0 = time.monotonic()
    first_seen: dict[str, float] = {}
    ready: dict[str, float] = {}
    already: set[str] | None = None
    last = None
    interval = poll_interval(getattr(ops, "sandbox", False))
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
                return {"ready": len(done_ids), "target": target,
                        "seconds": round(now - t0, 1),
                        "nodes": [{"id": i, "seconds": s} for i, s in ready.items()]}
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


# ---------------------------------------------------------------------------------------
# Status


def status(cfg: Config, pool: Pool, cloud: str, ops: CloudOps) -> PoolStatus:
    plan = plan_pool(pool, cloud)
    group = ops.find_group(cfg, pool)
    nodes = ops.nodes(group)
    rollout = ops.rollout_state(group)
    return_surge(cfg, pool, cloud, ops, group, rollout)
    queue = None if "queue_metric" in ops.unsupported else ops.queue_per_replica(group)
    if rollout is not None:
        _annotate(rollout, load_record(cfg, pool, cloud))
    return PoolStatus(pool=pool.name, cloud=cloud, group=group,
                      replicas_per_node=plan.replicas_per_node, nodes=nodes, rollout=rollout,
                      queue_per_replica=queue)


# ---------------------------------------------------------------------------------------
# The config file, edited in place (one scalar line; comments and layout kept)


def _value_node(text: str, path: tuple) -> yaml.Node | None:
    import yaml

    from poolctl.config import _LineLoader

    try:
        node = yaml.compose(text, Loader=_LineLoader)
    except yaml.YAMLError:
        return None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    node = v
                    break
            else:
                return None
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return None
            node = node.value[part]
        else:
            return None
    return node


def _render_scalar(value: str, style: str | None) -> str:
    """`value` as a YAML scalar that reads back as the same string, in the old quote style
    where that style can carry it."""
    import yaml

    if style == "'" and "\n" not in value:
        return "'" + value.replace("'", "''") + "'"
    if style is None and value.strip() == value and value and "#" not in value:
        try:
            if yaml.safe_load(f"k: {value}\n") == {"k": value}:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar


def edit_scalar(text: str, path: tuple, value: str, source: str = "poolctl.yaml"
                ) -> tuple[str, str, int]:
    """Replace the scalar at `path` with `value`: (new text, old value, line number).

    Only the scalar's own characters change. UsageError when the key is not literally in the
    file (a default applies) or is not a plain one-line value."""
    import yaml

    key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(
        ".[", "[")
    node = _value_node(text, path)
    if node is None:
        raise UsageError(
            f"{source}: {key} is not written in the file (its default applies); add it "
            f"there, then run the command again")
    if not isinstance(node, yaml.ScalarNode) or node.style in ("|", ">") or (
            node.start_mark.line != node.end_mark.line):
        raise UsageError(f"{source}:{node.start_mark.line + 1}: {key} must be a one-line "
                         "scalar for poolctl to change it in place; write it on one line")
    start, end = node.start_mark.index, node.end_mark.index
    new_text = text[:start] + _render_scalar(value, node.style) + text[end:]
    check = _value_node(new_text, path)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{node.start_mark.line + 1}: {key}: cannot write "
                         f"{value!r} in place; edit the file by hand")
    return new_text, node.value, node.start_mark.line + 1


def set_scalar(text: str, path: tuple, value: str, source: str = "poolctl.yaml"
               ) -> tuple[str, str | None, int]:
    """`edit_scalar`, or, when the key is not written (its default applies), one new line
    `key: value` at the top of its block-style mapping: (new text, old value or None, line)."""
    import yaml

    if _value_node(text, path) is not None:
        return edit_scalar(text, path, value, source)
    parent = _value_node(text, path[:-1])
    where = ".".join(str(p) for p in path[:-1] if not isinstance(p, int))
    if not isinstance(parent, yaml.MappingNode) or parent.flow_style or not parent.value:
        raise UsageError(f"{source}: {where}: not a block mapping poolctl can add "
                         f"`{path[-1]}` to; add `{path[-1]}:` there by hand")
    first = parent.value[0][0].start_mark
    start = first.index - first.column
    line = f"{' ' * first.column}{path[-1]}: {_render_scalar(value, None)}\n"
    new_text = text[:start] + line + text[start:]
    check = _value_node(new_text, path)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{first.line + 1}: {where}: cannot add {path[-1]}={value!r} "
                         "in place; edit the file by hand")
    return new_text, None, first.line + 1


def unset_scalar(text: str, path: tuple, source: str = "poolctl.yaml"
                 ) -> tuple[str, str | None, int | None]:
    """The inverse of `set_scalar` adding a line: remove the one line `key: value` at `path`,
    so that the default applies again: (new text, old value or None, line or None). A key
    not written leaves the text as it is."""
    import yaml

    parent = _value_node(text, path[:-1])
    pairs = parent.value if isinstance(parent, yaml.MappingNode) else []
    pair = next(((k, v) for k, v in pairs if k.value == path[-1]), None)
    if pair is None:
        return text, None, None
    k, v = pair
    start = text.rfind("\n", 0, k.start_mark.index) + 1
    end = text.find("\n", v.end_mark.index)
    end = len(text) if end < 0 else end + 1
    rest = text[v.end_mark.index:end].strip()
    new_text = text[:start] + text[end:]
    where = ".".join(str(p) for p in path if not isinstance(p, int))
    if (not isinstance(v, yaml.ScalarNode) or parent.flow_style or len(pairs) < 2
            or k.start_mark.line != v.end_mark.line or text[start:k.start_mark.index].strip()
            or (rest and not rest.startswith("#")) or _value_node(new_text, path) is not None):
        raise UsageError(f"{source}:{k.start_mark.line + 1}: {where}: not a line of its own "
                         "poolctl can remove; delete it by hand")
    return new_text, v.value, k.start_mark.line + 1


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.poolctl-tmp")
    tmp.write_text(text)
    try:
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    except OSError:
        pass
    tmp.replace(path)


ROLLOUT_KEYS = {"image": ("serving", "image"), "model_version": ("model", "version"),
                "ami_id": ("aws", "ami_id"), "gcp_image": ("gcp", "image")}
# The node image (`rollout start --node-image`): a key a file may not write yet (its default
# applies), so it is added in place rather than refused.
NODE_IMAGE_KEYS = {"aws": "ami_id", "gcp": "gcp_image"}
ROLLOUT_LABELS = {k: ".".join(v) for k, v in ROLLOUT_KEYS.items()}


def _rollout_key(label: str) -> str:
    return next(k for k, v in ROLLOUT_LABELS.items() if v == label)


def _edit(key: str):
    return set_scalar if key in NODE_IMAGE_KEYS.values() else edit_scalar


def _write_key(key: str, text: str, path: tuple, value: str | None, source: str
               ) -> tuple[str, str | None, int | None]:
    """The file's text with `value` for `key`; None (node images only): the line removed."""
    if value is None:
        return unset_scalar(text, path, source=source)
    return _edit(key)(text, path, value, source=source)


def record_in_file(file_path: Path, cfg: Config, pool: Pool, key: str, value: str | None
                   ) -> tuple[Config, str, bool, int]:
    """Write `value` for `key` (a ROLLOUT_KEYS key) of `pool` into the file (None: remove a
    node image's line): (re-parsed config, old value, changed?, line)."""
    idx = [p.name for p in cfg.pools].index(pool.name)
    path = ("pools", idx, *ROLLOUT_KEYS[key])
    text = file_path.read_text()
    new_text, old, line = _write_key(key, text, path, value, str(file_path))
    changed = new_text != text
    new_cfg = parse_config(new_text, source=str(file_path))
    if changed:
        write_atomic(file_path, new_text)
    return new_cfg, old, changed, line


# ---------------------------------------------------------------------------------------
# Rollout records: $POOLCTL_HOME/rollouts/<stack>.json


def rollouts_dir() -> Path:
    from poolctl.home import poolctl_home

    return poolctl_home() / "rollouts"


def record_path(cfg: Config, pool: Pool, cloud: str) -> Path:
    return rollouts_dir() / f"{naming.stack_name(cfg, pool, cloud)}.json"


def load_record(cfg: Config, pool: Pool, cloud: str) -> dict | None:
    try:
        data = json.loads(record_path(cfg, pool, cloud).read_text())
    except (OSError, ValueError):
        return None
    return data.get("current") if isinstance(data, dict) else None


def save_record(cfg: Config, pool: Pool, cloud: str, rec: dict, new: bool = False) -> None:
    from poolctl.home import write_private

    p = record_path(cfg, pool, cloud)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        data = {"history": []}
    if new and data.get("current"):
        data.setdefault("history", []).append(data["current"])
    data["current"] = rec
    write_private(p, json.dumps(data, indent=2) + "\n")


def _annotate(state: RolloutState, rec: dict | None) -> None:
    """Name what rolls (image / model version) when the record matches this rollout."""
    if rec and rec.get("rollout_id") == state.id:
        def v(x) -> str:  # a launch template version number (AWS), a template name (GCP)
            return f"v{x}" if str(x).isdigit() else str(x)

        state.from_version = f"{rec['key']}={rec['from']} ({v(rec.get('group_version_from'))})"
        state.to_version = f"{rec['key']}={rec['to']} ({v(rec.get('group_version_to'))})"


# ---------------------------------------------------------------------------------------
# Rollout


@dataclass
class RolloutResult:
    pool: str
    cloud: str
    stack: str
    key: str
    from_value: str
    to_value: str
    file: str
    file_changed: bool
    applied: bool
    rollout: RolloutState | None
    message: str = ""
    no_surge: bool = False
    progress: list[dict] = field(default_factory=list)
    quota: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["from"], d["to"] = d.pop("from_value"), d.pop("to_value")
        return d


def rollout_quota(cfg: Config, pool: Pool, cloud: str, ops: CloudOps, plan: PoolPlan,
                  group: Group, no_surge: bool) -> list[QuotaLine]:
    """Quota for the rollout: the group's running nodes + the surge (0 with --no-surge)."""
    surge = 0 if no_surge else plan.nodes["surge"]
    warm_running = plan.warm_state == "running"
    nodes = running_nodes(group.min_nodes, group.desired_nodes, group.warm_min_nodes,
                          warm_running) + surge
    return shared_quota_lines(cfg, pool, cloud, ops, scaled_needs(plan, nodes))


def rollout_start(
    cfg: Config,
    file_path: Path,
    pool: Pool,
    cloud: str,
    ops: CloudOps,
    *,
    image: str | None = None,
    model_version: str | None = None,
    node_image: str | None = None,
    unset_node_image: bool = False,
    no_surge: bool = False,
    confirm: Callable[[str], bool],
    sandbox: bool,
    outdir: Path,
    mirror: str | None = None,
    render_summary: Callable[[str, Any], None] = lambda name, summary: None,
    action: str = "start",
    verbose: bool = False,
) -> RolloutResult:
    """Record the new version in the file, apply it through Terraform (a new launch template
    version / instance template), then start the rollout with the pool's checkpoints.
    `unset_node_image`: back to the placement's default image, its line removed (the
    rollback of a node image rollout whose file had no line)."""
    from poolctl.deploy import run_stacks

    given = {"image": image, "model_version": model_version, NODE_IMAGE_KEYS[cloud]: node_image}
    given = {k: v for k, v in given.items() if v is not None}
    if unset_node_image:
        given = given or {NODE_IMAGE_KEYS[cloud]: None}
    if len(given) != 1 or (unset_node_image and None not in given.values()):
        raise UsageError("rollout start: give exactly one of --image IMAGE, "
                         "--model-version VERSION or --node-image IMAGE")
    [(key, value)] = given.items()
    value = None if value is None else str(value).strip()
    # The record outlives this working directory: `rollout rollback` run from another one
    # (or by a scheduler) must edit this file, not a poolctl.yaml where it happens to run.
    file_path = Path(file_path).resolve()
    if value == "":
        raise UsageError(f"--{key.replace('_', '-')}: empty; give the new value")
    # Refuse before any cloud call when the key is not literally in the file (exit 2).
    idx = [p.name for p in cfg.pools].index(pool.name)
    _write_key(key, file_path.read_text(), ("pools", idx, *ROLLOUT_KEYS[key]), value,
               str(file_path))
    stack = naming.stack_name(cfg, pool, cloud)
    group = ops.find_group(cfg, pool)
    active = ops.rollout_state(group)
    last = load_record(cfg, pool, cloud)
    # A rollout poolctl steps itself (GCP) holds at its step while nobody watches it: the
    # same version again drives it on.
    resume = (active is not None and getattr(ops, "rollout_advance", None) is not None
              and bool(last) and last.get("rollout_id") == active.id
              and last.get("to") == value)
    if active is not None and not active.done and not resume:
        raise OperationFailed(
            f"{pool.name}: rollout {active.id} is {active.status}; wait for it "
            f"(`poolctl rollout status --cloud {cloud}`), or stop it with `poolctl rollout "
            f"cancel` / `rollback`")
    plan = plan_pool(pool, cloud)
    lines = rollout_quota(cfg, pool, cloud, ops, plan, group, no_surge)
    short = [ln for ln in lines if ln.shortfall > 0]
    if short:
        surge = plan.nodes["surge"]
        offer = ("; or roll without surge with --no-surge (one node at a time out of "
                 "service, no extra node)" if surge and not no_surge else "")
        raise OperationFailed(
            f"{pool.name}: not enough quota for the rollout"
            f"{f' with its surge of {surge} node(s)' if surge and not no_surge else ''}: "
            + "; ".join(shortfall_line(ln) for ln in short)
            + f"; nothing was changed. File an increase with `poolctl quota request --cloud "
              f"{cloud}`{offer}")
    section, name = ROLLOUT_KEYS[key]
    current = getattr(getattr(pool, section), name)
    label = ROLLOUT_LABELS[key]
    to = "the default image (its line removed)" if value is None else value

    cps = ", ".join(f"{c}%" for c in pool.rollout.checkpoints)
    how = "one node at a time, no surge" if no_surge or not plan.nodes["surge"] else (
        f"surge {plan.nodes['surge']} node(s)")
    what = (f"{action} rollout of {stack}: {label} {current} -> {to} (checkpoints {cps}; "
            f"{how})")
    if current != value:
        log(what)
    # The question comes after Terraform's plan and its summary (run_stacks asks it): the file
    # records the value first, and a "no" puts the file and the rollout record back.
    from poolctl.home import write_private

    text_before = file_path.read_text()
    rec_path = record_path(cfg, pool, cloud)
    rec_before = rec_path.read_text() if rec_path.is_file() else None

    def undo_and_refuse() -> OperationFailed:
        write_atomic(file_path, text_before)
        if rec_before is None:
            rec_path.unlink(missing_ok=True)
        else:
            write_private(rec_path, rec_before)
        return OperationFailed(f"{stack}: not confirmed; nothing was changed")

    def confirm_rollout(question: str) -> bool:
        return confirm(f"{what}, recorded in {file_path}: {question}")

    new_cfg, old, changed, line = record_in_file(file_path, cfg, pool, key, value)
    new_pool = new_cfg.select(pool.name)[0]
    prev = load_record(cfg, pool, cloud) if not changed else None
    rec = {
        "stack": stack, "pool": pool.name, "cloud": cloud, "file": str(file_path),
        "key": label, "from": old, "to": value, "line": line,
        "group_version_from": group.version, "group_version_to": None,
        "no_surge": no_surge, "status": "recorded", "rollout_id": None, "action": action,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if not changed and prev and prev.get("to") == value:
        # The file already records the value: resume the earlier attempt, keep its origin.
        rec.update({k: prev[k] for k in ("from", "group_version_from") if prev.get(k)})
    save_record(cfg, pool, cloud, rec, new=changed)
    if changed:
        log(f"{file_path}:{line}: {label}: {old} -> {to} (recorded)")
    else:
        log(f"{file_path}:{line}: {label} is already {value}"
            + ("" if resume else "; applying it"))
    result = RolloutResult(
        pool=pool.name, cloud=cloud, stack=stack, key=label, from_value=rec["from"],
        to_value=value, file=str(file_path), file_changed=changed, applied=False, rollout=None,
        no_surge=no_surge, quota=[ln.to_json() for ln in lines],
    )
    workdir = None
    if resume and not changed:
        # Its apply is done (the rollout started after it): drive it on where it stands.
        log(f"{stack}: rollout {active.id} is {active.status} at its {active.step}% step; "
            "driving it on (its apply is done)")
    else:
        env = ops.rollout_apply_env(group, plan_pool(new_pool, cloud), no_surge=no_surge)
        try:
            res = run_stacks(
                new_cfg, [(new_pool, cloud)], outdir=outdir, sandbox=sandbox, destroy=False,
                plan_only=False, confirm=confirm_rollout, mirror=mirror,
                render_summary=render_summary, extra_env=env,
                before_apply=_keep_previous_version(ops, pool), verbose=verbose,
            )[0]
        except NotConfirmed:
            raise undo_and_refuse() from None
        except OperationFailed as e:
            raise OperationFailed(
                f"{e}\n{stack}: {file_path} records {label}={value} but the apply did not "
                f"finish; the pool still runs {rec['from']}. Run the same command again to "
                f"resume, or `poolctl rollout rollback --cloud {cloud}` to restore "
                f"{rec['from']} in the file") from None
        result.applied = res.applied
        workdir = Path(res.workdir)
    rec["status"] = "applied"
    save_record(cfg, pool, cloud, rec)
    state = ops.rollout_begin(group, new_cfg, new_pool, plan_pool(new_pool, cloud),
                              no_surge=no_surge, stack_dir=workdir)
    if state is None:
        return_surge(cfg, new_pool, cloud, ops, ops.find_group(cfg, new_pool), None)
        rec["status"] = "nothing_to_roll"
        save_record(cfg, pool, cloud, rec)
        result.message = (f"{stack}: the nodes' launch configuration did not change; "
                          "nothing to roll")
        return result
    rec.update(status="started", rollout_id=state.id, group_version_to=state.to_version)
    save_record(cfg, pool, cloud, rec)
    cleanup_versions(ops, group, pool)
    _annotate(state, rec)
    result.rollout = state
    result.message = (f"{stack}: rollout {state.id} started: {label} {rec['from']} -> "
                      f"{value}, checkpoints {cps}")
    log(result.message)
    return result


# Optional CloudOps steps, GCP's only (AWS keeps launch template versions by itself): keep the
# previous instance template through the apply of a new one, and delete older ones.


def _keep_previous_version(ops: CloudOps, pool: Pool) -> Callable[[Any], bool] | None:
    """The `before_apply` step of a rollout's Terraform run, when the cloud has one."""
    step = getattr(ops, "rollout_before_apply", None)
    if step is None:
        return None

    def before_apply(tf) -> bool:
        forgotten = step(tf)
        for t in forgotten:
            log(f"{pool.name}: instance template {t['name'] or t['address']} stays as the "
                "rollback target: removed from Terraform's state, not deleted")
        return bool(forgotten)

    return before_apply


def deploy_before_apply(targets: list[tuple[Pool, str]]) -> Callable[[Any], bool] | None:
    """`deploy`'s `before_apply` step: on GCP the MIG's versions are poolctl's (a rollout
    steps them), so an apply that replaces the instance template must not delete the one the
    MIG runs (GCE refuses while it is in use): Terraform forgets it, and `rollout start`
    rolls the new one checkpoint by checkpoint."""
    if not any(c == "gcp" for _, c in targets):
        return None
    from poolctl.clouds.gcp import GcpOps

    def before_apply(tf) -> bool:
        forgotten = GcpOps().rollout_before_apply(tf)
        for t in forgotten:
            log(f"instance template {t['name'] or t['address']} stays: the pool's MIG runs it "
                "until `poolctl rollout start --cloud gcp` rolls the new one (deploy does not "
                "roll GCP nodes); removed from Terraform's state, not deleted")
        return bool(forgotten)

    return before_apply


def cleanup_versions(ops: CloudOps, group: Group, pool: Pool) -> None:
    """Delete versions that are neither current nor previous, when the cloud needs it; a
    failure is reported and never fails the command."""
    step = getattr(ops, "rollout_cleanup", None)
    if step is None:
        return
    try:
        out = step(group)
    except OperationFailed as e:
        log(f"{pool.name}: old instance templates not cleaned up: {e}")
        return
    for name in out["deleted"]:
        log(f"{pool.name}: deleted instance template {name} (neither current nor previous)")
    for line in out["failed"]:
        log(f"{pool.name}: {line}")


def rollout_words(s: RolloutState) -> str:
    """Status, percentage, checkpoint, nodes to update, reason: as `status` commands say it."""
    why = f" ({s.reason})" if s.reason else ""
    if s.status.startswith(("Rollback", "Cancel")):
        # The forward percentage means nothing once the rollout turns back or stops.
        return f"{s.status}{why}"
    # A checkpoint of 100% is the end, said by the final line.
    cp = (f", checkpoint {s.checkpoint_reached}% reached"
          if s.checkpoint_reached and s.checkpoint_reached < 100 and not s.done else "")
    todo = "" if s.instances_to_update is None else f", {s.instances_to_update} to update"
    return f"{s.status} {s.percentage_complete:g}%{cp}{todo}{why}"


def _progress_line(pool: Pool, s: RolloutState) -> str:
    return f"{pool.name}: rollout {rollout_words(s)}"


def _final_line(pool: Pool, s: RolloutState) -> str:
    outcome = {
        "Successful": f"every node runs {s.to_version or 'the new version'}",
        "RollbackSuccessful": "rolled back, every node runs "
                              + (s.from_version or "the previous version"),
        "Cancelled": f"cancelled at {s.percentage_complete:g}%; replaced nodes keep the new "
                     "version",
    }.get(s.status, s.status + (f": {s.reason}" if s.reason else ""))
    return f"{pool.name}: rollout {s.id} finished: {outcome}"


def return_surge(cfg: Config, pool: Pool, cloud: str, ops: CloudOps, group: Group,
                 state: RolloutState | None) -> None:
    """Outside a rollout the group's maximum is the pool's max nodes: a rollout's start raised
    it by the surge (its apply), its end (finished, rolled back, cancelled) gives that back.
    Clouds whose update surge sits outside the autoscaler's maximum (GCE) have no step."""
    step = getattr(ops, "set_max_nodes", None)
    if step is None or (state is not None and not state.done):
        return
    n = plan_pool(pool, cloud).nodes
    top = max(n["max"], group.min_nodes)
    # Only the rollout's own raise: a maximum the file no longer gives is `deploy`'s business.
    if n["surge"] and group.max_nodes == n["max"] + n["surge"] > top:
        step(group, top)
        log(f"{pool.name}: group maximum {group.max_nodes} -> {top} node(s): the rollout's "
            "surge room given back")
        group.max_nodes = top


def wait_rollout(cfg: Config, pool: Pool, cloud: str, ops: CloudOps, timeout: float,
                 hint: str, sleep: Callable[[float], None] = time.sleep
                 ) -> tuple[RolloutState | None, list[dict]]:
    """Poll the newest rollout until it ends; one line per change of status, percentage or
    checkpoint. Returns the final state and the progress seen."""
    group = ops.find_group(cfg, pool)
    rec = load_record(cfg, pool, cloud)
    t0 = time.monotonic()
    seen: list[dict] = []
    last = None
    interval = poll_interval(getattr(ops, "sandbox", False))
    # Clouds whose rollout cannot pause by itself (GCP canaries) are stepped from here; such
    # a rollout holds at its step while nobody watches.
    advance = getattr(ops, "rollout_advance", None)
    keeps = ("holds at its step until `poolctl rollout start` with the same version drives "
             "it on" if advance else f"keeps going in {cloud}")
    progress = Progress().start()  # a live line on a terminal, else one line per change
    try:
        while True:
            s = ops.rollout_state(group)
            if s is None:
                return None, seen
            _annotate(s, rec)
            key = (s.status, s.percentage_complete, s.checkpoint_reached)
            if key != last:
                progress.update(_progress_line(pool, s))
                seen.append({"status": s.status, "percentage_complete": s.percentage_complete,
                             "checkpoint_reached": s.checkpoint_reached,
                             "instances_to_update": s.instances_to_update,
                             "seconds": round(time.monotonic() - t0, 1)})
                last = key
            if s.done:
                progress.stop()
                _after_end(cfg, pool, cloud, s)
                return_surge(cfg, pool, cloud, ops, ops.find_group(cfg, pool), s)
                if s.status in ROLLOUT_DONE_OK:
                    cleanup_versions(ops, group, pool)
                log(_final_line(pool, s))
                return s, seen
            if time.monotonic() - t0 >= timeout:
                raise OperationFailed(
                    f"{pool.name}: --timeout {timeout:g} s: rollout {s.id} is still "
                    f"{s.status} at {s.percentage_complete:g}%; it {keeps}; "
                    f"watch with `{hint}`")
            if advance is not None and (said := advance(group, s)):
                log(f"{pool.name}: {said}")
            sleep(interval)
    except KeyboardInterrupt:
        progress.stop()
        # Ctrl-C reached the synth's Node process too (rollout start synthesized): no
        # traceback of jsii's exit hook writing to it.
        forget_dead_synth_kernel(1.0)
        log(f"{pool.name}: interrupted; the rollout {keeps}; watch it with "
            f"`{hint}`, stop it with `{hint.replace(' status ', ' cancel ', 1)}`")
        raise
    finally:
        progress.stop()


def _after_end(cfg: Config, pool: Pool, cloud: str, s: RolloutState) -> None:
    """An automatic rollback returned the pool to the old version: record that in the file
    too, so that the next deploy does not roll forward again."""
    rec = load_record(cfg, pool, cloud)
    if not rec or rec.get("rollout_id") != s.id:
        return
    rec["status"] = s.status
    if s.status == "RollbackSuccessful" and rec.get("restored") is None:
        _restore_file(cfg, pool, rec)
    save_record(cfg, pool, cloud, rec)


def _restore_file(cfg: Config, pool: Pool, rec: dict) -> None:
    path = Path(rec["file"])
    key = _rollout_key(rec["key"])
    if not path.is_absolute():
        # Written by a poolctl that kept the path as typed: its directory is unknown.
        log(f"{path}: the rollout record names this file relative to a directory it does not "
            f"keep; set {rec['key']}={rec['from']} in it by hand")
        rec["restored"] = False
        return
    try:
        text = path.read_text()
        idx = [p.name for p in parse_config(text, str(path)).pools].index(pool.name)
    except (OSError, ValueError):
        log(f"{path}: cannot read it to restore {rec['key']}={rec['from']}; set it by hand")
        rec["restored"] = False
        return
    where = ("pools", idx, *ROLLOUT_KEYS[key])
    node = _value_node(text, where)
    # Absent (None) matches a node image rollout whose file had no line (`from` None).
    if getattr(node, "value", None) not in (rec["to"], rec["from"]):
        log(f"{path}: {rec['key']} is now {getattr(node, 'value', None)!r}, neither "
            f"{rec['to']} nor {rec['from']}; left as is")
        rec["restored"] = False
        return
    try:
        new_text, old, line = _write_key(key, text, where, rec["from"], str(path))
    except UsageError as e:
        log(f"{e}; restore {rec['key']}={rec['from']} by hand")
        rec["restored"] = False
        return
    if new_text != text:
        write_atomic(path, new_text)
        gone = "(line removed: the placement's default image)"
        log(f"{path}:{line}: {rec['key']}: {old} -> {rec['from'] or gone} (restored)")
    rec["restored"] = True


def rollout_status(cfg: Config, pool: Pool, cloud: str, ops: CloudOps) -> dict:
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    return_surge(cfg, pool, cloud, ops, group, s)
    rec = load_record(cfg, pool, cloud)
    if s is not None:
        _annotate(s, rec)
    checkpoints = []
    if s is not None:
        for c in s.checkpoints or []:
            checkpoints.append({"percentage": c, "reached": bool(
                s.checkpoint_reached and c <= s.checkpoint_reached) or s.status == "Successful"})
    return {"pool": pool.name, "cloud": cloud, "group": group.name,
            "group_version": group.version,
            "rollout": asdict(s) if s else None, "checkpoints": checkpoints, "record": rec}


def rollout_cancel(cfg: Config, pool: Pool, cloud: str, ops: CloudOps) -> RolloutState:
    if "rollout_cancel" in ops.unsupported:
        raise OperationFailed(f"rollout cancel: {cloud} cannot stop a rollout where it stands; "
                              f"use `poolctl rollout rollback --cloud {cloud}`")
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    if s is None or s.done:
        raise OperationFailed(f"{pool.name}: no rollout in progress; nothing to cancel")
    out = ops.rollout_cancel(group)
    return_surge(cfg, pool, cloud, ops, group, out)
    rec = load_record(cfg, pool, cloud)
    if rec and rec.get("rollout_id") == out.id:
        rec["status"] = "cancel_requested"
        save_record(cfg, pool, cloud, rec)
    return out


def rollout_rollback(
    cfg: Config, file_path: Path, pool: Pool, cloud: str, ops: CloudOps, *,
    confirm: Callable[[str], bool], sandbox: bool, outdir: Path, mirror: str | None = None,
    render_summary: Callable[[str, Any], None] = lambda name, summary: None,
    verbose: bool = False,
) -> dict:
    """Return to the recorded previous version.

    A rollout still in progress is rolled back by the cloud (AWS RollbackInstanceRefresh:
    replaced nodes go back to the previous launch template version); one that ended is rolled
    out again to the previous version (a new rollout). Either way the file records the
    previous version again, so the next deploy does not roll forward."""
    rec = load_record(cfg, pool, cloud)
    node_image = rec is not None and rec.get("key") in (
        ROLLOUT_LABELS[k] for k in NODE_IMAGE_KEYS.values())
    if not rec or not (rec.get("from") or node_image):
        raise OperationFailed(
            f"{pool.name}: no rollout recorded in {record_path(cfg, pool, cloud)}; nothing to "
            "roll back to")
    group = ops.find_group(cfg, pool)
    s = ops.rollout_state(group)
    mine = s is not None and s.id == rec.get("rollout_id")
    out: dict[str, Any] = {"pool": pool.name, "cloud": cloud, "key": rec["key"],
                           "from": rec["to"], "to": rec["from"], "how": None, "rollout": None}
    if rec.get("status") in ("recorded", "applied") and not mine:
        # The new version never started rolling: only the file needs restoring.
        _restore_file(cfg, pool, rec)
        rec["status"] = "rolled_back"
        save_record(cfg, pool, cloud, rec)
        out["how"] = "file"
        return out
    if mine and s.done and rec.get("action") == "rollback" and s.status == "Successful":
        raise OperationFailed(
            f"{pool.name}: the last rollout was already a rollback (to {rec['key']}="
            f"{rec['to']}); to go to {rec['from']} again, use `poolctl rollout start`")
    if mine and s.status == "RollbackSuccessful":
        _restore_file(cfg, pool, rec)
        save_record(cfg, pool, cloud, rec)
        out.update(how="already_rolled_back", rollout=asdict(s))
        return out
    held = mine and s.status == "Cancelled" and getattr(ops, "rollback_after_cancel", False)
    if mine and (not s.done or held):
        if "rollout_rollback" in ops.unsupported:
            raise OperationFailed(f"rollout rollback: {cloud} cannot reverse a rollout in "
                                  f"progress; cancel it, then roll back once it stopped")
        if not confirm(f"roll back {rec['stack']} to {rec['key']}={rec['from']} (replaced "
                       f"nodes return to the previous version)?"):
            raise OperationFailed(f"{rec['stack']}: not confirmed; nothing was changed")
        state = ops.rollout_rollback(group)
        _restore_file(cfg, pool, rec)
        rec["status"] = "rollback_requested"
        save_record(cfg, pool, cloud, rec)
        out.update(how="cloud_rollback", rollout=asdict(state))
        return out
    # Ended (successful, cancelled or failed): roll the previous version out again, in the
    # file the rollout recorded (wherever this command runs from).
    key = _rollout_key(rec["key"])
    key = "node_image" if key in NODE_IMAGE_KEYS.values() else key
    # A node image the file did not name before: back to the default, its line removed.
    back = {"unset_node_image": True} if rec["from"] is None else {key: rec["from"]}
    recorded = Path(rec["file"])
    if recorded.is_absolute() and recorded != Path(file_path).resolve():
        from poolctl.config import load_config

        file_path, cfg = recorded, load_config(recorded)
        pool = cfg.select(pool.name)[0]
    res = rollout_start(cfg, file_path, pool, cloud, ops, **back,
                        no_surge=bool(rec.get("no_surge")), confirm=confirm, sandbox=sandbox,
                        outdir=outdir, mirror=mirror, render_summary=render_summary,
                        action="rollback", verbose=verbose)
    out.update(how="new_rollout", rollout=asdict(res.rollout) if res.rollout else None,
               message=res.message)
    return out


def node_json(n: NodeState) -> dict:
    return asdict(n)
