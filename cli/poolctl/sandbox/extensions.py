"""poolctl's extensions to moto: the one place where the sandbox departs from stock moto.

The sandbox is moto 5.x (`moto.server`) with these additions, installed by `install()` before
the server answers its first request. Each fills a gap in moto 5.2.x that poolctl's runtime
commands (`rollout`, `warm`, `status`, `quota`) depend on; each behaves as the AWS API
reference documents it, within the limits said here.

1. Auto Scaling instance refresh (`rollout start/status/cancel/rollback`).
   StartInstanceRefresh, DescribeInstanceRefreshes, CancelInstanceRefresh and
   RollbackInstanceRefresh, added to moto's `AutoScalingResponse`. Preferences honoured:
   MinHealthyPercentage / MaxHealthyPercentage (batch size), CheckpointPercentages and
   CheckpointDelay (pause at each checkpoint; a last checkpoint below 100 is a partial
   refresh), SkipMatching, AutoRollback, ScaleInProtectedInstances, StandbyInstances,
   BakeTime. Instances are really replaced: old EC2 instances terminated, new ones launched
   from the desired (or the group's current) launch template version; the warm pool is
   refreshed after the live pool; on success the DesiredConfiguration becomes the group's.
   CLOCK: time does not pass on its own. Every DescribeInstanceRefreshes call for a group
   reports the refreshes as they are, then advances the group's active refresh by ONE step:
   Pending -> InProgress; one batch replaced; a checkpoint's CheckpointDelay elapsed; the
   warm pool replaced; Baking -> Successful; Cancelling -> Cancelled; one rollback batch.
   So a caller polling Describe sees every state, and tests need no sleep.
   A replacement counts in PercentageComplete once it is InService. A refresh waits while
   its replacements are in Pending:Wait (lifecycle hooks), and fails
   (or auto-rolls back) when one of them is marked Unhealthy (SetInstanceHealth), the
   sandbox's stand-in for failed health checks. "Wait" for protected or standby instances
   lasts WAIT_STEPS steps (AWS: one hour), then the refresh fails.
   Not emulated: InstanceWarmup (no warm-up time), AlarmSpecification (accepted, never fires).

2. Warm pool instances (`warm`, `status`).
   moto stores the PutWarmPool configuration but never launches warm instances. Here the
   pool holds real moto EC2 instances, tagged like the group's instances, stopped or running
   per PoolState, listed by DescribeWarmPool with LifecycleState Warmed:Stopped /
   Warmed:Running / Warmed:Hibernated (Warmed:Pending:Wait while a launch hook is open).
   Size, per the PutWarmPool reference: max(MinSize, MaxGroupPreparedCapacity - Desired),
   with MaxSize in place of MaxGroupPreparedCapacity when that is unset or -1. Scale-out
   takes warm instances first (started if stopped), then the pool is refilled; the group's
   WarmPoolSize is reported. DeleteWarmPool and DeleteAutoScalingGroup terminate them.
   Not emulated: InstanceReusePolicy (scale-in never returns instances to the pool).

3. Lifecycle actions (the node boot script completes `poolctl-node-ready`).
   With an autoscaling:EC2_INSTANCE_LAUNCHING hook on the group, launched instances wait in
   Pending:Wait (warm pool launches in Warmed:Pending:Wait) until CompleteLifecycleAction
   (by InstanceId or LifecycleActionToken): CONTINUE moves them to InService (or to their
   warm state), ABANDON terminates them and the group launches a replacement.
   RecordLifecycleActionHeartbeat extends the wait by HeartbeatTimeout. The timeout is real
   time, checked lazily on every Auto Scaling request; at expiry the hook's DefaultResult
   applies. Every action is recorded (GET /_poolctl/lifecycle-actions lists open ones with
   their tokens, and the log). Pending instances count towards desired capacity (moto
   counted only InService ones and would over-launch). Terminate hooks are not emulated.
   CreateAutoScalingGroup's LifecycleHookSpecificationList (Terraform's
   `initial_lifecycle_hook`; moto ignores it) creates the hooks before the group launches its
   first instances, as AWS does, so those instances wait in Pending:Wait too. Specifications
   are checked as the reference says (name and transition required, DefaultResult CONTINUE or
   ABANDON, HeartbeatTimeout 30..7200 s); a failed create leaves no hook behind.

4. Service Quotas for ec2 (`quota check/request`).
   moto knows only service `vpc`. Added for ServiceCode `ec2`: L-1216C47A (Standard),
   L-DB2E81BA (G and VT), L-417A185B (P), in vCPUs: GetServiceQuota, ListServiceQuotas,
   GetAWSDefaultServiceQuota, RequestServiceQuotaIncrease (status PENDING, an Id; a second
   open request for the same quota is ResourceAlreadyExistsException; a DesiredValue not
   above the current value is IllegalArgumentException), ListRequestedServiceQuotaChangeHistory,
   ListRequestedServiceQuotaChangeHistoryByQuota, GetRequestedServiceQuotaChange.
   Applied values: SANDBOX_GRANTS (enough for the examples; else the AWS defaults below)
   unless set by the POOLCTL_SANDBOX_QUOTAS env var (JSON {"L-417A185B": 384}) at start, or
   by the admin endpoint at run time.

5. Fixes to moto that the above rely on.
   - Instances launched for a group carry the launch template version the group resolves
     (moto tags them with the template's default version while using another's AMI), and
     DescribeAutoScalingGroups / DescribeAutoScalingInstances report each instance's own
     LaunchTemplate version (moto reports the template's default version for every one).
   - DescribeWarmPool on an unknown group is a ValidationError (moto: HTTP 500).
   - CreateLaunchTemplateVersion stores UserData as moto's CreateLaunchTemplate does (moto
     kept a plain string, and launching from that version failed an assertion: HTTP 500).
   - A retried attempt of a call (same amz-sdk-invocation-id, amz-sdk-request attempt > 1)
     that moto already answered, or is answering, gets that first answer instead of being
     performed again: a client that gave up on a slow answer must not create a second
     launch template version, rule or alias (the AWS provider retries under load).
   The ones below make a second `terraform plan` after `poolctl deploy --sandbox` empty (the
   AWS provider reads back every attribute it wrote; a missing one is a perpetual diff):
   - DefaultInstanceWarmup: CreateAutoScalingGroup and UpdateAutoScalingGroup store it (-1
     clears it) and DescribeAutoScalingGroups returns it; moto dropped it.
   - PutScalingPolicy stores Enabled (default true) and DescribePolicies returns it; moto
     dropped it. PredictiveScalingConfiguration is returned only when one was given (moto
     returned an empty one for every policy).
   - CreateLaunchTemplate: the request's TagSpecifications tag the launch template itself;
     moto also copied them into version 1's LaunchTemplateData, where they would tag the
     resources the template launches (DescribeLaunchTemplateVersions showed a
     `launch-template` entry no caller wrote).
   - DescribeSecurityGroupRules returns the Description of a rule that references a security
     group (moto returned it for CIDR rules only).
   - CreateAutoScalingGroup on an existing name is AlreadyExists (moto replaced the group),
     and DeleteAutoScalingGroup deletes the group's lifecycle hooks and scaling policies, as
     AWS does (moto kept them, so a new group of the same name inherited them).

7. EC2 Instance Connect (`nodes check --access instance-connect`).
   moto's SendSSHPublicKey accepts anything and keeps nothing. Here, as the API reference
   says: the instance must exist in the region (EC2InstanceNotFoundException) and be running
   (EC2InstanceStateInvalidException), the key must be an OpenSSH public key of a supported
   type (InvalidArgsException); the key is kept for 60 seconds. The node side of Instance
   Connect (sshd's AuthorizedKeysCommand reading the pushed keys from the instance metadata)
   is GET /_poolctl/instance-connect?instance_id=I&user=U: the keys still valid, one a line.
   EC2 Instance Connect Endpoints (`aws.node_access: instance-connect`; moto has none):
   CreateInstanceConnectEndpoint (the subnet must exist; create-complete at once),
   DescribeInstanceConnectEndpoints (by id; an unknown id is
   InvalidInstanceConnectEndpointId.NotFound) and DeleteInstanceConnectEndpoint.

6. Admin endpoints under /_poolctl/ (loopback only, no AWS equivalent):
   GET /_poolctl/health; GET|POST|DELETE /_poolctl/quotas (POST body
   {"quotas": {"L-417A185B": 384}, "region": "us-east-1"}, region optional = all regions);
   POST /_poolctl/quota-requests/<id> {"status": "APPROVED"} (APPROVED applies the value);
   GET /_poolctl/lifecycle-actions (open actions with tokens, and the log);
   POST /_poolctl/lifecycle-actions {"AutoScalingGroupName": optional,
   "LifecycleActionResult": "CONTINUE"} completes every open launch action, standing in for
   the nodes' boot scripts, which never run in the sandbox; it answers {"completed": [...]},
   each with the instance's LifecycleState afterwards (`poolctl sandbox boot-nodes` calls it).
   POST /_poolctl/faults {"action": "CreateLaunchTemplate", "delay_s": 20, "times": 1}
   holds back the answer to the next `times` calls of that API action by `delay_s` seconds
   AFTER moto performed them: a client that gives up meanwhile (Terraform interrupted) has
   created the resource without learning it, as with a connection lost on real AWS (the
   interrupt tests need it); GET lists the faults left and the actions whose answer is held
   back right now ("holding"), DELETE clears them.
   GET /_poolctl/boot: how nodes boot (section 8): the speedup, the registered start times,
   the nodes booting and their seconds left; POST {"speedup": 100} changes it (0: nodes
   boot only when told). POST /_poolctl/start-times {"region", "project", "pool",
   "start_seconds": {"cold": 440.5, "warm_stopped": 260.5, "warm_running": 30}} registers
   a pool's start times (`deploy --sandbox` sends its plan's).
   POST /_poolctl/snapshots {"name": "pool"} keeps a copy of everything the sandbox holds
   (every moto backend, the applied quotas, the registered start times); POST
   /_poolctl/snapshots/<name>/restore puts it back in about a second, resources and ids as
   they were, so a Terraform state written before the snapshot matches again (the test
   suite restores its deployed pool between groups of tests instead of deploying it anew);
   GET lists the names. A reset drops the snapshots (they point into the backends it
   replaces).
   moto's own POST /moto-api/reset also resets all of this (the speedup stays).

8. Self-booting nodes (`warm --wait`, `rollout`, `status` progress with nobody else acting).
   No boot script runs in the sandbox. With a speedup S > 0 (`poolctl sandbox start`:
   100 unless `--boot-speedup S` or `--manual-boot`), a thread in the server completes a
   node's open launch actions with CONTINUE once it has "booted" for its plan's start time
   / S: cold for a new instance (in the group or in the warm pool), warm_stopped or
   warm_running for one the group takes from its warm pool. The start times are the ones
   `deploy --sandbox` registered for the group's poolctl:project / poolctl:pool tags and
   region; else the group's DefaultInstanceWarmup (the stack's plan cold start) for every
   kind, else FALLBACK_START_S. The lifecycle log marks these "self-boot" with the kind and
   the seconds. Speedup 0 (the server's default, what the tests use): nodes wait until
   `poolctl sandbox boot-nodes` or CompleteLifecycleAction, as before.
"""

