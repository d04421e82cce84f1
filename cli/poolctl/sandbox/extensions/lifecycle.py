"""Lifecycle actions (the node boot script completes `poolctl-node-ready`).

With an autoscaling:EC2_INSTANCE_LAUNCHING hook on the group, launched instances wait in
Pending:Wait (warm pool launches in Warmed:Pending:Wait) until CompleteLifecycleAction (by
InstanceId or LifecycleActionToken): CONTINUE moves them to InService (or to their warm
state), ABANDON terminates them and the group launches a replacement.
RecordLifecycleActionHeartbeat extends the wait by HeartbeatTimeout. The timeout is real
time, checked lazily on every Auto Scaling request; at expiry the hook's DefaultResult
applies. Every action is recorded (`lifecycle_report`: the open ones with their tokens, and
the log). Pending instances count towards desired capacity (moto counted only InService ones
and would over-launch). Terminate hooks are not emulated.

CreateAutoScalingGroup's LifecycleHookSpecificationList (Terraform's `initial_lifecycle_hook`;
moto ignores it) creates the hooks before the group launches its first instances, as AWS
does, so those instances wait in Pending:Wait too. Specifications are checked as the
reference says (name and transition required, DefaultResult CONTINUE or ABANDON,
HeartbeatTimeout 30..7200 s); a failed create leaves no hook behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from poolctl.sandbox.extensions.common import (
    LOCK,
    all_backends,
    before_each_call,
    find_group,
    now,
    refresh_load_balancers,
    stored,
    validation_error,
    warm_states,
)
from poolctl.sandbox.extensions.launches import (
    LAUNCHING,
    actions_of,
    all_states,
    clear_actions,
    terminate,
)
from poolctl.sandbox.extensions.warm_pool import reconcile_warm_pool, settle_warm

NAMES = ("autoscaling.lifecycle-actions", "autoscaling.lifecycle-hook-specifications")

_CAPACITY_STATES = {"InService", "Pending", "Pending:Wait", "Pending:Proceed"}
_TRANSITIONS = (LAUNCHING, "autoscaling:EC2_INSTANCE_TERMINATING")


def _lifecycle_log(backend: Any) -> list[dict[str, Any]]:
    return stored(backend, "_poolctl_lifecycle_log", list)


def finish_action(backend: Any, group: Any, state: Any, hook: str, result: str, how: str,
                  note: dict[str, Any] | None = None) -> None:
    """Complete one open launch action with `result` (CONTINUE or ABANDON), logged as `how`."""
    actions = actions_of(state)
    action = actions.pop(hook, None)
    _lifecycle_log(backend).append(
        {
            "Time": now().isoformat(),
            "AutoScalingGroupName": group.name,
            "LifecycleHookName": hook,
            "InstanceId": state.instance.id,
            "LifecycleActionToken": action["token"] if action else None,
            "LifecycleActionResult": result,
            "How": how,
            **(note or {}),
        }
    )
    warm = warm_states(group)
    if result == "ABANDON":
        clear_actions(state)
        if state in warm:
            warm.remove(state)
            terminate(backend, [state.instance.id])
            reconcile_warm_pool(group)
        else:
            if state in group.instance_states:
                group.instance_states.remove(state)
            terminate(backend, [state.instance.id])
            # AWS launches a replacement for an abandoned launch.
            group.set_desired_capacity(group.desired_capacity)
        return
    if actions:
        return  # other launch hooks still hold the instance
    if state in warm:
        settle_warm(backend, group, state)
    else:
        state.lifecycle_state = "InService"
        refresh_load_balancers(backend, group)


def _expire_actions(backend: Any) -> None:
    """Apply each hook's DefaultResult once its heartbeat timeout has passed (real time)."""
    moment = time.monotonic()
    for group in list(backend.autoscaling_groups.values()):
        for state in all_states(group):
            for hook, action in list(actions_of(state).items()):
                if action["deadline"] <= moment:
                    finish_action(backend, group, state, hook, action["default"], "timeout")


