"""Node images on AWS (part of `AwsOps`): the AMIs `poolctl image build` made for the pool
and what uses them, their deletion with their snapshots, and what a build needs first (the
base AMI the SSM parameter names, a subnet for the builder)."""

from __future__ import annotations

from typing import Any

from poolctl import naming
from poolctl.adaptors.aws import botocore_exceptions
from poolctl.clouds.aws.api import AwsApi, stand_in_ami
from poolctl.clouds.aws.preflight import check_builder_subnet
from poolctl.clouds.base import ImageRow, KeepsNodeImages, PreparesImageBuilds
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed, UsageError


class AwsImages(AwsApi, KeepsNodeImages, PreparesImageBuilds):
    def node_images(self, cfg: Config, pool: Pool) -> list[ImageRow]:
        assert pool.aws is not None  # listed for the pool's aws placement (one_target)
        ec2 = self.client("ec2", pool.aws.region)
        tags = naming.aws_tags(cfg, pool)
        try:
            images = ec2.describe_images(Owners=["self"], Filters=[
                {"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()])["Images"]
            used = _in_use(ec2, cfg, pool)
        except (botocore_exceptions.ClientError, botocore_exceptions.BotoCoreError) as e:
            raise OperationFailed(f"image list --cloud aws: {e}") from None
        rows = []
        for im in images:
            t = {x["Key"]: x["Value"] for x in im.get("Tags", [])}
            rows.append(ImageRow(
                id=im["ImageId"], name=im.get("Name", ""), created=im.get("CreationDate", ""),
                serving_image=t.get(naming.TAG_SERVING_IMAGE),
                in_use=used.get(im["ImageId"], []),
                snapshots=[b["Ebs"]["SnapshotId"] for b in im.get("BlockDeviceMappings", [])
                           if b.get("Ebs", {}).get("SnapshotId")]))
        return rows

    def delete_node_image(self, pool: Pool, row: ImageRow) -> None:
        assert pool.aws is not None  # prune: the pool's aws placement, whose images it listed
        ec2 = self.client("ec2", pool.aws.region)
        try:
            ec2.deregister_image(ImageId=row.id)
            for snap in row.snapshots:
                ec2.delete_snapshot(SnapshotId=snap)
        except (botocore_exceptions.ClientError, botocore_exceptions.BotoCoreError) as e:
            raise OperationFailed(f"image prune: {row.id}: {e}") from None

    def image_build_base(self, pool: Pool, key: str) -> str:
        """Packer 1.6.6 cannot read SSM, so the parameter is resolved here. An endpoint
        with stand-in images (the sandbox) has no such parameter: its stand-in AMI is used, as
        `deploy --sandbox` does."""
        p = pool.aws
        assert p is not None  # build asks it only for the pool's aws placement, checked there
        ssm = self.client("ssm", p.region)
        try:
            value: str = ssm.get_parameter(Name=p.ami_ssm_parameter)["Parameter"]["Value"]
            return value
        except botocore_exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code != "ParameterNotFound":
                raise OperationFailed(f"{key}.ami_ssm_parameter: {e}") from None
        except botocore_exceptions.BotoCoreError as e:
            raise OperationFailed(f"{key}.ami_ssm_parameter: {e}") from None
        if self.endpoints.stand_in_images and (image := stand_in_ami(self.client("ec2", p.region))):
            return image
        raise UsageError(
            f"{key}.ami_ssm_parameter: {p.ami_ssm_parameter!r} names no image in {p.region}, "
            "so the image build has no base; set it to the Deep Learning Base AMI's parameter")

    def check_image_builder(self, pool: Pool, key: str, tags: dict[str, str]) -> None:
        p = pool.aws
        assert p is not None  # build checked the pool's placement on this cloud (aws)
        check_builder_subnet(f"{key}.network", p.region, tags, list(p.network.subnet_ids),
                             has_vpc=bool(p.network.vpc_id), ops=self)


def _in_use(ec2: Any, cfg: Config, pool: Pool) -> dict[str, list[str]]:
    """Image id -> what uses it: the file's placement, the pool's launch template versions
    (a rollback returns to the previous one), instances that are not terminated."""
    used: dict[str, list[str]] = {}
    assert pool.aws is not None  # node_images: the pool's aws placement
    if pool.aws.ami_id:
        used.setdefault(pool.aws.ami_id, []).append("aws.ami_id in the file")
    tags = naming.aws_tags(cfg, pool)
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
    for lt in ec2.describe_launch_templates(Filters=filters).get("LaunchTemplates", []):
        versions = ec2.describe_launch_template_versions(
            LaunchTemplateId=lt["LaunchTemplateId"]).get("LaunchTemplateVersions", [])
        for v in versions:
            ami = v.get("LaunchTemplateData", {}).get("ImageId")
            if ami:
                used.setdefault(ami, []).append(
                    f"launch template {lt['LaunchTemplateName']} v{v['VersionNumber']}")
    states = ["pending", "running", "stopping", "stopped"]
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[*filters, {"Name": "instance-state-name", "Values": states}]):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                used.setdefault(i["ImageId"], []).append(f"instance {i['InstanceId']}")
    return used
