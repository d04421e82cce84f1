"""A launch window on a bought Capacity Block (issue 22): the offers are only those in the
pool's zones, nothing is bought without yes, and a run that bought the block but could not
make the window's group says what was bought, and the same command run again finishes with
that block instead of buying another. An in-memory cloud; the sandbox runs the real path
(tests/ops/test_launch_windows.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BlockOffering,
    BlockWindow,
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
        return f"cr-{len(self.bought):017x}"

    def block_zones(self, group):
        return self.zones

    def unused_block(self, cfg, pool, instance_type, count, start, end):
        used = {bw.block for bw in self.opened}
        for i, o in enumerate(self.bought, 1):
            if f"cr-{i:017x}" not in used:
                return BlockOffering(id=f"cr-{i:017x}", instance_type=o.instance_type,
                                     zone=o.zone, count=o.count, start=o.start, end=o.end,
                                     hours=o.hours, upfront_usd=0.0)
        return None

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
    assert "found, bought by an earlier run" in r.message
    # Inside the block: from 12:00 (after its 11:30 start) to 14:00 (well before its end).
    assert (bw.window.start, bw.window.end) == (START, END)
    assert ops.changes == []  # the pool's group: no size changed
