"""Queue-depth autoscaling: up fast by target tracking, down slow by one node at a time."""

from __future__ import annotations

import math

from constructs import Construct

from poolctl import naming
from poolctl.config import Pool
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
