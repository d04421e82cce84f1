"""What the pool's owner watches: a CloudWatch dashboard of the pool (nodes, queue, TTFT and
TPOT p90 beside their SLOs, tokens per second, KV cache) and alarms on TTFT and TPOT p90
above the SLO for `slo.alarm_after_s`, notifying `aws.alarm_topic_arn` when given. The
metrics are the ones every node publishes (docs/metrics.md)."""

from __future__ import annotations

import json
from typing import Any

from constructs import Construct

from poolctl import naming
from poolctl.config import Pool
from poolctl.contract import aws as contract
from poolctl_stacks._providers import aws

PERIOD_S = 60


def _metric(name: str, group: str, stat: str, label: str) -> list[Any]:
    return [naming.METRIC_NAMESPACE, name, "AutoScalingGroupName", group,
            {"stat": stat, "label": label}]


def dashboard_body(pool: Pool, group: str, region: str) -> dict[str, Any]:
    """The dashboard's widgets (CloudWatch's dashboard body structure), 2 per row."""
    slo = pool.slo

    def widget(k: int, title: str, metrics: list[list[Any]], *, stat: str = "Average",
               hline: tuple[str, float] | None = None, unit: str = "") -> dict[str, Any]:
        props: dict[str, Any] = {"title": title, "region": region, "view": "timeSeries",
                                 "period": PERIOD_S, "stat": stat, "metrics": metrics}
        if hline is not None:
            props["annotations"] = {"horizontal": [{"label": hline[0], "value": hline[1]}]}
        if unit:
            props["yAxis"] = {"left": {"label": unit, "showUnits": False}}
        return {"type": "metric", "x": 12 * (k % 2), "y": 6 * (k // 2), "width": 12,
                "height": 6, "properties": props}

    asg = ["AWS/AutoScaling", "GroupInServiceInstances", "AutoScalingGroupName", group,
           {"label": "in service"}]
    warm = ["AWS/AutoScaling", "WarmPoolWarmedCapacity", "AutoScalingGroupName", group,
            {"label": "warm"}]
    widgets = [
        widget(0, "Nodes", [asg, warm], unit="nodes"),
        widget(1, "Queue: requests waiting per replica",
               [_metric(naming.METRIC_NAME, group, "Average", "waiting per replica")],
               hline=("scale-out target", pool.scaling.queue_target)),
        widget(2, "TTFT p50 / p90 (s)",
               [_metric(naming.TTFT_METRIC, group, "p50", "p50"),
                _metric(naming.TTFT_METRIC, group, "p90", "p90")],
               hline=("SLO (p90)", slo.ttft_p90_s), unit="s"),
        widget(3, "TPOT p50 / p90 (s)",
               [_metric(naming.TPOT_METRIC, group, "p50", "p50"),
                _metric(naming.TPOT_METRIC, group, "p90", "p90")],
               hline=("SLO (p90)", slo.tpot_p90_s) if slo.tpot_p90_s else None, unit="s"),
        widget(4, "Output tokens per second",
               [[{"expression": f"m1 / {PERIOD_S}", "label": "output tokens/s", "id": "e1"}],
                [naming.METRIC_NAMESPACE, naming.OUTPUT_TOKENS_METRIC, "AutoScalingGroupName",
                 group, {"stat": "Sum", "id": "m1", "visible": False}]]),
        widget(5, "KV-cache usage (0-1) and requests running",
               [_metric(naming.KV_USAGE_METRIC, group, "Average", "KV-cache usage"),
                [*_metric(naming.RUNNING_METRIC, group, "Average", "running")[:4],
                 {"stat": "Average", "label": "running", "yAxis": "right"}]]),
    ]
    return {"widgets": widgets}


class SloMonitoring(Construct):
    def __init__(self, scope: Construct, id: str, *, pool: Pool, group: str, region: str,
                 topic_arn: str | None, tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        slo = pool.slo
        aws("cloudwatch_dashboard").CloudwatchDashboard(
            self, "dashboard", dashboard_name=contract.dashboard_name(group),
            dashboard_body=json.dumps(dashboard_body(pool, group, region), sort_keys=True))
        periods = slo.alarm_after_s // PERIOD_S
        actions = [topic_arn] if topic_arn else []
        for key, metric, target in (("ttft", naming.TTFT_METRIC, slo.ttft_p90_s),
                                    ("tpot", naming.TPOT_METRIC, slo.tpot_p90_s)):
            if target is None:
                continue
            aws("cloudwatch_metric_alarm").CloudwatchMetricAlarm(
                self, f"{key}-slo", alarm_name=contract.slo_alarm_name(group, key),
                alarm_description=f"{key.upper()} p90 above the pool's SLO ({target:g} s) "
                                  f"for {periods} min",
                namespace=naming.METRIC_NAMESPACE, metric_name=metric,
                dimensions={"AutoScalingGroupName": group}, extended_statistic="p90",
                period=PERIOD_S, evaluation_periods=periods, datapoints_to_alarm=periods,
                threshold=target, comparison_operator="GreaterThanThreshold",
                # No request finished: no latency to hold against the SLO.
                treat_missing_data="notBreaching",
                alarm_actions=actions, ok_actions=actions, tags=tags,
            )
