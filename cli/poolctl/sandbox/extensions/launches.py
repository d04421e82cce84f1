"""Instances launched for an Auto Scaling group, and the launch actions that hold them.

moto launches a group's instances from the version its launch template resolves but tags
them with the template's default version, all in one random zone; `run_instances` launches
from the version given and remembers it on the instance (fixes.py reports it back), one
instance at a time in the zone Auto Scaling would pick, within the sandbox's capacity
(capacity.py), recording each launch as a scaling activity (activities.py). With an
autoscaling:EC2_INSTANCE_LAUNCHING hook on the group, a new instance waits (Pending:Wait, or
Warmed:Pending:Wait in the warm pool) with one open launch action per hook, and its boot
clock starts: lifecycle.py completes the actions, self_boot.py does when the clock runs out.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

from poolctl.sandbox.extensions import activities, capacity
from poolctl.sandbox.extensions.common import resolve_template, template_version, warm_states

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


def group_zones(group: Any) -> list[tuple[str, str | None]]:
    """(zone, subnet or None) the group launches into: one subnet per zone of its
    VPCZoneIdentifier, else its AvailabilityZones."""
    ec2 = group.autoscaling_backend.ec2_backend
    if not group.vpc_zone_identifier:
        return [(zone, None) for zone in group.availability_zones]
    out: dict[str, str | None] = {}
    for subnet_id in group.vpc_zone_identifier.split(","):
        if subnet_id.strip():
            out.setdefault(ec2.get_subnet(subnet_id.strip()).availability_zone,
                           subnet_id.strip())
    return list(out.items())


def launch_choices(group: Any, version: Any | None) -> list[tuple[str, Any | None]]:
    """(instance type, launch template version or None for the launch configuration) a
    launch tries, in order: a mixed instances policy's overrides by priority (the
    `prioritized` On-Demand strategy), else the one the group launches."""
    ec2 = group.autoscaling_backend.ec2_backend
    policy = group.mixed_instances_policy or {}
    choices: list[tuple[str, Any | None]] = []
    for override in (policy.get("LaunchTemplate") or {}).get("Overrides") or []:
        chosen = version
        spec = override.get("LaunchTemplateSpecification")
        if spec:
            chosen = template_version(resolve_template(ec2, spec), spec.get("Version"))
        itype = override.get("InstanceType") or (chosen.instance_type if chosen else None)
        if itype:
            choices.append((itype, chosen))
    if choices:
        return choices
    if version is not None:
        return [(version.instance_type, version)]
    return [(group.launch_config.instance_type, None)]


def _launch_one(group: Any, itype: str, version: Any | None, zone: str, subnet: str | None,
                tags: dict[str, str]) -> Any:
    """One instance for `group` in `zone`, from `version` (or its launch configuration);
    raises capacity.CapacityError when the zone (or the reservation) has no room."""
    backend = group.autoscaling_backend
    instance_tags = dict(tags)
    if version is not None:
        instance_tags.update(version.instance_tags)
        launch_template = {"LaunchTemplateId": version.template.id, "Version": str(version.number)}
        image_id, user_data, security_groups = (version.image_id, version.user_data,
                                                version.security_groups)
        associate_public_ip = None
    else:
        lc = group.launch_config
        launch_template = None
        image_id, user_data, security_groups = lc.image_id, lc.user_data, lc.security_groups
        associate_public_ip = lc.associate_public_ip_address
    reservation = backend.ec2_backend.run_instances(
        image_id,
        1,
        user_data,
        security_groups,
        instance_type=itype,
        tags={"instance": instance_tags},
        placement=zone,
        launch_config=group.launch_config,
        launch_template=launch_template,
        is_instance_type_default=False,
        associate_public_ip=associate_public_ip,
        subnet_id=subnet,
        poolctl_capacity=capacity.group_spec(group, version),
    )
    instance = reservation.instances[0]
    instance.autoscaling_group = group
    if version is not None:
        instance._poolctl_lt = (version.template, version.number)
    elif group.launch_config is not None:
        instance._poolctl_lc = group.launch_config.name
    return instance


def run_instances(
    group: Any, count: int, version: Any | None, tags: dict[str, str] | None = None,
    *, warm: str = "", cause: str | None = None,
) -> list[Any]:
    """Launch up to `count` EC2 instances for `group` from `version` (or its launch
    configuration); `warm` "into" when they are for its warm pool. Returns those launched:
    fewer when capacity ran out, each failure recorded as a scaling activity.

    As Auto Scaling does: each instance goes to the group's zone with the fewest of the
    pool's instances (zones where a reservation the group may use has room first), and to
    another zone when that one has no capacity (not with the balanced-only distribution
    strategy); a mixed instances policy's types are tried in priority order in each zone.
    The launch template version is passed explicitly, so the instance is tagged with (and
    remembers) the version it really runs.
    """
    ec2 = group.autoscaling_backend.ec2_backend
    instance_tags = dict(tags if tags is not None else group.get_propagated_tags())
    instance_tags[ASG_NAME_TAG] = group.name
    zones = group_zones(group)
    choices = launch_choices(group, version)
    pool = warm_states(group) if warm == "into" else list(group.instance_states)
    placed = Counter(s.instance.placement.zone for s in pool)
    cause = cause or activities.launch_cause(len(pool), len(pool) + count, warm == "into")
    strategy = (capacity.group_setting(group, "availability_zone_distribution") or {}).get(
        "CapacityDistributionStrategy")
    first_type, first_version = choices[0]
    first_spec = capacity.group_spec(group, first_version)
    launched: list[Any] = []
    for _ in range(count):
        order = sorted(range(len(zones)), key=lambda i: (
            first_spec.mode != "none" and capacity.reservation_room(
                ec2, first_type, zones[i][0], first_spec) == 0,
            placed[zones[i][0]], i))
        if strategy == "balanced-only":
            order = order[:1]
        instance = None
        for i in order:
            zone, subnet = zones[i]
            for itype, chosen in choices:
                try:
                    instance = _launch_one(group, itype, chosen, zone, subnet, instance_tags)
                except capacity.CapacityError as exc:
                    activities.record_failure(group, zone, subnet, exc.message, cause, warm)
                    continue
                activities.record_success(group, instance, subnet, cause, warm)
                break
            if instance is not None:
                placed[zone] += 1
                break
        if instance is None:
            break  # no zone has room now: Auto Scaling tries again later (activities.py)
        launched.append(instance)
    return launched


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