def _find_action(group: Any, hook: str, instance_id: str | None, token: str | None) -> Any:
    for state in all_states(group):
        action = actions_of(state).get(hook)
        if action is None:
            continue
        if instance_id and state.instance.id == instance_id:
            return state
        if token and action["token"] == token:
            return state
    if instance_id:
        raise validation_error(f"No active Lifecycle Action found with instance ID {instance_id}")
    raise validation_error(f"No active Lifecycle Action found with token {token}")


def _complete_lifecycle_action(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    group_name = self._get_param("AutoScalingGroupName")
    hook = self._get_param("LifecycleHookName")
    result = str(self._get_param("LifecycleActionResult") or "").upper()
    instance_id = self._get_param("InstanceId")
    token = self._get_param("LifecycleActionToken")
    if result not in ("CONTINUE", "ABANDON"):
        raise validation_error("LifecycleActionResult must be CONTINUE or ABANDON")
    if not instance_id and not token:
        raise validation_error("Either LifecycleActionToken or InstanceId is required")
    backend = self.autoscaling_backend
    group = find_group(backend, group_name)
    state = _find_action(group, hook, instance_id, token)
    finish_action(backend, group, state, hook, result, "CompleteLifecycleAction")
    return EmptyResult()


def _record_lifecycle_action_heartbeat(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    hook = self._get_param("LifecycleHookName")
    state = _find_action(
        group, hook, self._get_param("InstanceId"), self._get_param("LifecycleActionToken")
    )
    action = actions_of(state)[hook]
    action["deadline"] = time.monotonic() + action["timeout"]
    action["heartbeats"] += 1
    _lifecycle_log(backend).append(
        {
            "Time": now().isoformat(),
            "AutoScalingGroupName": group.name,
            "LifecycleHookName": hook,
            "InstanceId": state.instance.id,
            "LifecycleActionToken": action["token"],
            "LifecycleActionResult": None,
            "How": "RecordLifecycleActionHeartbeat",
        }
    )
    return EmptyResult()


def _hook_specs(raw: Any) -> list[dict[str, Any]]:
    """CreateAutoScalingGroup's LifecycleHookSpecificationList, checked per the reference."""
    specs: list[dict[str, Any]] = []
    for spec in raw or []:
        name, transition = spec.get("LifecycleHookName"), spec.get("LifecycleTransition")
        if not name or not transition:
            raise validation_error(
                "A LifecycleHookSpecification needs LifecycleHookName and LifecycleTransition"
            )
        if transition not in _TRANSITIONS:
            raise validation_error(
                f"Invalid LifecycleTransition {transition!r}: use {' or '.join(_TRANSITIONS)}"
            )
        result = str(spec.get("DefaultResult") or "ABANDON").upper()
        if result not in ("CONTINUE", "ABANDON"):
            raise validation_error("DefaultResult must be CONTINUE or ABANDON")
        timeout = spec.get("HeartbeatTimeout")
        if timeout is not None and not 30 <= int(timeout) <= 7200:
            raise validation_error("HeartbeatTimeout must be between 30 and 7200 seconds")
        if any(s["LifecycleHookName"] == name for s in specs):
            raise validation_error(f"Lifecycle hook {name} is specified more than once")
        specs.append({**spec, "DefaultResult": result,
                      "HeartbeatTimeout": int(timeout) if timeout is not None else None})
    return specs


def _put_hooks(backend: Any, group_name: str, specs: list[dict[str, Any]]) -> None:
    for spec in specs:
        hook = backend.create_lifecycle_hook(
            name=spec["LifecycleHookName"], as_name=group_name,
            transition=spec["LifecycleTransition"], timeout=spec["HeartbeatTimeout"],
            result=spec["DefaultResult"],
        )
        # moto fills these with made-up ARNs; a hook without them has none.
        hook.role_arn = spec.get("RoleARN")
        hook.notification_target_arn = spec.get("NotificationTargetARN")
        hook.notification_metadata = spec.get("NotificationMetadata")


def _wrap_create_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    def create_auto_scaling_group(self: Any) -> Any:
        backend = self.autoscaling_backend
        name = self._get_param("AutoScalingGroupName")
        if name in backend.autoscaling_groups:
            # Refused by the group create/delete fix (fixes.py): never touch its hooks.
            return orig(self)
        specs = _hook_specs(self._get_param("LifecycleHookSpecificationList"))
        # The hooks exist before moto's constructor launches the first instances.
        _put_hooks(backend, name, specs)
        try:
            return orig(self)
        except Exception:
            for spec in specs:
                backend.delete_lifecycle_hook(name, spec["LifecycleHookName"])
            raise

    return create_auto_scaling_group


def complete_open_actions(group_name: str | None, result: str) -> list[dict[str, str]]:
    """Complete every open launch action (of one group, or all): what the nodes' boot
    scripts would do, for sandbox runs where no boot script runs."""
    from moto.autoscaling.models import autoscaling_backends

    if result not in ("CONTINUE", "ABANDON"):
        raise ValueError("LifecycleActionResult must be CONTINUE or ABANDON")
    done = []
    with LOCK:
        for backend in all_backends(autoscaling_backends):
            for group in list(backend.autoscaling_groups.values()):
                if group_name and group.name != group_name:
                    continue
                for state in all_states(group):
                    for hook in list(actions_of(state)):
                        if hook not in actions_of(state):
                            continue  # an earlier ABANDON already ended the instance
                        finish_action(backend, group, state, hook, result, "admin endpoint")
                        kept = state in group.instance_states or state in warm_states(group)
                        done.append({"Region": backend.region_name,
                                     "AutoScalingGroupName": group.name,
                                     "InstanceId": state.instance.id,
                                     "LifecycleHookName": hook,
                                     # Where the instance went: InService, Warmed:Stopped ...,
                                     # Pending:Wait while another hook holds it, or gone.
                                     "LifecycleState": state.lifecycle_state if kept
                                     else "Terminated"})
    return done


def lifecycle_report() -> dict[str, Any]:
    """The open launch actions of every group, with their tokens, and the log of actions."""
    from moto.autoscaling.models import autoscaling_backends

    open_actions, log = [], []
    with LOCK:
        for backend in all_backends(autoscaling_backends):
            log.extend(_lifecycle_log(backend))
            for group in backend.autoscaling_groups.values():
                for state in all_states(group):
                    for hook, action in actions_of(state).items():
                        open_actions.append(
                            {
                                "Region": backend.region_name,
                                "AutoScalingGroupName": group.name,
                                "LifecycleHookName": hook,
                                "InstanceId": state.instance.id,
                                "LifecycleState": state.lifecycle_state,
                                "LifecycleActionToken": action["token"],
                                "Heartbeats": action["heartbeats"],
                                "SecondsLeft": round(action["deadline"] - time.monotonic(), 1),
                            }
                        )
    return {"open": open_actions, "log": log}


def install() -> None:
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse

    # Every Auto Scaling request runs after lapsed lifecycle timeouts apply.
    before_each_call(_expire_actions)
    AutoScalingResponse.create_auto_scaling_group = _wrap_create_group(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.create_auto_scaling_group
    )
    for name, fn in {
        "complete_lifecycle_action": _complete_lifecycle_action,
        "record_lifecycle_action_heartbeat": _record_lifecycle_action_heartbeat,
    }.items():
        setattr(AutoScalingResponse, name, fn)
    FakeAutoScalingGroup.active_instances = lambda self: [  # type: ignore[method-assign]  # moto extension: Pending counts
        s for s in self.instance_states if s.lifecycle_state in _CAPACITY_STATES
    ]


def reset() -> None:
    """Nothing kept outside moto's backends (the log and the actions live on moto's objects)."""
