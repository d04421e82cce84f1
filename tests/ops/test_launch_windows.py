"""Launch windows (issue 22) through the real CLI on the example pool `deployed_pool`
deployed in the sandbox, with the sandbox clock moved past the window's edges.

Worked out by hand: p5.48xlarge, 4 replicas per node; min 1 node, max 6, warm pool 2
stopped nodes. A window of 8 replicas = 8 / 4 = 2 nodes in service: the group's minimum
1 -> 1 + 2 = 3 at --from, back to 1 (desired 1) at --until. The warm pool stays at 2 behind
it: its size is max(MinSize 2, MaxGroupPreparedCapacity (1 + 2) - desired 3) = 2.

Windows survive `deploy` because Terraform manages none of them: the stack has no
`aws_autoscaling_schedule` (tests/synth/test_aws_stack.py checks it on the synthesized
JSON); test_the_window_launches_into_the_bought_block deploys in between and the window
still runs.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import pool_cli, sandbox_admin

ASG = "acme-chat-70b"


@pytest.fixture(scope="module")
def cli(deployed_pool, sandbox_home, tmp_path_factory) -> Any:
    path = tmp_path_factory.mktemp("windows") / "poolctl.yaml"
    shutil.copy(DEPLOYED_EXAMPLE, path)
    return pool_cli(sandbox_home, path)


@pytest.fixture(scope="module", autouse=True)
def known_state(sandbox, cli):
    cli("warm", "--reset")
    yield
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    cli("warm", "--reset", ok=False)


def group(sandbox_client) -> dict:
    return sandbox_client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[ASG])["AutoScalingGroups"][0]


def actions(sandbox_client) -> list[str]:
    return [a["ScheduledActionName"] for a in sandbox_client("autoscaling")
            .describe_scheduled_actions(AutoScalingGroupName=ASG)["ScheduledUpdateGroupActions"]]


def js(res) -> Any:
    return json.loads(res.stdout)


def test_a_window_raises_the_pool_at_its_start_and_gives_it_back_at_its_end(
        cli, sandbox, sandbox_client):
    res = cli("warm", "--replicas", "8", "--from", "+10m", "--until", "+70m", "--running",
              "--json")
    made = js(res)
    wid = made["window"]
    assert (made["kept_min_nodes"], made["windows"][0]["nodes"],
            made["windows"][0]["replicas"]) == (1, 2, 8)
    assert sorted(actions(sandbox_client)) == [f"poolctl-window-{wid}-2n-from",
                                               f"poolctl-window-{wid}-2n-until"]

    (row,) = js(cli("warm", "--list", "--json"))["windows"]
    assert (row["id"], row["state"], row["min_nodes"]) == (wid, "scheduled", 3)  # 1 + 2
    assert wid in cli("warm", "--list").stdout
    (st,) = js(cli("status", "--json"))["pools"]
    assert [w["id"] for w in st["windows"]] == [wid]
    g = group(sandbox_client)
    assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)  # nothing before --from

    # A deploy in between keeps both actions: test_the_window_launches_into_the_bought_block
    # deploys between scheduling and --from (one deploy fewer for the suite).

    # 11 minutes on: the start has run; the nodes boot (the hook completed for them).
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 11 * 60})
    g = group(sandbox_client)
    assert (g["MinSize"], g["DesiredCapacity"]) == (3, 3)
    sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions",
                  {"AutoScalingGroupName": ASG, "LifecycleActionResult": "CONTINUE"})
    (st,) = js(cli("status", "--json"))["pools"]
    # 3 nodes in service = 12 replicas: the file's 4 + the window's 8.
    assert st["replicas"]["in_service"] == 12
    assert st["group"]["warm_min_nodes"] == 2  # the warm pool stays behind the window
    (row,) = js(cli("warm", "--list", "--json"))["windows"]
    assert (row["start"], row["state"]) == (None, "active")

    # 71 minutes on: the end has run: the earlier sizes.
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 71 * 60})
    g = group(sandbox_client)
    assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)
    assert actions(sandbox_client) == []
    assert js(cli("warm", "--list", "--json"))["windows"] == []


def test_cancel_before_the_start_leaves_nothing(cli, sandbox, sandbox_client):
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    made = js(cli("warm", "--replicas", "4", "--from", "+1h", "--until", "+2h", "--running",
                  "--json"))
    assert len(actions(sandbox_client)) == 2
    cli("warm", "--cancel", made["window"])
    assert actions(sandbox_client) == []
    g = group(sandbox_client)
    assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)
    res = cli("warm", "--cancel", made["window"], ok=2)  # gone: one line, exit 2
    assert res.stderr.strip().count("\n") == 0 and "--cancel" in res.stderr


def capacity_blocks(sandbox) -> list[dict]:
    return [r for r in sandbox_admin(sandbox, "GET", "/_poolctl/capacity")["reservations"]
            if r["ReservationType"] == "capacity-block"]


def test_reserve_shows_the_blocks_and_buys_only_with_yes(cli, sandbox, sandbox_client):
    from datetime import UTC, datetime, timedelta

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    day = (datetime.now(UTC) + timedelta(days=2)).date()
    start, end = f"{day}T12:00:00Z", f"{day}T14:00:00Z"
    before = capacity_blocks(sandbox)
    # 8 replicas = 2 nodes: a block of 2 x p5.48xlarge from 11:30 UTC that day, 24 h (the
    # window ends at 14:00, + 30 min AWS keeps free before a block's end, within 1 day):
    # 55.04 $/h x 2 x 24 h = 2,641.92 $ upfront; the window On-Demand: 2 x 55.04 x 2 h.
    offered = js(cli("warm", "--replicas", "8", "--running", "--from", start, "--until", end,
                     "--reserve", "--json"))
    assert offered["action"] == "offered" and offered["bought"] is None
    cheapest = offered["offerings"][0]
    assert (cheapest["count"], cheapest["hours"], cheapest["upfront_usd"]) == (2, 24, 2641.92)
    assert cheapest["start"] == f"{day}T11:30:00+00:00"
    assert offered["on_demand_usd"] == pytest.approx(2 * 55.04 * 2)
    assert capacity_blocks(sandbox) == before and actions(sandbox_client) == []

    made = js(cli("warm", "--replicas", "8", "--running", "--from", start, "--until", end,
                  "--reserve", "--yes", "--json"))
    (block,) = [r for r in capacity_blocks(sandbox) if r not in before]
    assert made["bought"] == block["CapacityReservationId"]
    assert (block["TotalInstanceCount"], block["State"]) == (2, "scheduled")
    assert len(actions(sandbox_client)) == 2
    cli("warm", "--cancel", made["window"])
    assert actions(sandbox_client) == []


def test_a_bought_block_ends_the_window_more_than_30_minutes_before_its_own_end(
        cli, sandbox, sandbox_client):
    from datetime import UTC, datetime, timedelta

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    day = (datetime.now(UTC) + timedelta(days=2)).date()
    nxt = day + timedelta(days=1)
    # --until 11:00 the next day: the 24 h block from 11:30 ends at 11:30 = --until + 30 min
    # (it covers the window); AWS advises scaling in *more* than 30 min before the end, so
    # the window's nodes go at 11:30 - 35 min = 10:55, not at --until.
    made = js(cli("warm", "--replicas", "8", "--running", "--from", f"{day}T12:00:00Z",
                  "--until", f"{nxt}T11:00:00Z", "--reserve", "--yes", "--json"))
    assert made["offerings"][0]["end"] == f"{nxt}T11:30:00+00:00"
    (row,) = made["windows"]
    assert (row["start"], row["end"]) == (f"{day}T12:00:00+00:00", f"{nxt}T10:55:00+00:00")
    until = [a for a in sandbox_client("autoscaling").describe_scheduled_actions(
        AutoScalingGroupName=ASG)["ScheduledUpdateGroupActions"]
        if a["ScheduledActionName"].endswith("-until")]
    assert [a["StartTime"].astimezone(UTC).isoformat() for a in until] == [
        f"{nxt}T10:55:00+00:00"]
    # The one line and the deploy that put the pool's launches into the block.
    assert f"capacity_block: {made['bought']}" in made["message"]
    assert "poolctl deploy --pool chat-70b" in made["message"]
    assert "set warm_pool.replicas: 0" in made["message"]  # the example keeps 2 warm nodes
    cli("warm", "--cancel", made["window"])
    assert actions(sandbox_client) == []


@pytest.mark.parametrize("args", [
    ("--replicas", "8", "--from", "2020-01-01T00:00:00Z", "--until", "+1h", "--running"),
    ("--replicas", "8", "--from", "+2h", "--until", "+1h", "--running"),  # until <= from
    ("--replicas", "8", "--from", "+1h", "--until", "+40d", "--running"),  # too long
    ("--replicas", "8", "--from", "tomorrow", "--until", "+2h", "--running"),
    ("--replicas", "8", "--from", "+1h", "--until", "2026-12-05T10:00:00", "--running"),
    ("--replicas", "8", "--from", "+1h", "--until", "+2h"),  # no --running
    ("--replicas", "8", "--from", "+1h", "--running"),  # no --until
    ("--replicas", "8", "--until", "+1h", "--running"),  # no --from
    ("--from", "+1h", "--until", "+2h", "--running"),  # no --replicas
    ("--replicas", "0", "--from", "+1h", "--until", "+2h", "--running"),
    ("--replicas", "40", "--from", "+1h", "--until", "+2h", "--running"),  # > max - min
    ("--replicas", "8", "--from", "+1h", "--until", "+2h", "--running", "--wait"),
    ("--replicas", "8", "--from", "+1h", "--until", "+2h", "--running", "--exact"),
    ("--reset", "--from", "+1h", "--until", "+2h"),
    ("--list", "--replicas", "8"),
    ("--cancel", "not-an-id"),
    ("--cancel", "w123abc", "--list"),
    ("--replicas", "8", "--running", "--reserve"),  # --reserve without a window
    ("--replicas", "8", "--from", "+1h", "--until", "+2h", "--running", "--yes"),  # no --reserve
    ("--list", "--reserve", "--from", "+1h", "--until", "+2h"),
])
def test_bad_window_input_is_one_line_exit_2_and_schedules_nothing(cli, sandbox,
                                                                   sandbox_client, args):
    before = capacity_blocks(sandbox)
    res = cli("warm", *args, ok=2)
    assert res.stderr.strip() and res.stderr.strip().count("\n") == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert actions(sandbox_client) == [] and capacity_blocks(sandbox) == before


def test_the_window_launches_into_the_bought_block_and_leaves_it_before_its_end(
        cli, deployed_pool, sandbox_home, sandbox, sandbox_client, tmp_path):
    """The whole path: buy with --yes, add the line the message names, deploy, and the
    window's 2 nodes launch into the block and are gone 30 min before its end. The file
    drops its warm pool (a block pool keeps none: config rule). The pool's own deploy is
    restored at the end."""
    from datetime import UTC, datetime, timedelta

    def clock_at(at: datetime) -> None:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock",
                      {"offset_seconds": (at - datetime.now(UTC)).total_seconds()})

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    cli("warm", "--reset")
    day = (datetime.now(UTC) + timedelta(days=2)).date()
    nxt = day + timedelta(days=1)
    made = js(cli("warm", "--replicas", "8", "--running", "--from", f"{day}T12:00:00Z",
                  "--until", f"{nxt}T11:00:00Z", "--reserve", "--yes", "--json"))
    cr = made["bought"]
    path = tmp_path / "poolctl.yaml"
    path.write_text(DEPLOYED_EXAMPLE.read_text().replace(
        "    aws:\n", f"    aws:\n      capacity:\n        capacity_block: {cr}\n", 1).replace(
        "      replicas: 8\n      state: stopped\n", "      replicas: 0\n      state: stopped\n",
        1))
    ec2 = sandbox_client("ec2")

    def instances(ids: list[str]) -> list[dict]:
        return [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                for i in r["Instances"]]

    try:
        pool_cli(sandbox_home, path)("deploy", "--cloud", "aws", "--auto-approve")
        assert len(actions(sandbox_client)) == 2  # the deploy kept the window
        clock_at(datetime(day.year, day.month, day.day, 12, 1, tzinfo=UTC))
        sandbox_admin(sandbox, "POST", "/_poolctl/lifecycle-actions",
                      {"AutoScalingGroupName": ASG, "LifecycleActionResult": "CONTINUE"})
        g = group(sandbox_client)
        assert (g["MinSize"], g["DesiredCapacity"]) == (3, 3)  # 1 + the window's 2
        nodes = instances([i["InstanceId"] for i in g["Instances"]])
        in_block = [i["InstanceId"] for i in nodes if i.get("CapacityReservationId") == cr]
        assert len(in_block) == 2  # the window's; the node from before stays On-Demand
        # 11:01 the next day: past the window's 10:55 and the block's 11:30 - 30 min.
        clock_at(datetime(nxt.year, nxt.month, nxt.day, 11, 1, tzinfo=UTC))
        assert {i["State"]["Name"] for i in instances(in_block)} <= {"shutting-down",
                                                                     "terminated"}
        g = group(sandbox_client)
        assert (g["MinSize"], g["DesiredCapacity"]) == (1, 1)
    finally:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
        cli("deploy", "--cloud", "aws", "--auto-approve")
