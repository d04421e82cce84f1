"""What a deploy and `nodes check` ask of AWS beyond Terraform and the group (part of
`AwsOps`): the HTTPS listener's certificate, the resources an interrupted apply left
behind, the node image a local endpoint stands in with, and a login key pushed to one
instance through EC2 Instance Connect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from poolctl.adaptors.aws import botocore_exceptions
from poolctl.clouds.aws import adopt
from poolctl.clouds.aws.api import AwsApi, stand_in_ami
from poolctl.clouds.aws.preflight import check_certificate
from poolctl.clouds.base import DeployChecks, Found, SendsInstanceKeys
from poolctl.errors import OperationFailed, UsageError


class AwsDeployChecks(AwsApi, DeployChecks, SendsInstanceKeys):
    def certificate_note(self, key: str, arn: str, region: str) -> str | None:
        return check_certificate(key, arn, region, self)

    def adoptable(self, region: str, config: dict[str, Any], state: dict[str, dict[str, Any]],
                  contract: dict[str, str], on_denied: Callable[[str, str], None]
                  ) -> list[Found]:
        return adopt.find(lambda svc: self.client(svc, region), config, state, contract,
                          on_denied=on_denied)

    def stand_in_image(self, region: str) -> str:
        image = stand_in_ami(self.client("ec2", region))
        if image is None:
            raise OperationFailed(f"{self.endpoints.aws.url if self.endpoints.aws else region}"
                                  ": the endpoint offers no AMI to stand in for the node image; "
                                  "restart the sandbox with `poolctl sandbox stop && poolctl "
                                  "sandbox start`")
        return image

    def send_instance_key(self, region: str, instance_id: str, user: str,
                          public_key: str) -> None:
        eic = self.client("ec2-instance-connect", region)
        try:
            eic.send_ssh_public_key(InstanceId=instance_id, InstanceOSUser=user,
                                    SSHPublicKey=public_key)
        except botocore_exceptions.NoCredentialsError:
            raise UsageError("no AWS credentials to push the key with") from None
        except (botocore_exceptions.ClientError, botocore_exceptions.BotoCoreError) as e:
            raise OperationFailed(f"ec2-instance-connect SendSSHPublicKey to {instance_id} "
                                  f"failed: {e}") from None
