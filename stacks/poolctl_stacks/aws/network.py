"""The pool's network: an existing VPC and subnets, or a private VPC of its own."""

from __future__ import annotations

import ipaddress
import json

from constructs import Construct

from poolctl.config import AwsNetwork
from poolctl_stacks._providers import aws


class Network(Construct):
    """Private subnets for nodes and the internal load balancer.

    A created VPC has one private subnet per zone, a single NAT gateway for image pulls and
    API calls (one per pool keeps cost down; nodes tolerate a NAT outage once warm because
    weights come over the S3 gateway endpoint), and a default security group with no rules.
    """

    def __init__(self, scope: Construct, id: str, *, net: AwsNetwork, name: str,
                 tags: dict[str, str], region: str) -> None:
        super().__init__(scope, id)
        self.vpc_id: str
        self.vpc_cidr: str
        self.subnet_ids: list[str]
        self.created = not net.vpc_id
        if net.vpc_id:
            self.vpc_id = net.vpc_id
            self.subnet_ids = list(net.subnet_ids)
            vpc = aws("data_aws_vpc").DataAwsVpc(self, "vpc", id=net.vpc_id)
            self.vpc_cidr = vpc.cidr_block
            return

        # Zones pinned at synth (CKV_AWS_394): by ID when the file gives them (the same
        # zones in every account), else the region's first zone names; never "whatever
        # the account lists first", which changes when AWS adds a zone.
        if net.availability_zone_ids:
            zones = [{"availability_zone_id": z} for z in net.availability_zone_ids]
        else:
            zones = [{"availability_zone": f"{region}{chr(ord('a') + i)}"}
                     for i in range(net.availability_zones)]
        vpc = aws("vpc").Vpc(
            self, "vpc", cidr_block=net.vpc_cidr, enable_dns_hostnames=True,
            enable_dns_support=True, tags={**tags, "Name": name},
        )
        self.vpc_id = vpc.id
        self.vpc_cidr = vpc.cidr_block
        aws("default_security_group").DefaultSecurityGroup(
            self, "default-sg", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-default-deny"}
        )
        # /20 private subnets per zone, a /24 public one for the NAT gateway at the top.
        cidr = ipaddress.ip_network(net.vpc_cidr)
        private_cidrs = list(cidr.subnets(new_prefix=max(cidr.prefixlen + 4, 20)))
        public_cidr = list(cidr.subnets(new_prefix=min(cidr.prefixlen + 8, 28)))[-1]

        private_rt = aws("route_table").RouteTable(
            self, "private-rt", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-private"}
        )
        self.subnet_ids = []
        for i, zone in enumerate(zones):
            sn = aws("subnet").Subnet(
                self, f"private-{i}", vpc_id=vpc.id, cidr_block=str(private_cidrs[i]),
                **zone, map_public_ip_on_launch=False,
                tags={**tags, "Name": f"{name}-private-{i}", "poolctl:tier": "private"},
            )
            aws("route_table_association").RouteTableAssociation(
                self, f"private-{i}-rt", subnet_id=sn.id, route_table_id=private_rt.id
            )
            self.subnet_ids.append(sn.id)

        igw = aws("internet_gateway").InternetGateway(
            self, "igw", vpc_id=vpc.id, tags={**tags, "Name": name}
        )
        public = aws("subnet").Subnet(
            self, "public-nat", vpc_id=vpc.id, cidr_block=str(public_cidr),
            **zones[0], map_public_ip_on_launch=False,
            tags={**tags, "Name": f"{name}-nat", "poolctl:tier": "nat"},
        )
        public_rt = aws("route_table").RouteTable(
            self, "public-rt", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-nat"}
        )
        aws("route").Route(
            self, "public-default", route_table_id=public_rt.id,
            destination_cidr_block="0.0.0.0/0", gateway_id=igw.id,
        )
        aws("route_table_association").RouteTableAssociation(
            self, "public-nat-rt", subnet_id=public.id, route_table_id=public_rt.id
        )
        eip = aws("eip").Eip(self, "nat-eip", domain="vpc", tags={**tags, "Name": f"{name}-nat"})
        nat = aws("nat_gateway").NatGateway(
            self, "nat", allocation_id=eip.id, subnet_id=public.id, tags={**tags, "Name": name}
        )
        aws("route").Route(
            self, "private-default", route_table_id=private_rt.id,
            destination_cidr_block="0.0.0.0/0", nat_gateway_id=nat.id,
        )
        # Weights come from S3 through a gateway endpoint: no NAT bytes, no NAT bottleneck.
        aws("vpc_endpoint").VpcEndpoint(
            self, "s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway", route_table_ids=[private_rt.id],
            tags={**tags, "Name": f"{name}-s3"},
        )

    def flow_logs(self, *, name: str, kms_key_arn: str, tags: dict[str, str]) -> None:
        """Rejected-and-accepted flow records of the created VPC, kept a year, encrypted."""
        group = aws("cloudwatch_log_group").CloudwatchLogGroup(
            self, "flow-logs", name=f"/poolctl/vpc-flow/{name}", retention_in_days=365,
            kms_key_id=kms_key_arn, tags=tags,
        )
        role = aws("iam_role").IamRole(
            self, "flow-role", name=f"{name}-vpc-flow", tags=tags,
            assume_role_policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }],
            }),
        )
        aws("iam_role_policy").IamRolePolicy(
            self, "flow-policy", name=f"{name}-vpc-flow", role=role.id,
            policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Action": ["logs:CreateLogStream", "logs:PutLogEvents",
                               "logs:DescribeLogStreams"],
                    "Resource": [f"{group.arn}:*"],
                }],
            }),
        )
        aws("flow_log").FlowLog(
            self, "flow", vpc_id=self.vpc_id, traffic_type="ALL",
            log_destination_type="cloud-watch-logs", log_destination=group.arn,
            iam_role_arn=role.arn, max_aggregation_interval=600, tags=tags,
        )
