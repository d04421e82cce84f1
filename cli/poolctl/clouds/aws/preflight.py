"""Checks against AWS before poolctl changes anything there: what Terraform or Packer would
find out only half-way through (the HTTPS listener's certificate after the port 80 redirect,
the image builder's subnet after Packer's start).

Each check raises one line naming the file's key and the fix (exit 1: a failed check
against the cloud; 2: the file alone shows it), or returns a note when it could not look.
No cloud SDK at import; clients are made as `poolctl.clouds.aws` makes them, from the
`CloudEndpoints` (AWS itself, or one endpoint with its own credentials).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from poolctl.adaptors.aws import botocore_exceptions
from poolctl.clouds.aws.api import AwsApi
from poolctl.errors import OperationFailed, UsageError

# arn:PARTITION:acm:REGION:ACCOUNT:certificate/ID (an IAM server certificate is left to ELB).
ACM_ARN = re.compile(r"^arn:aws[a-z-]*:acm:(?P<region>[a-z0-9-]+):\d{12}:certificate/\S+$")
# What to do about a certificate in each status but ISSUED (ACM's statuses).
STATUS_FIX = {
    "PENDING_VALIDATION": "complete its validation (the DNS record `aws acm describe-"
                          "certificate` shows), then deploy again",
    "EXPIRED": "renew or re-import it, or name a current certificate",
}
OTHER_STATUS_FIX = "request or import a new certificate and name its ARN"
# The caller may not read the certificate: the check cannot say, the apply decides.
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}



def _code(e: Exception) -> str:
    response: Mapping[str, Any] = getattr(e, "response", {}) or {}
    return str(response.get("Error", {}).get("Code", ""))


def check_certificate(key: str, arn: str, region: str, ops: AwsApi) -> str | None:
    """`key` (e.g. pools[0].aws.certificate_arn) names `arn` for the HTTPS listener of a
    load balancer in `region`: it must be an ACM certificate of that region, and ISSUED.
    Raises when it is not; returns a note when the caller may not look (None: checked)."""
    m = ACM_ARN.match(arn)
    if m is None:
        return None  # not ACM's: its shape is validate's, an IAM certificate ELB's to judge
    if m["region"] != region:
        raise UsageError(
            f"{key}: the certificate is in {m['region']}, the pool's load balancer in {region}; "
            f"a load balancer takes a certificate of its own region only: import or request it "
            f"in {region} and name that ARN")
    acm = ops.client("acm", region)
    with ops.call(f"acm DescribeCertificate in {region}"):
        try:
            cert = acm.describe_certificate(CertificateArn=arn)["Certificate"]
        except botocore_exceptions.ClientError as e:
            code = _code(e)
            if code == "ResourceNotFoundException":
                raise OperationFailed(
                    f"{key}: no such certificate in {region} ({arn}); name one that "
                    f"`aws acm list-certificates --region {region}` lists, or remove the key "
                    "for plain HTTP; nothing was applied") from None
            if code in DENIED:
                return (f"{key}: not checked (acm:DescribeCertificate denied); should the "
                        "certificate be wrong, the apply stops at the HTTPS listener and "
                        "port 80 keeps serving")
            raise
    status = str(cert.get("Status", ""))
    if status != "ISSUED":
        fix = STATUS_FIX.get(status, OTHER_STATUS_FIX)
        raise OperationFailed(f"{key}: the certificate is {status or 'of no status'}, not "
                              f"ISSUED, so HTTPS cannot use it; {fix}; nothing was applied")
    return None


def check_builder_subnet(key: str, region: str, tags: Mapping[str, str],
                         subnet_ids: list[str], has_vpc: bool, ops: AwsApi) -> str:
    """The subnet an image builder launches in exists: the file's first subnet, else one
    of the pool's private subnets (what Packer's subnet filter looks for: the stack creates
    them at the first deploy). Returns the subnet found; raises before Packer would run."""
    ec2 = ops.client("ec2", region)
    with ops.call(f"ec2 DescribeSubnets in {region}"):
        if subnet_ids:
            try:
                found = ec2.describe_subnets(SubnetIds=subnet_ids[:1])["Subnets"]
            except botocore_exceptions.ClientError as e:
                if not _code(e).startswith("InvalidSubnetID"):
                    raise
                found = []
            if not found:
                raise OperationFailed(
                    f"{key}.subnet_ids: {subnet_ids[0]} does not exist in {region}, so the "
                    "image builder has nowhere to run; name a private subnet of "
                    "aws.network.vpc_id there (with NAT egress); Packer did not run")
            return str(found[0]["SubnetId"])
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        filters.append({"Name": "state", "Values": ["available"]})
        found = [s for page in ec2.get_paginator("describe_subnets").paginate(Filters=filters)
                 for s in page["Subnets"]]
    if found:
        return str(found[0]["SubnetId"])
    if has_vpc:
        raise UsageError(
            f"{key}.subnet_ids: the image builder needs a subnet of aws.network.vpc_id and "
            "the file names none; set aws.network.subnet_ids (private, with NAT egress); "
            "Packer did not run")
    shown = ", ".join(f"{k}={v}" for k, v in tags.items())
    flag = f" {ops.endpoints.flag}" if ops.endpoints.flag else ""
    raise OperationFailed(
        f"{key}: no subnet to build the image in: the pool's private subnets ({shown}) do "
        f"not exist in {region} before its first deploy; deploy the pool first (`poolctl "
        f"deploy --cloud aws{flag}`, then build again), or set aws.network.vpc_id and "
        "subnet_ids to a private subnet with NAT egress; Packer did not run")
