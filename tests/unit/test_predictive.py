"""Predictive scaling's figures, the config that asks for it, the GCP warning, and the
forecast lines of `status` (numbers worked by hand)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from poolctl.cloud import Cloud
from poolctl.clouds.base import ForecastHour, Group, LoadForecast, NodeState, PoolStatus
from poolctl.commands.ops import forecast_lines
from poolctl.config import parse_config
from poolctl.errors import UsageError
from poolctl.predictive import predictive
from poolctl.rules import run_checks
from poolctl.runtime import forecast_error
from poolctl.sizing import plan_pool
from poolctl.starts import KindStarts
from tests.configs import pool_yaml

SCALING = "      scale_down_stabilization_s: 900\n"


def _cfg(extra: str):
    text = pool_yaml()
    assert SCALING in text
    return parse_config(text.replace(SCALING, SCALING + extra))


def test_predictive_needs_a_target_one_line_naming_it():
    with pytest.raises(UsageError) as e:
        _cfg("      predictive: forecast\n")
    msg = str(e.value)
    assert "pools[0].scaling.predictive_target" in msg and "plan --traffic" in msg
    assert "\n" not in msg


def test_figures_from_the_file_and_the_plan():
    cfg = _cfg("      predictive: forecast-and-scale\n      predictive_target: 6\n")
    pool = cfg.pools[0]
    plan = plan_pool(pool, Cloud.aws)
    ahead = predictive(pool, plan)
    assert ahead is not None
    # 6 per replica x 4 replicas of TP 2 per p5 node; the plan's cold start of the example:
    # boot 120 + image 120 + weights 45 + load 35 + engine 90 + register 30 = 440 s
    assert (ahead.target_per_node, ahead.buffer_s, ahead.aws_mode) == (24, 440,
                                                                       "ForecastAndScale")
    assert ahead.buffer_source == "the plan's cold start"
    set_buffer = _cfg("      predictive: forecast\n      predictive_target: 6\n"
                      "      predictive_buffer_s: 300\n").pools[0]
    got = predictive(set_buffer, plan)
    assert got is not None and (got.buffer_s, got.aws_mode) == (300, "ForecastOnly")
    assert predictive(_cfg("").pools[0], plan) is None


def test_gcp_placement_says_predictive_is_cpu_only_and_names_warm_suggest():
    cfg = _cfg("      predictive: forecast\n      predictive_target: 6\n")
    found = [f for f in run_checks(cfg, cfg.targets(None, None))
             if f.check == "predictive-where-offered"]
    assert [(f.cloud, f.severity) for f in found] == [(Cloud.gcp, "warning")]
    assert "CPU utilization only" in found[0].message
    assert "poolctl warm --suggest --cloud gcp" in found[0].hint


def _status(hours: list[ForecastHour], starts=None, in_service=2) -> PoolStatus:
    group = Group(Cloud.aws, "acme-chat-70b", "us-east-1", 1, 6, 2, 0, "", "1")
    nodes = [NodeState(f"i-{k}", "InService", "in_service") for k in range(in_service)]
    return PoolStatus(pool="chat-70b", cloud=Cloud.aws, group=group, replicas_per_node=4,
                      nodes=nodes, rollout=None, queue_per_replica=0.0,
                      forecast=LoadForecast("acme-chat-70b-predictive", "ForecastOnly", hours,
                                            None),
                      forecast_buffer_s=440, starts=starts or {})


def test_forecast_lines_this_hour_next_and_the_error_of_the_last_hours():
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    hours = [
        ForecastHour(now - timedelta(hours=2), 1000.0, 1.0, 1200.0),  # off by 200
        ForecastHour(now - timedelta(hours=1), 2000.0, 2.0, 1800.0),  # off by 200
        ForecastHour(now, 3000.0, 3.0, None),
        ForecastHour(now + timedelta(hours=1), 4000.0, 4.0, None),
    ]
    s = _status(hours)
    # (200 + 200) / (1200 + 1800) = 13.3 %
    assert forecast_error(s.forecast) == (pytest.approx(0.1333, abs=1e-4), 2)
    assert forecast_lines(s) == [
        "forecast (ForecastOnly): 3 node(s) this hour, 4 next; 2 in service; its load "
        "forecast of the last 2 hour(s) was off by 13% of what happened (mean absolute error)"]
    slow = _status(hours, {"cold": KindStarts("cold", 5, 400.0, 512.3, now.isoformat())})
    assert forecast_lines(slow)[1] == (
        "forecast: nodes launch 440 s ahead, but a cold start measured p90 512.3 s: set "
        "scaling.predictive_buffer_s: 513 and deploy")


def test_forecast_lines_before_24_hours_of_history_and_without_a_policy():
    s = _status([])
    assert forecast_lines(s) == [
        "forecast (ForecastOnly): none yet: AWS forecasts once the load metric has 24 hours "
        "of history"]
    s.forecast = None
    assert forecast_lines(s)[0].startswith("forecast: no predictive policy on the group yet")
    s.forecast_buffer_s = None
    assert forecast_lines(s) == []


def _day_history(in_flight: dict[int, float], quiet: float, days: int = 2) -> dict:
    end = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)
    return {end - timedelta(hours=k): in_flight.get((end - timedelta(hours=k)).hour, quiet)
            for k in range(1, 24 * days + 1)}


def test_suggested_windows_cover_each_busy_stretch_a_cold_start_ahead():
    from poolctl.predictive import suggest_windows

    # 24 in flight per node; minimum 1 node, at most 6. Busy: 22:00-02:00 UTC at up to 70
    # (ceil(70 / 24) = 3 nodes: +2) across midnight, and 09:00-11:00 at 30 (2 nodes: +1);
    # the other hours 20 (1 node).
    hist = _day_history({22: 50.0, 23: 70.0, 0: 70.0, 1: 49.0, 9: 30.0, 10: 30.0}, 20.0)
    now = datetime(2026, 12, 7, 8, 58, tzinfo=UTC)
    got = suggest_windows(hist, per_node=24, min_nodes=1, max_nodes=6, rpn=4, lead_s=440,
                          now=now)
    # 09:00 less 440 s is 08:52:40, already past at 08:58: tomorrow's; 22:00 today's
    assert [(s.hours_utc, s.nodes, s.replicas, s.peak_in_flight) for s in got] == [
        ((22, 23, 0, 1), 2, 8, 70.0), ((9, 10), 1, 4, 30.0)]
    assert [(s.start, s.end) for s in got] == [
        (datetime(2026, 12, 7, 21, 52, 40, tzinfo=UTC), datetime(2026, 12, 8, 2, tzinfo=UTC)),
        (datetime(2026, 12, 8, 8, 52, 40, tzinfo=UTC), datetime(2026, 12, 8, 11, tzinfo=UTC))]
    # never beyond the maximum; none when no hour needs more than the minimum
    capped = suggest_windows(_day_history({12: 1000.0}, 5.0), 24, 1, 6, 4, 440, now)
    assert [(s.hours_utc, s.nodes) for s in capped] == [((12,), 5)]
    assert suggest_windows(_day_history({}, 24.0), 24, 1, 6, 4, 440, now) == []