from __future__ import annotations

import copy
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

from poolctl import naming

T = TypeVar("T")

EXTENSIONS = (
    "autoscaling.instance-refresh",
    "autoscaling.warm-pool-instances",
    "autoscaling.lifecycle-actions",
    "service-quotas.ec2",
    "autoscaling.lifecycle-hook-specifications",
    "moto-fixes.launch-template-version",
    "moto-fixes.default-instance-warmup",
    "moto-fixes.scaling-policy-enabled",
    "moto-fixes.launch-template-tag-specifications",
    "moto-fixes.security-group-rule-description",
    "moto-fixes.group-create-delete",
    "admin-endpoints",
    "admin-endpoints.faults",
    "admin-endpoints.snapshots",
    "retried-attempts-answered-once",
    "ec2-instance-connect.send-ssh-public-key",
    "ec2.instance-connect-endpoints",
)

# One lock for everything below: moto's server is threaded and these extensions mutate
# groups, instances and refreshes across several moto backends in one go.
_LOCK = threading.RLock()

LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
_WARM_SETTLED = {
    "Stopped": "Warmed:Stopped",
    "Running": "Warmed:Running",
    "Hibernated": "Warmed:Hibernated",
}
_CAPACITY_STATES = {"InService", "Pending", "Pending:Wait", "Pending:Proceed"}
_ACTIVE_REFRESH = {"Pending", "InProgress", "Baking", "Cancelling", "RollbackInProgress"}
_REVERSIBLE = {"Pending", "InProgress", "Baking"}
# How many Describe steps a refresh waits for protected / standby instances ("Wait"
# preference; AWS waits one hour) before it fails.
WAIT_STEPS = 3
ASG_NAME_TAG = "aws:autoscaling:groupName"

_installed = False


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------
# Shared helpers


def _fault(code: str, message: str) -> Exception:
    from moto.autoscaling.exceptions import AutoscalingClientError

    err = AutoscalingClientError(code, message)
    return err


def _validation(message: str) -> Exception:
    return _fault("ValidationError", message)


def _group(backend: Any, name: str | None) -> Any:
    group = backend.autoscaling_groups.get(name or "")
    if group is None:
        raise _validation(f"AutoScalingGroup name not found - AutoScalingGroup '{name}' not found")
    return group


def _store(obj: Any, name: str, factory: Callable[[], T]) -> T:
    """Per-object state kept in the object's __dict__, so moto's reset drops it too."""
    if name not in obj.__dict__:
        obj.__dict__[name] = factory()
    value: T = obj.__dict__[name]
    return value


def _warm(group: Any) -> list[Any]:
    return _store(group, "_poolctl_warm", list)


def _refreshes(backend: Any) -> list[_Refresh]:
    return _store(backend, "_poolctl_refreshes", list)


def _lifecycle_log(backend: Any) -> list[dict[str, Any]]:
    return _store(backend, "_poolctl_lifecycle_log", list)


def _launch_hooks(backend: Any, group: Any) -> list[Any]:
    return [
        h
        for h in backend.lifecycle_hooks.values()
        if h.auto_scaling_group_name == group.name and h.lifecycle_transition == LAUNCHING
    ]


def _ec2_state(instance: Any) -> str:
    name: str = instance._state.name
    return name


def _resolve_template(ec2: Any, spec: dict[str, Any]) -> Any:
    try:
        if spec.get("LaunchTemplateId"):
            return ec2.get_launch_template(spec["LaunchTemplateId"])
        if spec.get("LaunchTemplateName"):
            return ec2.get_launch_template_by_name(spec["LaunchTemplateName"])
    except Exception as exc:  # moto raises KeyError or its own EC2 errors
        raise _validation(f"Launch template not found: {spec}") from exc
    raise _validation("A launch template needs LaunchTemplateId or LaunchTemplateName")


def _version_of(template: Any, version: str | None) -> Any:
    try:
        return template.get_version(version or "$Default")
    except Exception as exc:  # moto raises its own EC2 error for a missing version
        raise _validation(
            f"Launch template {template.id} has no version {version!r}"
        ) from exc


def _group_version(group: Any) -> Any | None:
    """The launch template version the group launches now, or None for a launch config."""
    if group.ec2_launch_template is None:
        return None
    return _version_of(group.ec2_launch_template, group.launch_template_version)


def _config_key(instance: Any) -> tuple[Any, ...] | None:
    lt = instance.__dict__.get("_poolctl_lt")
    if lt is not None:
        return ("lt", lt[0].id, lt[1])
    lc = instance.__dict__.get("_poolctl_lc")
    if lc is not None:
        return ("lc", lc)
    return None


def _target_key(group: Any, version: Any | None) -> tuple[Any, ...] | None:
    if version is not None:
        return ("lt", version.template.id, version.number)
    if group.launch_config is not None:
        return ("lc", group.launch_config.name)
    return None


