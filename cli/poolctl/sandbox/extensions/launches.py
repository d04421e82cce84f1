"""Instances launched for an Auto Scaling group, and the launch actions that hold them.

moto launches a group's instances from the version its launch template resolves but tags
them with the template's default version; `run_instances` launches from the version given
and remembers it on the instance (fixes.py reports it back). With an
autoscaling:EC2_INSTANCE_LAUNCHING hook on the group, a new instance waits (Pending:Wait, or
Warmed:Pending:Wait in the warm pool) with one open launch action per hook, and its boot
clock starts: lifecycle.py completes the actions, self_boot.py does when the clock runs out.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from poolctl.sandbox.extensions.common import warm_states

LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
ASG_NAME_TAG = "aws:autoscaling:groupName"
# Wakes the self-boot thread: a node started booting, or its speedup or start times changed.
BOOT_WAKE = threading.Event()


def launch_hooks(backend: Any, group: Any) -> list[Any]:
    return [
        h
        for h in backend.lifecycle_hooks.values()
        if h.auto_scaling_group_name == group.name and h.lifecycle_transition == LAUNCHING
    ]


def run_instances(
    group: Any, count: int, version: Any | None, tags: dict[str, str] | None = None
) -> list[Any]:
    """Launch `count` EC2 instances for `group` from `version` (or its launch configuration).

    Mirrors moto's FakeAutoScalingGroup.replace_autoscaling_group_instances, except that the
    launch template version is passed explicitly so the instance is tagged with (and
    remembers) the version it really runs.
    """
    from moto.moto_api._internal import mock_random as random

    backend = group.autoscaling_backend
    instance_tags = dict(tags if tags is not None else group.get_propagated_tags())
    instance_tags[ASG_NAME_TAG] = group.name
    subnet_id = group.vpc_zone_identifier.split(",")[0] if group.vpc_zone_identifier else None
    if version is not None:
        instance_tags.update(version.instance_tags)
        launch_template = {"LaunchTemplateId": version.template.id, "Version": str(version.number)}
        image_id, instance_type = version.image_id, version.instance_type
        user_data, security_groups = version.user_data, version.security_groups
        associate_public_ip = None
    else:
        lc = group.launch_config
        launch_template = None
        image_id, instance_type = lc.image_id, lc.instance_type
        user_data, security_groups = lc.user_data, lc.security_groups
        associate_public_ip = lc.associate_public_ip_address
    reservation = backend.ec2_backend.run_instances(
        image_id,
        count,
        user_data,
        security_groups,
        instance_type=instance_type,
        tags={"instance": instance_tags},
        placement=random.choice(group.availability_zones),
        launch_config=group.launch_config,
        launch_template=launch_template,
        is_instance_type_default=False,
        associate_public_ip=associate_public_ip,
        subnet_id=subnet_id,
    )
    for instance in reservation.instances:
        instance.autoscaling_group = group
        if version is not None:
            instance._poolctl_lt = (version.template, version.number)
        elif group.launch_config is not None:
            instance._poolctl_lc = group.launch_config.name
    return list(reservation.instances)


def terminate(backend: Any, instance_ids: list[str]) -> None:
    if not instance_ids:
        return
    backend.ec2_backend.terminate_instances(instance_ids)
    # Deregisters the targets, as moto's EC2 TerminateInstances response does.
    backend.elbv2_backend.notify_terminate_instances(instance_ids)


def open_actions(backend: Any, group: Any, state: Any, hooks: list[Any],
                 kind: str = "cold") -> None:
    """Open the launch actions of a node starting up; `kind` (cold, warm_stopped,
    warm_running) is how it starts, which sets how long it boots by itself (self_boot.py)."""
    deadline = time.monotonic()
    state._poolctl_boot = {"kind": kind, "since": deadline}
    BOOT_WAKE.set()
    state._poolctl_actions = {
        h.name: {
            "token": str(uuid.uuid4()),
            "deadline": deadline + int(h.heartbeat_timeout or 3600),
            "timeout": int(h.heartbeat_timeout or 3600),
            "default": (h.default_result or "ABANDON").upper(),
            "heartbeats": 0,
        }
        for h in hooks
    }


def actions_of(state: Any) -> dict[str, dict[str, Any]]:
    """The launch actions still open on an instance: hook name -> action."""
    actions: dict[str, dict[str, Any]] = state.__dict__.get("_poolctl_actions") or {}
    return actions


def clear_actions(state: Any) -> None:
    state._poolctl_actions = {}


def boot_clock(state: Any) -> dict[str, Any] | None:
    """How and since when (time.monotonic) a node with open launch actions boots."""
    clock: dict[str, Any] | None = state.__dict__.get("_poolctl_boot")
    return clock


def launched_from(instance: Any) -> tuple[Any, ...] | None:
    """What `run_instances` launched an instance from: ("lt", template, version number) or
    ("lc", launch configuration name); None for an instance it did not launch."""
    lt = instance.__dict__.get("_poolctl_lt")
    if lt is not None:
        return ("lt", *lt)
    lc = instance.__dict__.get("_poolctl_lc")
    if lc is not None:
        return ("lc", lc)
    return None


def new_group_state(backend: Any, group: Any, instance: Any) -> Any:
    """moto's InstanceState of a new group instance: Pending:Wait, its launch actions open,
    when the group has launch hooks, else InService."""
    from moto.autoscaling.models import InstanceState

    hooks = launch_hooks(backend, group)
    state = InstanceState(
        instance,
        lifecycle_state="Pending:Wait" if hooks else "InService",
        protected_from_scale_in=group.new_instances_protected_from_scale_in,
        autoscaling_group=group,
    )
    if hooks:
        open_actions(backend, group, state, hooks)
    return state


def all_states(group: Any) -> list[Any]:
    """The group's instances, then its warm pool's: every node an action may hold."""
    return list(group.instance_states) + list(warm_states(group))
