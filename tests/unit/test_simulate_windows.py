"""Launch windows in the simulator (`simulate --warm-window`): when the window's nodes serve,
what they cost, overlaps, and the flag's bad input. The example pool (llama-70b-p5 on AWS):
4 replicas per node, min 1 node, max 6, warm pool 2 stopped nodes, $55.04 per node-hour."""

from __future__ import annotations

import json
import os

import pytest

from poolctl.capacity import run_pool
from poolctl.config import load_config
from poolctl.simulate import SimWindow, summary
from poolctl.sizing import plan_pool
from poolctl.traces import Trace
from tests.inproc import run
from tests.plugins.sandbox import REPO

EXAMPLE = REPO / "examples" / "llama-70b-p5" / "poolctl.yaml"
PRICE = 55.04


@pytest.fixture(scope="module")
def pool():
    return load_config(EXAMPLE).pools[0]


def calm(span_s: float) -> Trace:
    """One short request every 20 s: one replica is never busy, the queue never grows."""
    n = int(span_s // 20)
    return Trace("calm", [20.0 * k for k in range(n)], [100] * n, [10] * n)


def serving_at(res, t: float) -> int:
    return [s for at, s, _ in res.timeline if at <= t][-1]


def test_a_window_begun_before_the_trace_serves_from_its_start_and_is_fixed_cost(pool):
    # Window -10m..600 s of 8 replicas = 2 nodes over min 1: 3 nodes serve from t=0.
    w = SimWindow(start_s=-600, end_s=600, nodes=2)
    res = run_pool(pool, "aws", calm(1200), autoscale=True, windows=(w,), run_until_s=1200)
    assert serving_at(res, 0) == 3 and serving_at(res, 700) == 1
    # Billed: 3 nodes x 600 s + 1 node x 600 s = 2400 node-s = 0.667 h, all of it fixed
    # (1 node x 1200 s of minimum + 2 x 600 s of window).
    # (+ under a second: the last request finishes after the 1200 s mark, on 1 node.)
    assert res.node_s == pytest.approx(2400, abs=1)
    s = summary(res, 2.0).to_json()
    assert s["cost"]["usd"] == pytest.approx(2400 / 3600 * PRICE, abs=0.05)
    assert s["cost"]["marginal_usd"] == pytest.approx(0, abs=0.01)


def test_a_window_at_300_s_launches_from_the_warm_pool_then_gives_the_nodes_back(pool):
    plan = plan_pool(pool, "aws")
    warm = sum(plan.start_phases["warm_stopped"].values())
    w = SimWindow(start_s=300, end_s=1500, nodes=2)
    res = run_pool(pool, "aws", calm(1800), autoscale=True, windows=(w,), run_until_s=1800)
    # Both nodes come from the 2-node warm pool: they serve at 300 + the warm start.
    assert serving_at(res, 300 + warm - 1) == 1
    assert serving_at(res, 300 + warm) == 3
    assert serving_at(res, 1500) == 1  # the minimum and the desired size return
    # 1 node x 1800 s + 2 nodes x (1500 - 300) s = 4200 node-s, starting nodes billed too.
    assert res.node_s == pytest.approx(4200, abs=1)


def test_overlapping_windows_take_the_larger_not_the_sum(pool):
    # Begun 600 s before: 2 warm nodes (260.5 s) and 1 cold (440.5 s) are ready by t=0.
    a = SimWindow(start_s=-600, end_s=600, nodes=1)
    b = SimWindow(start_s=-600, end_s=300, nodes=3)
    res = run_pool(pool, "aws", calm(900), autoscale=True, windows=(a, b), run_until_s=900)
    # 0..300: 1 + max(1, 3) = 4 nodes (not 1 + 4 = 5); 300..600: 1 + 1 = 2; then 1.
    assert serving_at(res, 0) == 4 and serving_at(res, 400) == 2 and serving_at(res, 700) == 1


def test_a_window_begun_shortly_before_serves_once_its_nodes_have_started(pool):
    plan = plan_pool(pool, "aws")
    warm = sum(plan.start_phases["warm_stopped"].values())
    # From -60 s: both nodes from the warm pool, serving at -60 + warm start.
    w = SimWindow(start_s=-60, end_s=1200, nodes=2)
    res = run_pool(pool, "aws", calm(1200), autoscale=True, windows=(w,), run_until_s=1200)
    assert serving_at(res, 0) == 1
    assert serving_at(res, -60 + warm) == 3


def test_a_stopped_window_raises_the_warm_pool_without_billing_it(pool):
    w = SimWindow(start_s=-600, end_s=600, nodes=2, running=False)
    res = run_pool(pool, "aws", calm(1200), autoscale=True, windows=(w,), run_until_s=1200)
    assert serving_at(res, 0) == 1  # nothing serves more: the nodes wait stopped
    assert res.node_s == pytest.approx(1200, abs=1)  # 1 node; stopped nodes bill their disks only


@pytest.mark.parametrize("value", [
    "0,1h", "0,1h,8,hot", "1h,0,8", "0,0,8", "0,1h,0", "0,1h,x", "soon,1h,8", "0,1h,-8",
    "0,1h,40",  # 10 nodes: more than max 6 - min 1 leaves room for
])
def test_bad_warm_window_is_one_line_exit_2(value):
    res = run(["simulate", "-f", str(EXAMPLE), "--cloud", "aws", "--rate", "1",
                   "--duration", "60", "--warm-window", value], env=dict(os.environ), cwd=REPO)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "--warm-window" in last and "Traceback" not in res.stderr


def test_the_json_compares_the_window_with_the_same_replay_without_it():
    res = run(["simulate", "-f", str(EXAMPLE), "--cloud", "aws", "--rate", "0.05",
                   "--duration", "600", "--warm-window", "-5m,10m,8", "--json"],
              env=dict(os.environ), cwd=REPO)
    assert res.returncode == 0, res.stderr
    ww = json.loads(res.stdout)["warm_window"]
    assert (ww["from_s"], ww["until_s"], ww["replicas"], ww["nodes"], ww["state"]) == (
        -300, 600, 8, 2, "running")
    # Both billed over the same 600 s: 3 nodes vs 1 node -> 0.5 vs 0.167 node-hours.
    assert ww["with"]["node_hours"] == pytest.approx(0.5, abs=0.01)
    assert ww["without"]["node_hours"] == pytest.approx(600 / 3600, abs=0.01)