def _run_instances(
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


def _terminate(backend: Any, instance_ids: list[str]) -> None:
    if not instance_ids:
        return
    backend.ec2_backend.terminate_instances(instance_ids)
    # Deregisters the targets, as moto's EC2 TerminateInstances response does.
    backend.elbv2_backend.notify_terminate_instances(instance_ids)


def _refresh_load_balancers(backend: Any, group: Any) -> None:
    if group.name in backend.autoscaling_groups:
        backend.update_attached_elbs(group.name)
        backend.update_attached_target_groups(group.name)


# --------------------------------------------------------------------------------------
# 3. Lifecycle actions


def _open_actions(backend: Any, group: Any, state: Any, hooks: list[Any],
                  kind: str = "cold") -> None:
    """Open the launch actions of a node starting up; `kind` (cold, warm_stopped,
    warm_running) is how it starts, which sets how long it boots by itself (section 8)."""
    deadline = time.monotonic()
    state._poolctl_boot = {"kind": kind, "since": deadline}
    _boot_wake.set()
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


def _new_group_state(backend: Any, group: Any, instance: Any) -> Any:
    from moto.autoscaling.models import InstanceState

    hooks = _launch_hooks(backend, group)
    state = InstanceState(
        instance,
        lifecycle_state="Pending:Wait" if hooks else "InService",
        protected_from_scale_in=group.new_instances_protected_from_scale_in,
        autoscaling_group=group,
    )
    if hooks:
        _open_actions(backend, group, state, hooks)
    return state


def _settle_warm(backend: Any, group: Any, state: Any) -> None:
    """Bring a warm instance to the pool's state (Warmed:Stopped means the instance stops)."""
    pool_state = group.warm_pool.pool_state if group.warm_pool else "Stopped"
    target = _WARM_SETTLED.get(pool_state, "Warmed:Stopped")
    state.lifecycle_state = target
    ec2_state = _ec2_state(state.instance)
    if target == "Warmed:Running" and ec2_state == "stopped":
        backend.ec2_backend.start_instances([state.instance.id])
    elif target != "Warmed:Running" and ec2_state == "running":
        backend.ec2_backend.stop_instances([state.instance.id])


def _finish_action(backend: Any, group: Any, state: Any, hook: str, result: str, how: str,
                   note: dict[str, Any] | None = None) -> None:
    actions = state.__dict__.get("_poolctl_actions") or {}
    action = actions.pop(hook, None)
    _lifecycle_log(backend).append(
        {
            "Time": _now().isoformat(),
            "AutoScalingGroupName": group.name,
            "LifecycleHookName": hook,
            "InstanceId": state.instance.id,
            "LifecycleActionToken": action["token"] if action else None,
            "LifecycleActionResult": result,
            "How": how,
            **(note or {}),
        }
    )
    warm = _warm(group)
    if result == "ABANDON":
        state._poolctl_actions = {}
        if state in warm:
            warm.remove(state)
            _terminate(backend, [state.instance.id])
            _reconcile_warm_pool(group)
        else:
            if state in group.instance_states:
                group.instance_states.remove(state)
            _terminate(backend, [state.instance.id])
            # AWS launches a replacement for an abandoned launch.
            group.set_desired_capacity(group.desired_capacity)
        return
    if actions:
        return  # other launch hooks still hold the instance
    if state in warm:
        _settle_warm(backend, group, state)
    else:
        state.lifecycle_state = "InService"
        _refresh_load_balancers(backend, group)


def _expire_actions(backend: Any) -> None:
    """Apply each hook's DefaultResult once its heartbeat timeout has passed (real time)."""
    now = time.monotonic()
    for group in list(backend.autoscaling_groups.values()):
        for state in list(group.instance_states) + list(_warm(group)):
            actions = state.__dict__.get("_poolctl_actions") or {}
            for hook, action in list(actions.items()):
                if action["deadline"] <= now:
                    _finish_action(backend, group, state, hook, action["default"], "timeout")


def _find_action(group: Any, hook: str, instance_id: str | None, token: str | None) -> Any:
    for state in list(group.instance_states) + list(_warm(group)):
        action = (state.__dict__.get("_poolctl_actions") or {}).get(hook)
        if action is None:
            continue
        if instance_id and state.instance.id == instance_id:
            return state
        if token and action["token"] == token:
            return state
    if instance_id:
        raise _validation(f"No active Lifecycle Action found with instance ID {instance_id}")
    raise _validation(f"No active Lifecycle Action found with token {token}")


def _complete_lifecycle_action(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    group_name = self._get_param("AutoScalingGroupName")
    hook = self._get_param("LifecycleHookName")
    result = str(self._get_param("LifecycleActionResult") or "").upper()
    instance_id = self._get_param("InstanceId")
    token = self._get_param("LifecycleActionToken")
    if result not in ("CONTINUE", "ABANDON"):
        raise _validation("LifecycleActionResult must be CONTINUE or ABANDON")
    if not instance_id and not token:
        raise _validation("Either LifecycleActionToken or InstanceId is required")
    backend = self.autoscaling_backend
    group = _group(backend, group_name)
    state = _find_action(group, hook, instance_id, token)
    _finish_action(backend, group, state, hook, result, "CompleteLifecycleAction")
    return EmptyResult()


def _record_lifecycle_action_heartbeat(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    backend = self.autoscaling_backend
    group = _group(backend, self._get_param("AutoScalingGroupName"))
    hook = self._get_param("LifecycleHookName")
    state = _find_action(
        group, hook, self._get_param("InstanceId"), self._get_param("LifecycleActionToken")
    )
    action = state._poolctl_actions[hook]
    action["deadline"] = time.monotonic() + action["timeout"]
    action["heartbeats"] += 1
    _lifecycle_log(backend).append(
        {
            "Time": _now().isoformat(),
            "AutoScalingGroupName": group.name,
            "LifecycleHookName": hook,
            "InstanceId": state.instance.id,
            "LifecycleActionToken": action["token"],
            "LifecycleActionResult": None,
            "How": "RecordLifecycleActionHeartbeat",
        }
    )
    return EmptyResult()


_TRANSITIONS = (LAUNCHING, "autoscaling:EC2_INSTANCE_TERMINATING")


def _hook_specs(raw: Any) -> list[dict[str, Any]]:
    """CreateAutoScalingGroup's LifecycleHookSpecificationList, checked per the reference."""
    specs: list[dict[str, Any]] = []
    for spec in raw or []:
        name, transition = spec.get("LifecycleHookName"), spec.get("LifecycleTransition")
        if not name or not transition:
            raise _validation(
                "A LifecycleHookSpecification needs LifecycleHookName and LifecycleTransition"
            )
        if transition not in _TRANSITIONS:
            raise _validation(
                f"Invalid LifecycleTransition {transition!r}: use {' or '.join(_TRANSITIONS)}"
            )
        result = str(spec.get("DefaultResult") or "ABANDON").upper()
        if result not in ("CONTINUE", "ABANDON"):
            raise _validation("DefaultResult must be CONTINUE or ABANDON")
        timeout = spec.get("HeartbeatTimeout")
        if timeout is not None and not 30 <= int(timeout) <= 7200:
            raise _validation("HeartbeatTimeout must be between 30 and 7200 seconds")
        if any(s["LifecycleHookName"] == name for s in specs):
            raise _validation(f"Lifecycle hook {name} is specified more than once")
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


def _instance_warmup(raw: Any) -> int | None:
    """DefaultInstanceWarmup as stored: -1 (the documented way to clear it) means none."""
    if raw is None or str(raw).strip() == "":
        return None
    value = int(raw)
    if value < -1:
        raise _validation("DefaultInstanceWarmup must be -1 or a number of seconds >= 0")
    return None if value == -1 else value


def _wrap_create_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    def create_auto_scaling_group(self: Any) -> Any:
        backend = self.autoscaling_backend
        name = self._get_param("AutoScalingGroupName")
        if name in backend.autoscaling_groups:
            raise _fault(
                "AlreadyExists",
                f"AutoScalingGroup by this name already exists - A group with the name {name} "
                "already exists",
            )
        specs = _hook_specs(self._get_param("LifecycleHookSpecificationList"))
        warmup = _instance_warmup(self._get_param("DefaultInstanceWarmup"))
        # The hooks exist before moto's constructor launches the first instances.
        _put_hooks(backend, name, specs)
        try:
            out = orig(self)
        except Exception:
            for spec in specs:
                backend.delete_lifecycle_hook(name, spec["LifecycleHookName"])
            raise
        backend.autoscaling_groups[name].default_instance_warmup = warmup
        return out

    return create_auto_scaling_group


def _wrap_update_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    def update_auto_scaling_group(self: Any) -> Any:
        raw = self._get_param("DefaultInstanceWarmup")
        warmup = _instance_warmup(raw)
        out = orig(self)
        group = self.autoscaling_backend.autoscaling_groups.get(
            self._get_param("AutoScalingGroupName")
        )
        if group is not None and raw is not None:
            group.default_instance_warmup = warmup
        return out

    return update_auto_scaling_group


# --------------------------------------------------------------------------------------
# 2. Warm pool instances


def warm_pool_target_size(
    min_size: int | None, max_prepared: int | None, max_size: int, desired: int
) -> int:
    """Warm pool size per the PutWarmPool reference (MaxGroupPreparedCapacity -1 = unset)."""
    base = max_size if max_prepared is None or int(max_prepared) < 0 else int(max_prepared)
    return max(int(min_size or 0), base - desired, 0)


def _reconcile_warm_pool(group: Any) -> None:
    backend = group.autoscaling_backend
    warm = _warm(group)
    warm[:] = [s for s in warm if _ec2_state(s.instance) not in ("terminated", "shutting-down")]
    wp = group.warm_pool
    target = (
        0
        if wp is None
        else warm_pool_target_size(
            wp.min_size, wp.max_group_prepared_capacity, group.max_size or 0,
            group.desired_capacity or 0,
        )
    )
    if len(warm) > target:
        extra = warm[target:]
        del warm[target:]
        _terminate(backend, [s.instance.id for s in extra])
    elif len(warm) < target:
        _launch_warm(group, target - len(warm), _group_version(group))
    for state in warm:
        if state.lifecycle_state in _WARM_SETTLED.values():
            _settle_warm(backend, group, state)


def _launch_warm(group: Any, count: int, version: Any | None) -> list[Any]:
    from moto.autoscaling.models import InstanceState

    backend = group.autoscaling_backend
    hooks = _launch_hooks(backend, group)
    states = []
    for instance in _run_instances(group, count, version):
        state = InstanceState(
            instance,
            lifecycle_state="Warmed:Pending:Wait" if hooks else "Warmed:Pending",
            autoscaling_group=group,
        )
        _warm(group).append(state)
        if hooks:
            _open_actions(backend, group, state, hooks)
        else:
            _settle_warm(backend, group, state)
        states.append(state)
    return states


def _take_from_warm_pool(group: Any, count: int) -> list[Any]:
    """Scale-out: move up to `count` warm instances into the group (settled ones first)."""
    warm = _warm(group)
    if count <= 0 or not warm:
        return []
    backend = group.autoscaling_backend
    ordered = sorted(warm, key=lambda s: s.lifecycle_state not in _WARM_SETTLED.values())
    moved = []
    for state in ordered[:count]:
        warm.remove(state)
        kind = "warm_stopped" if _ec2_state(state.instance) == "stopped" else "warm_running"
        if kind == "warm_stopped":
            backend.ec2_backend.start_instances([state.instance.id])
        hooks = _launch_hooks(backend, group)
        state.lifecycle_state = "Pending:Wait" if hooks else "InService"
        state.protected_from_scale_in = group.new_instances_protected_from_scale_in
        state._poolctl_actions = {}
        if hooks:
            _open_actions(backend, group, state, hooks, kind)
        group.instance_states.append(state)
        moved.append(state)
    return moved


def _instance_dict(state: Any) -> dict[str, Any]:
    out = {
        "InstanceId": state.instance.id,
        "InstanceType": state.instance.instance_type,
        "AvailabilityZone": state.instance.placement.zone,
        "LifecycleState": state.lifecycle_state,
        "HealthStatus": state.health_status,
        "ProtectedFromScaleIn": bool(state.protected_from_scale_in),
    }
    lt = state.launch_template
    if lt:
        out["LaunchTemplate"] = lt
    elif state.launch_configuration_name:
        out["LaunchConfigurationName"] = state.launch_configuration_name
    return out


def _describe_warm_pool(self: Any) -> Any:
    from moto.core.responses import ActionResult

    group = _group(self.autoscaling_backend, self._get_param("AutoScalingGroupName"))
    _reconcile_warm_pool(group)
    instances = [_instance_dict(s) for s in _warm(group)]
    start = int(self._get_param("NextToken") or 0)
    limit = int(self._get_param("MaxRecords") or 50)
    page = instances[start : start + limit]
    result: dict[str, Any] = {"WarmPoolConfiguration": group.warm_pool, "Instances": page}
    if start + limit < len(instances):
        result["NextToken"] = str(start + limit)
    return ActionResult(result)


# --------------------------------------------------------------------------------------
# 1. Instance refresh


class _Refresh:
    def __init__(self, group: Any, prefs: dict[str, Any], desired: dict[str, Any] | None,
                 strategy: str, target: Any | None, previous: dict[str, Any] | None) -> None:
        self.id = str(uuid.uuid4())
        self.group_name = group.name
        self.status = "Pending"
        self.status_reason = ""
        self.start_time = _now()
        self.end_time: datetime | None = None
        self.prefs = prefs
        self.desired = desired
        self.strategy = strategy
        self.target = target  # LaunchTemplateVersion, or None: the group's launch config
        self.previous = previous  # the group's LaunchTemplate spec at the start
        self.live_todo: list[str] = []
        self.warm_todo: list[str] = []
        self.live_total = 0
        self.warm_total = 0
        self.live_done = 0
        self.warm_done = 0
        self.launched: list[str] = []
        self.warm_launched: list[str] = []
        self.checkpoints: list[int] = list(prefs.get("CheckpointPercentages") or [])
        self.next_checkpoint = 0
        self.checkpoint_wait = False
        self.blocked_steps = 0
        self.partial_done = False
        self.rollback: dict[str, Any] | None = None

    # -- reporting --
    def _pct(self, done: int, total: int) -> int:
        return 100 if total == 0 else int(math.floor(100 * done / total))

    def to_dict(self, group: Any) -> dict[str, Any]:
        # A replacement counts as updated once it is InService (AWS: healthy and warmed up).
        launched = set(self.launched)
        pending = sum(
            1 for s in group.instance_states
            if s.instance.id in launched and s.lifecycle_state != "InService"
        ) if self.status in ("InProgress", "Baking") else 0
        live_done = self.live_done - pending
        total = self.live_total + self.warm_total
        updated = live_done + self.warm_done
        rolled = self.rollback["done"] if self.rollback else 0
        out: dict[str, Any] = {
            "InstanceRefreshId": self.id,
            "AutoScalingGroupName": self.group_name,
            "Status": self.status,
            "StartTime": self.start_time,
            "PercentageComplete": (
                self._pct(max(updated - rolled, 0), total) if total else
                (100 if self.status == "Successful" else 0)
            ),
            "InstancesToUpdate": total - updated,
            "ProgressDetails": {
                "LivePoolProgress": {
                    "PercentageComplete": self._pct(live_done, self.live_total),
                    "InstancesToUpdate": self.live_total - live_done,
                },
                "WarmPoolProgress": {
                    "PercentageComplete": self._pct(self.warm_done, self.warm_total),
                    "InstancesToUpdate": self.warm_total - self.warm_done,
                },
            },
            "Preferences": copy.deepcopy(self.prefs),
            "Strategy": self.strategy,
        }
        if self.status_reason:
            out["StatusReason"] = self.status_reason
        if self.end_time:
            out["EndTime"] = self.end_time
        if self.desired is not None:
            out["DesiredConfiguration"] = copy.deepcopy(self.desired)
        if self.rollback is not None:
            rb = self.rollback
            out["RollbackDetails"] = {
                "RollbackReason": rb["reason"],
                "RollbackStartTime": rb["start"],
                "PercentageCompleteOnRollback": self._pct(rb["done"], rb["total"]),
                "InstancesToUpdateOnRollback": rb["total"] - rb["done"],
            }
        return out


_PREF_DEFAULTS: dict[str, Any] = {
    "MinHealthyPercentage": 90,
    "SkipMatching": False,
    "AutoRollback": False,
    "ScaleInProtectedInstances": "Wait",
    "StandbyInstances": "Wait",
}


def _validate_prefs(prefs: dict[str, Any]) -> dict[str, Any]:
    p = dict(_PREF_DEFAULTS)
    p.update({k: v for k, v in prefs.items() if v is not None})
    minh = int(p["MinHealthyPercentage"])
    if not 0 <= minh <= 100:
        raise _validation("MinHealthyPercentage must be between 0 and 100")
    if "MaxHealthyPercentage" in p:
        if "MinHealthyPercentage" not in prefs:
            raise _validation(
                "MaxHealthyPercentage needs MinHealthyPercentage to be specified as well"
            )
        maxh = int(p["MaxHealthyPercentage"])
        if not 100 <= maxh <= 200:
            raise _validation("MaxHealthyPercentage must be between 100 and 200")
        if maxh - minh > 100:
            raise _validation(
                "The difference between MaxHealthyPercentage and MinHealthyPercentage "
                "cannot be greater than 100"
            )
    cps = p.get("CheckpointPercentages")
    if cps:
        cps = [int(c) for c in cps]
        if any(not 1 <= c <= 100 for c in cps) or cps != sorted(set(cps)):
            raise _validation(
                "CheckpointPercentages must be unique values between 1 and 100 in ascending order"
            )
        p["CheckpointPercentages"] = cps
        p.setdefault("CheckpointDelay", 3600)
    elif "CheckpointDelay" in p:
        raise _validation("CheckpointDelay needs CheckpointPercentages")
    for key, allowed in (
        ("ScaleInProtectedInstances", ("Refresh", "Ignore", "Wait")),
        ("StandbyInstances", ("Terminate", "Ignore", "Wait")),
    ):
        if p[key] not in allowed:
            raise _validation(f"{key} must be one of {', '.join(allowed)}")
    return p


def _is_floating(version: str | None) -> bool:
    return version is None or str(version).lower() in ("$latest", "$default")


def _reversible(r: _Refresh) -> str | None:
    """Why a rollback is impossible (the RollbackInstanceRefresh reference), or None."""
    if r.desired is None:
        return "there is no desired configuration specified for the instance refresh"
    lt = (r.desired or {}).get("LaunchTemplate") or {}
    if _is_floating(lt.get("Version")) or r.previous is None or _is_floating(
        r.previous.get("Version")
    ):
        return "the Auto Scaling group uses the launch template's $Latest or $Default version"
    return None


def _start_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = _group(backend, self._get_param("AutoScalingGroupName"))
    strategy = self._get_param("Strategy") or "Rolling"
    if strategy != "Rolling":
        raise _validation(f"Strategy {strategy} is not supported by the sandbox; use Rolling")
    if any(r.group_name == group.name and r.status in _ACTIVE_REFRESH for r in _refreshes(backend)):
        raise _fault(
            "InstanceRefreshInProgress",
            "An Instance Refresh is already in progress and blocks the execution of this "
            "Instance Refresh.",
        )
    prefs = _validate_prefs(dict(self._get_param("Preferences") or {}))
    desired = self._get_param("DesiredConfiguration") or None
    target = _group_version(group)
    if desired:
        spec = desired.get("LaunchTemplate")
        if not spec and desired.get("MixedInstancesPolicy"):
            spec = desired["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
        if not spec:
            raise _validation("DesiredConfiguration needs a LaunchTemplate")
        template = _resolve_template(backend.ec2_backend, spec)
        target = _version_of(template, spec.get("Version"))
    previous = None
    if group.ec2_launch_template is not None:
        previous = {
            "LaunchTemplateId": group.ec2_launch_template.id,
            "LaunchTemplateName": group.ec2_launch_template.name,
            "Version": group.provided_launch_template_version,
        }
    r = _Refresh(group, prefs, desired, strategy, target, previous)
    if prefs.get("AutoRollback"):
        why = _reversible(r)
        if why:
            raise _validation(f"AutoRollback is not supported because {why}")
    target_key = _target_key(group, target)
    for state in group.instance_states:
        if prefs["SkipMatching"] and _config_key(state.instance) == target_key:
            continue
        if state.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Ignore":
            continue
        if state.protected_from_scale_in and prefs["ScaleInProtectedInstances"] == "Ignore":
            continue
        r.live_todo.append(state.instance.id)
    for state in _warm(group):
        if prefs["SkipMatching"] and _config_key(state.instance) == target_key:
            continue
        r.warm_todo.append(state.instance.id)
    r.live_total, r.warm_total = len(r.live_todo), len(r.warm_todo)
    _refreshes(backend).append(r)
    return ActionResult({"InstanceRefreshId": r.id})


def _batch_size(r: _Refresh, group: Any) -> int:
    desired = group.desired_capacity or len(group.instance_states) or 1
    minh = int(r.prefs["MinHealthyPercentage"])
    maxh = int(r.prefs.get("MaxHealthyPercentage", 100))
    return max(1, math.floor(desired * maxh / 100) - math.ceil(desired * minh / 100))


def _replace(backend: Any, group: Any, old: Any, version: Any | None) -> Any:
    """Terminate one group instance and launch its replacement; returns the new state."""
    group.instance_states.remove(old)
    _terminate(backend, [old.instance.id])
    new = _new_group_state(backend, group, _run_instances(group, 1, version)[0])
    group.instance_states.append(new)
    return new


def _fail(backend: Any, group: Any, r: _Refresh, reason: str) -> None:
    if r.prefs.get("AutoRollback") and not _reversible(r):
        _begin_rollback(group, r, f"Instance refresh failed: {reason}")
        return
    r.status, r.status_reason, r.end_time = "Failed", reason, _now()


def _begin_rollback(group: Any, r: _Refresh, reason: str) -> None:
    live = {s.instance.id for s in group.instance_states}
    warm = {s.instance.id for s in _warm(group)}
    todo = [i for i in r.launched if i in live] + [i for i in r.warm_launched if i in warm]
    r.rollback = {"reason": reason, "start": _now(), "todo": todo, "total": len(todo), "done": 0}
    r.status, r.status_reason = "RollbackInProgress", reason
    r.checkpoint_wait = False


def _step_in_progress(backend: Any, group: Any, r: _Refresh) -> None:
    by_id = {s.instance.id: s for s in group.instance_states}
    launched = [by_id[i] for i in r.launched if i in by_id]
    sick = [s.instance.id for s in launched if s.health_status == "Unhealthy"]
    if sick:
        _fail(backend, group, r, f"Replacement instance(s) failed health checks: {', '.join(sick)}")
        return
    waiting = [s.instance.id for s in launched if s.lifecycle_state != "InService"]
    if waiting:
        r.status_reason = (
            f"Waiting for replacement instance(s) to enter InService: {', '.join(waiting)}"
        )
        return
    if r.checkpoint_wait:
        r.checkpoint_wait, r.status_reason = False, ""
        return
    if not r.partial_done:
        gone = [i for i in r.live_todo if i not in by_id]
        for i in gone:
            r.live_todo.remove(i)
            r.live_done += 1
        if r.live_todo:
            _replace_live_batch(backend, group, r, by_id)
            return
    if r.warm_todo and not r.partial_done:
        version = r.target if r.target is not None else _group_version(group)
        warm = _warm(group)
        ids = set(r.warm_todo)
        for state in [s for s in warm if s.instance.id in ids]:
            warm.remove(state)
            _terminate(backend, [state.instance.id])
        r.warm_done += len(r.warm_todo)
        r.warm_todo = []
        for state in _launch_warm(group, r.warm_total, version):
            r.warm_launched.append(state.instance.id)
        _reconcile_warm_pool(group)
        r.status_reason = "Replaced the warm pool's instances"
        return
    if int(r.prefs.get("BakeTime") or 0) > 0 and r.status != "Baking":
        r.status, r.status_reason = "Baking", f"Waiting BakeTime of {r.prefs['BakeTime']} seconds"
        return
    _succeed(group, r)


def _replace_live_batch(backend: Any, group: Any, r: _Refresh, by_id: dict[str, Any]) -> None:
    prefs = r.prefs
    eligible, blocked = [], []
    for iid in r.live_todo:
        state = by_id[iid]
        if state.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Wait":
            blocked.append(iid)
        elif state.protected_from_scale_in and prefs["ScaleInProtectedInstances"] == "Wait":
            blocked.append(iid)
        else:
            eligible.append(iid)
    if not eligible:
        r.blocked_steps += 1
        reason = (
            f"Waiting for instance(s) {', '.join(blocked)} to lose scale-in protection or "
            "leave Standby"
        )
        if r.blocked_steps > WAIT_STEPS:
            _fail(backend, group, r, reason.replace("Waiting for", "Gave up waiting for"))
        else:
            r.status_reason = reason
        return
    r.blocked_steps = 0
    batch = _batch_size(r, group)
    if r.next_checkpoint < len(r.checkpoints):
        cp = r.checkpoints[r.next_checkpoint]
        room = math.ceil(r.live_total * cp / 100) - r.live_done
        batch = max(1, min(batch, room))
    version = r.target if r.target is not None else _group_version(group)
    for iid in eligible[:batch]:
        old = by_id[iid]
        r.live_todo.remove(iid)
        r.live_done += 1
        if old.lifecycle_state == "Standby" and prefs["StandbyInstances"] == "Terminate":
            group.instance_states.remove(old)
            _terminate(backend, [iid])
            continue
        new = _replace(backend, group, old, version)
        r.launched.append(new.instance.id)
    _refresh_load_balancers(backend, group)
    r.status_reason = ""
    reached = None
    while r.next_checkpoint < len(r.checkpoints) and r.live_done >= math.ceil(
        r.live_total * r.checkpoints[r.next_checkpoint] / 100
    ):
        reached = r.checkpoints[r.next_checkpoint]
        r.next_checkpoint += 1
    if reached is None:
        return
    if r.next_checkpoint == len(r.checkpoints) and reached < 100:
        r.partial_done = True
        r.status_reason = f"Reached the last checkpoint ({reached}%): a partial instance refresh"
    elif reached < 100:
        r.checkpoint_wait = True
        r.status_reason = (
            f"Checkpoint {reached}% reached: waiting CheckpointDelay of "
            f"{r.prefs['CheckpointDelay']} seconds (one Describe step in the sandbox)"
        )


def _succeed(group: Any, r: _Refresh) -> None:
    if r.desired and r.target is not None:
        spec = r.desired.get("LaunchTemplate") or {}
        group.ec2_launch_template = r.target.template
        group.launch_template_version = spec.get("Version") or "$Default"
        group.provided_launch_template_version = spec.get("Version")
    r.status, r.status_reason, r.end_time = "Successful", "", _now()


def _step_rollback(backend: Any, group: Any, r: _Refresh) -> None:
    rb = r.rollback
    assert rb is not None
    by_id = {s.instance.id: s for s in group.instance_states}
    warm_ids = {s.instance.id for s in _warm(group)}
    for i in [i for i in rb["todo"] if i not in by_id and i not in warm_ids]:
        rb["todo"].remove(i)
        rb["done"] += 1
    live = [i for i in rb["todo"] if i in by_id]
    previous = _group_version(group)  # the desired configuration was never applied
    if live:
        for iid in live[: _batch_size(r, group)]:
            _replace(backend, group, by_id[iid], previous)
            rb["todo"].remove(iid)
            rb["done"] += 1
        _refresh_load_balancers(backend, group)
        return
    if rb["todo"]:
        warm = _warm(group)
        for state in [s for s in warm if s.instance.id in set(rb["todo"])]:
            warm.remove(state)
            _terminate(backend, [state.instance.id])
        rb["done"] += len(rb["todo"])
        rb["todo"] = []
        _reconcile_warm_pool(group)
        return
    r.status, r.status_reason, r.end_time = "RollbackSuccessful", rb["reason"], _now()


def _step(backend: Any, group: Any, r: _Refresh) -> None:
    if r.status == "Pending":
        r.status = "InProgress"
    elif r.status in ("InProgress", "Baking"):
        if r.status == "Baking":
            _succeed(group, r)
        else:
            _step_in_progress(backend, group, r)
    elif r.status == "Cancelling":
        r.status, r.end_time = "Cancelled", _now()
        r.status_reason = r.status_reason or "Cancelled by user"
    elif r.status == "RollbackInProgress":
        _step_rollback(backend, group, r)


def _describe_instance_refreshes(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = _group(backend, self._get_param("AutoScalingGroupName"))
    ids = self._get_param("InstanceRefreshIds") or []
    mine = [r for r in _refreshes(backend) if r.group_name == group.name]
    listed = [r for r in reversed(mine) if not ids or r.id in ids]
    start = int(self._get_param("NextToken") or 0)
    limit = int(self._get_param("MaxRecords") or 50)
    page = [r.to_dict(group) for r in listed[start : start + limit]]
    result: dict[str, Any] = {"InstanceRefreshes": page}
    if start + limit < len(listed):
        result["NextToken"] = str(start + limit)
    # The sandbox clock: the observation above, then one step of progress.
    for r in mine:
        if r.status in _ACTIVE_REFRESH:
            _step(backend, group, r)
    return ActionResult(result)


def _active(backend: Any, group: Any) -> _Refresh:
    for r in _refreshes(backend):
        if r.group_name == group.name and r.status in _ACTIVE_REFRESH:
            return r
    raise _fault(
        "ActiveInstanceRefreshNotFound",
        f"No in progress or pending Instance Refresh found for Auto Scaling group {group.name}",
    )


def _cancel_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = _group(backend, self._get_param("AutoScalingGroupName"))
    r = _active(backend, group)
    if r.status != "Cancelling":
        r.status, r.status_reason = "Cancelling", "Cancellation requested by user"
        r.checkpoint_wait = False
    return ActionResult({"InstanceRefreshId": r.id})


def _rollback_instance_refresh(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = _group(backend, self._get_param("AutoScalingGroupName"))
    r = _active(backend, group)
    if r.status not in _REVERSIBLE:
        raise _fault(
            "ActiveInstanceRefreshNotFound",
            f"No in progress or pending Instance Refresh found for Auto Scaling group {group.name}",
        )
    why = _reversible(r)
    if why:
        raise _fault("IrreversibleInstanceRefresh", f"Rollback is not supported because {why}")
    _begin_rollback(group, r, "Rollback requested by user")
    return ActionResult({"InstanceRefreshId": r.id})


# --------------------------------------------------------------------------------------
# 4. Service Quotas for ec2

EC2_QUOTAS: dict[str, dict[str, Any]] = {
    "L-1216C47A": {
        "QuotaName": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
        "Class": "Standard/OnDemand",
        "Default": 5.0,
    },
    "L-DB2E81BA": {
        "QuotaName": "Running On-Demand G and VT instances",
        "Class": "G/OnDemand",
        "Default": 0.0,
    },
    "L-417A185B": {
        "QuotaName": "Running On-Demand P instances",
        "Class": "P/OnDemand",
        "Default": 0.0,
    },
}
_OPEN_REQUEST = ("PENDING", "CASE_OPENED")
_REQUEST_STATUSES = (
    "PENDING", "CASE_OPENED", "APPROVED", "DENIED", "CASE_CLOSED", "NOT_APPROVED",
    "INVALID_REQUEST",
)


def _env_quotas() -> dict[str, float]:
    raw = os.environ.get("POOLCTL_SANDBOX_QUOTAS", "").strip()
    if not raw:
        return {}
    values = json.loads(raw)
    return {str(k): float(v) for k, v in values.items()}


# Applied quota values: {region or "*": {quota code: value}}; "*" applies to every region.
_quota_values: dict[str, dict[str, float]] = {}


# What the sandbox grants at start-up unless POOLCTL_SANDBOX_QUOTAS says otherwise: enough
# for the examples' peaks (llama-70b-p5: (6 + 1) x 192 = 1344 P vCPUs) with room for `warm`,
# so a first `deploy --sandbox` passes its quota check. AWS's own defaults (0 for G and P,
# GetAWSDefaultServiceQuota) stay in EC2_QUOTAS.
SANDBOX_GRANTS: dict[str, float] = {"L-417A185B": 2304.0, "L-DB2E81BA": 2304.0}


def reset_quotas() -> None:
    _quota_values.clear()
    _quota_values["*"] = {**SANDBOX_GRANTS, **_env_quotas()}


def set_quotas(values: dict[str, Any], region: str | None = None) -> None:
    for code, value in values.items():
        if code not in EC2_QUOTAS:
            raise ValueError(f"unknown ec2 quota code {code!r}: known {', '.join(EC2_QUOTAS)}")
        _quota_values.setdefault(region or "*", {})[code] = float(value)


def applied_quota(region: str, code: str) -> float:
    for scope in (region, "*"):
        if code in _quota_values.get(scope, {}):
            return _quota_values[scope][code]
    return float(EC2_QUOTAS[code]["Default"])


def _quota_error(kind: str, message: str) -> Exception:
    from moto.core.exceptions import JsonRESTError

    return JsonRESTError(kind, message)


def _no_such_quota(code: str) -> Exception:
    return _quota_error(
        "NoSuchResourceException", f"The request failed because the specified quota {code} "
        "does not exist."
    )


def _ec2_quota(backend: Any, code: str, value: float) -> dict[str, Any]:
    info = EC2_QUOTAS[code]
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{backend.region_name}:{backend.account_id}:ec2/{code}",
        "QuotaCode": code,
        "QuotaName": info["QuotaName"],
        "Value": value,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
        "UsageMetric": {
            "MetricNamespace": "AWS/Usage",
            "MetricName": "ResourceCount",
            "MetricDimensions": {
                "Class": info["Class"], "Resource": "vCPU", "Service": "EC2", "Type": "Resource",
            },
            "MetricStatisticRecommendation": "Maximum",
        },
        "QuotaAppliedAtLevel": "ACCOUNT",
        "Description": f"Maximum number of vCPUs assigned to the {info['QuotaName']}.",
    }


def _applied_list(backend: Any, service: str) -> list[dict[str, Any]]:
    if service == "ec2":
        return [_ec2_quota(backend, c, applied_quota(backend.region_name, c)) for c in EC2_QUOTAS]
    return list(backend.list_aws_default_service_quotas(service))


def _sq_params(self: Any) -> dict[str, Any]:
    params: dict[str, Any] = json.loads(self.body or "{}")
    return params


def _sq_get_service_quota(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service == "ec2":
        if code not in EC2_QUOTAS:
            raise _no_such_quota(code)
        quota = _ec2_quota(self.backend, code, applied_quota(self.region, code))
    else:
        quota = self.backend.get_service_quota(service_code=service, quota_code=code)
    return json.dumps({"Quota": quota})


def _sq_get_aws_default_service_quota(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service == "ec2":
        if code not in EC2_QUOTAS:
            raise _no_such_quota(code)
        quota = _ec2_quota(self.backend, code, float(EC2_QUOTAS[code]["Default"]))
    else:
        quota = self.backend.get_service_quota(service_code=service, quota_code=code)
    return json.dumps({"Quota": quota})


def _sq_list_aws_default_service_quotas(self: Any) -> str:
    p = _sq_params(self)
    service = str(p.get("ServiceCode"))
    if service == "ec2":
        quotas = [
            _ec2_quota(self.backend, c, float(EC2_QUOTAS[c]["Default"])) for c in EC2_QUOTAS
        ]
    else:
        quotas = self.backend.list_aws_default_service_quotas(service)
    return json.dumps({"Quotas": quotas})


def _sq_list_service_quotas(self: Any) -> str:
    p = _sq_params(self)
    quotas = _applied_list(self.backend, str(p.get("ServiceCode")))
    if p.get("QuotaCode"):
        quotas = [q for q in quotas if q["QuotaCode"] == p["QuotaCode"]]
    return json.dumps({"Quotas": quotas})


def _quota_requests(backend: Any) -> list[dict[str, Any]]:
    return _store(backend, "_poolctl_quota_requests", list)


def _sq_request_service_quota_increase(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service != "ec2" or code not in EC2_QUOTAS:
        raise _no_such_quota(code)
    try:
        desired = float(p["DesiredValue"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _quota_error("IllegalArgumentException", "DesiredValue must be a number") from exc
    current = applied_quota(self.region, code)
    if desired <= current:
        raise _quota_error(
            "IllegalArgumentException",
            f"Invalid input: the desired value {desired:g} must be greater than the current "
            f"value {current:g}.",
        )
    requests = _quota_requests(self.backend)
    if any(
        r["ServiceCode"] == service and r["QuotaCode"] == code and r["Status"] in _OPEN_REQUEST
        for r in requests
    ):
        raise _quota_error(
            "ResourceAlreadyExistsException",
            f"A quota increase request for {service}/{code} is already open.",
        )
    stamp = time.time()
    quota = _ec2_quota(self.backend, code, current)
    request = {
        "Id": uuid.uuid4().hex,
        "ServiceCode": service,
        "ServiceName": quota["ServiceName"],
        "QuotaCode": code,
        "QuotaName": quota["QuotaName"],
        "DesiredValue": desired,
        "Status": "PENDING",
        "Created": stamp,
        "LastUpdated": stamp,
        "Requester": json.dumps(
            {"accountId": self.backend.account_id,
             "callerArn": f"arn:aws:iam::{self.backend.account_id}:root"}
        ),
        "QuotaArn": quota["QuotaArn"],
        "GlobalQuota": False,
        "Unit": "None",
        "QuotaRequestedAtLevel": "ACCOUNT",
    }
    requests.append(request)
    return json.dumps({"RequestedQuota": request})


def _filter_requests(self: Any, by_quota: bool) -> str:
    p = _sq_params(self)
    out = list(_quota_requests(self.backend))
    if p.get("ServiceCode"):
        out = [r for r in out if r["ServiceCode"] == p["ServiceCode"]]
    if by_quota:
        out = [r for r in out if r["QuotaCode"] == p.get("QuotaCode")]
    if p.get("Status"):
        out = [r for r in out if r["Status"] == p["Status"]]
    return json.dumps({"RequestedQuotas": out})


def _sq_list_history(self: Any) -> str:
    return _filter_requests(self, by_quota=False)


def _sq_list_history_by_quota(self: Any) -> str:
    return _filter_requests(self, by_quota=True)


def _sq_get_requested_change(self: Any) -> str:
    request_id = _sq_params(self).get("RequestId")
    for r in _quota_requests(self.backend):
        if r["Id"] == request_id:
            return json.dumps({"RequestedQuota": r})
    raise _quota_error(
        "NoSuchResourceException", f"The request {request_id} does not exist."
    )


def _all_backends(backend_dict: Any) -> Iterable[Any]:
    for account_backends in list(backend_dict.values()):
        yield from list(account_backends.values())


def set_request_status(request_id: str, status: str) -> dict[str, Any]:
    from moto.servicequotas.models import servicequotas_backends

    if status not in _REQUEST_STATUSES:
        raise ValueError(f"status must be one of {', '.join(_REQUEST_STATUSES)}")
    for backend in _all_backends(servicequotas_backends):
        for r in _quota_requests(backend):
            if r["Id"] == request_id:
                r["Status"], r["LastUpdated"] = status, time.time()
                if status == "APPROVED":
                    set_quotas({r["QuotaCode"]: r["DesiredValue"]}, backend.region_name)
                return r
    raise KeyError(request_id)


def complete_open_actions(group_name: str | None, result: str) -> list[dict[str, str]]:
    """Complete every open launch action (of one group, or all): what the nodes' boot
    scripts would do, for sandbox runs where no boot script runs."""
    from moto.autoscaling.models import autoscaling_backends

    if result not in ("CONTINUE", "ABANDON"):
        raise ValueError("LifecycleActionResult must be CONTINUE or ABANDON")
    done = []
    with _LOCK:
        for backend in _all_backends(autoscaling_backends):
            for group in list(backend.autoscaling_groups.values()):
                if group_name and group.name != group_name:
                    continue
                for state in list(group.instance_states) + list(_warm(group)):
                    for hook in list(state.__dict__.get("_poolctl_actions") or {}):
                        if hook not in (state.__dict__.get("_poolctl_actions") or {}):
                            continue  # an earlier ABANDON already ended the instance
                        _finish_action(backend, group, state, hook, result, "admin endpoint")
                        kept = state in group.instance_states or state in _warm(group)
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
    from moto.autoscaling.models import autoscaling_backends

    open_actions, log = [], []
    with _LOCK:
        for backend in _all_backends(autoscaling_backends):
            log.extend(_lifecycle_log(backend))
            for group in backend.autoscaling_groups.values():
                for state in list(group.instance_states) + list(_warm(group)):
                    for hook, action in (state.__dict__.get("_poolctl_actions") or {}).items():
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


# --------------------------------------------------------------------------------------
# 5. Fixes to moto (the group create/delete and DefaultInstanceWarmup ones are in section 3)


def _wrap_create_launch_template_version(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Parse UserData of a new version the way CreateLaunchTemplate does (base64 checked)."""

    def create_launch_template_version(self: Any) -> Any:
        from moto.ec2.utils import parse_user_data

        orig_get = self._get_param

        def get_param(name: str, *args: Any, **kwargs: Any) -> Any:
            value = orig_get(name, *args, **kwargs)
            if name == "LaunchTemplateData" and isinstance(value, dict) and (
                    "UserData" in value):
                value = {**value, "UserData": parse_user_data(value["UserData"])}
            return value

        self._get_param = get_param
        try:
            return orig(self)
        finally:
            del self._get_param

    return create_launch_template_version


def _wrap_put_scaling_policy(orig: Callable[..., Any]) -> Callable[..., Any]:
    def put_scaling_policy(self: Any) -> Any:
        out = orig(self)
        policy = self.autoscaling_backend.policies.get(self._get_param("PolicyName"))
        if policy is not None:
            policy.enabled = self._get_bool_param("Enabled", True)
            if not self._get_param("PredictiveScalingConfiguration"):
                policy.predictive_scaling_configuration = None
        return out

    return put_scaling_policy


def _wrap_create_launch_template(orig: Callable[..., Any]) -> Callable[..., Any]:
    def create_launch_template(self: Any) -> Any:
        # Read before moto's handler, which appends the template's own tags to this list.
        given = copy.deepcopy(
            (self._get_param("LaunchTemplateData") or {}).get("TagSpecifications")
        )
        out = orig(self)
        template = self.ec2_backend.get_launch_template_by_name(
            self._get_param("LaunchTemplateName")
        )
        data = template.versions[0].data
        if given:
            data["TagSpecifications"] = given
        else:
            data.pop("TagSpecifications", None)
        return out

    return create_launch_template


def _rule_description(self: Any) -> str | None:
    return self.ip_range.get("Description") or (self.source_group or {}).get("Description")


def _delete_group_children(backend: Any, group_name: str) -> None:
    for key, hook in list(backend.lifecycle_hooks.items()):
        if hook.auto_scaling_group_name == group_name:
            del backend.lifecycle_hooks[key]
    for key, policy in list(backend.policies.items()):
        if policy.auto_scaling_group_name == group_name:
            del backend.policies[key]


# --------------------------------------------------------------------------------------
# 7. EC2 Instance Connect

EIC_KEY_TTL_S = 60.0
_EIC_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521")
# (instance id, OS user) -> [(public key line, expiry as time.time())]
_eic_keys: dict[tuple[str, str], list[tuple[str, float]]] = {}


def _eic_error(code: str, message: str) -> Exception:
    from moto.core.exceptions import JsonRESTError

    return JsonRESTError(code, message)


def _send_ssh_public_key(self: Any) -> str:
    from moto.ec2.models import ec2_backends

    body = json.loads(self.body or "{}")
    instance_id = str(body.get("InstanceId", ""))
    user = str(body.get("InstanceOSUser", ""))
    key = str(body.get("SSHPublicKey", "")).strip()
    if key.split(" ", 1)[0] not in _EIC_KEY_TYPES or len(key.split()) < 2:
        raise _eic_error("InvalidArgsException", "The SSH public key is not a supported "
                         "OpenSSH public key (ssh-ed25519, ssh-rsa, ecdsa-sha2-*)")
    ec2 = ec2_backends[self.current_account][self.region]
    try:
        instance = ec2.get_instance(instance_id)
    except Exception:
        raise _eic_error("EC2InstanceNotFoundException",
                         f"Instance {instance_id} not found in {self.region}") from None
    if instance.state != "running":
        raise _eic_error("EC2InstanceStateInvalidException",
                         f"Instance {instance_id} is {instance.state}, not running")
    now = time.time()
    with _LOCK:
        kept = [(k, t) for k, t in _eic_keys.get((instance_id, user), []) if t > now]
        _eic_keys[(instance_id, user)] = [*kept, (key, now + EIC_KEY_TTL_S)]
    return json.dumps({"RequestId": str(uuid.uuid4()), "Success": True})


def _eic_endpoints(backend: Any) -> dict[str, dict[str, Any]]:
    return _store(backend, "_poolctl_eic_endpoints", dict)


def _eic_endpoint_missing(endpoint_id: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError("InvalidInstanceConnectEndpointId.NotFound",
                          f"The instance connect endpoint ID '{endpoint_id}' does not exist")


def _create_instance_connect_endpoint(self: Any) -> Any:
    from moto.core.responses import ActionResult
    from moto.ec2.utils import add_tag_specification

    subnet = self.ec2_backend.get_subnet(self._get_param("SubnetId"))
    endpoint_id = f"eice-{uuid.uuid4().hex[:17]}"
    region, account = self.region, self.current_account
    endpoint = {
        "OwnerId": account, "InstanceConnectEndpointId": endpoint_id,
        "InstanceConnectEndpointArn":
            f"arn:aws:ec2:{region}:{account}:instance-connect-endpoint/{endpoint_id}",
        "State": "create-complete", "StateMessage": "",
        "DnsName": f"{endpoint_id}.{account}.ec2-instance-connect-endpoint.{region}"
                   ".amazonaws.com",
        "NetworkInterfaceIds": [], "VpcId": subnet.vpc_id,
        "AvailabilityZone": subnet.availability_zone, "CreatedAt": _now(),
        "SubnetId": subnet.id,
        "PreserveClientIp": self._get_bool_param("PreserveClientIp", if_none=False),
        "SecurityGroupIds": self._get_param("SecurityGroupIds", []),
        "IpAddressType": "ipv4",
        "Tags": [{"Key": k, "Value": v} for k, v in add_tag_specification(
            self._get_param("TagSpecifications", [])).items()],
    }
    with _LOCK:
        _eic_endpoints(self.ec2_backend)[endpoint_id] = endpoint
    return ActionResult({"InstanceConnectEndpoint": endpoint})


def _describe_instance_connect_endpoints(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ids = self._get_param("InstanceConnectEndpointIds", [])
    with _LOCK:
        known = _eic_endpoints(self.ec2_backend)
        for endpoint_id in ids:
            if endpoint_id not in known:
                raise _eic_endpoint_missing(endpoint_id)
        found = [e for i, e in known.items() if not ids or i in ids]
    return ActionResult({"InstanceConnectEndpoints": found})


def _delete_instance_connect_endpoint(self: Any) -> Any:
    from moto.core.responses import ActionResult

    endpoint_id = self._get_param("InstanceConnectEndpointId")
    with _LOCK:
        endpoint = _eic_endpoints(self.ec2_backend).pop(endpoint_id, None)
    if endpoint is None:
        raise _eic_endpoint_missing(endpoint_id)
    return ActionResult({"InstanceConnectEndpoint": {**endpoint, "State": "delete-complete"}})


def instance_connect_keys(instance_id: str, user: str) -> list[str]:
    now = time.time()
    with _LOCK:
        return [k for k, t in _eic_keys.get((instance_id, user), []) if t > now]


# --------------------------------------------------------------------------------------
# 8. Self-booting nodes

BOOT_KINDS = ("cold", "warm_stopped", "warm_running")
# A group no start times were registered for (made without `deploy --sandbox`) boots in its
# DefaultInstanceWarmup, where the AWS stack puts the plan's cold start, else in this.
FALLBACK_START_S = 300.0
# speedup 0: nodes wait for `sandbox boot-nodes` (the tests' default, they pick the moment).
_boot: dict[str, float] = {"speedup": 0.0}
# (region, project, pool) -> {kind: seconds}, the plan's start times `deploy --sandbox` sent.
_start_times: dict[tuple[str, str, str], dict[str, float]] = {}
_boot_wake = threading.Event()


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
    with _LOCK:
        _boot["speedup"] = value
    _boot_wake.set()  # nodes already waiting are due now, or later
    return value


def register_start_times(region: str, project: str, pool: str, seconds: dict[str, Any]) -> None:
    unknown = set(seconds) - set(BOOT_KINDS)
    if "cold" not in seconds or unknown:
        raise ValueError(f"start_seconds needs cold and only {', '.join(BOOT_KINDS)}")
    values = {k: float(v) for k, v in seconds.items()}
    if not all(math.isfinite(v) and v >= 0 for v in values.values()):
        raise ValueError("start_seconds values must be finite numbers >= 0")
    with _LOCK:
        _start_times[(str(region), str(project), str(pool))] = values
    _boot_wake.set()


def _group_start_seconds(backend: Any, group: Any) -> dict[str, float]:
    tags = {t["Key"]: t["Value"] for t in group.tags}
    key = (backend.region_name, tags.get(naming.TAG_PROJECT, ""), tags.get(naming.TAG_POOL, ""))
    found = _start_times.get(key)
    if found:
        return found
    return {"cold": float(group.__dict__.get("default_instance_warmup") or FALLBACK_START_S)}


def _booting() -> Iterable[tuple[Any, Any, Any, dict[str, Any], float]]:
    """(backend, group, state, boot, delay) of every node waiting on its launch actions."""
    from moto.autoscaling.models import autoscaling_backends

    for backend in _all_backends(autoscaling_backends):
        for group in list(backend.autoscaling_groups.values()):
            for state in list(group.instance_states) + list(_warm(group)):
                boot = state.__dict__.get("_poolctl_boot")
                if not boot or not state.__dict__.get("_poolctl_actions"):
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
    with _LOCK:
        for backend, group, state, boot, delay in list(_booting()):
            due = boot["since"] + delay
            if due > now:
                nxt = due if nxt is None else min(nxt, due)
                continue
            note = {"BootKind": boot["kind"], "BootSeconds": round(delay, 3)}
            for hook in list(state.__dict__.get("_poolctl_actions") or {}):
                if hook in (state.__dict__.get("_poolctl_actions") or {}):
                    _finish_action(backend, group, state, hook, "CONTINUE", "self-boot", note)
    return None if nxt is None else max(0.0, nxt - now)


def boot_report() -> dict[str, Any]:
    now = time.monotonic()
    with _LOCK:
        waiting = [{"Region": b.region_name, "AutoScalingGroupName": g.name,
                    "InstanceId": s.instance.id, "BootKind": boot["kind"],
                    "SecondsLeft": round(max(0.0, boot["since"] + delay - now), 2)}
                   for b, g, s, boot, delay in _booting()]
        times = [{"region": r, "project": pr, "pool": po, "start_seconds": v}
                 for (r, pr, po), v in _start_times.items()]
        return {"speedup": _boot["speedup"], "start_times": times, "booting": waiting}


def _boot_loop() -> None:
    while True:
        try:
            wait = boot_due_nodes()
        except Exception as exc:  # moto raises many types; the thread must outlive one
            print(f"self-boot: {exc!r}; retrying in 1 s", flush=True)
            wait = 1.0
        # Sleeps until the next node is due, or until a node starts or the speedup changes.
        _boot_wake.wait(wait)
        _boot_wake.clear()


def start_self_boot(speedup: float) -> None:
    """Run the thread that boots nodes by themselves (idle while the speedup is 0)."""
    set_boot_speedup(speedup)
    threading.Thread(target=_boot_loop, name="poolctl-self-boot", daemon=True).start()


# --------------------------------------------------------------------------------------
# 6. Admin endpoints

# Faults: API action -> {"delay_s": seconds, "times": calls left}; actions whose answer is
# being held back right now (a test interrupts its client then).
_faults: dict[str, dict[str, float]] = {}
_holding: list[str] = []

# Retried attempts. The SDKs mark every attempt of one call with the same invocation id
# (amz-sdk-invocation-id) and its number (amz-sdk-request: attempt=N). On a loaded machine a
# client may give up on an answer moto is still writing and send the call again; for a call
# that creates something (a launch template version, a rule, an alias) moto would then do it
# twice. A later attempt of a call moto already answered (or is answering) gets that answer,
# as a lost answer's retry is meant to. Bounded: the newest RETRY_MEMORY calls (every answer is
# kept, DescribeImages ones too, and a retry follows its first attempt within seconds).
RETRY_MEMORY = 256
_attempts: dict[str, dict[str, Any]] = {}  # invocation id -> {"done": Event, "answer"}


def _attempt(environ: dict[str, Any]) -> tuple[str | None, int]:
    inv = environ.get("HTTP_AMZ_SDK_INVOCATION_ID")
    req = environ.get("HTTP_AMZ_SDK_REQUEST", "")
    for part in req.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "attempt" and value.isdigit():
            return inv, int(value)
    return inv, 1


def _answer_once(app: Callable[..., Any], environ: dict[str, Any], start_response: Any,
                 inv: str, attempt: int) -> list[bytes]:
    with _LOCK:
        seen = _attempts.get(inv)
        first = seen is None
        if seen is None:
            seen = _attempts[inv] = {"done": threading.Event(), "answer": None}
            while len(_attempts) > RETRY_MEMORY:
                del _attempts[next(iter(_attempts))]
    if not first and attempt > 1:
        seen["done"].wait(120)
        answer = seen["answer"]
        if answer is not None:
            print(f"retry: attempt {attempt} of call {inv} answered as the first", flush=True)
            start_response(*answer[:2])
            return [answer[2]]
    got: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *exc: got.append((status, headers))))
    status, headers = got[0]
    if first:
        # A 5xx may mean nothing was done: a retry of it runs again.
        seen["answer"] = None if status.startswith("5") else (status, headers, body)
        seen["done"].set()
    start_response(status, headers)
    return [body]


# Snapshots: name -> deep copies of every moto backend's attributes and of the state above.
_snapshots: dict[str, dict[str, Any]] = {}


def _live_backends() -> dict[tuple[str, str, str], Any]:
    """Every moto backend in use: (service, account, region) -> backend object."""
    from moto.core.base_backend import BackendDict

    return {(bd.service_name, account, region): backend
            for bd in list(BackendDict._instances)  # type: ignore[misc]  # moto: a class-level registry not declared ClassVar
            for account, region, backend in bd.iter_backends()}


def _backends_kept(live: dict[tuple[str, str, str], Any]) -> dict[int, Any]:
    """A deepcopy memo that copies what the backends hold but never a backend itself:
    moto's objects point at backends (a group at its EC2 backend), and after a restore
    those pointers must reach the live ones."""
    from moto.core.base_backend import BackendDict

    memo: dict[int, Any] = {id(backend): backend for backend in live.values()}
    for bd in list(BackendDict._instances):  # type: ignore[misc]  # moto: a class-level registry not declared ClassVar
        memo[id(bd)] = bd
        for per_account in bd.values():
            memo[id(per_account)] = per_account
    return memo


def _copyable_ssm_parameters() -> None:
    """moto's SSM ParameterDict is a defaultdict whose __init__ takes (account, region): the
    copy module rebuilds a defaultdict as cls(default_factory) and fails, so a snapshot after
    any SSM call (Packer's AMI lookup) was refused. Tell it how to rebuild one."""
    import copyreg

    from moto.ssm.models import ParameterDict

    def rebuild(d: ParameterDict) -> tuple[Any, ...]:
        state = {k: v for k, v in vars(d).items() if k not in ("account_id", "region_name")}
        return ParameterDict, (d.account_id, d.region_name), state, None, iter(d.items())

    copyreg.pickle(ParameterDict, rebuild)


def take_snapshot(name: str) -> dict[str, Any]:
    if not name:
        raise ValueError("the body needs a snapshot name: {\"name\": \"...\"}")
    _copyable_ssm_parameters()
    with _LOCK:
        live = _live_backends()
        _snapshots[name] = {
            "backends": copy.deepcopy({key: vars(b) for key, b in live.items()},
                                      _backends_kept(live)),
            "quotas": copy.deepcopy(_quota_values),
            "start_times": copy.deepcopy(_start_times),
        }
        return {"name": name, "backends": len(live)}


def restore_snapshot(name: str) -> dict[str, Any]:
    _copyable_ssm_parameters()
    with _LOCK:
        snap = _snapshots[name]  # KeyError: 404
        live = _live_backends()
        saved = copy.deepcopy(snap["backends"], _backends_kept(live))
        for key, backend in live.items():
            if key in saved:
                backend.__dict__ = saved[key]
            else:  # first used after the snapshot: as new
                backend.reset()
        _quota_values.clear()
        _quota_values.update(copy.deepcopy(snap["quotas"]))
        _start_times.clear()
        _start_times.update(copy.deepcopy(snap["start_times"]))
        _faults.clear()
        _eic_keys.clear()
        return {"name": name, "backends": len(live)}


def _api_action(environ: dict[str, Any]) -> str | None:
    """The API action of a request (query protocol: Action=..., JSON: X-Amz-Target), with
    the body left readable for moto."""
    import io
    from urllib.parse import parse_qs

    target: str | None = environ.get("HTTP_X_AMZ_TARGET")
    if target:
        return target.rsplit(".", 1)[-1]
    query: str = environ.get("QUERY_STRING", "")
    action = parse_qs(query).get("Action")
    if action:
        return action[0]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if not length:
        return None
    raw = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(raw)
    found = parse_qs(raw.decode(errors="replace")).get("Action")
    return found[0] if found else None


def _delayed(app: Callable[..., Any], environ: dict[str, Any], start_response: Any,
             action: str, delay_s: float) -> list[bytes]:
    """moto's answer, complete, handed over `delay_s` seconds after moto acted."""
    seen: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *exc: seen.append((status, headers))))
    with _LOCK:
        _holding.append(action)
    try:
        time.sleep(delay_s)
    finally:
        with _LOCK:
            _holding.remove(action)
    start_response(*seen[0])
    return [body]


def _take_fault(action: str | None) -> float | None:
    with _LOCK:
        fault = _faults.get(action or "")
        if fault is None:
            return None
        fault["times"] -= 1
        if fault["times"] <= 0:
            del _faults[action or ""]
        return float(fault["delay_s"])


def admin_middleware(app: Callable[..., Any], info: dict[str, Any]) -> Callable[..., Any]:
    """WSGI wrapper answering /_poolctl/... and passing everything else to moto."""

    def respond(start_response: Any, status: int, body: Any) -> list[bytes]:
        data = json.dumps(body, default=str).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
        start_response(
            f"{status} {reason.get(status, 'OK')}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/_poolctl/"):
            action = _api_action(environ) if _faults else None
            delay = _take_fault(action)
            if delay is not None:
                return _delayed(app, environ, start_response, str(action), delay)
            inv, attempt = _attempt(environ)
            if inv:
                return _answer_once(app, environ, start_response, inv, attempt)
            return app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            raw = environ["wsgi.input"].read(length) if length else b""
            body = json.loads(raw or b"{}")
        except (ValueError, json.JSONDecodeError):
            return respond(start_response, 400, {"error": "the body must be a JSON object"})
        try:
            if path == "/_poolctl/health":
                return respond(start_response, 200, {**info, "boot_speedup": _boot["speedup"]})
            if path == "/_poolctl/boot":
                if method == "POST":
                    set_boot_speedup(body.get("speedup"))
                elif method != "GET":
                    return respond(start_response, 405, {"error": "GET or POST"})
                return respond(start_response, 200, boot_report())
            if path == "/_poolctl/start-times" and method == "POST":
                missing = [k for k in ("region", "project", "pool", "start_seconds")
                           if k not in body]
                if missing:
                    raise ValueError(f"the body needs {', '.join(missing)}")
                register_start_times(body["region"], body["project"], body["pool"],
                                     dict(body["start_seconds"]))
                return respond(start_response, 200, boot_report())
            if path == "/_poolctl/quotas":
                with _LOCK:
                    if method == "POST":
                        set_quotas(dict(body.get("quotas") or {}), body.get("region"))
                    elif method == "DELETE":
                        reset_quotas()
                    elif method != "GET":
                        return respond(start_response, 405, {"error": "GET, POST or DELETE"})
                    return respond(start_response, 200, {"quotas": _quota_values})
            if path.startswith("/_poolctl/quota-requests/") and method == "POST":
                with _LOCK:
                    request = set_request_status(path.rsplit("/", 1)[1], str(body.get("status")))
                return respond(start_response, 200, {"RequestedQuota": request})
            if path == "/_poolctl/instance-connect":
                from urllib.parse import parse_qs

                q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
                keys = instance_connect_keys(q.get("instance_id", ""), q.get("user", ""))
                return respond(start_response, 200, {"keys": keys})
            if path == "/_poolctl/faults":
                with _LOCK:
                    if method == "POST":
                        _faults[str(body["action"])] = {
                            "delay_s": max(0.0, float(body.get("delay_s", 10))),
                            "times": max(1, int(body.get("times", 1)))}
                    elif method == "DELETE":
                        _faults.clear()
                    return respond(start_response, 200, {"faults": _faults,
                                                         "holding": list(_holding)})
            if path == "/_poolctl/snapshots":
                if method == "POST":
                    return respond(start_response, 200, take_snapshot(str(body.get("name", ""))))
                return respond(start_response, 200, {"snapshots": sorted(_snapshots)})
            if (path.startswith("/_poolctl/snapshots/") and path.endswith("/restore")
                    and method == "POST"):
                name = path.removeprefix("/_poolctl/snapshots/").removesuffix("/restore")
                return respond(start_response, 200, restore_snapshot(name))
            if path == "/_poolctl/lifecycle-actions":
                if method == "POST":
                    done = complete_open_actions(
                        body.get("AutoScalingGroupName"),
                        str(body.get("LifecycleActionResult") or "CONTINUE").upper(),
                    )
                    return respond(start_response, 200, {"completed": done})
                return respond(start_response, 200, lifecycle_report())
        except KeyError as exc:
            return respond(start_response, 404, {"error": f"not found: {exc}"})
        except (ValueError, TypeError, AttributeError) as exc:
            return respond(start_response, 400, {"error": str(exc)})
        return respond(start_response, 404, {"error": f"no admin endpoint {method} {path}"})

    return wsgi


# --------------------------------------------------------------------------------------
# Installation


def _locked(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def install() -> None:
    """Patch moto's classes in place; idempotent. Call before the server's first request."""
    global _installed
    if _installed:
        return
    from moto.autoscaling import models as asm
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.ec2.models.security_groups import SecurityGroupRule
    from moto.ec2.responses.launch_templates import LaunchTemplates
    from moto.moto_api._internal.models import MotoAPIBackend
    from moto.servicequotas.responses import ServiceQuotasResponse

    group_cls, backend_cls, state_cls = (
        asm.FakeAutoScalingGroup, asm.AutoScalingBackend, asm.InstanceState,
    )

    # Every Auto Scaling request runs under the lock, after lapsed lifecycle timeouts apply.
    orig_call_action = AutoScalingResponse.call_action

    def call_action(self: Any) -> Any:
        with _LOCK:
            _expire_actions(self.autoscaling_backend)
            return orig_call_action(self)

    AutoScalingResponse.call_action = call_action  # type: ignore[method-assign]  # moto extension: under the lock
    AutoScalingResponse.create_auto_scaling_group = _wrap_create_group(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.create_auto_scaling_group
    )
    AutoScalingResponse.update_auto_scaling_group = _wrap_update_group(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.update_auto_scaling_group
    )
    AutoScalingResponse.put_scaling_policy = _wrap_put_scaling_policy(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.put_scaling_policy
    )
    LaunchTemplates.create_launch_template = _wrap_create_launch_template(  # type: ignore[method-assign]  # moto extension: wrapped
        LaunchTemplates.create_launch_template
    )
    SecurityGroupRule.description = property(_rule_description)  # type: ignore[method-assign,assignment]  # moto extension: a property replaced
    for name, fn in {
        "start_instance_refresh": _start_instance_refresh,
        "describe_instance_refreshes": _describe_instance_refreshes,
        "cancel_instance_refresh": _cancel_instance_refresh,
        "rollback_instance_refresh": _rollback_instance_refresh,
        "describe_warm_pool": _describe_warm_pool,
        "complete_lifecycle_action": _complete_lifecycle_action,
        "record_lifecycle_action_heartbeat": _record_lifecycle_action_heartbeat,
    }.items():
        setattr(AutoScalingResponse, name, fn)

    def replace_instances(self: Any, count_needed: int, propagated_tags: dict[str, str]) -> None:
        with _LOCK:
            remaining = count_needed - len(_take_from_warm_pool(self, count_needed))
            if remaining <= 0:
                return
            backend = self.autoscaling_backend
            for instance in _run_instances(self, remaining, _group_version(self), propagated_tags):
                self.instance_states.append(_new_group_state(backend, self, instance))

    group_cls.replace_autoscaling_group_instances = replace_instances  # type: ignore[method-assign]  # moto extension: warm pool first
    group_cls.active_instances = lambda self: [  # type: ignore[method-assign]  # moto extension: Pending counts
        s for s in self.instance_states if s.lifecycle_state in _CAPACITY_STATES
    ]
    group_cls.warm_pool_size = property(  # type: ignore[attr-defined]  # moto extension: new attribute
        lambda self: len(_warm(self)) if self.__dict__.get("warm_pool") is not None else None
    )

    orig_set_desired = group_cls.set_desired_capacity

    def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
        with _LOCK:
            orig_set_desired(self, new_capacity)
            if self.__dict__.get("warm_pool") is not None or _warm(self):
                _reconcile_warm_pool(self)

    group_cls.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]  # moto extension: warm pool kept

    def after(method: str, fn: Callable[..., None]) -> None:
        orig = getattr(backend_cls, method)

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _LOCK:
                out = orig(self, *args, **kwargs)
                fn(self, *args, **kwargs)
                return out

        setattr(backend_cls, method, wrapped)

    def reconcile_named(self: Any, *args: Any, **kwargs: Any) -> None:
        name = kwargs.get("group_name") or kwargs.get("name") or (args[0] if args else None)
        group = self.autoscaling_groups.get(name)
        if group is not None:
            _reconcile_warm_pool(group)

    after("put_warm_pool", reconcile_named)
    after("delete_warm_pool", reconcile_named)
    after("update_auto_scaling_group", reconcile_named)

    orig_delete = backend_cls.delete_auto_scaling_group

    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        with _LOCK:
            group = self.autoscaling_groups.get(group_name)
            if group is not None:
                group.warm_pool = None
                _reconcile_warm_pool(group)
            orig_delete(self, group_name)
            _delete_group_children(self, group_name)
            refreshes = _refreshes(self)
            refreshes[:] = [r for r in refreshes if r.group_name != group_name]

    backend_cls.delete_auto_scaling_group = delete_auto_scaling_group  # type: ignore[method-assign]  # moto extension: children too
    backend_cls.notify_terminate_instances = _locked(  # type: ignore[method-assign]  # moto extension: under the lock
        backend_cls.notify_terminate_instances)

    orig_lt = state_cls.launch_template

    def launch_template(self: Any) -> dict[str, Any] | None:
        lt = self.instance.__dict__.get("_poolctl_lt")
        if lt is None:
            stock: dict[str, Any] | None = orig_lt.fget(self)  # type: ignore[attr-defined]  # moto: launch_template is a property
            return stock
        return {"LaunchTemplateId": lt[0].id, "LaunchTemplateName": lt[0].name,
                "Version": str(lt[1])}

    state_cls.launch_template = property(launch_template)  # type: ignore[method-assign,assignment]  # moto extension: a property replaced

    from moto.ec2.responses.launch_templates import LaunchTemplates

    LaunchTemplates.create_launch_template_version = _wrap_create_launch_template_version(  # type: ignore[method-assign]  # moto extension: wrapped
        LaunchTemplates.create_launch_template_version)

    # Service Quotas: ec2 next to moto's vpc.
    orig_sq_call = ServiceQuotasResponse.call_action

    def sq_call_action(self: Any) -> Any:
        with _LOCK:
            return orig_sq_call(self)

    ServiceQuotasResponse.call_action = sq_call_action  # type: ignore[method-assign]  # moto extension: under the lock
    for name, fn in {
        "get_service_quota": _sq_get_service_quota,
        "get_aws_default_service_quota": _sq_get_aws_default_service_quota,
        "list_aws_default_service_quotas": _sq_list_aws_default_service_quotas,
        "list_service_quotas": _sq_list_service_quotas,
        "request_service_quota_increase": _sq_request_service_quota_increase,
        "list_requested_service_quota_change_history": _sq_list_history,
        "list_requested_service_quota_change_history_by_quota": _sq_list_history_by_quota,
        "get_requested_service_quota_change": _sq_get_requested_change,
    }.items():
        setattr(ServiceQuotasResponse, name, fn)

    orig_reset = MotoAPIBackend.reset

    def reset(self: Any) -> None:
        with _LOCK:
            orig_reset(self)
            reset_quotas()
            _faults.clear()
            _eic_keys.clear()
            _start_times.clear()
            _snapshots.clear()
            _attempts.clear()

    MotoAPIBackend.reset = reset  # type: ignore[method-assign]  # moto extension: resets poolctl state too
    reset_quotas()

    from moto.ec2instanceconnect.responses import Ec2InstanceConnectResponse

    Ec2InstanceConnectResponse.send_ssh_public_key = _send_ssh_public_key  # type: ignore[method-assign]  # moto extension: keys kept
    from moto.ec2.responses import EC2Response

    for name, fn in {
        "create_instance_connect_endpoint": _create_instance_connect_endpoint,
        "describe_instance_connect_endpoints": _describe_instance_connect_endpoints,
        "delete_instance_connect_endpoint": _delete_instance_connect_endpoint,
    }.items():
        setattr(EC2Response, name, fn)
    _installed = True
