"""Find what an interrupted apply created in AWS but could not record in Terraform's state.

Terraform records a resource once the cloud answers its create call. An interrupt (or a lost
connection) between the call and the answer leaves the resource in AWS, unknown to the
state: the next apply fails with AlreadyExists (launch template, group, role, load balancer
and other named resources) or makes a duplicate (VPC, subnets ...). `find` looks up every
resource of the stack that the state lacks by its literal name (or `Name` tag) and returns
the ones whose tags prove poolctl created them for this pool (`poolctl:project` and
`poolctl:pool`, the contract's tags); `poolctl.deploy` imports them with `import` blocks.

Listeners are found on their load balancer by port. Not covered (nothing to find them by):
security group rules, routes, route table associations, policy attachments, and the KMS key
when its alias was not created; alarms, scaling policies and inline role policies are
upserts (created again without error).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from poolctl.clouds.base import Found
from poolctl.errors import OperationFailed


def _literal(value: Any) -> str | None:
    """A plain string of the synthesized JSON, not a Terraform expression."""
    return value if isinstance(value, str) and value and "${" not in value else None


def _tags(items: Any) -> dict[str, str]:
    if isinstance(items, dict):
        return {str(k): str(v) for k, v in items.items()}
    out = {}
    for t in items or []:
        key = t.get("Key", t.get("TagKey"))
        out[str(key)] = str(t.get("Value", t.get("TagValue")))
    return out


def _absent(e: Exception) -> bool:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
    return "NotFound" in code or code in ("NoSuchEntity", "ValidationError")


# Lookups: (client factory, the resource's block with references resolved) -> [(id, tags)].
Client = Callable[[str], Any]
# (id, tags) of each resource a lookup finds.
Candidates = list[tuple[str, dict[str, str]]]
Lookup = Callable[[Client, dict[str, Any]], Candidates]
_REF = re.compile(r"\$\{(aws_\w+\.[\w-]+)\.(\w+)\}")


def _resolve(value: Any, known: dict[str, dict[str, Any]]) -> Any:
    """`${aws_lb.x.arn}` -> the attribute of a resource in the state (or adopted already)."""
    m = _REF.fullmatch(value) if isinstance(value, str) else None
    return (known.get(m[1]) or {}).get(m[2]) if m else value


def _by_name(fn: Callable[[Client, str], Candidates],
             attr: str = "name") -> Lookup:
    def lookup(client: Client, block: dict[str, Any]) -> Candidates:
        name = _literal(block.get(attr))
        if name is None:
            return []
        try:
            return fn(client, name)
        except Exception as e:
            if _absent(e):
                return []
            raise
    return lookup


def _launch_template(c: Client, name: str) -> Candidates:
    lts = c("ec2").describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
    return [(t["LaunchTemplateId"], _tags(t.get("Tags"))) for t in lts]


def _group(c: Client, name: str) -> Candidates:
    groups = c("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return [(g["AutoScalingGroupName"], _tags(g.get("Tags"))) for g in groups]


def _role(c: Client, name: str) -> Candidates:
    role = c("iam").get_role(RoleName=name)["Role"]
    return [(role["RoleName"], _tags(role.get("Tags")))]


def _profile(c: Client, name: str) -> Candidates:
    p = c("iam").get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    return [(p["InstanceProfileName"], _tags(p.get("Tags")))]


def _log_group(c: Client, name: str) -> Candidates:
    logs = c("logs")
    groups = logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"]
    return [(g["logGroupName"], _tags(logs.list_tags_log_group(logGroupName=name)["tags"]))
            for g in groups if g["logGroupName"] == name]


def _elb(kind: str) -> Callable[[Client, str], Candidates]:
    def lookup(c: Client, name: str) -> Candidates:
        elbv2 = c("elbv2")
        if kind == "lb":
            arns = [x["LoadBalancerArn"]
                    for x in elbv2.describe_load_balancers(Names=[name])["LoadBalancers"]]
        else:
            arns = [x["TargetGroupArn"]
                    for x in elbv2.describe_target_groups(Names=[name])["TargetGroups"]]
        if not arns:
            return []
        tags = {d["ResourceArn"]: _tags(d.get("Tags"))
                for d in elbv2.describe_tags(ResourceArns=arns)["TagDescriptions"]}
        return [(a, tags.get(a, {})) for a in arns]
    return lookup


def _listener(c: Client, block: dict[str, Any]) -> Candidates:
    lb_arn, port = _literal(block.get("load_balancer_arn")), block.get("port")
    if lb_arn is None or port is None:
        return []
    elbv2 = c("elbv2")
    arns = [x["ListenerArn"] for x in elbv2.describe_listeners(LoadBalancerArn=lb_arn)[
        "Listeners"] if str(x.get("Port")) == str(port)]
    if not arns:
        return []
    tags = {d["ResourceArn"]: _tags(d.get("Tags"))
            for d in elbv2.describe_tags(ResourceArns=arns)["TagDescriptions"]}
    return [(a, tags.get(a, {})) for a in arns]


def _kms_key_of_alias(c: Client, alias: str) -> Candidates:
    kms = c("kms")
    key = kms.describe_key(KeyId=alias)["KeyMetadata"]
    if key.get("KeyState") in ("PendingDeletion", "PendingReplicaDeletion"):
        return []
    tags = _tags(kms.list_resource_tags(KeyId=key["KeyId"])["Tags"])
    return [(key["KeyId"], tags)]


def _alias(c: Client, alias: str) -> Candidates:
    return [(alias, tags) for _, tags in _kms_key_of_alias(c, alias)]


# EC2 resources found by their Name tag (or group name): describe call, list key, id key.
_EC2 = {
    "aws_vpc": ("describe_vpcs", "Vpcs", "VpcId"),
    "aws_subnet": ("describe_subnets", "Subnets", "SubnetId"),
    "aws_internet_gateway": ("describe_internet_gateways", "InternetGateways",
                             "InternetGatewayId"),
    "aws_route_table": ("describe_route_tables", "RouteTables", "RouteTableId"),
    "aws_eip": ("describe_addresses", "Addresses", "AllocationId"),
    "aws_nat_gateway": ("describe_nat_gateways", "NatGateways", "NatGatewayId"),
    "aws_vpc_endpoint": ("describe_vpc_endpoints", "VpcEndpoints", "VpcEndpointId"),
    "aws_security_group": ("describe_security_groups", "SecurityGroups", "GroupId"),
}
_GONE = {"deleted", "deleting", "failed", "rejected", "expired"}


def _ec2(kind: str, contract: dict[str, str]) -> Lookup:
    call, key, id_key = _EC2[kind]

    def lookup(c: Client, block: dict[str, Any]) -> Candidates:
        if kind == "aws_security_group":
            name = _literal(block.get("name"))
            flt = [{"Name": "group-name", "Values": [name]}] if name else None
        else:
            name = _literal((block.get("tags") or {}).get("Name"))
            flt = [{"Name": "tag:Name", "Values": [name]}] if name else None
        if flt is None:
            return []
        flt += [{"Name": f"tag:{k}", "Values": [v]} for k, v in contract.items()]
        items = getattr(c("ec2"), call)(Filters=flt)[key]
        return [(x[id_key], _tags(x.get("Tags"))) for x in items
                if str(x.get("State", "")).lower() not in _GONE]
    return lookup


def _sg_rule(egress: bool) -> Lookup:
    """A security group rule is found by its group and its whole spec (protocol, ports, CIDR
    or referenced group); its own tags (Terraform sets them in the Authorize call) prove it
    poolctl's. Interrupts land between Authorize and the state write as easily as elsewhere,
    and a re-run then fails with InvalidPermission.Duplicate."""
    def lookup(c: Client, block: dict[str, Any]) -> Candidates:
        group = _literal(block.get("security_group_id"))
        if group is None:
            return []
        want = (str(block.get("ip_protocol")), block.get("from_port"), block.get("to_port"),
                _literal(block.get("cidr_ipv4")),
                _literal(block.get("referenced_security_group_id")))
        rules = c("ec2").describe_security_group_rules(
            Filters=[{"Name": "group-id", "Values": [group]}])["SecurityGroupRules"]
        return [(r["SecurityGroupRuleId"], _tags(r.get("Tags"))) for r in rules
                if bool(r.get("IsEgress")) == egress
                and (str(r.get("IpProtocol")), r.get("FromPort"), r.get("ToPort"),
                     r.get("CidrIpv4"), (r.get("ReferencedGroupInfo") or {}).get("GroupId"))
                == want]
    return lookup


def lookups(contract: dict[str, str]) -> dict[str, Lookup]:
    return {
        "aws_launch_template": _by_name(_launch_template),
        "aws_autoscaling_group": _by_name(_group),
        "aws_iam_role": _by_name(_role),
        "aws_iam_instance_profile": _by_name(_profile),
        "aws_cloudwatch_log_group": _by_name(_log_group),
        "aws_lb": _by_name(_elb("lb")),
        "aws_lb_target_group": _by_name(_elb("tg")),
        "aws_kms_alias": _by_name(_alias),
        "aws_lb_listener": _listener,
        "aws_vpc_security_group_ingress_rule": _sg_rule(egress=False),
        "aws_vpc_security_group_egress_rule": _sg_rule(egress=True),
        **{kind: _ec2(kind, contract) for kind in _EC2},
    }


def _key_alias(config: dict[str, Any], key_name: str) -> str | None:
    """The literal alias name of the key `aws_kms_key.<key_name>`: how its key is found."""
    ref = f"${{aws_kms_key.{key_name}."
    for block in (config.get("resource", {}).get("aws_kms_alias") or {}).values():
        if str(block.get("target_key_id", "")).startswith(ref):
            return _literal(block.get("name"))
    return None


def _denied(e: Exception) -> str | None:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
    return code if "AccessDenied" in code or "Unauthorized" in code else None


def find(client: Client, config: dict[str, Any], state: dict[str, dict[str, Any]],
         contract: dict[str, str],
         on_denied: Callable[[str, str], None] = lambda address, code: None) -> list[Found]:
    """Resources of `config` (cdk.tf.json) missing from `state` (address -> attributes) that
    exist in AWS with the `contract` tags and are not in the state under another address.
    A lookup the caller may not make is skipped (`on_denied(address, error code)`): the
    deploy goes on as it would without adoption."""
    table = lookups(contract)
    known = dict(state)
    managed = {(a.split(".")[0], str(attrs.get("id"))) for a, attrs in state.items()}
    found: list[Found] = []
    # Sorted: a load balancer (aws_lb.x) is adopted before its listener (aws_lb_listener.y).
    for kind, blocks in sorted(config.get("resource", {}).items()):
        for name, block in blocks.items():
            address = f"{kind}.{name}"
            if address in state or "count" in block or "for_each" in block:
                continue
            block = {k: _resolve(v, known) for k, v in block.items()}
            if kind == "aws_kms_key":
                alias = _key_alias(config, name)
                lookup, block = (_by_name(_kms_key_of_alias), {"name": alias}) if alias else (
                    None, block)
            else:
                lookup = table.get(kind)
            if lookup is None:
                continue
            try:
                candidates = lookup(client, block)
            except Exception as e:  # botocore's ClientError / BotoCoreError
                if _denied(e):
                    on_denied(address, str(_denied(e)))
                    continue
                raise OperationFailed(f"looking for {address} in AWS (to adopt what an "
                                      f"interrupted apply created) failed: {e}") from None
            ours = [i for i, tags in candidates
                    if contract.items() <= tags.items() and (kind, i) not in managed]
            if len(ours) != 1:
                continue
            label = _literal(block.get("name")) or _literal(
                (block.get("tags") or {}).get("Name")) or ours[0]
            found.append(Found(address, ours[0], f"{kind.removeprefix('aws_')} {label}"))
            known[address] = {"id": ours[0], "arn": ours[0]}
    return found
