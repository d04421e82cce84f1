"""What the extensions share: one lock, moto's objects as they reach them, AWS-style errors.

moto's server is threaded and the extensions change groups, instances and refreshes across
several moto backends in one go, so all of it runs under LOCK (`lock_entry_points` takes it
around moto's own Auto Scaling entry points). State an extension keeps on a moto object
lives in that object's __dict__ (`stored`), so moto's reset drops it with the object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

T = TypeVar("T")

# One lock for everything the extensions do (re-entrant: a wrapped call may call another).
LOCK = threading.RLock()


def now() -> datetime:
    return datetime.now(UTC)


def autoscaling_error(code: str, message: str) -> Exception:
    from moto.autoscaling.exceptions import AutoscalingClientError

    err = AutoscalingClientError(code, message)
    return err


def validation_error(message: str) -> Exception:
    return autoscaling_error("ValidationError", message)


def find_group(backend: Any, name: str | None) -> Any:
    group = backend.autoscaling_groups.get(name or "")
    if group is None:
        raise validation_error(
            f"AutoScalingGroup name not found - AutoScalingGroup '{name}' not found"
        )
    return group


def stored(obj: Any, name: str, factory: Callable[[], T]) -> T:
    """Per-object state kept in the object's __dict__, so moto's reset drops it too."""
    if name not in obj.__dict__:
        obj.__dict__[name] = factory()
    value: T = obj.__dict__[name]
    return value


def warm_states(group: Any) -> list[Any]:
    """The InstanceStates of the group's warm pool (moto keeps none: warm_pool.py fills it)."""
    return stored(group, "_poolctl_warm", list)


def ec2_state(instance: Any) -> str:
    name: str = instance._state.name
    return name


def resolve_template(ec2: Any, spec: dict[str, Any]) -> Any:
    try:
        if spec.get("LaunchTemplateId"):
            return ec2.get_launch_template(spec["LaunchTemplateId"])
        if spec.get("LaunchTemplateName"):
            return ec2.get_launch_template_by_name(spec["LaunchTemplateName"])
    except Exception as exc:  # moto raises KeyError or its own EC2 errors
        raise validation_error(f"Launch template not found: {spec}") from exc
    raise validation_error("A launch template needs LaunchTemplateId or LaunchTemplateName")


def template_version(template: Any, version: str | None) -> Any:
    try:
        return template.get_version(version or "$Default")
    except Exception as exc:  # moto raises its own EC2 error for a missing version
        raise validation_error(
            f"Launch template {template.id} has no version {version!r}"
        ) from exc


def group_version(group: Any) -> Any | None:
    """The launch template version the group launches now, or None for a launch config."""
    if group.ec2_launch_template is None:
        return None
    return template_version(group.ec2_launch_template, group.launch_template_version)


def refresh_load_balancers(backend: Any, group: Any) -> None:
    if group.name in backend.autoscaling_groups:
        backend.update_attached_elbs(group.name)
        backend.update_attached_target_groups(group.name)


def all_backends(backend_dict: Any) -> Iterable[Any]:
    """Every region's backend of every account in one of moto's BackendDicts."""
    for account_backends in list(backend_dict.values()):
        yield from list(account_backends.values())


def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def lock_entry_points() -> None:
    """Every Auto Scaling request, and every termination EC2 reports to Auto Scaling, under
    LOCK: both change the groups the extensions change."""
    from moto.autoscaling.models import AutoScalingBackend
    from moto.autoscaling.responses import AutoScalingResponse

    AutoScalingResponse.call_action = locked(  # type: ignore[method-assign]  # moto extension: under the lock
        AutoScalingResponse.call_action)
    AutoScalingBackend.notify_terminate_instances = locked(  # type: ignore[method-assign]  # moto extension: under the lock
        AutoScalingBackend.notify_terminate_instances)


def on_group_delete(cleanup: Callable[[Any, str], None]) -> None:
    """Wrap moto's DeleteAutoScalingGroup: `cleanup(backend, group_name)` after it, under
    LOCK (state an extension keeps per group goes with the group)."""
    from moto.autoscaling.models import AutoScalingBackend

    orig_delete = AutoScalingBackend.delete_auto_scaling_group

    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        with LOCK:
            orig_delete(self, group_name)
            cleanup(self, group_name)

    AutoScalingBackend.delete_auto_scaling_group = delete_auto_scaling_group  # type: ignore[method-assign]  # moto extension: the extension's state too


def before_each_call(step: Callable[[Any], None]) -> None:
    """`step(the Auto Scaling backend)` under LOCK before every Auto Scaling request: what
    the sandbox's clock makes due (lifecycle timeouts, scheduled actions, retries, a
    forecast's scaling) happens before the request sees the group. Installed later, run
    earlier."""
    from moto.autoscaling.responses import AutoScalingResponse

    orig = AutoScalingResponse.call_action

    def call_action(self: Any) -> Any:
        with LOCK:
            step(self.autoscaling_backend)
            return orig(self)

    AutoScalingResponse.call_action = call_action  # type: ignore[method-assign]  # moto extension: due work first
