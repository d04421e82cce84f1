"""What each cloud's operations class declares it can do (poolctl.clouds.base), and what the
runtime says, before any cloud call, to a cloud that cannot."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds import base, registry
from poolctl.config import parse_config
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from tests.configs import pool_yaml


def test_every_capability_is_listed():
    # A capability is an abstract class of base.py other than CloudOps itself.
    declared = {c for c in vars(base).values() if isinstance(c, type)
                and c.__module__ == base.__name__ and issubclass(c, base.ABC)}
    assert set(base.CAPABILITIES) == declared - {base.CloudOps}


def test_aws_declares_its_capabilities():
    aws = registry.driver(Cloud.aws)
    assert [c.__name__ for c in aws.capabilities] == [
        "RequestsQuota", "CancelsRollouts", "RollsBackRollouts", "PublishesQueueMetric",
        "ReportsBootFailures", "ReportsBootPhases", "ReportsServing", "ForecastsLoad",
        "ReadsLoadHistory", "KeepsWarmSizes", "BoundsGroupMaximum", "ChecksCapacity",
        "ReportsLaunchFailures", "SchedulesWindows", "SchedulesWarmWindows",
        "BuysCapacityBlocks", "RunsBlockWindows",
        "DeployChecks", "SendsInstanceKeys", "KeepsNodeImages", "PreparesImageBuilds"]
    assert issubclass(aws.ops_class, base.CloudOps) and aws.ops_class.cloud == Cloud.aws


def test_gcp_declares_its_capabilities():
    gcp = registry.driver(Cloud.gcp)
    assert [c.__name__ for c in gcp.capabilities] == [
        "RequestsQuota", "CancelsRollouts", "RollsBackRollouts", "PublishesQueueMetric",
        "ReportsBootPhases", "ReportsServing", "ReadsLoadHistory", "StepsRollouts",
        "ChecksCapacity",
        "ReportsLaunchFailures",
        "SchedulesWindows", "ReservesCalendarCapacity", "ImportsLoginKeys", "KeepsNodeImages"]
    assert issubclass(gcp.ops_class, base.CloudOps) and gcp.ops_class.cloud == Cloud.gcp


def test_the_registry_makes_each_clouds_ops_and_refuses_endpoints_that_miss_it():
    assert type(registry.get_ops(Cloud.aws)) is registry.driver(Cloud.aws).ops_class
    assert type(registry.get_ops(Cloud.gcp)) is registry.driver(Cloud.gcp).ops_class
    aws_only = CloudEndpoints(flag="--sandbox", clouds=frozenset({Cloud.aws}))
    with pytest.raises(UsageError):
        registry.get_ops(Cloud.gcp, aws_only)


class Bare:
    """A cloud with none of the capabilities: every call the runtime makes fails the test."""

    cloud = "aws"
    endpoints = REAL_CLOUDS

    def __getattr__(self, name):
        raise AssertionError(f"the runtime called {name} on a cloud that cannot")


@pytest.fixture
def pool():
    cfg = parse_config(pool_yaml(with_gcp=False))
    return cfg, cfg.pools[0]


def test_quota_request_is_refused_without_the_capability(pool):
    cfg, p = pool
    with pytest.raises(OperationFailed, match="offers no API to request increases"):
        runtime.quota_request(cfg, p, "aws", Bare())


def test_cancel_is_refused_without_the_capability(pool):
    cfg, p = pool
    with pytest.raises(OperationFailed, match="cannot stop a rollout where it stands"):
        runtime.rollout_cancel(cfg, p, "aws", Bare())


def test_a_window_is_refused_without_the_capability(pool):
    from datetime import UTC, datetime, timedelta

    cfg, p = pool
    now = datetime.now(UTC)
    with pytest.raises(UsageError, match="no scheduled windows"):
        runtime.schedule_window(cfg, p, "aws", Bare(), 4, now + timedelta(hours=1),
                                now + timedelta(hours=2), running=True, now=now)
