"""Queue-depth autoscaling of the regional MIG: out as soon as the queue grows, in by one
node at a time after the scale-down stabilization window."""

from __future__ import annotations

from cdktn import TerraformResourceLifecycle
from constructs import Construct

from poolctl import naming
from poolctl.config import Pool
from poolctl.sizing import PoolPlan
from poolctl_stacks._providers import google
from poolctl_stacks.gcp.pool import NodeGroup


class QueueAutoscaler(Construct):
    """Per-instance GAUGE on `GCP_METRIC_TYPE`, written by every node (resource type
    gce_instance) as its vLLM `num_requests_waiting` divided by its replicas. The autoscaler
    keeps the average over the group's instances at the target; every node hosts the same
    number of replicas, so that average is waiting requests per replica and the target is
    `queue_target` itself, as on AWS (not queue_target x replicas_per_node, which would be a
    per-node total). No per-pool filter is needed: per-instance metrics are matched to the
    group's own instances.

    Scale-out is immediate (the GCE autoscaler has no scale-up stabilization); scale-in
    removes at most one node per `scale_down_stabilization_s`. The cooldown (initialization
    period) is the cold start: a new node's zero queue must not count before it serves.
    """

    def __init__(self, scope: Construct, id: str, *, pool: Pool, plan: PoolPlan, name: str,
                 nodes: NodeGroup) -> None:
        super().__init__(scope, id)
        p, s = pool.gcp, pool.scaling
        assert p is not None  # a gcp stack: the pool has a gcp placement
        a = google("compute_region_autoscaler")
        fixed = a.ComputeRegionAutoscalerAutoscalingPolicyScaleInControlMaxScaledInReplicas
        self.autoscaler = a.ComputeRegionAutoscaler(
            self, "autoscaler", name=naming.short(name, 63), project=p.project, region=p.region,
            target=nodes.mig.id,
            autoscaling_policy=a.ComputeRegionAutoscalerAutoscalingPolicy(
                # Variables (NodeGroup._variables): a runtime apply keeps `warm`'s bounds.
                min_replicas=nodes.autoscaler_min,
                max_replicas=nodes.autoscaler_max,
                cooldown_period=int(plan.start_seconds["cold"]),
                mode="ON",
                metric=[a.ComputeRegionAutoscalerAutoscalingPolicyMetric(
                    name=naming.GCP_METRIC_TYPE,
                    filter='resource.type = "gce_instance"',
                    type="GAUGE",
                    target=s.queue_target,
                )],
                scale_in_control=a.ComputeRegionAutoscalerAutoscalingPolicyScaleInControl(
                    max_scaled_in_replicas=fixed(fixed=1),
                    time_window_sec=s.scale_down_stabilization_s,
                ),
            ),
            # Launch windows (`warm --from`) are scaling schedules poolctl writes at runtime;
            # the provider's scaling_schedules is optional, not computed: without this a
            # deploy would delete them.
            lifecycle=TerraformResourceLifecycle(
                ignore_changes=["autoscaling_policy[0].scaling_schedules"]),
        )
