"""Launch windows (issue 22) through the real CLI on the example pool `deployed_pool`
deployed in the sandbox, with the sandbox clock moved past the window's edges.

Worked out by hand: p5.48xlarge, 4 replicas per node; min 1 node, max 6, warm pool 2
stopped nodes. A window of 8 replicas = 8 / 4 = 2 nodes in service: the group's minimum
1 -> 1 + 2 = 3 at --from, back to 1 (desired 1) at --until. The warm pool stays at 2 behind
it: its size is max(MinSize 2, MaxGroupPreparedCapacity (1 + 2) - desired 3) = 2.

Windows survive `deploy` because Terraform manages none of them: the stack has no
`aws_autoscaling_schedule` (tests/synth/test_aws_stack.py checks it on the synthesized
JSON); the first test deploys in between and the window still runs.

A window on a bought Capacity Block runs in a group of its own (`<pool group>-<window id>`,
clouds/aws/blocks.py), scaled by its own two actions; the pool's group is not touched.
"""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace
from typing import Any

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.config import load_config
from poolctl.sandbox import manager
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

    # A deploy in between keeps both actions (Terraform manages no scheduled action).
    cli("deploy", "--cloud", "aws", "--auto-approve")
    assert sorted(actions(sandbox_client)) == [f"poolctl-window-{wid}-2n-from",
                                               f"poolctl-window-{wid}-2n-until"]

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


def window_group(sandbox_client, wid: str) -> dict | None:
    found = sandbox_client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[f"{ASG}-{wid}"])["AutoScalingGroups"]
    return found[0] if found else None


def window_actions(sandbox_client, wid: str) -> dict[str, dict]:
    return {a["ScheduledActionName"]: a for a in sandbox_client("autoscaling")
            .describe_scheduled_actions(AutoScalingGroupName=f"{ASG}-{wid}")[
                "ScheduledUpdateGroupActions"]}


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
    wid = made["window"]
    (block,) = [r for r in capacity_blocks(sandbox) if r not in before]
    assert made["bought"] == block["CapacityReservationId"]
    assert (block["TotalInstanceCount"], block["State"]) == (2, "scheduled")
    # The window's own group, in the block's zone, empty until its start; the pool's group
    # has no action.
    g = window_group(sandbox_client, wid)
    assert g is not None and (g["MinSize"], g["MaxSize"], g["DesiredCapacity"]) == (0, 0, 0)
    assert g["AvailabilityZones"] == [block["AvailabilityZone"]]
    assert sorted(window_actions(sandbox_client, wid)) == [
        f"poolctl-window-{wid}-2n-from", f"poolctl-window-{wid}-2n-until"]
    assert actions(sandbox_client) == []
    (row,) = js(cli("warm", "--list", "--json"))["windows"]
    assert (row["id"], row["capacity_block"], row["group"]) == (
        wid, made["bought"], f"{ASG}-{wid}")
    res = cli("warm", "--cancel", wid)
    assert "stays bought" in res.stderr
    assert window_group(sandbox_client, wid) is None
    lts = sandbox_client("ec2").describe_launch_templates()["LaunchTemplates"]
    assert f"{ASG}-{wid}" not in {lt["LaunchTemplateName"] for lt in lts}


def test_a_window_within_the_hour_is_offered_a_block_that_starts_now_not_in_the_past(
        cli, sandbox, sandbox_client):
    from datetime import UTC, datetime, timedelta

    # Whatever the time of day: EC2 offers no block that has begun, so the search starts now
    # and the block that holds the window starts at the next 5-minute mark, by --from.
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    before = datetime.now(UTC).replace(microsecond=0)
    offered = js(cli("warm", "--replicas", "8", "--running", "--from", "+10m", "--until",
                     "+70m", "--reserve", "--json"))
    best = offered["offerings"][0]
    start, end = datetime.fromisoformat(best["start"]), datetime.fromisoformat(best["end"])
    assert before <= start <= before + timedelta(minutes=10)
    assert end - start == timedelta(hours=best["hours"], minutes=best["minutes"])
    assert start.minute % 5 == 0 and offered["bought"] is None
    assert actions(sandbox_client) == []


