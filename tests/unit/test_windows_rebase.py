"""`warm` and `deploy` around launch windows (issue 22): the windows rise over the minimum
kept outside them, so `warm --running` / `--reset` while a window is open keeps its raise on
top, and a window scheduled over an earlier minimum returns to the one `warm` or `deploy`
set last. An in-memory cloud with AWS's semantics (scheduled actions set the group's
MinSize, absolute sizes at each edge); the example pool: 1 node minimum, 4 replicas a
node, maximum 7 nodes (6 + 1 surge)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from poolctl import runtime
from poolctl.clouds.base import SchedulesWarmWindows, SchedulesWindows
from poolctl.config import parse_config
from poolctl.windows import Window, raise_at
from tests.unit.test_runtime_math import FakeOps, group, llama, own_home  # noqa: F401

H = timedelta(hours=1)


class FakeWindowOps(FakeOps, SchedulesWindows):
    max_windows = 62
    raises_group_minimum = True

    def __init__(self, g, windows: list[Window], base: int) -> None:
        super().__init__(g, granted=100_000)
        self.windows, self.base = windows, base

    def scheduled_windows(self, group):
        return list(self.windows), self.base

    def write_windows(self, group, windows, base_min, removed):
        self.windows, self.base = list(windows), base_min
        now = datetime.now(UTC)
        if any(w.active(now) for w in windows):  # AWS: the open window's raise is in MinSize
            self.group = replace(self.group, min_nodes=base_min + raise_at(windows, now))


def open_window(nodes: int = 2) -> Window:
    now = datetime.now(UTC)
    return Window(id="w1", nodes=nodes, start=None, end=now + H)  # begun: its start ran


def test_warm_running_in_an_open_window_keeps_the_raise_on_top_and_moves_the_base():
    cfg, pool = llama()
    # Kept minimum 1, a window of +2 open: the group's minimum is 3, desired 3.
    ops = FakeWindowOps(group(min_nodes=3, desired_nodes=3), [open_window(2)], base=1)
    r = runtime.warm(cfg, pool, "aws", ops, replicas=4, running=True)
    # Outside the window: 1 + 1 node (4 replicas) = 2; with the window's 2 on top: 4.
    assert ops.changes == [{"min": 4, "warm": 2, "desired": None}]
    assert r.after.min_nodes == 4 and ops.group.min_nodes == 4
    # The window's end now returns to 2 (what `warm` set), not to the 1 it was written over.
    assert ops.base == 2 and [w.id for w in ops.windows] == ["w1"]
    assert "+2 of the open launch window" in r.message
    assert "now rise over a minimum of 2 node(s) (was 1)" in r.message


def test_warm_reset_in_an_open_window_returns_the_base_and_keeps_the_window():
    cfg, pool = llama()
    # `warm --running` had kept 2; a window of +2 is open: minimum 4, desired 4.
    ops = FakeWindowOps(group(min_nodes=4, desired_nodes=4), [open_window(2)], base=2)
    runtime.warm(cfg, pool, "aws", ops, replicas=None, reset=True)
    # The file's 1 + the window's 2 = 3; desired 4 - (2 - 1) = 3: the window's nodes stay.
    assert ops.changes == [{"min": 3, "warm": 2, "desired": 3}]
    assert ops.base == 1 and ops.group.min_nodes == 3


def test_deploy_moves_windows_scheduled_over_an_earlier_minimum():
    cfg, pool = llama()
    now = datetime.now(UTC)
    later = Window(id="w2", nodes=3, start=now + H, end=now + 2 * H)
    # Scheduled when a `warm --running` kept 2; since then `warm --reset`, then `deploy`
    # of the file's minimum of 1 (no warm record): the window must end at 1, not 2.
    ops = FakeWindowOps(group(min_nodes=1, desired_nodes=1), [later], base=2)
    line = runtime.deploy_windows(cfg, pool, "aws", ops)
    assert line == ("chat-70b: 1 window(s) now rise over a minimum of 1 node(s) (was 2) and "
                    "return to it at their ends")
    assert ops.base == 1 and ops.group.min_nodes == 1  # not open: the minimum is untouched
    assert runtime.deploy_windows(cfg, pool, "aws", ops) is None  # already over it


def test_no_window_no_change():
    cfg, pool = llama()
    ops = FakeWindowOps(group(), [], base=1)
    assert runtime.deploy_windows(cfg, pool, "aws", ops) is None
    runtime.warm(cfg, pool, "aws", ops, replicas=4, running=True)
    assert ops.changes == [{"min": 2, "warm": 2, "desired": None}] and ops.windows == []


# Windows of warm nodes (no --running): the warm pool's size rises over the one kept
# outside them, the same way.

class FakeWarmWindowOps(FakeOps, SchedulesWarmWindows):
    max_warm_windows = 62

    def __init__(self, g, windows: list[Window], base: int) -> None:
        super().__init__(g, granted=100_000)
        self.windows, self.base = windows, base

    def scheduled_warm_windows(self, group):
        return list(self.windows), self.base

    def write_warm_windows(self, group, windows, base_warm, removed, *, kept_min, running):
        self.windows, self.base = list(windows), base_warm
        now = datetime.now(UTC)
        if any(w.active(now) for w in windows):  # AWS: the open window's PutWarmPool ran
            self.group = replace(self.group, warm_min_nodes=base_warm + raise_at(windows, now))


def test_warm_in_an_open_window_of_warm_nodes_keeps_the_raise_on_top_and_moves_the_base():
    cfg, pool = llama()
    # Warm pool kept at 2, a window of +2 warm nodes open: the warm pool is 4.
    ops = FakeWarmWindowOps(group(warm_min_nodes=4), [open_window(2)], base=2)
    r = runtime.warm(cfg, pool, "aws", ops, replicas=12)
    # Outside the window: 12 replicas = 3 nodes; with the window's 2 on top: 5.
    assert ops.changes == [{"min": 1, "warm": 5, "desired": None}]
    assert r.before.warm_nodes == 4 and r.after.warm_nodes == 5
    assert ops.base == 3  # the window's end returns to what `warm` set
    assert "+2 warm of the open launch window" in r.message
    # Asking for what the warm pool holds outside the window changes nothing.
    assert not runtime.warm(cfg, pool, "aws", ops, replicas=12).changed


def test_warm_windows_are_refused_where_they_cannot_be_with_the_flag_named():
    import pytest

    from poolctl.errors import UsageError
    from tests.configs import pool_yaml

    cfg, pool = llama()
    with pytest.raises(UsageError, match="targetStoppedSize.*add --running"):
        runtime.check_warm_window(pool, "gcp", reserve=False)
    with pytest.raises(UsageError, match="--reserve without --running"):
        runtime.check_warm_window(pool, "aws", reserve=True)
    no_warm = parse_config(pool_yaml(warm=0)).pools[0]
    with pytest.raises(UsageError, match=r"warm_pool.replicas: 0"):
        runtime.check_warm_window(no_warm, "aws", reserve=False)
    runtime.check_warm_window(pool, "aws", reserve=False)  # the example keeps 2 warm nodes


def test_deploy_in_an_open_window_keeps_its_raise_and_says_the_window_returns_it():
    cfg, pool = llama()
    # No `warm` ran; a window of +2 nodes in service is open: minimum 3 (the file's 1 + 2).
    from poolctl.clouds.base import KeepsWarmSizes
    from poolctl.contract.aws import kept_sizes_env

    class KeepingOps(FakeWindowOps, KeepsWarmSizes):  # AWS: deploy passes the live sizes
        def kept_sizes_env(self, group, plan):
            return kept_sizes_env(plan, min_nodes=group.min_nodes,
                                  warm_min_nodes=group.warm_min_nodes)

    w = open_window(2)
    ops = KeepingOps(group(min_nodes=3, desired_nodes=3), [w], base=1)
    env, lines = runtime.deploy_keeps(cfg, pool, "aws", ops)
    assert env == {"TF_VAR_min_nodes": "3", "TF_VAR_warm_nodes": "2"} and lines == [
        f"chat-70b: keeps minimum nodes 3 (the file says 1; held by launch window w1 until "
        f"{w.end.isoformat(timespec='seconds')}, whose end returns to the file's 1)"]
