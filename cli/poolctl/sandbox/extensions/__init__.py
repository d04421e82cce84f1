"""poolctl's extensions to moto: the one place where the sandbox departs from stock moto.

The sandbox is moto 5.x (`moto.server`) with these additions, installed by `install()` before
the server answers its first request. Each fills a gap in moto 5.2.x that poolctl's runtime
commands (`rollout`, `warm`, `status`, `quota`, `nodes check`) depend on, and behaves as the
AWS API reference documents it, within the limits its module's docstring says.

Features (FEATURES, in the order they are installed):
  fixes             moto bugs the rest (and Terraform's read-back) rely on
  lifecycle         launch lifecycle actions and hooks given at group creation
  warm_pool         real warm pool instances, taken first on scale-out
  refresh           instance refresh, one step per DescribeInstanceRefreshes (the clock)
  capacity          per (type, zone) launch limits, Capacity Reservations, a group's
                    reservation preference
  activities        scaling activities of every launch, launches retried after a failure
  schedules         scheduled actions, run when the sandbox clock (an offset) reaches them
  forecasts         predictive scaling: GetPredictiveScalingForecast from the load metric's
                    history, and ForecastAndScale raising capacity ahead of it
  scheduler         EventBridge Scheduler one-time schedules (PutWarmPool), run on that clock
  capacity_blocks   Capacity Block offerings priced from the catalog, and their purchase
  quotas            Service Quotas for ec2 (moto knows only vpc)
  instance_connect  EC2 Instance Connect keys and endpoints
  self_boot         nodes that finish booting by themselves after their plan's start time
  serving_nodes     with --serve: nodes run their boot script, an engine serves
  balancers         with --serve: HAProxy routes each load balancer's listeners
  autoscaler        with --serve: alarms evaluated and scaling policies run, on the clock
  percentiles       CloudWatch value/count arrays kept weighted, pNN statistics of them
  retries           a retried attempt of a call answered once
  faults            answers held back on purpose (the interrupt tests)
  snapshots         everything the sandbox holds, kept and restored
  admin             the /_poolctl/ endpoints in front of moto
Shared by them: common (the lock, moto lookups, errors) and launches (instances launched for
a group, zone by zone within capacity, and the launch actions that hold them).

To add a feature (capacity reservations, say): write a module here whose docstring says what
it emulates, why, and what it does not; give it NAMES (what /_poolctl/health lists),
install() (patch moto's classes: wrap a method and call the original, under common.LOCK when
it changes state) and reset() (clear what it keeps outside moto's backends; moto's
POST /moto-api/reset calls it); add it to FEATURES; a test in tests/ops/test_sandbox.py drives
it through boto3. State kept on a moto object goes in common.stored(...), which moto's reset
drops by itself.
"""

from __future__ import annotations

from typing import Any, Protocol

from poolctl.sandbox.extensions import (
    activities,
    admin,
    autoscaler,
    balancers,
    capacity,
    capacity_blocks,
    capacity_groups,
    capacity_reservations,
    faults,
    fixes,
    forecasts,
    instance_connect,
    lifecycle,
    percentiles,
    quotas,
    refresh,
    retries,
    scheduler,
    schedules,
    self_boot,
    serving_nodes,
    snapshots,
    warm_pool,
)
from poolctl.sandbox.extensions.admin import admin_middleware
from poolctl.sandbox.extensions.common import LOCK, lock_entry_points
from poolctl.sandbox.extensions.quotas import EC2_QUOTAS
from poolctl.sandbox.extensions.self_boot import start_self_boot

__all__ = ["EC2_QUOTAS", "EXTENSIONS", "FEATURES", "admin_middleware", "install",
           "start_self_boot"]


class Feature(Protocol):
    """What a feature module has (see the package docstring)."""

    @property
    def NAMES(self) -> tuple[str, ...]: ...  # read-only: a module's constant tuple fits

    def install(self) -> None: ...

    def reset(self) -> None: ...


# fixes first: lifecycle wraps the CreateAutoScalingGroup that fixes corrected.
# capacity after lifecycle: it checks a new group's capacity settings before hooks exist.
FEATURES: tuple[Feature, ...] = (
    fixes, lifecycle, warm_pool, refresh, capacity, capacity_groups, capacity_reservations,
    capacity_blocks, activities, schedules, forecasts,
    scheduler, quotas, instance_connect,
    self_boot, serving_nodes, balancers, autoscaler, percentiles, retries, faults, snapshots,
    admin,
)
EXTENSIONS = tuple(name for feature in FEATURES for name in feature.NAMES)

_installed = False


def install() -> None:
    """Patch moto's classes in place; idempotent. Call before the server's first request."""
    global _installed
    if _installed:
        return
    from moto.moto_api._internal.models import MotoAPIBackend

    lock_entry_points()
    for feature in FEATURES:
        feature.install()
    orig_reset = MotoAPIBackend.reset

    def reset(self: Any) -> None:
        with LOCK:
            orig_reset(self)
            for feature in FEATURES:
                feature.reset()

    MotoAPIBackend.reset = reset  # type: ignore[method-assign]  # moto extension: resets poolctl state too
    _installed = True
