"""Snapshots: everything the sandbox holds, kept and put back in about a second.

POST /_poolctl/snapshots {"name": "pool"} (admin.py) keeps a copy of every moto backend (the
Capacity Reservations and scaling activities with them), the applied quotas, the capacity
limits and the registered start times; POST /_poolctl/snapshots/<name>/restore puts it
back, resources and ids as they were, so a Terraform state written before the snapshot matches
again (the test suite restores its deployed pool between groups of tests instead of deploying
it anew). A restore drops the faults and the pushed Instance Connect keys. A reset drops the
snapshots (they point into the backends it replaces).
"""

from __future__ import annotations

import copy
from typing import Any

from poolctl.sandbox.extensions import capacity, faults, instance_connect, quotas, self_boot
from poolctl.sandbox.extensions.common import LOCK

NAMES = ("admin-endpoints.snapshots",)

# name -> deep copies of every moto backend's attributes and of the state above.
_snapshots: dict[str, dict[str, Any]] = {}


def _live_backends() -> dict[tuple[str, str, str, str], Any]:
    """Every moto backend in use: (service, backend class, account, region) -> backend
    object. The class too: two of moto's BackendDicts call themselves "ec2" (EC2's and EC2
    Instance Connect's), and keyed by the service name alone one hid the other, at random
    (the order services were first called): a snapshot then missed EC2's backend and a
    restore left the groups pointing at a copy of it (launch templates "not found")."""
    from moto.core.base_backend import BackendDict

    return {(bd.service_name, bd.backend.__name__, account, region): backend
            for bd in list(BackendDict._instances)  # type: ignore[misc]  # moto: a class-level registry not declared ClassVar
            for account, region, backend in bd.iter_backends()}


def _backends_kept(live: dict[tuple[str, str, str, str], Any]) -> dict[int, Any]:
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
    with LOCK:
        live = _live_backends()
        _snapshots[name] = {
            "backends": copy.deepcopy({key: vars(b) for key, b in live.items()},
                                      _backends_kept(live)),
            "quotas": copy.deepcopy(quotas.applied_values),
            "capacity_limits": dict(capacity.limits),
            "start_times": copy.deepcopy(self_boot.start_times),
        }
        return {"name": name, "backends": len(live)}


def restore_snapshot(name: str) -> dict[str, Any]:
    _copyable_ssm_parameters()
    with LOCK:
        snap = _snapshots[name]  # KeyError: 404
        live = _live_backends()
        saved = copy.deepcopy(snap["backends"], _backends_kept(live))
        for key, backend in live.items():
            if key in saved:
                backend.__dict__ = saved[key]
            else:  # first used after the snapshot: as new
                backend.reset()
        quotas.applied_values.clear()
        quotas.applied_values.update(copy.deepcopy(snap["quotas"]))
        self_boot.start_times.clear()
        self_boot.start_times.update(copy.deepcopy(snap["start_times"]))
        capacity.limits.clear()
        capacity.limits.update(snap["capacity_limits"])
        faults.reset()
        instance_connect.reset()
        return {"name": name, "backends": len(live)}


def snapshot_names() -> list[str]:
    return sorted(_snapshots)


def install() -> None:
    """Nothing to patch: admin.py answers the snapshot endpoints."""


def reset() -> None:
    _snapshots.clear()
