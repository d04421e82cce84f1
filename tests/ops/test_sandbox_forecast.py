"""The sandbox's predictive scaling (extensions/forecasts.py) over HTTP with boto3: the
forecast from the load metric's history, HonorMaxCapacity, no forecast before 24 hours of
history, ForecastOnly changing nothing and ForecastAndScale raising capacity ahead.

The history is a daily curve written with PutMetricData timestamps in the past: the pool holds
96 requests in flight for the 12 UTC hours from the one 10 minutes from now (the busy half of
its day, so that scaling ahead has something to do whenever the test runs) and 24 in the
other 12, each hour one value/count datum of 60 one-minute datapoints (what the nodes publish,
docs/metrics.md).
Worked out by hand: an hour's load (Sum) is 60 x in flight (1,440 or 5,760); with TargetValue
24 per node its capacity is ceil(24 / 24) = 1 or ceil(96 / 24) = 4, at most the group's
MaxSize 3.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.ops.test_sandbox import launch_template, make_group

NS = "poolctl"


BUFFER_S = 600
# The UTC hour the busy half of the day starts at: the one BUFFER_S from when the history is
# written (_setup); a later hour of the test's run is still in the busy half.
_busy_from = [0]


def _busy(hour: int) -> bool:
    return (hour - _busy_from[0]) % 24 < 12


def _in_flight(hour: int) -> float:
    return 96.0 if _busy(hour) else 24.0


def _queries(group: str, stat: str) -> list[dict]:
    def q(qid: str, name: str) -> dict:
        return {"Id": qid, "ReturnData": False, "MetricStat": {"Stat": stat, "Metric": {
            "Namespace": NS, "MetricName": name,
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group}]}}}
    return [q("running", "RunningRequests"), q("waiting", "RequestsWaitingPerReplica"),
            {"Id": "in_flight", "Expression": "running + waiting * 4", "ReturnData": True}]


def _policy(asg, group: str, mode: str, buffer_s: int = BUFFER_S) -> str:
    name = f"{group}-predictive"
    asg.put_scaling_policy(
        AutoScalingGroupName=group, PolicyName=name, PolicyType="PredictiveScaling",
        PredictiveScalingConfiguration={
            "Mode": mode, "SchedulingBufferTime": buffer_s,
            "MaxCapacityBreachBehavior": "HonorMaxCapacity",
            "MetricSpecifications": [{
                "TargetValue": 24.0,
                "CustomizedLoadMetricSpecification": {"MetricDataQueries": _queries(group,
                                                                                   "Sum")},
                "CustomizedScalingMetricSpecification": {
                    "MetricDataQueries": _queries(group, "Average")}}]})
    return name


def _history(cw, group: str, hours: int) -> datetime:
    """`hours` hours of the curve before the current UTC hour; returns that hour's start."""
    this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    data = []
    for k in range(1, hours + 1):
        at = this_hour - timedelta(hours=k)
        for name, value in (("RunningRequests", _in_flight(at.hour)),
                            ("RequestsWaitingPerReplica", 0.0)):
            data.append({"MetricName": name, "Timestamp": at + timedelta(minutes=30),
                         "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group}],
                         "Values": [value], "Counts": [60.0]})
    for i in range(0, len(data), 500):
        cw.put_metric_data(Namespace=NS, MetricData=data[i:i + 500])
    return this_hour


def _setup(sandbox_client, hours: int, mode: str, desired: int = 1):
    ec2, asg, cw = (sandbox_client(s) for s in ("ec2", "autoscaling", "cloudwatch"))
    _busy_from[0] = (datetime.now(UTC) + timedelta(seconds=BUFFER_S)).hour
    lt_id, _ = launch_template(ec2)
    group = f"forecast-{uuid.uuid4().hex[:8]}"
    make_group(asg, group, lt_id, desired=desired, max_size=3, min_size=1)
    policy = _policy(asg, group, mode)
    this_hour = _history(cw, group, hours)
    return asg, group, policy, this_hour


def test_the_forecast_repeats_the_daily_curve_within_the_group_maximum(sandbox_client):
    asg, group, policy, this_hour = _setup(sandbox_client, 48, "ForecastOnly")
    out = asg.get_predictive_scaling_forecast(
        AutoScalingGroupName=group, PolicyName=policy, StartTime=this_hour,
        EndTime=this_hour + timedelta(hours=24))
    [load] = out["LoadForecast"]
    hours = [this_hour + timedelta(hours=k) for k in range(24)]
    assert load["Timestamps"] == hours
    assert load["Values"] == [60 * _in_flight(h.hour) for h in hours]
    assert out["CapacityForecast"]["Values"] == [3.0 if _busy(h.hour) else 1.0 for h in hours]
    assert load["MetricSpecification"]["TargetValue"] == 24.0
    # the load as it was, read with the policy's own queries (metric math included)
    cw = sandbox_client("cloudwatch")
    past = [this_hour - timedelta(hours=k) for k in (3, 2, 1)]
    got = cw.get_metric_data(
        MetricDataQueries=[{**q, "MetricStat": {**q["MetricStat"], "Period": 3600}}
                           if "MetricStat" in q else q for q in _queries(group, "Sum")],
        StartTime=past[0], EndTime=this_hour)["MetricDataResults"]
    assert [r["Id"] for r in got] == ["in_flight"]
    assert dict(zip(got[0]["Timestamps"], got[0]["Values"], strict=True)) == {
        h: 60 * _in_flight(h.hour) for h in past}
    # ForecastOnly: the calls above changed no capacity
    [g] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    assert g["DesiredCapacity"] == 1


def test_no_forecast_before_24_hours_of_history(sandbox_client):
    asg, group, policy, this_hour = _setup(sandbox_client, 20, "ForecastOnly")
    out = asg.get_predictive_scaling_forecast(
        AutoScalingGroupName=group, PolicyName=policy, StartTime=this_hour,
        EndTime=this_hour + timedelta(hours=6))
    assert out["CapacityForecast"] == {"Timestamps": [], "Values": []}
    assert out["LoadForecast"][0]["Values"] == []


def test_forecast_and_scale_raises_the_group_ahead_and_never_lowers_it(sandbox_client):
    asg, group, _, _ = _setup(sandbox_client, 48, "ForecastAndScale")
    # the hour that starts within the buffer from now is busy: 96 in flight, 4 nodes, at most 3
    [g] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    assert g["DesiredCapacity"] == 3
    # lowered by hand below the forecast: raised again at the next call; never lowered
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=2)
    [g] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    assert g["DesiredCapacity"] == 3


def test_a_forecast_of_an_unknown_policy_is_a_validation_error(sandbox_client):
    from botocore.exceptions import ClientError

    asg, group, _, this_hour = _setup(sandbox_client, 1, "ForecastOnly")
    with pytest.raises(ClientError) as e:
        asg.get_predictive_scaling_forecast(
            AutoScalingGroupName=group, PolicyName="nope", StartTime=this_hour,
            EndTime=this_hour + timedelta(hours=1))
    assert e.value.response["Error"]["Code"] == "ValidationError"
