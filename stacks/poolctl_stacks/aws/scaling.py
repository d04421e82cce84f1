"""Queue-depth autoscaling: up fast by target tracking, down slow by one node at a time;
and, where the file asks for it, predictive scaling ahead of the forecast load."""

from __future__ import annotations

import math
from typing import Any

from constructs import Construct

from poolctl import naming
from poolctl.config import Pool
from poolctl.contract.aws import predictive_policy
from poolctl.predictive import Predictive
from poolctl.sizing import PoolPlan
from poolctl_stacks._providers import aws

SCALE_IN_COOLDOWN_S = 300  # -1 node per 5 minutes at most


class QueueScaling(Construct):
    """Target tracking on RequestsWaitingPerReplica (published by every node from vLLM's
    `num_requests_waiting`) scales out; its scale-in is disabled because target tracking's
    is neither slow nor tunable. A simple policy removes one node when the queue has stayed
    below half the target for the whole scale-down stabilization window."""

    def __init__(self, scope: Construct, id: str, *, pool: Pool, plan: PoolPlan,
                 asg_name: str, tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        s = pool.scaling
        metric = {
            "metric_name": naming.METRIC_NAME,
            "namespace": naming.METRIC_NAMESPACE,
            "statistic": "Average",
            "metric_dimension": [
                aws("autoscaling_policy")
                .AutoscalingPolicyTargetTrackingConfigurationCustomizedMetricSpecificationMetricDimension(
                    name="AutoScalingGroupName", value=asg_name
                )
            ],
        }
        self.scale_out = aws("autoscaling_policy").AutoscalingPolicy(
            self, "queue-target", name=f"{asg_name}-queue-target",
            autoscaling_group_name=asg_name, policy_type="TargetTrackingScaling",
            estimated_instance_warmup=int(plan.start_seconds["cold"]),
            target_tracking_configuration={
                "customized_metric_specification": metric,
                "target_value": s.queue_target,
                "disable_scale_in": True,
            },
        )
        self.scale_in = aws("autoscaling_policy").AutoscalingPolicy(
            self, "scale-in", name=f"{asg_name}-scale-in", autoscaling_group_name=asg_name,
            policy_type="SimpleScaling", adjustment_type="ChangeInCapacity",
            scaling_adjustment=-1, cooldown=SCALE_IN_COOLDOWN_S,
        )
        periods = max(1, math.ceil(s.scale_down_stabilization_s / 60))
        aws("cloudwatch_metric_alarm").CloudwatchMetricAlarm(
            self, "queue-low", alarm_name=f"{asg_name}-queue-low",
            alarm_description=f"queue below {s.queue_target / 2} per replica for "
                              f"{periods} min: remove one node",
            namespace=naming.METRIC_NAMESPACE, metric_name=naming.METRIC_NAME,
            dimensions={"AutoScalingGroupName": asg_name}, statistic="Average",
            period=60, evaluation_periods=periods, datapoints_to_alarm=periods,
            threshold=s.queue_target / 2, comparison_operator="LessThanThreshold",
            treat_missing_data="notBreaching", alarm_actions=[self.scale_in.arn], tags=tags,
        )


def _queries(group: str, rpn: int, stat: str, label: str, spec: str) -> list[Any]:
    """Requests in flight on the pool's nodes: vLLM's running requests plus the queue, which
    the nodes publish per replica (x replicas per node). `stat` Sum: the pool's total (the
    load); Average: per node (the scaling metric). `spec`: the binding's block (Load, Scaling);
    its typed structs, as nested dicts lose their snake_case keys on the way to jsii."""
    mod = aws("autoscaling_policy")
    base = f"AutoscalingPolicyPredictiveScalingConfigurationMetricSpecificationCustomized{spec}" \
           "MetricSpecificationMetricDataQueries"
    query, stat_t = getattr(mod, base), getattr(mod, base + "MetricStat")
    metric_t, dim_t = getattr(mod, base + "MetricStatMetric"), getattr(
        mod, base + "MetricStatMetricDimensions")

    def metric(q_id: str, name: str) -> Any:
        return query(id=q_id, return_data=False, metric_stat=stat_t(stat=stat, metric=metric_t(
            namespace=naming.METRIC_NAMESPACE, metric_name=name,
            dimensions=[dim_t(name="AutoScalingGroupName", value=group)])))
    return [metric("running", naming.RUNNING_METRIC), metric("waiting", naming.METRIC_NAME),
            query(id="in_flight", expression=f"running + waiting * {rpn}", label=label,
                  return_data=True)]


class PredictiveScaling(Construct):
    """AWS predictive scaling on the pool's requests in flight (poolctl.predictive): a
    forecast from the pool's own history, and, in forecast-and-scale, nodes launched
    `buffer_s` before the forecast load. It only ever raises capacity; the queue policies
    above still scale on what happens."""

    def __init__(self, scope: Construct, id: str, *, figures: Predictive, group: str,
                 rpn: int) -> None:
        super().__init__(scope, id)
        self.policy = aws("autoscaling_policy").AutoscalingPolicy(
            self, "policy", name=predictive_policy(group), autoscaling_group_name=group,
            policy_type="PredictiveScaling",
            predictive_scaling_configuration={
                "mode": figures.aws_mode,
                "scheduling_buffer_time": str(figures.buffer_s),
                "max_capacity_breach_behavior": "HonorMaxCapacity",
                "metric_specification": {
                    "target_value": figures.target_per_node,
                    "customized_load_metric_specification": {"metric_data_queries": _queries(
                        group, rpn, "Sum", "requests in flight, pool", "Load")},
                    "customized_scaling_metric_specification": {
                        "metric_data_queries": _queries(
                            group, rpn, "Average", "requests in flight per node", "Scaling")},
                },
            },
        )