def test_a_bought_block_ends_the_window_more_than_30_minutes_before_its_own_end(
        cli, sandbox, sandbox_client):
    from datetime import UTC, datetime, timedelta

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    day = (datetime.now(UTC) + timedelta(days=3)).date()
    nxt = day + timedelta(days=1)
    # --until 11:00 the next day: the 24 h block from 11:30 ends at 11:30 = --until + 30 min
    # (it covers the window); AWS advises scaling in *more* than 30 min before the end, so
    # the window's nodes go at 11:30 - 35 min = 10:55, not at --until.
    made = js(cli("warm", "--replicas", "8", "--running", "--from", f"{day}T12:00:00Z",
                  "--until", f"{nxt}T11:00:00Z", "--reserve", "--yes", "--json"))
    assert made["offerings"][0]["end"] == f"{nxt}T11:30:00+00:00"
    (row,) = made["windows"]
    assert (row["start"], row["end"]) == (f"{day}T12:00:00+00:00", f"{nxt}T10:55:00+00:00")
    until = window_actions(sandbox_client, made["window"])[
        f"poolctl-window-{made['window']}-2n-until"]
    assert until["StartTime"].astimezone(UTC).isoformat() == f"{nxt}T10:55:00+00:00"
    assert (until["MinSize"], until["MaxSize"], until["DesiredCapacity"]) == (0, 0, 0)
    # Nothing to edit or deploy: the pool's own group is untouched.
    assert "capacity_block:" not in made["message"] and "deploy" not in made["message"]
    assert f"run by group {ASG}-{made['window']}" in made["message"]
    cli("warm", "--cancel", made["window"])
    assert window_group(sandbox_client, made["window"]) is None


@pytest.mark.parametrize("args", [
    ("--replicas", "8", "--from", "2020-01-01T00:00:00Z", "--until", "+1h", "--running"),
    ("--replicas", "8", "--from", "+2h", "--until", "+1h", "--running"),  # until <= from
    ("--replicas", "8", "--from", "+1h", "--until", "+40d", "--running"),  # too long
    ("--replicas", "8", "--from", "tomorrow", "--until", "+2h", "--running"),
    ("--replicas", "8", "--from", "+1h", "--until", "2026-12-05T10:00:00", "--running"),
    ("--replicas", "8", "--from", "+1h", "--until", "+2h", "--reserve"),  # a block, stopped
    ("--replicas", "16", "--from", "+1h", "--until", "+2h"),  # 1 + 2 + 4 warm > max 6
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
    assert warm_schedules(sandbox_client) == {}


def warm_schedules(sandbox_client) -> dict[str, dict]:
    """The pool's window schedules (EventBridge Scheduler, the stack's group), by name."""
    sched = sandbox_client("scheduler")
    return {s["Name"]: sched.get_schedule(GroupName=ASG, Name=s["Name"])
            for s in sched.list_schedules(GroupName=ASG)["Schedules"]}


def warm_pool(sandbox_client) -> tuple[int, int]:
    """(the warm pool's MinSize, its instances)."""
    w = sandbox_client("autoscaling").describe_warm_pool(AutoScalingGroupName=ASG)
    return w["WarmPoolConfiguration"]["MinSize"], len(w["Instances"])


def test_a_window_of_warm_nodes_raises_the_warm_pool_at_its_start_and_returns_it_at_its_end(
        cli, sandbox, sandbox_client):
    # Without --running: 8 replicas = 2 nodes more in the warm pool, stopped as the file's:
    # MinSize 2 -> 4 at --from (MaxGroupPreparedCapacity, as the stack sets it, min 1 + 4 =
    # 5), back to 2 (1 + 2 = 3) at --until; the group's minimum stays 1.
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    made = js(cli("warm", "--replicas", "8", "--from", "+10m", "--until", "+70m", "--json"))
    wid = made["window"]
    (row,) = made["windows"]
    assert (row["id"], row["nodes"], row["in_service"], row["min_nodes"]) == (wid, 2, False, 4)
    got = warm_schedules(sandbox_client)
    assert sorted(got) == [f"poolctl-window-{wid}-2n-from", f"poolctl-window-{wid}-2n-until"]
    for kind, warm in (("from", 4), ("until", 2)):
        s = got[f"poolctl-window-{wid}-2n-{kind}"]
        assert s["Target"]["Arn"] == "arn:aws:scheduler:::aws-sdk:autoscaling:putWarmPool"
        assert s["Target"]["RoleArn"] == f"arn:aws:iam::123456789012:role/{ASG}-windows"
        assert json.loads(s["Target"]["Input"]) == {
            "AutoScalingGroupName": ASG, "MinSize": warm, "MaxGroupPreparedCapacity": 1 + warm,
            "PoolState": "Stopped", "InstanceReusePolicy": {"ReuseOnScaleIn": True}}
        assert (s["ActionAfterCompletion"], s["FlexibleTimeWindow"]["Mode"],
                s["ScheduleExpressionTimezone"]) == ("DELETE", "OFF", "UTC")
    (listed,) = js(cli("warm", "--list", "--json"))["windows"]
    assert (listed["id"], listed["in_service"], listed["state"]) == (wid, False, "scheduled")
    assert warm_pool(sandbox_client) == (2, 2) and actions(sandbox_client) == []

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 11 * 60})
    assert warm_pool(sandbox_client) == (4, 4)
    assert group(sandbox_client)["MinSize"] == 1
    assert sorted(warm_schedules(sandbox_client)) == [f"poolctl-window-{wid}-2n-until"]
    (status,) = js(cli("status", "--json"))["pools"]
    assert ([w["id"] for w in status["warm_windows"]], status["warm_windows_kept_nodes"]) == (
        [wid], 2)

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 71 * 60})
    assert warm_pool(sandbox_client) == (2, 2) and warm_schedules(sandbox_client) == {}

    # --cancel before the start leaves nothing behind.
    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    made = js(cli("warm", "--replicas", "4", "--from", "+1h", "--until", "+2h", "--json"))
    assert len(warm_schedules(sandbox_client)) == 2
    cli("warm", "--cancel", made["window"])
    assert warm_schedules(sandbox_client) == {} and warm_pool(sandbox_client)[0] == 2


