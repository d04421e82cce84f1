"""Launch-day arithmetic (issue 12) without a cloud: warm never lowers spare capacity unless
--exact, the surge room only in a rollout's apply, rollout wording."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.clouds.base import RolloutState
from poolctl.contract import aws as contract
from poolctl.sizing import plan_pool
from tests.unit.test_runtime_math import group, llama


@pytest.fixture(autouse=True)
def own_home(monkeypatch, tmp_path):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))


def test_warm_targets_keep_more_spare_capacity_unless_exact():
    _, pool = llama()
    plan = plan_pool(pool, "aws")  # 4 replicas per node, min 1, max 6 nodes
    g = group(max_nodes=6, warm_min_nodes=3)
    # 4 replicas = 1 node asked for; 3 warm nodes stay
    assert runtime.warm_targets(plan, g, 4, False, False) == (1, 3, None, 1)
    assert runtime.warm_targets(plan, g, 4, False, False, exact=True) == (1, 1, None, 1)
    # --running: the minimum is at least the file's 1 + 1 node; a live 4 stays
    g = group(max_nodes=6, min_nodes=4, desired_nodes=4)
    assert runtime.warm_targets(plan, g, 4, True, False) == (4, 2, None, 1)
    assert runtime.warm_targets(plan, g, 4, True, False, exact=True) == (2, 2, None, 1)


def test_only_a_rollouts_apply_gives_the_surge_room():
    _, pool = llama()
    plan = plan_pool(pool, "aws")  # max 6 nodes, surge 1
    defaults = dict(contract.stack_variables(plan, None))
    assert defaults[contract.MAX_NODES] == 6
    env = contract.rollout_env(plan, running_version="3", min_nodes=1, desired_nodes=1,
                               warm_min_nodes=2, no_surge=False)
    assert env[contract.MAX_NODES.env] == "7"  # 6 + 1 while it rolls
    env = contract.rollout_env(plan, running_version="3", min_nodes=1, desired_nodes=1,
                               warm_min_nodes=2, no_surge=True)
    assert env[contract.MAX_NODES.env] == "6"
    assert contract.kept_sizes_env(plan, min_nodes=2, warm_min_nodes=3) == {
        "TF_VAR_min_nodes": "2", "TF_VAR_warm_nodes": "3"}


def state(**kw) -> RolloutState:
    base = dict(id="r-1", status="in_progress", done=False, percentage_complete=25.0,
                checkpoints=[25, 50, 100], checkpoint_reached=25, instances_to_update=3,
                from_version="serving.image=a (v1)", to_version="serving.image=b (v2)")
    return RolloutState(**{**base, **kw})


def test_rollout_wording():
    _, pool = llama()
    assert runtime.rollout_progress_line(pool, state()) == (
        "chat-70b: rollout in progress 25%, checkpoint 25% reached, 3 to update")
    # no percentage once it turns back; no "checkpoint 100%": the final line says the end
    assert runtime.rollout_progress_line(pool, state(status="rolled_back", done=True,
                                              percentage_complete=0, reason="unhealthy")
                                  ) == "chat-70b: rollout rolled back (unhealthy)"
    assert runtime.rollout_progress_line(pool, state(status="successful", done=True,
                                              percentage_complete=100, checkpoint_reached=100,
                                              instances_to_update=0)
                                  ) == "chat-70b: rollout successful 100%, 0 to update"
    assert runtime.rollout_final_line(pool, state(status="successful", done=True)) == (
        "chat-70b: rollout r-1 finished: every node runs serving.image=b (v2)")
    assert runtime.rollout_final_line(pool, state(status="rolled_back", done=True)) == (
        "chat-70b: rollout r-1 finished: rolled back, every node runs serving.image=a (v1)")
