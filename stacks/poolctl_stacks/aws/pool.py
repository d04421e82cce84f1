"""The pool itself: load balancer, security groups, launch template, Auto Scaling group."""

from __future__ import annotations

import base64
from typing import Any

from cdktn import Op, TerraformVariable
from constructs import Construct

from poolctl import naming
from poolctl.bootscript import LIB_IMAGE_TAG, boot_library
from poolctl.bootscript import user_data as boot_user_data
from poolctl.catalog import InstanceType
from poolctl.cloud import Cloud
from poolctl.config import AwsCapacity, Config, Pool
from poolctl.contract import aws as contract
from poolctl.sizing import PoolPlan
from poolctl_stacks._providers import aws
from poolctl_stacks.base import STICKY_COOKIE_S
from poolctl_stacks.literal import hcl_quoted

# Where a node launches, as the Auto Scaling API reference's CapacityReservationSpecification
# has it: the group's preference and target decide (`default` would defer to the launch
# template); with `open` or `none` a target is not given. The launch template's block takes
# one preference (open | none) or one target, so the list of ids lives on the group.
_GROUP_PREFERENCE = {"reservations-first": "capacity-reservations-first",
                     "reservations-only": "capacity-reservations-only"}


def launch_kw(asg: Any, pool: Pool, template_id: str, version: str) -> dict[str, Any]:
    """The group's launch template, or with fallback types a mixed instances policy over it
    (provider 6.25's names; the runtime passes the same policy to an instance refresh:
    poolctl.contract.aws.mixed_instances_policy)."""
    types = contract.launch_types(pool)
    if len(types) == 1:
        return {"launch_template": {"id": template_id, "version": version}}
    return {"mixed_instances_policy": asg.AutoscalingGroupMixedInstancesPolicy(
        launch_template=asg.AutoscalingGroupMixedInstancesPolicyLaunchTemplate(
            launch_template_specification=(
                asg.AutoscalingGroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecification(
                    launch_template_id=template_id, version=version)),
            override=[asg.AutoscalingGroupMixedInstancesPolicyLaunchTemplateOverride(
                instance_type=t) for t in types],
        ),
        instances_distribution=asg.AutoscalingGroupMixedInstancesPolicyInstancesDistribution(
            on_demand_allocation_strategy=contract.ON_DEMAND_ALLOCATION,
            on_demand_base_capacity=0, on_demand_percentage_above_base_capacity=100,
        ),
    )}


def capacity_reservation_specs(cap: AwsCapacity) -> tuple[dict[str, object] | None,
                                                          dict[str, object] | None]:
    """(launch template's, group's) capacity_reservation_specification; (None, None) for
    EC2's default (a matching open reservation is used, else On-Demand). A Capacity Block
    is targeted by the launch template alone (instance_market_options sets its market)."""
    if cap.capacity_block is not None:
        return ({"capacity_reservation_target": {"capacity_reservation_id": cap.capacity_block}},
                None)
    mode = cap.mode
    if mode == "open":
        return None, None
    if mode == "none":
        return {"capacity_reservation_preference": "none"}, None
    arn = cap.group_arn
    target = ({"capacity_reservation_resource_group_arns": [arn]} if arn is not None
              else {"capacity_reservation_ids": cap.reservation_ids})
    return ({"capacity_reservation_preference": "open"},
            {"capacity_reservation_preference": _GROUP_PREFERENCE[mode],
             "capacity_reservation_target": target})

