"""Predictive scaling on a deployed pool (issue 36, part 3), with real Terraform against the
session's sandbox: the policy `scaling.predictive: forecast` adds applies as synthesized and
reads back without a diff, changes no capacity, and `status` shows its forecast beside the
load that happened (the sandbox's forecast: extensions/forecasts.py).

Worked out by hand: predictive_target 6 in flight per replica x 4 replicas per node = 24 per
node (TargetValue); the load metric is the pool's running requests plus the waiting ones per
replica x 4. The history written: 48 hours in which the pool held 24 in flight (1 node's
worth) for 12 hours and 96 (4 nodes', at most the group's 6) for the 12 from the hour now
starting, as 60 one-minute datapoints an hour.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import run_poolctl, terraform_missing

ASG = "acme-chat-70b"
POLICY = f"{ASG}-predictive"

MISSING = terraform_missing()
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(MISSING is not None, reason=f"e2e deploy: {MISSING}")]


def _predictive(tmp_path: Path) -> Path:
    f = tmp_path / "poolctl.yaml"
    text = DEPLOYED_EXAMPLE.read_text()
    anchor = "      scale_down_stabilization_s: 900\n"
    assert anchor in text
    f.write_text(text.replace(anchor, anchor + "      predictive: forecast\n"
                                               "      predictive_target: 6\n"))
    return f


def _deploy(home: Path, f: Path, out: Path, *extra: str):
    return run_poolctl(home, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve", "-f",
                       str(f), "--out", str(out), *extra, timeout=900)


def _history(cw, busy_from: int) -> None:
    this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    data = []
    for k in range(1, 49):
        at = this_hour - timedelta(hours=k)
        running = 96.0 if (at.hour - busy_from) % 24 < 12 else 24.0
        for name, value in (("RunningRequests", running), ("RequestsWaitingPerReplica", 0.0)):
            data.append({"MetricName": name, "Timestamp": at + timedelta(minutes=30),
                         "Dimensions": [{"Name": "AutoScalingGroupName", "Value": ASG}],
                         "Values": [value], "Counts": [60.0]})
    for i in range(0, len(data), 500):
        cw.put_metric_data(Namespace="poolctl", MetricData=data[i:i + 500])


def test_a_forecast_only_policy_applies_forecasts_and_changes_no_capacity(
        deployed_pool, sandbox_home, sandbox_client, tmp_path):
    home = Path(sandbox_home)
    asg, cw = sandbox_client("autoscaling"), sandbox_client("cloudwatch")
    [before] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"]
    f = _predictive(tmp_path)
    res = _deploy(home, f, tmp_path / "cdktf.out", "--json")
    assert res.returncode == 0, res.stderr[-4000:]
    [stack] = json.loads(res.stdout)["stacks"]
    assert [(c["action"], c["address"].split(".")[0]) for c in stack["changes"]] == [
        ("create", "aws_autoscaling_policy")]
    [policy] = asg.describe_policies(AutoScalingGroupName=ASG,
                                     PolicyNames=[POLICY])["ScalingPolicies"]
    cfg = policy["PredictiveScalingConfiguration"]
    assert (cfg["Mode"], cfg["MaxCapacityBreachBehavior"]) == ("ForecastOnly",
                                                                "HonorMaxCapacity")
    # the plan's cold start (440 s: boot 120, image 120, weights 45, load 35, engine 90,
    # register 30), as the plan prints it
    assert cfg["SchedulingBufferTime"] == 440
    [spec] = cfg["MetricSpecifications"]
    assert spec["TargetValue"] == 24.0
    load = spec["CustomizedLoadMetricSpecification"]["MetricDataQueries"]
    assert [q.get("Expression") for q in load] == [None, None, "running + waiting * 4"]
    # what was applied reads back as written: a CI drift check finds nothing
    again = _deploy(home, f, tmp_path / "cdktf.out", "--plan-only", "--detailed-exitcode")
    assert again.returncode == 0, again.stderr[-4000:]

    busy_from = (datetime.now(UTC) + timedelta(seconds=440)).hour
    _history(cw, busy_from)
    st = run_poolctl(home, "status", "--cloud", "aws", "--sandbox", "-f", str(f), "--json")
    assert st.returncode == 0, st.stderr
    [pool] = json.loads(st.stdout)["pools"]
    pred = pool["predictive"]
    assert pred["buffer_s"] == 440 and pred["forecast"]["mode"] == "ForecastOnly"
    hours = {h["start"]: h for h in pred["forecast"]["hours"]}
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for k in range(-6, 3):
        h = now + timedelta(hours=k)
        busy = (h.hour - busy_from) % 24 < 12
        got = hours[h.isoformat()]
        # the same hour of the earlier days: 96 or 24 in flight, 60 minutes of it
        assert got["load"] == (5760.0 if busy else 1440.0)
        assert got["capacity"] == (4.0 if busy else 1.0)
        if k < 0:  # what happened: the history, as written
            assert got["actual_load"] == got["load"]
    text = run_poolctl(home, "status", "--cloud", "aws", "--sandbox", "-f", str(f))
    this = 4 if (now.hour - busy_from) % 24 < 12 else 1
    nxt = 4 if (now.hour + 1 - busy_from) % 24 < 12 else 1
    assert re.search(rf"forecast \(ForecastOnly\): {this} node\(s\) this hour, {nxt} next; "
                     r"\d+ in service; its load forecast of the last 6 hour\(s\) was off by "
                     r"0% of what happened", text.stdout), text.stdout
    # the same history as launch windows (what GCP pools get instead of a forecast):
    # 96 in flight for 12 hours needs 4 nodes, 3 beyond the minimum of 1
    sg = run_poolctl(home, "warm", "--suggest", "--cloud", "aws", "--sandbox", "-f", str(f),
                     "--days", "2", "--json")
    assert sg.returncode == 0, sg.stderr
    got = json.loads(sg.stdout)
    assert (got["hours"], got["in_flight_per_node"], got["min_nodes"]) == (48, 24.0, 1)
    [window] = got["suggestions"]
    assert sorted(window["hours_utc"]) == sorted((busy_from + k) % 24 for k in range(12))
    assert (window["nodes"], window["replicas"], window["peak_in_flight"]) == (3, 12, 96.0)
    # ForecastOnly: the busy hour's 4 nodes were never launched
    [after] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"]
    assert after["DesiredCapacity"] == before["DesiredCapacity"]
