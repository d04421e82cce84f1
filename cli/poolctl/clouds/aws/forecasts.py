"""The pool's predictive scaling forecast beside what happened (part of `AwsOps`): `status`
shows it so that an owner can watch a `forecast` policy before letting it scale.

GetPredictiveScalingForecast answers the policy's hourly load and capacity forecast for any
window (past hours included: what it forecast then); GetMetricData the load metric itself,
hour by hour, with the policy's own load queries (metric math included), so both are in the
same units.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl import naming
from poolctl.clouds.aws.api import AwsApi
from poolctl.clouds.base import (
    ForecastHour,
    ForecastsLoad,
    Group,
    LoadForecast,
    ReadsLoadHistory,
)

HOUR_S = 3600
# The nodes publish their metrics once a minute (boot/_node_lib.sh.j2, docs/metrics.md): an
# hour's Sum of the pool's in-flight gauges over 60 is their mean total.
MINUTES_PER_HOUR = 60


def _queries(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The policy's load queries as GetMetricData takes them (hourly periods)."""
    out = []
    for q in spec.get("CustomizedLoadMetricSpecification", {}).get("MetricDataQueries", []):
        item = {k: v for k, v in q.items() if k in ("Id", "Expression", "Label", "ReturnData")}
        if "MetricStat" in q:
            item["MetricStat"] = {**q["MetricStat"], "Period": HOUR_S}
        out.append(item)
    return out


class PredictiveForecasts(AwsApi, ForecastsLoad, ReadsLoadHistory):
    def load_history(self, group: Group, days: int, replicas_per_node: int
                     ) -> dict[datetime, float]:
        """Running requests plus the queue (per replica x replicas per node), hourly Sums
        over the group's nodes, over 60 one-minute datapoints."""
        this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        queries = [{"Id": qid, "ReturnData": True, "MetricStat": {
            "Period": HOUR_S, "Stat": "Sum", "Metric": {
                "Namespace": naming.METRIC_NAMESPACE, "MetricName": name,
                "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group.name}]}}}
            for qid, name in (("running", naming.RUNNING_METRIC),
                              ("waiting", naming.METRIC_NAME))]
        got: dict[str, dict[datetime, float]] = {"running": {}, "waiting": {}}
        cw = self.client("cloudwatch", group.region)
        for page in self.pages(cw, "get_metric_data", "cloudwatch:GetMetricData",
                               MetricDataQueries=queries,
                               StartTime=this_hour - timedelta(days=days), EndTime=this_hour):
            for res in page.get("MetricDataResults", []):
                got[str(res["Id"])].update(zip(res.get("Timestamps") or [],
                                               res.get("Values") or [], strict=False))
        return {h: (v + got["waiting"].get(h, 0.0) * replicas_per_node) / MINUTES_PER_HOUR
                for h, v in got["running"].items()}


    def load_forecast(self, group: Group, policy: str, hours_back: int, hours_ahead: int
                      ) -> LoadForecast | None:
        asg = self.client("autoscaling", group.region)
        with self.call(f"autoscaling:DescribePolicies {group.name}"):
            found = asg.describe_policies(AutoScalingGroupName=group.name,
                                          PolicyNames=[policy])["ScalingPolicies"]
        found = [p for p in found if p.get("PolicyType") == "PredictiveScaling"]
        if not found:
            return None
        cfg = found[0].get("PredictiveScalingConfiguration") or {}
        this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        start = this_hour - timedelta(hours=hours_back)
        end = this_hour + timedelta(hours=hours_ahead + 1)
        with self.call(f"autoscaling:GetPredictiveScalingForecast {policy}"):
            fc = asg.get_predictive_scaling_forecast(
                AutoScalingGroupName=group.name, PolicyName=policy, StartTime=start,
                EndTime=end)
        loads: dict[datetime, float] = {}
        for lf in fc.get("LoadForecast") or []:
            loads.update(zip(lf.get("Timestamps") or [], lf.get("Values") or [], strict=False))
        cap = fc.get("CapacityForecast") or {}
        caps = dict(zip(cap.get("Timestamps") or [], cap.get("Values") or [], strict=False))
        actual: dict[datetime, float] = {}
        specs = cfg.get("MetricSpecifications") or []
        queries = _queries(specs[0]) if specs else []
        if queries:
            cw = self.client("cloudwatch", group.region)
            for page in self.pages(cw, "get_metric_data", "cloudwatch:GetMetricData",
                                   MetricDataQueries=queries, StartTime=start,
                                   EndTime=this_hour + timedelta(hours=1)):
                for res in page.get("MetricDataResults", []):
                    actual.update(zip(res.get("Timestamps") or [], res.get("Values") or [],
                                      strict=False))
        hours = []
        h = start
        while h < end:
            hours.append(ForecastHour(h, loads.get(h), caps.get(h), actual.get(h)))
            h += timedelta(hours=1)
        return LoadForecast(policy, str(cfg.get("Mode", "ForecastOnly")), hours,
                            fc.get("UpdateTime"))
