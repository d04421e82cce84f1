"""Launch-day semantics (issue 12) through the real CLI against the sandbox, on the example
pool `deployed_pool` deployed (examples/llama-70b-p5/poolctl.yaml).

Worked out by hand: p5.48xlarge, 4 replicas per node, 192 vCPUs per node; min 1 node, max 6
nodes (24 replicas), surge 1 node, warm pool 2 nodes (8 replicas) kept stopped. The deploy's
quota check counts the peak: (6 max + 1 surge) x 192 = 1344 vCPUs of L-417A185B.

The module leaves the pool at the file's sizes (`warm --reset`) and the quotas at the
sandbox's start-up values.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import pool_cli, run_poolctl, sandbox_admin, terraform_missing

ASG = "acme-chat-70b"
REGION = "us-east-1"
P5 = 192
QUOTA = "L-417A185B"
MISSING = terraform_missing()
needs_terraform = pytest.mark.skipif(
    MISSING is not None, reason=f"deploy applies through Terraform: {MISSING}")


@pytest.fixture(scope="module")
def cli(deployed_pool, sandbox_home, tmp_path_factory) -> Any:
    """The CLI on a copy of the example (what deploy synthesizes goes beside it)."""
    path = tmp_path_factory.mktemp("launch-day") / "poolctl.yaml"
    shutil.copy(DEPLOYED_EXAMPLE, path)
    return pool_cli(sandbox_home, path)


@pytest.fixture
def aws(sandbox_client) -> Any:
    return sandbox_client


def group(aws) -> dict:
    return aws("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ASG]
                                                           )["AutoScalingGroups"][0]


def warm_min(aws) -> int:
    return group(aws)["WarmPoolConfiguration"]["MinSize"]


def set_quota(endpoint: str, value: float) -> None:
    sandbox_admin(endpoint, "POST", "/_poolctl/quotas",
                  {"quotas": {QUOTA: value}, "region": REGION})


@pytest.fixture(scope="module", autouse=True)
def known_state(sandbox, cli):
    cli("warm", "--reset")
    yield
    sandbox_admin(sandbox, "DELETE", "/_poolctl/quotas")
    cli("warm", "--reset", ok=False)


def js(res) -> dict:
    return json.loads(res.stdout)


def test_the_sandbox_grants_enough_quota_for_the_example(cli):
    # start-up grant 2304 vCPUs >= the peak 1344 beside the pool's own node
    (q,) = js(cli("quota", "check", "--cloud", "aws", "--json"))["quotas"]
    assert (q["name"], q["granted"], q["needed"], q["shortfall"]) == (QUOTA, 2304, 1344, 0)


def test_group_max_is_the_pools_max_nodes_outside_a_rollout(cli):
    (s,) = js(cli("status", "--json"))["pools"]
    # max_replicas 24 / 4 per node = 6 nodes; no surge room (7) while nothing rolls
    assert (s["group"]["min_nodes"], s["group"]["max_nodes"]) == (1, 6)
    assert s["rollout"] is None


def test_warm_never_shrinks_without_exact(cli, aws):
    grow = js(cli("warm", "--replicas", "12", "--json"))
    # 12 replicas = 3 nodes; the file's warm pool is 2 nodes = 8 replicas
    assert grow["spare"] == {"before": {"nodes": 2, "replicas": 8},
                             "after": {"nodes": 3, "replicas": 12}}
    assert grow["message"] == ("chat-70b: set warm pool minimum 3 node(s): warm 2 -> 3 node(s) "
                               "(8 -> 12 replicas)")
    assert warm_min(aws) == 3
    # 4 replicas = 1 node asked for: the 3 nodes stay, and the output says why
    res = cli("warm", "--replicas", "4", "--json")
    keep = js(res)
    assert keep["changed"] is False and keep["nodes"] == 1
    assert keep["after"]["warm_nodes"] == 3
    assert keep["spare"]["before"] == keep["spare"]["after"] == {"nodes": 3, "replicas": 12}
    assert ("chat-70b: already at warm pool minimum 3 node(s) (4 replicas asked for; 12 kept: "
            "warm never lowers spare capacity, --exact or --reset does); nothing changed"
            ) in res.stderr
    assert warm_min(aws) == 3
    # --exact lowers it: 3 -> 1 node
    low = js(cli("warm", "--replicas", "4", "--exact", "--json"))
    assert low["changed"] is True
    assert (low["before"]["warm_nodes"], low["after"]["warm_nodes"]) == (3, 1)
    assert low["spare"]["after"] == {"nodes": 1, "replicas": 4}
    assert warm_min(aws) == 1
    bad = cli("warm", "--reset", "--exact", ok=2)
    assert bad.stderr.strip() == ("poolctl: --reset: give it alone (it returns to the file's "
                                  "sizes), without --replicas, --running or --exact")


def others(cli) -> int:
    """vCPUs of P instances that are not the pool's (other modules' tests may run some)."""
    (q,) = js(cli("quota", "check", "--cloud", "aws", "--json", ok=False))["quotas"]
    return int(q["in_use"] - q["pool_in_use"])


def test_deploy_stops_on_a_quota_shortfall(sandbox, cli, aws):
    set_quota(sandbox, 1000)
    try:
        o = others(cli)
        before = group(aws)
        res = cli("deploy", "--cloud", "aws", "--auto-approve", ok=1)
        # peak 1344 beside the others' use; 1000 granted: short by 344 + others
        lines = res.stderr.strip().splitlines()
        assert lines[-2] == (f"poolctl: chat-70b/aws: quota {QUOTA} in {REGION}: short by "
                             f"{344 + o} vCPU (needs 1344 beside {o} in use by others, "
                             "granted 1000)")
        assert lines[-1] == (
            "poolctl: deploy: not enough quota for the pools' peak (1 shortfall(s) above); "
            "nothing was applied. File an increase with `poolctl quota request`, or deploy "
            "anyway with --skip-quota-check")
        assert "synthesizing" not in res.stderr  # stopped before any Terraform work
        assert group(aws)["LaunchTemplate"] == before["LaunchTemplate"]
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/quotas")


def test_approve_quota_applies_a_pending_request(sandbox, cli, sandbox_home):
    set_quota(sandbox, 1000)
    try:
        o = others(cli)
        (r,) = js(cli("quota", "request", "--cloud", "aws", "--yes", "--json"))["requests"]
        # granted 1000 + shortfall (1344 + others - 1000)
        assert (r["state"], r["desired"]) == ("PENDING", 1344 + o)
        res = run_poolctl(sandbox_home, "sandbox", "approve-quota", r["id"])
        assert res.returncode == 0, res.stderr
        assert f"approved {r['id']}: {QUOTA}" in res.stdout
        assert f"in {REGION} is now {1344 + o}" in res.stdout
        (q,) = js(cli("quota", "check", "--cloud", "aws", "--json"))["quotas"]
        assert (q["granted"], q["shortfall"]) == (1344 + o, 0)
        bad = run_poolctl(sandbox_home, "sandbox", "approve-quota", "../quotas")
        assert bad.returncode == 2
        assert bad.stderr.strip() == (
            "poolctl: approve-quota ../quotas: no quota increase request with this id in the "
            "sandbox; `poolctl quota request --cloud aws --sandbox` prints the ids")
    finally:
        sandbox_admin(sandbox, "DELETE", "/_poolctl/quotas")


@needs_terraform
def test_deploy_after_warm_keeps_the_warm_sizes(cli, aws):
    cli("warm", "--replicas", "12")  # 3 warm nodes (the file: 2)
    res = cli("deploy", "--cloud", "aws", "--auto-approve", "--json")
    (stack,) = js(res)["stacks"]
    (kept,) = stack["kept"]
    assert kept.startswith("chat-70b: keeps warm nodes 3 (the file says 2; set by `poolctl warm "
                           "--replicas 12` at ")
    assert kept.endswith("; `poolctl warm --reset` returns to the file's 2)")
    assert f"== acme-chat-70b-aws: {kept}" in res.stderr
    # Terraform saw the group as it is: nothing to change, nothing reverted
    assert stack["applied"] is False and "== acme-chat-70b-aws: no changes" in res.stderr
    assert (group(aws)["MinSize"], warm_min(aws)) == (1, 3)
    # after --reset, deploy keeps nothing
    cli("warm", "--reset")
    assert warm_min(aws) == 2
    again = js(cli("deploy", "--cloud", "aws", "--auto-approve", "--json"))["stacks"][0]
    assert again["kept"] == [] and again["applied"] is False
