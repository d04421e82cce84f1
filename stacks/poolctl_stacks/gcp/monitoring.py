"""What the pool's owner watches on GCP: a Cloud Monitoring dashboard of the pool (nodes,
queue, TTFT and TPOT p50/p90 beside their SLOs, tokens per second, KV cache) and alert
policies on TTFT and TPOT p90 above the SLO for `slo.alarm_after_s`, notifying
`gcp.alert_notification_channel` when given. The metrics are the ones every node writes
(docs/metrics.md), labelled pool=<the MIG>."""

from __future__ import annotations

import json
from typing import Any

from constructs import Construct

from poolctl import naming
from poolctl.config import Pool
from poolctl.contract import gcp as contract
from poolctl_stacks._providers import google

PERIOD = "60s"


def pool_filter(mtype: str, mig: str) -> str:
    """The series of one of the pool's metrics, as status reads them."""
    return (f'metric.type = "{mtype}" AND resource.type = "gce_instance" AND '
            f'metric.labels.{naming.GCP_POOL_LABEL} = "{mig}"')


def dashboard_json(pool: Pool, mig: str, labels: dict[str, str]) -> dict[str, Any]:
    """The dashboard (Cloud Monitoring's Dashboard resource): a 48-column mosaic, two charts
    a row."""
    slo = pool.slo

    def series(flt: str, aligner: str, reducer: str, legend: str) -> dict[str, Any]:
        return {"timeSeriesQuery": {"timeSeriesFilter": {"filter": flt, "aggregation": {
            "alignmentPeriod": PERIOD, "perSeriesAligner": aligner,
            "crossSeriesReducer": reducer}}}, "plotType": "LINE", "legendTemplate": legend}

    def chart(k: int, title: str, sets: list[dict[str, Any]], unit: str,
              line: tuple[str, float | None] | None = None) -> dict[str, Any]:
        xy: dict[str, Any] = {"dataSets": sets, "yAxis": {"label": unit, "scale": "LINEAR"}}
        if line is not None and line[1] is not None:
            xy["thresholds"] = [{"label": line[0], "value": line[1]}]
        return {"xPos": 24 * (k % 2), "yPos": 16 * (k // 2), "width": 24, "height": 16,
                "widget": {"title": title, "xyChart": xy}}

    def latency(mtype: str) -> list[dict[str, Any]]:
        return [series(pool_filter(mtype, mig), "ALIGN_DELTA", f"REDUCE_PERCENTILE_{q}",
                       f"p{q}") for q in (50, 90)]

    size = ('metric.type = "compute.googleapis.com/instance_group/size" AND '
            f'resource.type = "instance_group" AND resource.labels.instance_group_name = "{mig}"')
    # the queue's series carry no pool label (the autoscaler reads them per VM): the VMs'
    # own labels select them (a key with a hyphen is quoted in Monitoring's filters)
    queue = (f'metric.type = "{naming.GCP_METRIC_TYPE}" AND resource.type = "gce_instance" AND '
             + " AND ".join(f'metadata.user_labels."{k}" = "{v}"' for k, v in labels.items()
                            if k != naming.LABEL_ROLE))
    tiles = [
        chart(0, "Nodes in the group", [series(size, "ALIGN_MEAN", "REDUCE_SUM", "nodes")],
              "nodes"),
        chart(1, "Queue: requests waiting per replica",
              [series(queue, "ALIGN_MEAN", "REDUCE_MEAN", "waiting per replica")], "requests",
              ("scale-out target", pool.scaling.queue_target)),
        chart(2, "TTFT p50 / p90", latency(naming.GCP_TTFT_TYPE), "s",
              ("SLO (p90)", slo.ttft_p90_s)),
        chart(3, "TPOT p50 / p90", latency(naming.GCP_TPOT_TYPE), "s",
              ("SLO (p90)", slo.tpot_p90_s)),
        chart(4, "Output tokens per second",
              [series(pool_filter(naming.GCP_OUTPUT_TOKENS_TYPE, mig), "ALIGN_RATE",
                      "REDUCE_SUM", "output tokens/s")], "tokens/s"),
        chart(5, "KV-cache usage (0-1) and requests running",
              [series(pool_filter(naming.GCP_KV_USAGE_TYPE, mig), "ALIGN_MEAN", "REDUCE_MEAN",
                      "KV-cache usage"),
               series(pool_filter(naming.GCP_RUNNING_TYPE, mig), "ALIGN_MEAN", "REDUCE_MEAN",
                      "running per node")], ""),
    ]
    return {"displayName": contract.dashboard_name(mig),
            "mosaicLayout": {"columns": 48, "tiles": tiles}}


class SloPolicies(Construct):
    def __init__(self, scope: Construct, id: str, *, pool: Pool, mig: str,
                 labels: dict[str, str]) -> None:
        super().__init__(scope, id)
        p, slo = pool.gcp, pool.slo
        assert p is not None  # a gcp stack: the pool has a gcp placement
        google("monitoring_dashboard").MonitoringDashboard(
            self, "dashboard", project=p.project,
            dashboard_json=json.dumps(dashboard_json(pool, mig, labels), sort_keys=True))
        a = google("monitoring_alert_policy")
        channels = [p.alert_notification_channel] if p.alert_notification_channel else None
        for key, mtype, target in (("ttft", naming.GCP_TTFT_TYPE, slo.ttft_p90_s),
                                   ("tpot", naming.GCP_TPOT_TYPE, slo.tpot_p90_s)):
            if target is None:
                continue
            a.MonitoringAlertPolicy(
                self, f"{key}-slo", project=p.project,
                display_name=contract.slo_policy_name(mig, key), combiner="OR",
                severity="WARNING", user_labels=labels, notification_channels=channels,
                documentation=a.MonitoringAlertPolicyDocumentation(
                    mime_type="text/markdown",
                    content=f"{key.upper()} p90 of pool {pool.name} above its SLO "
                            f"({target:g} s) for {slo.alarm_after_s} s. `poolctl status` "
                            "shows it beside the serving model's prediction."),
                conditions=[a.MonitoringAlertPolicyConditions(
                    display_name=f"{key.upper()} p90 above {target:g} s",
                    condition_threshold=a.MonitoringAlertPolicyConditionsConditionThreshold(
                        filter=pool_filter(mtype, mig), comparison="COMPARISON_GT",
                        threshold_value=target, duration=f"{slo.alarm_after_s}s",
                        # No request finished: no latency to hold against the SLO.
                        evaluation_missing_data="EVALUATION_MISSING_DATA_INACTIVE",
                        trigger=a.MonitoringAlertPolicyConditionsConditionThresholdTrigger(
                            count=1),
                        aggregations=[
                            a.MonitoringAlertPolicyConditionsConditionThresholdAggregations(
                                alignment_period=PERIOD, per_series_aligner="ALIGN_DELTA",
                                cross_series_reducer="REDUCE_PERCENTILE_90")]))])