class LoadBalancer(Construct):
    """Internal ALB: least-outstanding-requests suits long, uneven LLM requests. With
    `sticky`, the target group's lb_cookie stickiness keeps a client on one node (where its
    conversation's prefix cache is); its first request still goes least-outstanding."""

    def __init__(self, scope: Construct, id: str, *, name: str, vpc_id: str,
                 subnet_ids: list[str], client_cidrs: list[str], port: int,
                 health_path: str, sticky: bool, certificate_arn: str | None,
                 access_logs_bucket: str | None, access_logs_prefix: str | None,
                 tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        self.sg = aws("security_group").SecurityGroup(
            self, "sg", name=f"{name}-lb", vpc_id=vpc_id, tags=tags,
            description=f"poolctl {name}: clients to the load balancer",
        )
        listen_ports = [80, 443] if certificate_arn else [80]
        for i, cidr in enumerate(client_cidrs):
            for lp in listen_ports:
                aws("vpc_security_group_ingress_rule").VpcSecurityGroupIngressRule(
                    self, f"in-{i}-{lp}", security_group_id=self.sg.id, cidr_ipv4=cidr,
                    ip_protocol="tcp", from_port=lp, to_port=lp, tags=tags,
                    description="clients to the listener",
                )
        self.lb = aws("lb").Lb(
            self, "lb", name=naming.short(name, 32), internal=True,
            load_balancer_type="application", security_groups=[self.sg.id],
            subnets=subnet_ids, drop_invalid_header_fields=True,
            enable_deletion_protection=False, idle_timeout=600, tags=tags,
            # Off unless the file names a bucket: ELB writes only to a bucket whose policy
            # admits the region's log-delivery principal, which the user owns.
            access_logs={"bucket": access_logs_bucket, "prefix": access_logs_prefix or None,
                         "enabled": True} if access_logs_bucket else None,
        )
        self.tg = aws("lb_target_group").LbTargetGroup(
            self, "tg", name=naming.short(name, 32), port=port, protocol="HTTP",
            vpc_id=vpc_id, target_type="instance",
            load_balancing_algorithm_type="least_outstanding_requests",
            deregistration_delay="120",
            health_check={
                "path": health_path, "port": "traffic-port", "protocol": "HTTP",
                "matcher": "200", "interval": 15, "timeout": 5,
                "healthy_threshold": 2, "unhealthy_threshold": 3,
            },
            stickiness={"type": "lb_cookie", "enabled": True,
                        "cookie_duration": STICKY_COOKIE_S} if sticky else None,
            tags=tags,
        )
        listener = aws("lb_listener")
        forward = listener.LbListenerDefaultAction(type="forward", target_group_arn=self.tg.arn)
        if certificate_arn:
            self.listener = listener.LbListener(
                self, "https", load_balancer_arn=self.lb.arn, port=443, protocol="HTTPS",
                ssl_policy="ELBSecurityPolicy-TLS13-1-2-2021-06",
                certificate_arn=certificate_arn, default_action=[forward], tags=tags,
            )
            # Port 80 turns into the redirect only once the HTTPS listener exists: an
            # apply that fails on the certificate leaves it forwarding, not redirecting to
            # nothing (a new pool gets neither listener until HTTPS works).
            listener.LbListener(
                self, "http", load_balancer_arn=self.lb.arn, port=80, protocol="HTTP",
                default_action=[listener.LbListenerDefaultAction(
                    type="redirect",
                    redirect={"port": "443", "protocol": "HTTPS", "status_code": "HTTP_301"},
                )],
                tags=tags, depends_on=[self.listener],
            )
        else:
            self.listener = listener.LbListener(
                self, "http", load_balancer_arn=self.lb.arn, port=80, protocol="HTTP",
                default_action=[forward], tags=tags,
            )


class NodeGroup(Construct):
    """Launch template and Auto Scaling group, with warm pool, hook and refresh policy."""

    def _instance_connect(self, *, name: str, vpc_id: str, subnet_id: str,
                          tags: dict[str, str]) -> None:
        """SSH for `nodes check` through an EC2 Instance Connect Endpoint: port 22 open to the
        endpoint's security group only, no public address, no key pair (the check pushes a key
        valid 60 s with ec2-instance-connect:SendSSHPublicKey)."""
        eic_sg = aws("security_group").SecurityGroup(
            self, "eic-sg", name=f"{name}-eic", vpc_id=vpc_id, tags=tags,
            description=f"poolctl {name}: EC2 Instance Connect Endpoint to the nodes",
        )
        aws("vpc_security_group_egress_rule").VpcSecurityGroupEgressRule(
            self, "eic-to-nodes", security_group_id=eic_sg.id,
            referenced_security_group_id=self.sg.id, ip_protocol="tcp", from_port=22,
            to_port=22, description="SSH to the nodes", tags=tags,
        )
        # The older rule resource: checkov's CKV_AWS_24 reads a vpc_security_group_ingress_rule
        # that references a group (no CIDR) as open to the world; this one it reads right.
        aws("security_group_rule").SecurityGroupRule(
            self, "ssh-from-eic", type="ingress", security_group_id=self.sg.id,
            source_security_group_id=eic_sg.id, protocol="tcp", from_port=22, to_port=22,
            description="SSH from the Instance Connect Endpoint only",
        )
        aws("ec2_instance_connect_endpoint").Ec2InstanceConnectEndpoint(
            self, "eic", subnet_id=subnet_id, security_group_ids=[eic_sg.id],
            preserve_client_ip=False, tags={**tags, "Name": f"{name}-eic"},
        )

    def __init__(self, scope: Construct, id: str, *, cfg: Config, pool: Pool,
                 row: InstanceType, plan: PoolPlan, name: str, vpc_id: str,
                 subnet_ids: list[str], lb: LoadBalancer, instance_profile_arn: str,
                 user_data: str, image_user_data: str, ami_id: str | None,
                 tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        placement = pool.aws
        assert placement is not None  # an aws stack: the pool has an aws placement
        port = pool.serving.port
        self.sg = aws("security_group").SecurityGroup(
            self, "sg", name=f"{name}-nodes", vpc_id=vpc_id, tags=tags,
            description=f"poolctl {name}: serving port from the load balancer only",
        )
        aws("vpc_security_group_ingress_rule").VpcSecurityGroupIngressRule(
            self, "from-lb", security_group_id=self.sg.id,
            referenced_security_group_id=lb.sg.id, ip_protocol="tcp",
            from_port=port, to_port=port, description="serving port from the ALB", tags=tags,
        )
        aws("vpc_security_group_egress_rule").VpcSecurityGroupEgressRule(
            self, "https-out", security_group_id=self.sg.id, cidr_ipv4="0.0.0.0/0",
            ip_protocol="tcp", from_port=443, to_port=443,
            description="S3, registries and AWS APIs over HTTPS", tags=tags,
        )
        aws("vpc_security_group_egress_rule").VpcSecurityGroupEgressRule(
            lb, "to-nodes", security_group_id=lb.sg.id,
            referenced_security_group_id=self.sg.id, ip_protocol="tcp",
            from_port=port, to_port=port, description="listener to the nodes", tags=tags,
        )
        if placement.node_access == "instance-connect":
            self._instance_connect(name=name, vpc_id=vpc_id, subnet_id=subnet_ids[0], tags=tags)

        # Variables (names, defaults: poolctl.contract.aws): `deploy` uses the defaults (the
        # file's sizes); runtime commands pass TF_VAR_... so that an apply they run keeps what
        # they changed at runtime (`warm` sizes, `rollout start --no-surge`, the running
        # launch template version), and `deploy --sandbox` passes the emulator's AMI without
        # changing the synthesized file.
        v = {}
        for spec, default in contract.stack_variables(plan, ami_id):
            v[spec.name] = TerraformVariable(self, spec.name, type=spec.type, default=default,
                                             description=spec.description)
            v[spec.name].override_logical_id(spec.name)  # a stable name for TF_VAR_<name>

        # The AMI: given in the file, or resolved from SSM at deploy time.
        ssm = aws("data_aws_ssm_parameter").DataAwsSsmParameter(
            self, "ami", name=placement.ami_ssm_parameter,
        )
        ami = contract.NODE_AMI_ID.name
        ssm.add_override("count", f'${{var.{ami} == "" ? 1 : 0}}')
        image_id = (f'${{var.{ami} != "" ? var.{ami} : '
                    f'one(data.aws_ssm_parameter.{ssm.friendly_unique_id}[*].insecure_value)}}')

        # The boot script: the image variant on an image `poolctl image build` made with
        # this very boot library (its tag names the version), else the whole script. Chosen
        # at plan time from the image itself, so the synthesized JSON is the same wherever
        # it is made, and `--node-image` to an image without the library gets the whole one.
        # Deprecated images included: the SSM parameter or the file may name one.
        node_ami = aws("data_aws_ami").DataAwsAmi(
            self, "node-ami", include_deprecated=True,
            filter=[{"name": "image-id", "values": [image_id]}],
        )
        # gzip, then base64 (no template syntax): bootscript.user_data
        b64 = {k: base64.b64encode(boot_user_data(text, Cloud.aws)).decode()
               for k, text in (("whole", user_data), ("image", image_user_data))}
        user_data_choice = (
            f"${{lookup(data.aws_ami.{node_ami.friendly_unique_id}.tags, "
            f"{hcl_quoted(LIB_IMAGE_TAG['aws'])}, \"\") == "
            f"{hcl_quoted(boot_library('aws')['version'])} ? "
            f"\"{b64['image']}\" : \"{b64['whole']}\"}}"
        )

        lt_capacity, group_capacity = capacity_reservation_specs(placement.capacity)
        lt = aws("launch_template")
        self.lt = lt.LaunchTemplate(
            self, "lt", name=name, image_id=image_id, instance_type=row.name,
            update_default_version=True, ebs_optimized="true",
            iam_instance_profile={"arn": instance_profile_arn},
            # IMDSv2 only; one hop: containers never need the node's credentials.
            metadata_options={
                "http_endpoint": "enabled", "http_tokens": "required",
                "http_put_response_hop_limit": 1, "instance_metadata_tags": "disabled",
            },
            monitoring={"enabled": True},
            block_device_mappings=[lt.LaunchTemplateBlockDeviceMappings(
                device_name="/dev/sda1",
                ebs=lt.LaunchTemplateBlockDeviceMappingsEbs(
                    volume_size=placement.root_volume_gb, volume_type="gp3",
                    encrypted="true", delete_on_termination="true",
                    iops=6000, throughput=500,
                    # Both lines we support carry it (hashicorp/aws 5.100 schema, bindings
                    # 6.25): a pre-pulled image's layers then load at this rate, not lazily.
                    volume_initialization_rate=placement.volume_initialization_rate_mib_s,
                ),
            )],
            # One plain ENA interface: no EFA, no public address.
            network_interfaces=[lt.LaunchTemplateNetworkInterfaces(
                device_index=0, associate_public_ip_address="false",
                delete_on_termination="true", security_groups=[self.sg.id],
            )],
            user_data=user_data_choice,
            capacity_reservation_specification=lt_capacity,
            # A Capacity Block takes only launches of its market type (AWS Auto Scaling user
            # guide, "Use Capacity Blocks for machine learning workloads").
            instance_market_options=(None if placement.capacity.capacity_block is None
                                     else {"market_type": contract.CAPACITY_BLOCK}),
            tag_specifications=[
                lt.LaunchTemplateTagSpecifications(resource_type=kind, tags={**tags, "Name": name})
                for kind in ("instance", "volume")
            ],
            tags=tags,
        )

        refresh_min = v[contract.REFRESH_MIN_HEALTHY.name]
        refresh_max = v[contract.REFRESH_MAX_HEALTHY.name]
        min_nodes = v[contract.MIN_NODES.name]
        lt_pin = v[contract.LAUNCH_TEMPLATE_VERSION.name]
        cold = int(plan.start_seconds["cold"])
        warm_pool = None
        if contract.WARM_NODES.name in v:
            warm_nodes = v[contract.WARM_NODES.name]
            warm_pool = {
                "pool_state": "Running" if pool.warm_pool.state == "running" else "Stopped",
                "min_size": warm_nodes.number_value,
                "max_group_prepared_capacity": Op.add(min_nodes.number_value,
                                                      warm_nodes.number_value),
                "instance_reuse_policy": {"reuse_on_scale_in": True},
            }
        # A raw expression: cdktf renders the "" of Op.neq as `undefined`.
        lt_version = (
            f'${{var.{lt_pin.friendly_unique_id} != "" ? var.{lt_pin.friendly_unique_id} : '
            f"aws_launch_template.{self.lt.friendly_unique_id}.latest_version}}"
        )
        asg = aws("autoscaling_group")
        self.asg = asg.AutoscalingGroup(
            self, "asg", name=name,
            # The pool's max nodes; a rollout passes max + surge for its time (contract).
            min_size=min_nodes.number_value,
            max_size=v[contract.MAX_NODES.name].number_value,
            desired_capacity=min_nodes.number_value,
            vpc_zone_identifier=subnet_ids, target_group_arns=[lb.tg.arn],
            health_check_type="ELB", health_check_grace_period=cold,
            default_instance_warmup=cold,
            **launch_kw(asg, pool, self.lt.id, lt_version),
            # Nodes start serving only once the boot script completes this hook.
            initial_lifecycle_hook=[asg.AutoscalingGroupInitialLifecycleHook(
                name=naming.LIFECYCLE_HOOK,
                lifecycle_transition="autoscaling:EC2_INSTANCE_LAUNCHING",
                default_result="ABANDON",
                heartbeat_timeout=min(7200, max(600, 2 * cold)),
            )],
            warm_pool=warm_pool,
            capacity_reservation_specification=group_capacity,
            instance_refresh={
                "strategy": "Rolling",
                # The same preferences `rollout start` passes to StartInstanceRefresh.
                "preferences": {
                    "min_healthy_percentage": refresh_min.number_value,
                    "max_healthy_percentage": refresh_max.number_value,
                    **contract.refresh_preferences(pool, plan),
                },
            },
            termination_policies=["OldestLaunchTemplate", "ClosestToNextInstanceHour"],
            enabled_metrics=[
                "GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances",
                "GroupTerminatingInstances", "GroupTotalInstances", "WarmPoolWarmedCapacity",
                "WarmPoolPendingCapacity", "WarmPoolDesiredCapacity",
            ],
            wait_for_capacity_timeout="0",
            # Model and image: what `poolctl ls` shows without the file; a node launched
            # during a rollout carries the version it runs.
            tag=[asg.AutoscalingGroupTag(key=k, value=v, propagate_at_launch=True)
                 for k, v in {**tags, "Name": name, naming.TAG_MODEL: pool.model.id,
                              naming.TAG_IMAGE: pool.serving.image}.items()],
            # poolctl sizes the group at runtime (warm, autoscaling); Terraform owns the shape.
            lifecycle={"ignore_changes": ["desired_capacity"]},
        )
