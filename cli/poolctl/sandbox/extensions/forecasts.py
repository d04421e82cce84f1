"""Predictive scaling policies forecast and act: GetPredictiveScalingForecast, which moto 5.2
lacks, and ForecastAndScale policies raising capacity ahead of the forecast.

AWS's forecasting model is not published; this is a stand-in, in the API's own shapes
(botocore's `autoscaling` model: LoadForecast, CapacityForecast, UpdateTime):

- **Load**: the policy's customized load metric, per UTC hour: each MetricStat query's
  statistic (Sum, Average, SampleCount, Minimum, Maximum) over the hour's datapoints, then the
  query with ReturnData true (a MetricStat, or an arithmetic expression over the other
  queries' ids: + - * / and numbers; an hour where an id it names has no datapoint is left
  out, as CloudWatch's metric math leaves out a timestamp an operand lacks). The forecast of
  an hour is the mean load of the same UTC hour on up to 14 earlier days. As AWS: no
  forecast (empty arrays) until the load has 24 hours of history; EndTime - StartTime at
  most 30 days.
- **Capacity**: ceil(load per minute / TargetValue), within the group's maximum
  (HonorMaxCapacity); load per minute is the hourly Sum over the 60 one-minute datapoints the
  nodes publish each hour (docs/metrics.md). AWS learns the relation of load to capacity
  from the group's history instead.
- **ForecastAndScale**: before each Auto Scaling call, a group with such a policy whose
  desired capacity is below the capacity forecast for the hour that starts within
  SchedulingBufferTime from now is raised to it (a scaling activity records it), as AWS's
  scheduled actions for the forecast do; predictive scaling never lowers capacity.
  ForecastOnly changes nothing.

- **Metric math in GetMetricData**: arithmetic expressions (the same + - * / over query ids
  and numbers), evaluated per timestamp where every id it names has a value; moto 5.2
  answers only an expression that is a bare id. Functions (SUM, FILL, METRICS(), ...) are
  not emulated: a ValidationError names the expression.

Wall-clock UTC, as the datapoints' timestamps: a test writes days of history with
PutMetricData timestamps in the past. Not emulated: predefined metric pairs, capacity
metrics, MaxCapacityBuffer and IncreaseMaxCapacity, forecast refresh every 6 hours (here:
at every call).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from poolctl.predictive import FORECAST_DAYS, same_hour_mean
from poolctl.sandbox.extensions.common import before_each_call, find_group, validation_error
from poolctl.sandbox.extensions.percentiles import datum_point, statistic

NAMES = ("autoscaling.predictive-forecast", "cloudwatch.metric-math-arithmetic")
HOUR_S = 3600
DAY_S = 86_400
MIN_HISTORY_S = DAY_S
MAX_SPAN_S = 30 * DAY_S
MINUTES_PER_HOUR = 60


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, list):
        return v
    if isinstance(v, dict):  # a querystring's member.N map
        return [v[k] for k in sorted(v, key=lambda k: int(k) if str(k).isdigit() else k)]
    return [v]


def _spec(policy: Any) -> dict[str, Any] | None:
    cfg = policy.predictive_scaling_configuration or {}
    specs = _as_list(cfg.get("MetricSpecifications"))
    return specs[0] if specs else None


def _ts(d: Any) -> float:
    t = d.timestamp
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    return datetime.fromisoformat(str(t).replace("Z", "+00:00")).timestamp()


_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: lambda a, b: a / b if b else math.nan}


class _Missing(Exception):
    """An id the expression names has no value at this timestamp."""


def _evaluate(expr: str, values: Mapping[str, float]) -> float:
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise _Missing(node.id)
            return values[node.id]
        raise validation_error(f"Expression '{expr}': only + - * / over query ids and numbers "
                               "are emulated")
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        raise validation_error(f"Expression '{expr}' is not valid metric math") from None
    return ev(tree)


def _per_time(expr: str, series: Mapping[str, Mapping[Any, float]]) -> dict[Any, float]:
    """The expression at each time (hour, timestamp) where every id it names has a value."""
    out = {}
    for t in sorted({t for v in series.values() for t in v}):
        try:
            out[t] = _evaluate(expr, {qid: v[t] for qid, v in series.items() if t in v})
        except _Missing:
            continue
    return out


def hourly_load(cw: Any, spec: Mapping[str, Any], start: float, end: float
                ) -> dict[int, float]:
    """UTC hour start -> the load metric's value, for hours in [start, end)."""
    queries = _as_list((spec.get("CustomizedLoadMetricSpecification") or {})
                       .get("MetricDataQueries"))
    per_id: dict[str, dict[int, list[tuple[float, float]]]] = {}
    stats: dict[str, str] = {}
    for q in queries:
        ms = q.get("MetricStat")
        if not ms:
            continue
        m = ms.get("Metric") or {}
        dims = {d.get("Name"): d.get("Value") for d in _as_list(m.get("Dimensions"))}
        stats[q["Id"]] = ms.get("Stat", "Average")
        hours = per_id.setdefault(q["Id"], {})
        for d in cw.metric_data:
            if d.namespace != m.get("Namespace") or d.name != m.get("MetricName"):
                continue
            if {x.name: x.value for x in d.dimensions} != dims:
                continue
            t = _ts(d)
            point = datum_point(d)
            if point is None or not start <= t < end:
                continue
            hours.setdefault(int(t // HOUR_S * HOUR_S), []).append(point)
    values = {qid: {h: statistic(p, stats[qid]) for h, p in hours.items()}
              for qid, hours in per_id.items()}
    out_q = next((q for q in queries if str(q.get("ReturnData", "true")).lower() == "true"),
                 None)
    if out_q is None:
        return {}
    if out_q.get("MetricStat"):
        return values.get(out_q["Id"], {})
    return _per_time(out_q.get("Expression", "0"), values)


def forecast(cw: Any, group: Any, policy: Any, start: float, end: float, now: float
             ) -> tuple[list[int], list[float], list[float]]:
    """(hour starts, load, capacity) for the hours of [start, end) that have a forecast."""
    spec = _spec(policy)
    if spec is None:
        return [], [], []
    history = hourly_load(cw, spec, start - FORECAST_DAYS * DAY_S, now)
    if not history or now - min(history) < MIN_HISTORY_S:
        return [], [], []
    by_hour = {t // HOUR_S: v for t, v in history.items()}  # hours since the epoch
    target = float(spec.get("TargetValue") or 0) or 1.0
    hours, loads, caps = [], [], []
    h = int(start // HOUR_S * HOUR_S)
    while h < end:
        load = same_hour_mean(by_hour, h // HOUR_S)
        if load is not None:
            hours.append(h)
            loads.append(round(load, 3))
            caps.append(float(min(group.max_size,
                                  math.ceil(load / MINUTES_PER_HOUR / target - 1e-9))))
        h += HOUR_S
    return hours, loads, caps


def _cw(asg: Any) -> Any:
    """The CloudWatch backend of an Auto Scaling backend's account and region."""
    from moto.cloudwatch.models import cloudwatch_backends

    return cloudwatch_backends[asg.account_id][asg.region_name]


def _get_forecast(self: Any) -> Any:
    from moto.core.responses import ActionResult

    backend = self.autoscaling_backend
    group = find_group(backend, self._get_param("AutoScalingGroupName"))
    name = self._get_param("PolicyName")
    policy = next((p for p in backend.policies.values()
                   if p.name == name and p.auto_scaling_group_name == group.name
                   and p.policy_type == "PredictiveScaling"), None)
    if policy is None:
        raise validation_error(f"No predictive scaling policy {name} for group {group.name}")
    start, end = (datetime.fromisoformat(str(self._get_param(k)).replace("Z", "+00:00"))
                  .timestamp() for k in ("StartTime", "EndTime"))
    if end <= start or end - start > MAX_SPAN_S:
        raise validation_error("EndTime must be after StartTime and at most 30 days later")
    now = datetime.now(UTC).timestamp()
    hours, loads, caps = forecast(_cw(backend), group, policy, start, end, now)
    stamps = [datetime.fromtimestamp(h, UTC) for h in hours]
    spec = _spec(policy) or {}
    return ActionResult({
        "LoadForecast": [{"Timestamps": stamps, "Values": loads,
                          "MetricSpecification": spec}],
        "CapacityForecast": {"Timestamps": stamps, "Values": caps},
        "UpdateTime": datetime.fromtimestamp(now, UTC),
    })


def scale_ahead(backend: Any, now: float | None = None) -> None:
    """ForecastAndScale: each such policy's group raised to the capacity forecast for the
    hour that starts within its scheduling buffer (never lowered)."""
    now = datetime.now(UTC).timestamp() if now is None else now
    for policy in list(backend.policies.values()):
        if policy.policy_type != "PredictiveScaling":
            continue
        cfg = policy.predictive_scaling_configuration or {}
        if cfg.get("Mode") != "ForecastAndScale":
            continue
        group = backend.autoscaling_groups.get(policy.auto_scaling_group_name)
        if group is None:
            continue
        buffer_s = float(cfg.get("SchedulingBufferTime") or 300)
        ahead = int((now + buffer_s) // HOUR_S * HOUR_S)
        _, _, caps = forecast(_cw(backend), group, policy, ahead, ahead + HOUR_S,
                              now)
        if caps and caps[0] > (group.desired_capacity or 0):
            group.set_desired_capacity(int(caps[0]))


def _metric_math(orig: Callable[..., Any]) -> Callable[..., Any]:
    def parse_expression(expression: str, results: list[dict[str, Any]]) -> Any:
        if expression.isidentifier() or expression.startswith("SELECT"):
            return orig(expression, results)
        series = {r["id"]: dict(zip(r["timestamps"], r["values"], strict=False))
                  for r in results}
        got = _per_time(expression, series)
        return list(got.values()), list(got)
    parse_expression._poolctl = True  # type: ignore[attr-defined]
    return parse_expression


def install() -> None:
    import moto.cloudwatch.models as cw_models
    from moto.autoscaling.responses import AutoScalingResponse

    orig_parse = getattr(cw_models, "parse_expression")  # noqa: B009 - moto's, not exported
    if not getattr(orig_parse, "_poolctl", False):
        setattr(cw_models, "parse_expression", _metric_math(orig_parse))  # noqa: B010

    AutoScalingResponse.get_predictive_scaling_forecast = (  # type: ignore[attr-defined]  # moto extension: the forecast
        _get_forecast)
    before_each_call(scale_ahead)


def reset() -> None:
    """Nothing kept outside moto's backends."""