def test_the_window_launches_into_the_bought_block_and_leaves_it_before_its_end(
        cli, sandbox, sandbox_client, sandbox_home):
    """The whole path, with nothing to edit or deploy: buy with --yes; at the window's start
    the window's group launches 2 nodes into the block, in the pool's target group; they are
    gone before the block's end, and the pool's own group never changed."""
    from datetime import UTC, datetime, timedelta

    def clock_at(at: datetime) -> None:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock",
                      {"offset_seconds": (at - datetime.now(UTC)).total_seconds()})

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    cli("warm", "--reset")
    day = (datetime.now(UTC) + timedelta(days=4)).date()
    nxt = day + timedelta(days=1)
    made = js(cli("warm", "--replicas", "8", "--running", "--from", f"{day}T12:00:00Z",
                  "--until", f"{nxt}T11:00:00Z", "--reserve", "--yes", "--json"))
    cr, wid = made["bought"], made["window"]
    ec2, elb = sandbox_client("ec2"), sandbox_client("elbv2")
    pool_before = group(sandbox_client)

    def instances(ids: list[str]) -> list[dict]:
        return [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                for i in r["Instances"]]

    try:
        clock_at(datetime(day.year, day.month, day.day, 12, 1, tzinfo=UTC))
        g = window_group(sandbox_client, wid)
        assert g is not None and (g["MinSize"], g["DesiredCapacity"]) == (2, 2)
        ids = [i["InstanceId"] for i in g["Instances"]]
        nodes = instances(ids)
        assert len(nodes) == 2 and {i.get("CapacityReservationId") for i in nodes} == {cr}
        assert {i["InstanceLifecycle"] for i in nodes} == {"capacity-block"}
        tags = {t["Key"]: t["Value"] for t in nodes[0]["Tags"]}
        assert (tags["poolctl:pool"], tags["poolctl:window"]) == ("chat-70b", wid)
        # They serve behind the pool's load balancer: its target group has them.
        (tg,) = pool_before["TargetGroupARNs"]
        targets = {t["Target"]["Id"] for t in elb.describe_target_health(
            TargetGroupArn=tg)["TargetHealthDescriptions"]}
        assert set(ids) <= targets
        g = group(sandbox_client)
        assert (g["MinSize"], g["DesiredCapacity"], g["MaxSize"]) == (
            pool_before["MinSize"], pool_before["DesiredCapacity"], pool_before["MaxSize"])
        (st,) = js(cli("status", "--json"))["pools"]
        (bw,) = st["block_windows"]
        assert (bw["id"], bw["capacity_block"], bw["in_service"], bw["block_state"]) == (
            wid, cr, 2, "active")
        # 11:01 the next day: past the window's 10:55 and the block's 11:30 - 30 min.
        clock_at(datetime(nxt.year, nxt.month, nxt.day, 11, 1, tzinfo=UTC))
        assert {i["State"]["Name"] for i in instances(ids)} <= {"shutting-down", "terminated"}
        g = window_group(sandbox_client, wid)
        assert g is not None and (g["MinSize"], g["DesiredCapacity"]) == (0, 0)
        g = group(sandbox_client)
        assert (g["MinSize"], g["DesiredCapacity"]) == (
            pool_before["MinSize"], pool_before["DesiredCapacity"])
    finally:
        sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
        # `destroy`'s step before Terraform's: the window's group and launch template go
        # (they hold the pool's subnets and target group); the pool's own group stays.
        cfg = load_config(DEPLOYED_EXAMPLE)
        step = runtime.destroy_before_apply(cfg, cfg.targets(None, Cloud.aws),
                                            manager.endpoints(sandbox_home))
        assert step is not None and step(SimpleNamespace(label=f"{ASG}-aws")) is False
        assert window_group(sandbox_client, wid) is None
        lts = sandbox_client("ec2").describe_launch_templates()["LaunchTemplates"]
        assert f"{ASG}-{wid}" not in {lt["LaunchTemplateName"] for lt in lts}
        assert group(sandbox_client)["AutoScalingGroupName"] == ASG


