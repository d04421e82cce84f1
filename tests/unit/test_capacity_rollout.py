"""Insufficient capacity in a rollout (issue 21, part 3): a replacement that cannot launch
pauses the rollout's wait with the one line, and `rollout status` says so; a failure while
a launch is still in flight, or one a later launch overcame, does not."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.clouds.base import (
    LaunchFailure,
    NodeState,
    ReportsLaunchFailures,
    RolloutState,
    RolloutStatus,
)
from poolctl.errors import OperationFailed
from tests.unit.test_runtime_math import RolloutOps, llama, own_home  # noqa: F401

ICE = LaunchFailure(zone="us-east-1a", instance_type="p5.48xlarge",
                    code="InsufficientInstanceCapacity", at="2026-12-04T20:00:00+00:00")
ICE_B = LaunchFailure(zone="us-east-1b", instance_type="p5.48xlarge",
                      code="InsufficientInstanceCapacity", at="2026-12-04T20:00:05+00:00")


class CapacityOps(RolloutOps, ReportsLaunchFailures):
    """A rollout in progress, the group's failed launches and its nodes, as the test sets
    them; counts the polls."""

    def __init__(self, failures, nodes=()) -> None:
        super().__init__(RolloutState("r-1", RolloutStatus.in_progress, False, 25.0,
                                      checkpoints=[100]))
        self.failures, self.node_list, self.polls = list(failures), list(nodes), 0

    def rollout_state(self, group):
        self.polls += 1
        return self.state

    def nodes(self, group):
        return self.node_list

    def launch_failures(self, group, instance_type, since_s=3600):
        return self.failures


def wait(ops, timeout=60.0):
    cfg, pool = llama()
    return runtime.wait_rollout(cfg, pool, "aws", ops, timeout,
                                "poolctl rollout status --cloud aws --pool chat-70b",
                                sleep=lambda s: None)


def test_a_replacement_that_cannot_launch_pauses_the_wait_with_one_line():
    ops = CapacityOps([ICE, ICE_B])
    with pytest.raises(OperationFailed) as e:
        wait(ops)
    msg = str(e.value)
    assert "\n" not in msg and ops.polls == 1  # at the first poll, not at the timeout
    assert msg.startswith("chat-70b: rollout r-1 paused at 25%: a replacement cannot launch: "
                          "InsufficientInstanceCapacity: no p5.48xlarge capacity in "
                          "us-east-1a, us-east-1b; the nodes not replaced yet keep serving")
    assert "`poolctl rollout cancel --cloud aws --pool chat-70b`" in msg


def test_a_launch_in_flight_keeps_the_wait_going():
    pending = NodeState(id="i-1", state="Pending", phase="pending")
    ops = CapacityOps([ICE], nodes=[pending])
    with pytest.raises(OperationFailed) as e:
        wait(ops, timeout=0.0)
    assert "--timeout 0 s" in str(e.value)  # the timeout, not the pause


def test_no_failures_no_pause():
    ops = CapacityOps([])
    with pytest.raises(OperationFailed) as e:
        wait(ops, timeout=0.0)
    assert "paused" not in str(e.value)


def test_rollout_status_says_paused_and_lists_the_failures():
    cfg, pool = llama()
    data = runtime.rollout_status(cfg, pool, "aws", CapacityOps([ICE])).to_json()
    assert data["paused"] == ("a replacement cannot launch: InsufficientInstanceCapacity: no "
                              "p5.48xlarge capacity in us-east-1a")
    assert [f["code"] for f in data["capacity_failures"]] == ["InsufficientInstanceCapacity"]
    done = CapacityOps([ICE])
    done.state = RolloutState("r-1", RolloutStatus.successful, True, 100.0)
    assert runtime.rollout_status(cfg, pool, "aws", done).paused is None


# ------------------------------------------------------------------ deploy's one look

def test_deploy_names_launches_failing_since_it_began():
    cfg, pool = llama()
    line = runtime.deploy_launches(cfg, pool, "aws", CapacityOps([ICE]), since_wall=0.0)
    assert line == ("chat-70b/aws: launches failing: InsufficientInstanceCapacity: no "
                    "p5.48xlarge capacity in us-east-1a; the group retries when capacity "
                    "returns: free or reserve capacity (`poolctl capacity check`), or try "
                    "later; watch with `poolctl status`")
    assert runtime.deploy_launches(cfg, pool, "aws", CapacityOps([]), since_wall=0.0) is None
