"""One AWS pool stack: network, node role, load balancer, node group, queue scaling."""

from __future__ import annotations

from cdktn import S3Backend

from poolctl import naming
from poolctl.bootscript import render_boot_script
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract
from poolctl.predictive import predictive
from poolctl.sizing import PoolPlan, instance_row, weights_path
from poolctl_stacks._providers import aws
from poolctl_stacks.aws.iam import LogsKey, NodeRole
from poolctl_stacks.aws.monitoring import SloMonitoring
from poolctl_stacks.aws.network import Network
from poolctl_stacks.aws.pool import LoadBalancer, NodeGroup
from poolctl_stacks.aws.scaling import PredictiveScaling, QueueScaling
from poolctl_stacks.aws.windows import WindowScheduler
from poolctl_stacks.base import PoolStack


class AwsPoolStack(PoolStack):
    cloud = Cloud.aws

    def build(self, cfg: Config, pool: Pool, user_data: str, plan: PoolPlan) -> None:
        placement, raw_placement = pool.aws, self.raw_pool.aws
        # An aws stack is built for a pool's aws placement only (Config.targets).
        assert placement is not None and raw_placement is not None
        row = instance_row(pool, Cloud.aws)
        name = naming.base(cfg, pool)
        tags = naming.aws_tags(cfg, pool)

        aws("provider").AwsProvider(
            self, "aws", region=placement.region,
            default_tags=[aws("provider").AwsProviderDefaultTags(tags=tags)],
        )
        if b := self.raw_cfg.backend.aws:  # backend settings are literal-only: raw values
            # Without a DynamoDB table, S3's own lock file (Terraform 1.10+).
            S3Backend(self, bucket=b.bucket, region=b.region, encrypt=True,
                      key=f"{b.key_prefix}/{self.node.id}/terraform.tfstate",
                      dynamodb_table=b.dynamodb_table,
                      use_lockfile=None if b.dynamodb_table else True)
        else:
            self.local_backend()

        net = Network(self, "network", net=placement.network, name=name, tags=tags,
                      region=placement.region)
        key = LogsKey(self, "kms", name=name, region=placement.region, tags=tags)
        logs = aws("cloudwatch_log_group").CloudwatchLogGroup(
            self, "logs", name=contract.log_group_name(cfg, pool), retention_in_days=365,
            kms_key_id=key.key.arn, tags=tags,
        )
        if net.created:
            net.flow_logs(name=name, kms_key_arn=key.key.arn, tags=tags)
        role = NodeRole(self, "iam", name=name, weights=placement.weights,
                        asg_name=name, log_group_arn=logs.arn, tags=tags,
                        ssm_access=placement.ssm_access,
                        api_key_secret=pool.api_key_secret(Cloud.aws),
                        compile_cache=placement.compile_cache,
                        stream_weights=weights_path(pool, row) == "stream")
        lb = LoadBalancer(self, "lb", name=name, vpc_id=net.vpc_id, subnet_ids=net.subnet_ids,
                          client_cidrs=placement.network.client_cidrs,
                          port=pool.serving.port, health_path=pool.serving.health_path,
                          sticky=pool.serving.balancer == "sticky",
                          certificate_arn=placement.certificate_arn,
                          access_logs_bucket=placement.access_logs_bucket,
                          access_logs_prefix=placement.access_logs_prefix, tags=tags)
        nodes = NodeGroup(self, "nodes", cfg=cfg, pool=pool, row=row, plan=plan, name=name,
                          vpc_id=net.vpc_id, subnet_ids=net.subnet_ids, lb=lb,
                          instance_profile_arn=role.profile.arn, user_data=user_data,
                          image_user_data=render_boot_script(self.raw_cfg, self.raw_pool, Cloud.aws,
                                                             from_image=True),
                          ami_id=raw_placement.ami_id, tags=tags)
        QueueScaling(self, "scaling", pool=pool, plan=plan, asg_name=nodes.asg.name, tags=tags)
        if (ahead := predictive(pool, plan)) is not None:
            PredictiveScaling(self, "predictive", figures=ahead, group=nodes.asg.name,
                              rpn=plan.replicas_per_node)
        SloMonitoring(self, "monitoring", pool=pool, group=name, region=placement.region,
                      topic_arn=placement.alarm_topic_arn, tags=tags)
        if plan.nodes.warm:  # launch windows of warm nodes raise the pool's warm pool
            WindowScheduler(self, "windows", name=name, asg_name=name, tags=tags)

        self.output("autoscaling_group_name", nodes.asg.name, "The pool's Auto Scaling group")
        self.output("autoscaling_group_arn", nodes.asg.arn, "ARN of the Auto Scaling group")
        self.output("launch_template_id", nodes.lt.id, "Launch template of the nodes")
        self.output("launch_template_latest_version", nodes.lt.latest_version,
                    "Version instance refresh rolls to")
        self.output("lb_dns_name", lb.lb.dns_name, "Internal endpoint of the pool")
        self.output("lb_target_group_arn", lb.tg.arn, "Target group of the nodes")
        self.output("security_group_id", nodes.sg.id, "Security group of the nodes")
        self.output("vpc_id", net.vpc_id, "VPC of the pool")
        self.output("iam_role_name", role.role.name, "Role of the nodes")
