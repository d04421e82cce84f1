"""Self-booting nodes (`warm --wait`, `rollout`, `status` progress with nobody else acting).

No boot script runs in the sandbox. With a speedup S > 0 (`poolctl sandbox start`: 100
unless `--boot-speedup S` or `--manual-boot`), a thread in the server completes a node's open
launch actions with CONTINUE once it has "booted" for its plan's start time / S: cold for a
new instance (in the group or in the warm pool), warm_stopped or warm_running for one the
group takes from its warm pool. The start times are the ones `deploy --sandbox` registered
for the group's poolctl:project / poolctl:pool tags and region; else the group's
DefaultInstanceWarmup (the stack's plan cold start) for every kind, else FALLBACK_START_S.
The lifecycle log marks these "self-boot" with the kind and the seconds. Speedup 0 (the
server's default, what the tests use): nodes wait until `poolctl sandbox boot-nodes` or
CompleteLifecycleAction.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from poolctl import naming
from poolctl.sandbox.extensions.common import LOCK, all_backends
from poolctl.sandbox.extensions.launches import BOOT_WAKE, actions_of, all_states, boot_clock
from poolctl.sandbox.extensions.lifecycle import finish_action
from poolctl.sandbox.extensions.serving_nodes import serving

# Reported apart, as /_poolctl/health's boot_speedup.
NAMES: tuple[str, ...] = ()

BOOT_KINDS = ("cold", "warm_stopped", "warm_running")
# A group no start times were registered for (made without `deploy --sandbox`) boots in its
# DefaultInstanceWarmup, where the AWS stack puts the plan's cold start, else in this.
FALLBACK_START_S = 300.0
# speedup 0: nodes wait for `sandbox boot-nodes` (the tests' default, they pick the moment).
_boot: dict[str, float] = {"speedup": 0.0}
# (region, project, pool) -> {kind: seconds}, the plan's start times `deploy --sandbox` sent.
# Changed in place only (snapshots.py copies and restores it).
start_times: dict[tuple[str, str, str], dict[str, float]] = {}


def boot_delay_s(start_seconds: dict[str, float], kind: str, speedup: float) -> float | None:
    """How long a node starting as `kind` boots in the sandbox: the plan's start time for
    it (the cold one when the plan has none for that kind) divided by `speedup`; None when
    nodes boot only when told (speedup 0)."""
    if speedup <= 0:
        return None
    return float(start_seconds.get(kind, start_seconds["cold"])) / speedup


def set_boot_speedup(speedup: Any) -> float:
    value = float(speedup)
    if not math.isfinite(value) or value < 0:
        raise ValueError("speedup must be a finite number >= 0 (0: nodes boot when told)")
    with LOCK:
        _boot["speedup"] = value
    BOOT_WAKE.set()  # nodes already waiting are due now, or later
    return value


def boot_speedup() -> float:
    return _boot["speedup"]


def register_start_times(region: str, project: str, pool: str, seconds: dict[str, Any]) -> None:
    unknown = set(seconds) - set(BOOT_KINDS)
    if "cold" not in seconds or unknown:
        raise ValueError(f"start_seconds needs cold and only {', '.join(BOOT_KINDS)}")
    values = {k: float(v) for k, v in seconds.items()}
    if not all(math.isfinite(v) and v >= 0 for v in values.values()):
        raise ValueError("start_seconds values must be finite numbers >= 0")
    with LOCK:
        start_times[(str(region), str(project), str(pool))] = values
    BOOT_WAKE.set()


def _group_start_seconds(backend: Any, group: Any) -> dict[str, float]:
    tags = {t["Key"]: t["Value"] for t in group.tags}
    key = (backend.region_name, tags.get(naming.TAG_PROJECT, ""), tags.get(naming.TAG_POOL, ""))
    found = start_times.get(key)
    if found:
        return found
    return {"cold": float(group.__dict__.get("default_instance_warmup") or FALLBACK_START_S)}


def _booting() -> Iterable[tuple[Any, Any, Any, dict[str, Any], float]]:
    """(backend, group, state, boot, delay) of every node waiting on its launch actions."""
    from moto.autoscaling.models import autoscaling_backends

    for backend in all_backends(autoscaling_backends):
        for group in list(backend.autoscaling_groups.values()):
            if serving() and any(t["Key"] == naming.TAG_POOL for t in group.tags):
                continue  # its nodes run their boot script (serving_nodes.py)
            for state in all_states(group):
                boot = boot_clock(state)
                if not boot or not actions_of(state):
                    continue
                delay = boot_delay_s(_group_start_seconds(backend, group), boot["kind"],
                                     _boot["speedup"])
                if delay is not None:
                    yield backend, group, state, boot, delay


def boot_due_nodes(now: float | None = None) -> float | None:
    """Complete the launch actions of the nodes whose simulated start is over (CONTINUE, as
    their boot script would once vLLM answers). Returns the seconds until the next node is
    due, None when no node is booting by itself."""
    now = time.monotonic() if now is None else now
    nxt = None
    with LOCK:
        for backend, group, state, boot, delay in list(_booting()):
            due = boot["since"] + delay
            if due > now:
                nxt = due if nxt is None else min(nxt, due)
                continue
            note = {"BootKind": boot["kind"], "BootSeconds": round(delay, 3)}
            for hook in list(actions_of(state)):
                if hook in actions_of(state):
                    finish_action(backend, group, state, hook, "CONTINUE", "self-boot", note)
    return None if nxt is None else max(0.0, nxt - now)


def boot_report() -> dict[str, Any]:
    now = time.monotonic()
    with LOCK:
        waiting = [{"Region": b.region_name, "AutoScalingGroupName": g.name,
                    "InstanceId": s.instance.id, "BootKind": boot["kind"],
                    "SecondsLeft": round(max(0.0, boot["since"] + delay - now), 2)}
                   for b, g, s, boot, delay in _booting()]
        times = [{"region": r, "project": pr, "pool": po, "start_seconds": v}
                 for (r, pr, po), v in start_times.items()]
        return {"speedup": _boot["speedup"], "start_times": times, "booting": waiting}


def _boot_loop() -> None:
    while True:
        try:
            wait = boot_due_nodes()
        except Exception as exc:  # moto raises many types; the thread must outlive one
            print(f"self-boot: {exc!r}; retrying in 1 s", flush=True)
            wait = 1.0
        # Sleeps until the next node is due, or until a node starts or the speedup changes.
        BOOT_WAKE.wait(wait)
        BOOT_WAKE.clear()


def start_self_boot(speedup: float) -> None:
    """Run the thread that boots nodes by themselves (idle while the speedup is 0)."""
    set_boot_speedup(speedup)
    threading.Thread(target=_boot_loop, name="poolctl-self-boot", daemon=True).start()


def install() -> None:
    """Nothing to patch: the server starts the thread (`start_self_boot`)."""


def reset() -> None:
    """Forget the registered start times (the speedup stays)."""
    start_times.clear()