def test_concurrent_windows_leave_the_schedule_a_serial_run_leaves(cli, sandbox,
                                                                    sandbox_client,
                                                                    sandbox_home):
    """Issue 31: three `warm --running --from/--until` at once on one pool (three processes)
    wrote absolute sizes computed without each other, and one window's end dropped the
    minimum while later windows were open. The pool's lock serializes them; the result is
    the schedule worked out by hand (kept minimum 1): A 1 node +1h..+3h, B 2 nodes +2h..+4h,
    C 1 node +150m..+5h:
      A from  {A}      1 + 1 = 2     A until {B, C}  1 + 2 = 3
      B from  {A, B}   1 + 2 = 3     B until {C}     1 + 1 = 2 (desired 2)
      C from  {A,B,C}  1 + 2 = 3     C until {}      1         (desired 1)
    and the same as the three run one after the other."""
    import subprocess
    import sys
    from datetime import UTC, datetime, timedelta

    from tests.plugins.sandbox import poolctl_env

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    t0 = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)

    def at(minutes: int) -> str:
        return f"{t0 + timedelta(minutes=minutes):%Y-%m-%dT%H:%M:%SZ}"

    windows = {"A": ("4", at(60), at(180)), "B": ("8", at(120), at(240)),
               "C": ("4", at(150), at(300))}
    env = poolctl_env(sandbox_home, POOLCTL_POLL_S="0.05")
    path = cli("warm", "--list").args[cli("warm", "--list").args.index("-f") + 1]

    def schedule() -> dict[str, tuple[int, int | None]]:
        out = {}
        for a in sandbox_client("autoscaling").describe_scheduled_actions(
                AutoScalingGroupName=ASG)["ScheduledUpdateGroupActions"]:
            out[a["ScheduledActionName"]] = (a["MinSize"], a.get("DesiredCapacity"))
        return out

    def cancel_all() -> None:
        for row in js(cli("warm", "--list", "--json"))["windows"]:
            cli("warm", "--cancel", row["id"])

    def argv(replicas: str, start: str, end: str) -> list[str]:
        return [sys.executable, "-m", "poolctl", "warm", "--replicas", replicas, "--running",
                "--from", start, "--until", end, "-f", path, "--sandbox", "--json"]

    cancel_all()
    procs = [subprocess.Popen(argv(*w), env=env, cwd=str(sandbox_home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in windows.values()]
    ids = {}
    for name, p in zip(windows, procs, strict=True):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        ids[name] = json.loads(out)["window"]
    together = schedule()
    edge = {(n, k): together[f"poolctl-window-{ids[n]}-{nodes}n-{k}"]
            for n, nodes in (("A", 1), ("B", 2), ("C", 1)) for k in ("from", "until")}
    assert edge == {("A", "from"): (2, None), ("B", "from"): (3, None),
                    ("C", "from"): (3, None), ("A", "until"): (3, None),
                    ("B", "until"): (2, 2), ("C", "until"): (1, 1)}, edge
    listed = js(cli("warm", "--list", "--json"))
    assert listed["consistent"] is True
    assert {r["id"]: r["min_nodes"] for r in listed["windows"]} == {
        ids["A"]: 2, ids["B"]: 3, ids["C"]: 3}

    cancel_all()
    for w in windows.values():
        cli("warm", "--replicas", w[0], "--running", "--from", w[1], "--until", w[2])
    assert schedule() == together
    # run again: the same windows (same ids), nothing changed
    again = js(cli("warm", "--replicas", "4", "--running", "--from", windows["A"][1],
                   "--until", windows["A"][2], "--json"))
    assert (again["action"], again["window"]) == ("exists", ids["A"])
    assert schedule() == together
    cancel_all()
    assert actions(sandbox_client) == []


def test_sigint_at_drawn_points_of_reserve_yes_never_loses_or_doubles_a_purchase(
        cli, sandbox, sandbox_client, sandbox_home, tmp_path):
    """Issue 31: Ctrl-C at drawn moments of `warm --reserve --yes` (a child process, the
    signal to its group as a terminal sends it), then the same command run to its end: every
    block bought for the pool is in the ledger, at most one was bought for the window, and
    the window runs in it."""
    import random
    import signal
    import subprocess
    import sys
    import time
    from datetime import UTC, datetime, timedelta

    from poolctl.runtime.purchases import ledger_path
    from tests.plugins.sandbox import poolctl_env

    sandbox_admin(sandbox, "POST", "/_poolctl/clock", {"offset_seconds": 0})
    day = (datetime.now(UTC) + timedelta(days=5)).date()
    window = ["--replicas", "4", "--running", "--from", f"{day}T13:00:00Z", "--until",
              f"{day}T15:00:00Z", "--reserve", "--yes"]
    path = cli("warm", "--list").args[cli("warm", "--list").args.index("-f") + 1]
    env = poolctl_env(sandbox_home, POOLCTL_POLL_S="0.05")
    before = {r["CapacityReservationId"] for r in capacity_blocks(sandbox)}
    rng = random.Random(31)
    for delay in sorted(round(rng.uniform(0.8, 2.5), 2) for _ in range(4)):
        p = subprocess.Popen([sys.executable, "-m", "poolctl", "warm", *window, "-f", path,
                              "--sandbox"], env=env, cwd=str(sandbox_home),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        time.sleep(delay)
        try:
            os.killpg(p.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        _, err = p.communicate(timeout=120)
        assert p.returncode in (0, 130, -signal.SIGINT), err[-2000:]
        assert "Traceback" not in err, err[-3000:]
    done = js(cli("warm", *window, "--json"))
    assert done["action"] in ("scheduled", "exists")
    new = [r for r in capacity_blocks(sandbox) if r["CapacityReservationId"] not in before]
    assert len(new) == 1, [r["CapacityReservationId"] for r in new]  # never two
    (block,) = new
    assert done["bought"] == block["CapacityReservationId"]
    steps = [json.loads(line) for line in
             ledger_path(sandbox_home).read_text().splitlines()]
    mine = [s for s in steps if s.get("reservation") == block["CapacityReservationId"]]
    assert mine and mine[0]["state"] == "bought" and mine[0]["pool"] == "chat-70b"
    (described,) = sandbox_client("ec2").describe_capacity_reservations(
        CapacityReservationIds=[block["CapacityReservationId"]])["CapacityReservations"]
    tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
    assert tags["poolctl:window"] == mine[0]["window"] and tags["poolctl:bought-by"]
    unused = js(cli("warm", "--list", "--json"))["unused_blocks"]
    assert block["CapacityReservationId"] not in {b["id"] for b in unused}  # the window's
    cli("warm", "--cancel", done["window"])
