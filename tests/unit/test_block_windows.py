"""A launch window on a bought Capacity Block (issue 22): the offers are only those in the
pool's zones, nothing is bought without yes, and a run that bought the block but could not
make the window's group says what was bought, and the same command run again finishes with
that block instead of buying another. An in-memory cloud; the sandbox runs the real path
(tests/ops/test_launch_windows.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from poolctl import naming, runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BlockOffering,
    BlockWindow,
    BoughtBlock,
    BuysCapacityBlocks,
    RunsBlockWindows,
    SchedulesWindows,
)
from poolctl.errors import OperationFailed
from tests.unit.test_runtime_math import FakeOps, group, llama, own_home  # noqa: F401

DAY = (datetime.now(UTC) + timedelta(days=2)).replace(hour=0, minute=0, second=0,
                                                      microsecond=0)
START, END = DAY.replace(hour=12), DAY.replace(hour=14)
BLOCK_START, BLOCK_END = DAY.replace(hour=11, minute=30), DAY.replace(hour=11, minute=30) \
    + timedelta(days=1)


class FakeBlockOps(FakeOps, SchedulesWindows, BuysCapacityBlocks, RunsBlockWindows):
    max_windows = 62
    raises_group_minimum = True

    def __init__(self, zones: list[str], fail_open: int = 0) -> None:
        super().__init__(group(), granted=100_000)
        self.zones, self.fail_open = zones, fail_open
        self.bought: list[BlockOffering] = []
        self.tags: list[dict[str, str]] = []
        self.opened: list[BlockWindow] = []

    def scheduled_windows(self, group):
        return [], None

    def write_windows(self, group, windows, base_min, removed):
        raise AssertionError("a block window leaves the pool's group alone")

    def capacity_block_offerings(self, region, instance_type, count, hours, earliest, latest):
        return [BlockOffering(id=f"cbr-{z}", instance_type=instance_type, zone=z, count=count,
                              start=BLOCK_START, end=BLOCK_END, hours=24,
                              upfront_usd=2641.92 + i)
                for i, z in enumerate(["us-east-1a", "us-east-1b"])]

    def buy_capacity_block(self, region, offering, tags):
        self.bought.append(offering)
        self.tags.append(dict(tags))
        return f"cr-{len(self.bought):017x}"

    def block_zones(self, group):
        return self.zones

    def pool_blocks(self, cfg, pool):
        return [BoughtBlock(id=f"cr-{i:017x}", instance_type=o.instance_type, zone=o.zone,
                            count=o.count, start=o.start, end=o.end, state="scheduled",
                            window=tags.get(naming.TAG_WINDOW),
                            span=tags.get(naming.TAG_WINDOW_SPAN),
                            bought_by=tags.get(naming.TAG_BOUGHT_BY),
                            bought_at=tags.get(naming.TAG_BOUGHT_AT))
                for i, (o, tags) in enumerate(zip(self.bought, self.tags, strict=True), 1)]

    def open_block_window(self, group, window, block, zone, tags):
        if self.fail_open:
            self.fail_open -= 1
            raise OperationFailed("aws autoscaling:CreateAutoScalingGroup x: Throttling")
        bw = BlockWindow(window=window, block=block, group=f"{group.name}-{window.id}",
                         zone=zone, in_service=0)
        self.opened.append(bw)
        return bw

    def block_windows(self, cfg, pool):
        return list(self.opened)

    def close_block_window(self, group, bw):
        self.opened.remove(bw)


def schedule(ops, yes: bool):
    cfg, pool = llama()
    return runtime.schedule_window(cfg, pool, Cloud.aws, ops, 8, START, END, True,
                                   datetime.now(UTC), reserve=True, yes=yes)


def test_only_blocks_in_the_pools_zones_and_nothing_bought_without_yes():
    ops = FakeBlockOps(zones=["us-east-1b", "us-east-1c"])
    r = schedule(ops, yes=False)
    # us-east-1a's block is cheaper, but the pool's group has no subnet there.
    assert [o.zone for o in r.offerings] == ["us-east-1b"] and ops.bought == []
    assert r.action == "offered" and "add --yes" in r.message
    with pytest.raises(OperationFailed) as e:
        schedule(FakeBlockOps(zones=["us-east-1c"]), yes=True)
    assert "no subnet" in str(e.value) and "nothing was bought" in str(e.value)


def test_a_failed_group_after_the_purchase_is_finished_by_running_again():
    ops = FakeBlockOps(zones=["us-east-1a"], fail_open=1)
    with pytest.raises(OperationFailed) as e:
        schedule(ops, yes=True)
    assert len(ops.bought) == 1 and ops.opened == []
    msg = str(e.value)
    assert "Capacity Block cr-00000000000000001 bought for $2,641.92" in msg
    assert "cannot be cancelled" in msg and "run the same command again" in msg
    r = schedule(ops, yes=True)
    assert len(ops.bought) == 1  # not bought again
    (bw,) = ops.opened
    assert (r.bought, bw.block, bw.zone) == ("cr-00000000000000001",) * 2 + ("us-east-1a",)
    assert "found, bought " in r.message and "no window used it" in r.message
    # Inside the block: from 12:00 (after its 11:30 start) to 14:00 (well before its end).
    assert (bw.window.start, bw.window.end) == (START, END)
    assert ops.changes == []  # the pool's group: no size changed


# -- issue 31: purchases never lost nor doubled -----------------------------------------


class Interrupted(FakeBlockOps):
    """Ctrl-C at a chosen point: `after_buy` right after the purchase returned (before the
    window's group); `in_buy` inside the purchase call, the cloud having made it (`made`) or
    not."""

    def __init__(self, zones, point: str, made: bool = True) -> None:
        super().__init__(zones)
        self.point, self.made = point, made

    def buy_capacity_block(self, region, offering, tags):
        if self.point == "in_buy":
            self.point = ""
            if self.made:
                super().buy_capacity_block(region, offering, tags)
            raise KeyboardInterrupt
        return super().buy_capacity_block(region, offering, tags)

    def open_block_window(self, group, window, block, zone, tags):
        if self.point == "after_buy":
            self.point = ""
            raise KeyboardInterrupt
        if self.point == "half_open":  # the group made, its two actions not yet
            self.point = ""
            self.opened.append(BlockWindow(
                window=dataclasses.replace(window, start=None, end=datetime.now(UTC)),
                block=block, group=f"{group.name}-{window.id}", zone=zone, in_service=0))
            raise KeyboardInterrupt
        self.opened = [bw for bw in self.opened if bw.group != f"{group.name}-{window.id}"]
        return super().open_block_window(group, window, block, zone, tags)


def listed(ops):
    cfg, pool = llama()
    return runtime.list_windows(cfg, pool, Cloud.aws, ops, datetime.now(UTC))


def ledger() -> list[dict]:
    import json
    import os
    from pathlib import Path

    path = Path(os.environ["POOLCTL_HOME"]) / "purchases.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ctrl_c_right_after_the_purchase_leaves_it_recorded_listed_and_used_next_time():
    ops = Interrupted(zones=["us-east-1a"], point="after_buy")
    with pytest.raises(KeyboardInterrupt):
        schedule(ops, yes=True)
    assert len(ops.bought) == 1 and ops.opened == []
    steps = ledger()
    assert [s["state"] for s in steps] == ["buying", "bought"]
    assert steps[1]["reservation"] == "cr-00000000000000001"
    assert steps[0]["window"] == ops.tags[0][naming.TAG_WINDOW]
    assert steps[0]["by"] == ops.tags[0][naming.TAG_BOUGHT_BY] and "@" in steps[0]["by"]
    # warm --list (and status) name the block and the command that uses it
    r = listed(ops)
    assert [b.id for b in r.unused_blocks] == ["cr-00000000000000001"] and not r.pending
    (note,) = r.notes()
    assert "Capacity Block cr-00000000000000001" in note and "has no window" in note
    assert f"--from {START:%Y-%m-%dT%H:%MZ} --until {END:%Y-%m-%dT%H:%MZ} --reserve --yes" \
        in note and "cannot be cancelled" in note
    # A dry run offers that block, not a second purchase; --yes uses it.
    dry = schedule(ops, yes=False)
    assert dry.action == "offered" and [o.id for o in dry.offerings] == [
        "cr-00000000000000001"] and "nothing is bought" in dry.message
    done = schedule(ops, yes=True)
    assert len(ops.bought) == 1 and done.bought == "cr-00000000000000001"
    assert listed(ops).unused_blocks == ()


def test_the_same_reserve_run_twice_buys_once_and_says_so():
    ops = FakeBlockOps(zones=["us-east-1a"])
    first = schedule(ops, yes=True)
    again = schedule(ops, yes=True)
    assert len(ops.bought) == 1 and len(ops.opened) == 1
    assert again.action == "exists" and again.window == first.window
    assert again.bought == first.bought and "nothing bought" in again.message


def test_a_purchase_whose_answer_never_came_is_pending_until_the_cloud_shows_it():
    ops = Interrupted(zones=["us-east-1a"], point="in_buy", made=False)
    with pytest.raises(KeyboardInterrupt):
        schedule(ops, yes=True)
    assert [s["state"] for s in ledger()] == ["buying"] and ops.bought == []
    r = listed(ops)
    (p,) = r.pending
    assert p.offering == "cbr-us-east-1a" and "got no answer" in r.notes()[0]
    # made by the cloud although the answer was lost: the block carries the window's tag
    ops2 = Interrupted(zones=["us-east-1a"], point="in_buy", made=True)
    with pytest.raises(KeyboardInterrupt):
        schedule(ops2, yes=True)
    r2 = listed(ops2)
    assert r2.pending == () and [b.id for b in r2.unused_blocks] == ["cr-00000000000000001"]
    schedule(ops2, yes=True)
    assert len(ops2.bought) == 1  # the lost answer's block is used, not bought again


def test_a_refused_purchase_is_recorded_failed():
    class Refused(FakeBlockOps):
        def buy_capacity_block(self, region, offering, tags):
            raise OperationFailed("aws ec2:PurchaseCapacityBlock: InsufficientCapacity")

    with pytest.raises(OperationFailed):
        schedule(Refused(zones=["us-east-1a"]), yes=True)
    assert [s["state"] for s in ledger()] == ["buying", "failed"]
    assert "InsufficientCapacity" in ledger()[1]["error"]


def test_ctrl_c_between_the_windows_group_and_its_actions_is_finished_by_running_again():
    ops = Interrupted(zones=["us-east-1a"], point="half_open")
    with pytest.raises(KeyboardInterrupt):
        schedule(ops, yes=True)
    (half,) = ops.opened
    assert half.window.start is None and len(ops.bought) == 1
    r = schedule(ops, yes=True)
    (bw,) = ops.opened
    assert (bw.window.start, bw.window.end) == (START, END) and len(ops.bought) == 1
    assert r.action == "scheduled" and "half made" in r.message
    assert schedule(ops, yes=True).action == "exists"
