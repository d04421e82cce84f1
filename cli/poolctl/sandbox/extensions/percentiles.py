"""CloudWatch percentiles of value/count arrays, as nodes publish their latency histograms.

A node publishes TTFT, TPOT and end-to-end latency as PutMetricData `Values` with `Counts`
(boot script, `publish_metrics`), and `status` reads them back as percentile statistics
(`p50`, `p90`, `p99`), which CloudWatch computes for custom metrics published as raw values.
moto 5.2 stores value i `int(Counts[i])` times, one datum each (a fractional count, which the
API allows, is truncated, often to nothing), and answers no percentile statistic. Here:

- a member with `Values` is stored as one aggregated datum per distinct value (its count as
  the sample count, value x count as the sum), so SampleCount, Sum, Average, Minimum and
  Maximum stay exact with fractional counts, and a datum stays one object per bucket, not
  one per request;
- GetMetricData's `pNN` / `pNN.N` statistics are the weighted nearest-rank percentile of a
  period's values: the smallest value whose cumulative count reaches NN % of the period's
  total count; `PR(lo:hi)` (percentile rank, either bound may be left out) is the percentage
  of the count with lo < value <= hi. Datums published as one Value count once each;
  StatisticValues sets (a min-to-max spread) are not used, as CloudWatch does not compute
  percentiles from them either.

Not emulated: GetMetricStatistics' ExtendedStatistics; CloudWatch's own approximation of
percentiles (its documentation bounds none; here they are exact over the published values);
trimmed means and the other statistics besides pNN and PR; the 150 distinct values one
member may carry (the boot script stays within it).
"""

from __future__ import annotations

import re
from typing import Any

from poolctl.histograms import percent_rank, weighted_percentile

NAMES = ("cloudwatch.percentiles",)
PCT_STAT = re.compile(r"p(\d{1,2}(?:\.\d+)?)$")
_RANK = re.compile(r"PR\(([0-9.eE+-]*):([0-9.eE+-]*)\)$")


def datum_point(d: Any) -> tuple[float, float] | None:
    """A stored datum as a (value, count) point: one published Value counts once; a value of
    a value/count array (an aggregated datum with min = max, as put_metric_data below keeps
    it) counts its count; a StatisticValues set (min < max) is no point."""
    value = getattr(d, "value", None)
    if value is not None:
        return (float(value), 1.0)
    if getattr(d, "min", None) is not None and d.min == d.max:
        return (float(d.min), float(d.sample_count))
    return None


def statistic(points: list[tuple[float, float]], stat: str) -> float:
    """A CloudWatch statistic (Sum, Maximum, Minimum, SampleCount; else Average) of (value,
    count) points."""
    total = sum(c for _, c in points)
    if stat == "Sum":
        return sum(v * c for v, c in points)
    if stat == "Maximum":
        return max(v for v, _ in points)
    if stat == "Minimum":
        return min(v for v, _ in points)
    if stat == "SampleCount":
        return total
    return sum(v * c for v, c in points) / total if total else 0.0  # Average


def _points(data: list[Any]) -> list[tuple[float, float]]:
    return [p for p in map(datum_point, data) if p is not None]


def install() -> None:
    from moto.cloudwatch.models import (
        CloudWatchBackend,
        MetricAggregatedDatum,
        Statistics,
    )

    put = CloudWatchBackend.put_metric_data
    if getattr(put, "_poolctl", False):
        return

    def put_metric_data(self: Any, namespace: str, metric_data: list[dict[str, Any]]) -> None:
        plain = []
        for member in metric_data:
            values = member.get("Values")
            if not values:
                plain.append(member)
                continue
            counts = member.get("Counts") or ["1"] * len(values)
            for value, count in zip(values, counts, strict=False):
                c = float(count)
                if c <= 0:
                    continue
                v = float(value)
                self.metric_data.append(MetricAggregatedDatum(
                    namespace=namespace, name=member["MetricName"], min_stat=v, max_stat=v,
                    sample_count=c, sum_stat=v * c,
                    dimensions=member.get("Dimensions", []),
                    timestamp=member.get("Timestamp"), unit=member.get("Unit")))
        if plain:
            put(self, namespace, plain)

    put_metric_data._poolctl = True  # type: ignore[attr-defined]
    CloudWatchBackend.put_metric_data = put_metric_data  # type: ignore[method-assign]

    stat_of = Statistics.get_statistics_for_type

    def get_statistics_for_type(self: Any, stat: str) -> Any:
        m = PCT_STAT.match(stat or "")
        if m is not None:
            return weighted_percentile(_points(self.metric_data), float(m.group(1)) / 100)
        r = _RANK.match(stat or "")
        if r is not None:
            lo, hi = (float(x) if x else None for x in r.groups())
            return percent_rank(_points(self.metric_data), lo, hi)
        return stat_of(self, stat)

    Statistics.get_statistics_for_type = get_statistics_for_type  # type: ignore[method-assign]


def reset() -> None:
    """Nothing kept outside moto's backends."""
