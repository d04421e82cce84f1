"""The autoscaler acts (`sandbox start --serve`): CloudWatch metric alarms evaluated on the
sandbox clock, and the Auto Scaling policies they (and target tracking) execute.

Pool time runs `speed` times faster than the machine's (serving_nodes.py): a datapoint that
`put-metric-data` stored at wall time w sits at pool time (w - start) x speed, and a 60 s
period lasts 60 / speed wall seconds.

- **Metric alarms** (PutMetricAlarm; the stacks' `queue-low`): each period, the statistic of
  every one of the last EvaluationPeriods periods; a period without datapoints follows
  TreatMissingData (notBreaching: not breaching; breaching: breaching; missing or ignore: not
  counted, and with no datapoint at all the state stays, or is INSUFFICIENT_DATA when it never
  had one). ALARM when at least DatapointsToAlarm of them breach, else OK; the state is set on
  moto's alarm (DescribeAlarms shows it, with its reason). While in ALARM, its Auto Scaling
  actions run once per period, as CloudWatch does for Auto Scaling actions.
- **Simple and step scaling policies** run as AWS runs them: ChangeInCapacity, ExactCapacity
  or PercentChangeInCapacity (MinAdjustmentMagnitude), within the group's bounds; a simple
  policy waits its cooldown (pool seconds) after the group's last scaling action.
- **Target tracking** (the stacks' `queue-target`): the metric's average each 60 s period;
  after 3 periods in a row above the target (AWS's AlarmHigh: 3 of 3 datapoints), the group's
  desired capacity becomes ceil(in service x metric / target) if that is more (at most its
  maximum); unless DisableScaleIn, after 15 periods in a row below 90 % of the target it
  becomes ceil(in service x metric / target), at least its minimum.

Not emulated: the AlarmHigh/AlarmLow alarms AWS creates for target tracking (no alarm of
moto's shows them), metric math alarms, percentile statistics, composite alarms, alarm
actions other than Auto Scaling policies (SNS), and instance warm-up excluding new instances
from the metric.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from poolctl.histograms import weighted_percentile
from poolctl.sandbox.extensions.common import LOCK, all_backends
from poolctl.sandbox.extensions.percentiles import PCT_STAT, datum_point
from poolctl.sandbox.extensions.percentiles import statistic as cw_statistic

NAMES = ("cloudwatch.alarms-act",)
TT_PERIOD_S = 60.0
TT_HIGH_PERIODS = 3
TT_LOW_PERIODS = 15
TT_LOW_FRACTION = 0.9


@dataclass
class _Clock:
    wall0: float = 0.0
    mono0: float = 0.0
    speed: float = 1.0
    on: bool = False


_clock = _Clock()


@dataclass
class _State:
    next_eval: dict[str, float] = field(default_factory=dict)  # alarm/policy key -> pool s
    last_scaling: dict[str, float] = field(default_factory=dict)  # group -> pool s
    tt_high: dict[str, int] = field(default_factory=dict)
    tt_low: dict[str, int] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    alarms: list[dict[str, Any]] = field(default_factory=list)  # state changes, in order


_state = _State()


def enable(speed: float) -> None:
    _clock.wall0, _clock.mono0 = time.time(), time.monotonic()
    _clock.speed, _clock.on = float(speed), True


def pool_now() -> float:
    return (time.monotonic() - _clock.mono0) * _clock.speed


def _pool_time(ts: Any) -> float:
    return float(ts.timestamp() - _clock.wall0) * _clock.speed


def _periods(cw: Any, namespace: str, name: str, dims: dict[str, str], statistic: str,
             period: float, count: int, now: float) -> list[float | None]:
    """The statistic of each of the last `count` whole periods, newest first (None: no
    datapoint in it)."""
    # (value, count) of each period (percentiles.datum_point)
    buckets: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    end = math.floor(now / period) * period  # periods end on multiples of the period
    for d in cw.metric_data:
        if d.namespace != namespace or d.name != name:
            continue
        if {x.name: x.value for x in d.dimensions} != dims:
            continue
        point = datum_point(d)
        if point is None:
            continue
        k = math.floor((end - _pool_time(d.timestamp)) / period)
        if 0 <= k < count:
            buckets[k].append(point)
    pct = PCT_STAT.match(statistic)
    if pct is not None:  # an alarm's ExtendedStatistic
        q = float(pct.group(1)) / 100
        return [weighted_percentile(b, q) if b else None for b in buckets]
    return [cw_statistic(b, statistic) if b else None for b in buckets]


def _breaches(value: float, op: str, threshold: float) -> bool:
    return {"GreaterThanThreshold": value > threshold,
            "GreaterThanOrEqualToThreshold": value >= threshold,
            "LessThanThreshold": value < threshold,
            "LessThanOrEqualToThreshold": value <= threshold}.get(op, False)


def _policies(asg: Any) -> dict[str, Any]:
    return {p.arn: p for p in list(asg.policies.values())}


def _set_desired(asg: Any, group: Any, desired: int, why: str, now: float) -> None:
    desired = max(group.min_size, min(group.max_size, desired))
    if desired == group.desired_capacity:
        return
    _state.log.append({"PoolSeconds": round(now, 1), "AutoScalingGroupName": group.name,
                       "From": group.desired_capacity, "To": desired, "Cause": why})
    group.set_desired_capacity(desired)
    _state.last_scaling[group.name] = now


def _execute(asg: Any, policy: Any, why: str, now: float) -> None:
    group = asg.autoscaling_groups.get(policy.auto_scaling_group_name)
    if group is None:
        return
    cooldown = float(policy.cooldown or 0) if policy.policy_type == "SimpleScaling" else 0.0
    last = _state.last_scaling.get(group.name)
    if last is not None and now - last < cooldown:
        return
    adj = policy.scaling_adjustment
    if adj is None:
        return
    cur = group.desired_capacity or 0
    kind = policy.adjustment_type or "ChangeInCapacity"
    if kind == "ExactCapacity":
        new = int(adj)
    elif kind == "PercentChangeInCapacity":
        step = cur * float(adj) / 100
        step = math.floor(step) if step > 0 else math.ceil(step)
        least = int(policy.min_adjustment_magnitude or 0)
        if abs(step) < least:
            step = least if adj > 0 else -least
        new = cur + step
    else:
        new = cur + int(adj)
    _set_desired(asg, group, new, f"policy {policy.name}: {why}", now)


def _step(asg: Any, policy: Any, value: float, threshold: float, why: str,
          now: float) -> None:
    """A step policy: the adjustment whose interval holds the breach (value - threshold)."""
    group = asg.autoscaling_groups.get(policy.auto_scaling_group_name)
    if group is None:
        return
    over = value - threshold
    for s in policy.step_adjustments or []:
        lo = s.get("MetricIntervalLowerBound")
        hi = s.get("MetricIntervalUpperBound")
        if (lo is None or over >= float(lo)) and (hi is None or over < float(hi)):
            cur = group.desired_capacity or 0
            adj = int(s["ScalingAdjustment"])
            new = adj if policy.adjustment_type == "ExactCapacity" else cur + adj
            _set_desired(asg, group, new, f"policy {policy.name}: {why}", now)
            return


def _alarm(cw: Any, asgs: list[Any], alarm: Any, now: float) -> None:
    period = float(alarm.period or 60)
    key = f"alarm:{alarm.region_name}:{alarm.name}"
    due = _state.next_eval.get(key)
    if due is not None and now < due:
        return
    _state.next_eval[key] = (math.floor(now / period) + 1) * period
    n = int(alarm.evaluation_periods or 1)
    m = int(alarm.datapoints_to_alarm or n)
    dims = {d.name: d.value for d in alarm.dimensions}
    statistic = alarm.statistic or alarm.extended_statistic or "Average"
    values = _periods(cw, alarm.namespace, alarm.metric_name, dims, statistic, period, n, now)
    missing = alarm.treat_missing_data or "missing"
    breaching = 0
    present = 0
    for v in values:
        if v is None:
            if missing == "breaching":
                breaching += 1
            continue
        present += 1
        if _breaches(v, alarm.comparison_operator, float(alarm.threshold)):
            breaching += 1
    if present == 0 and missing in ("missing", "ignore"):
        state = alarm.state_value if missing == "ignore" else "INSUFFICIENT_DATA"
    else:
        state = "ALARM" if breaching >= m else "OK"
    if state != alarm.state_value:
        newest = next((v for v in values if v is not None), None)
        _state.alarms.append({"PoolSeconds": round(now, 1), "AlarmName": alarm.name,
                              "From": alarm.state_value, "To": state, "Newest": newest})
        alarm.update_state(f"{breaching} of the last {n} datapoints breached the threshold "
                           f"{alarm.threshold} (newest: {newest}; sandbox clock)",
                           '{"sandbox": true}', state)
    if state != "ALARM" or not alarm.actions_enabled:
        return
    newest = next((v for v in values if v is not None), float(alarm.threshold))
    for arn in alarm.alarm_actions or []:
        for asg in asgs:
            policy = _policies(asg).get(arn)
            if policy is None:
                continue
            why = f"alarm {alarm.name} in ALARM"
            if policy.policy_type == "StepScaling":
                _step(asg, policy, newest, float(alarm.threshold), why, now)
            else:
                _execute(asg, policy, why, now)


def _target_tracking(cw: Any, asg: Any, policy: Any, now: float) -> None:
    cfg = policy.target_tracking_configuration
    spec = getattr(cfg, "CustomizedMetricSpecification", None)
    target = float(getattr(cfg, "TargetValue", 0) or 0)
    if not spec or target <= 0:
        return
    key = f"tt:{asg.region_name}:{policy.name}"
    due = _state.next_eval.get(key)
    if due is not None and now < due:
        return
    _state.next_eval[key] = (math.floor(now / TT_PERIOD_S) + 1) * TT_PERIOD_S
    group = asg.autoscaling_groups.get(policy.auto_scaling_group_name)
    if group is None:
        return
    dims = {d["Name"]: d["Value"] for d in spec.get("Dimensions") or []}
    value = _periods(cw, spec.get("Namespace"), spec.get("MetricName"), dims,
                     spec.get("Statistic") or "Average", TT_PERIOD_S, 1, now)[0]
    if value is None:
        return
    in_service = sum(1 for s in group.instance_states if s.lifecycle_state == "InService")
    want = math.ceil(max(in_service, 1) * value / target)
    high = _state.tt_high[key] = _state.tt_high.get(key, 0) + 1 if value > target else 0
    low = (_state.tt_low.get(key, 0) + 1) if value < TT_LOW_FRACTION * target else 0
    _state.tt_low[key] = low
    why = f"target tracking {policy.name}: metric {value:g}, target {target:g}"
    if high >= TT_HIGH_PERIODS and want > (group.desired_capacity or 0):
        _set_desired(asg, group, want, why, now)
    disable_in = bool(getattr(cfg, "DisableScaleIn", False))
    if not disable_in and low >= TT_LOW_PERIODS and want < (group.desired_capacity or 0):
        _set_desired(asg, group, want, why, now)


def tick() -> None:
    """Evaluate what is due; called often by the serving loop."""
    if not _clock.on:
        return
    from moto.autoscaling.models import autoscaling_backends
    from moto.cloudwatch.models import cloudwatch_backends

    now = pool_now()
    with LOCK:
        asgs = list(all_backends(autoscaling_backends))
        for cw in all_backends(cloudwatch_backends):
            region_asgs = [a for a in asgs if a.region_name == cw.region_name]
            for alarm in list(cw.alarms.values()):
                if alarm.namespace and alarm.metric_name:
                    _alarm(cw, region_asgs, alarm, now)
            for asg in region_asgs:
                for policy in list(asg.policies.values()):
                    if policy.policy_type == "TargetTrackingScaling":
                        _target_tracking(cw, asg, policy, now)


def report() -> dict[str, Any]:
    return {"pool_seconds": round(pool_now(), 1) if _clock.on else None,
            "scaling": list(_state.log), "alarms": list(_state.alarms)}


def install() -> None:
    """Nothing to patch: the serving loop calls `tick`."""


def reset() -> None:
    global _state
    _state = _State()
