"""What each cloud's operations class declares it can do (poolctl.clouds.base), and what the
runtime says, before any cloud call, to a cloud that cannot."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.clouds import base
from poolctl.clouds.aws import AwsOps
from poolctl.config import parse_config
from poolctl.endpoints import REAL_CLOUDS
from poolctl.errors import OperationFailed
from tests.configs import pool_yaml

EVERY = (base.RequestsQuota, base.CancelsRollouts, base.RollsBackRollouts,
         base.PublishesQueueMetric, base.HibernatesWarmNodes, base.KeepsWarmSizes,
         base.BoundsGroupMaximum, base.StepsRollouts)


def test_aws_declares_its_capabilities():
    has = {c.__name__ for c in EVERY if issubclass(AwsOps, c)}
    assert has == {"RequestsQuota", "CancelsRollouts", "RollsBackRollouts",
                   "PublishesQueueMetric", "KeepsWarmSizes", "BoundsGroupMaximum"}
    assert issubclass(AwsOps, base.CloudOps) and AwsOps.cloud == "aws"


def test_gcp_declares_its_capabilities():
    from poolctl.clouds.gcp import GcpOps

    has = {c.__name__ for c in EVERY if issubclass(GcpOps, c)}
    assert has == {"RequestsQuota", "CancelsRollouts", "RollsBackRollouts",
                   "PublishesQueueMetric", "StepsRollouts"}
    assert issubclass(GcpOps, base.CloudOps) and GcpOps.cloud == "gcp"


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
