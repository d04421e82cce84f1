"""EC2 Instance Connect (`nodes check --access instance-connect`).

moto's SendSSHPublicKey accepts anything and keeps nothing. Here, as the API reference says:
the instance must exist in the region (EC2InstanceNotFoundException) and be running
(EC2InstanceStateInvalidException), the key must be an OpenSSH public key of a supported type
(InvalidArgsException); the key is kept for EIC_KEY_TTL_S (60 seconds). The node side of
Instance Connect (sshd's AuthorizedKeysCommand reading the pushed keys from the instance
metadata) is `instance_connect_keys`, served by admin.py.

EC2 Instance Connect Endpoints (`aws.node_access: instance-connect`; moto has none):
CreateInstanceConnectEndpoint (the subnet must exist; create-complete at once),
DescribeInstanceConnectEndpoints (by id; an unknown id is
InvalidInstanceConnectEndpointId.NotFound) and DeleteInstanceConnectEndpoint.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from poolctl.sandbox.extensions.common import LOCK, now, stored

NAMES = ("ec2-instance-connect.send-ssh-public-key", "ec2.instance-connect-endpoints")

EIC_KEY_TTL_S = 60.0
_EIC_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521")
# (instance id, OS user) -> [(public key line, expiry as time.time())]
_eic_keys: dict[tuple[str, str], list[tuple[str, float]]] = {}


def _eic_error(code: str, message: str) -> Exception:
    from moto.core.exceptions import JsonRESTError

    return JsonRESTError(code, message)


def _send_ssh_public_key(self: Any) -> str:
    from moto.ec2.models import ec2_backends

    body = json.loads(self.body or "{}")
    instance_id = str(body.get("InstanceId", ""))
    user = str(body.get("InstanceOSUser", ""))
    key = str(body.get("SSHPublicKey", "")).strip()
    if key.split(" ", 1)[0] not in _EIC_KEY_TYPES or len(key.split()) < 2:
        raise _eic_error("InvalidArgsException", "The SSH public key is not a supported "
                         "OpenSSH public key (ssh-ed25519, ssh-rsa, ecdsa-sha2-*)")
    ec2 = ec2_backends[self.current_account][self.region]
    try:
        instance = ec2.get_instance(instance_id)
    except Exception:
        raise _eic_error("EC2InstanceNotFoundException",
                         f"Instance {instance_id} not found in {self.region}") from None
    if instance.state != "running":
        raise _eic_error("EC2InstanceStateInvalidException",
                         f"Instance {instance_id} is {instance.state}, not running")
    moment = time.time()
    with LOCK:
        kept = [(k, t) for k, t in _eic_keys.get((instance_id, user), []) if t > moment]
        _eic_keys[(instance_id, user)] = [*kept, (key, moment + EIC_KEY_TTL_S)]
    return json.dumps({"RequestId": str(uuid.uuid4()), "Success": True})


def _eic_endpoints(backend: Any) -> dict[str, dict[str, Any]]:
    return stored(backend, "_poolctl_eic_endpoints", dict)


def _eic_endpoint_missing(endpoint_id: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError("InvalidInstanceConnectEndpointId.NotFound",
                          f"The instance connect endpoint ID '{endpoint_id}' does not exist")


def _create_instance_connect_endpoint(self: Any) -> Any:
    from moto.core.responses import ActionResult
    from moto.ec2.utils import add_tag_specification

    subnet = self.ec2_backend.get_subnet(self._get_param("SubnetId"))
    endpoint_id = f"eice-{uuid.uuid4().hex[:17]}"
    region, account = self.region, self.current_account
    endpoint = {
        "OwnerId": account, "InstanceConnectEndpointId": endpoint_id,
        "InstanceConnectEndpointArn":
            f"arn:aws:ec2:{region}:{account}:instance-connect-endpoint/{endpoint_id}",
        "State": "create-complete", "StateMessage": "",
        "DnsName": f"{endpoint_id}.{account}.ec2-instance-connect-endpoint.{region}"
                   ".amazonaws.com",
        "NetworkInterfaceIds": [], "VpcId": subnet.vpc_id,
        "AvailabilityZone": subnet.availability_zone, "CreatedAt": now(),
        "SubnetId": subnet.id,
        "PreserveClientIp": self._get_bool_param("PreserveClientIp", if_none=False),
        "SecurityGroupIds": self._get_param("SecurityGroupIds", []),
        "IpAddressType": "ipv4",
        "Tags": [{"Key": k, "Value": v} for k, v in add_tag_specification(
            self._get_param("TagSpecifications", [])).items()],
    }
    with LOCK:
        _eic_endpoints(self.ec2_backend)[endpoint_id] = endpoint
    return ActionResult({"InstanceConnectEndpoint": endpoint})


def _describe_instance_connect_endpoints(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ids = self._get_param("InstanceConnectEndpointIds", [])
    with LOCK:
        known = _eic_endpoints(self.ec2_backend)
        for endpoint_id in ids:
            if endpoint_id not in known:
                raise _eic_endpoint_missing(endpoint_id)
        found = [e for i, e in known.items() if not ids or i in ids]
    return ActionResult({"InstanceConnectEndpoints": found})


def _delete_instance_connect_endpoint(self: Any) -> Any:
    from moto.core.responses import ActionResult

    endpoint_id = self._get_param("InstanceConnectEndpointId")
    with LOCK:
        endpoint = _eic_endpoints(self.ec2_backend).pop(endpoint_id, None)
    if endpoint is None:
        raise _eic_endpoint_missing(endpoint_id)
    return ActionResult({"InstanceConnectEndpoint": {**endpoint, "State": "delete-complete"}})


def instance_connect_keys(instance_id: str, user: str) -> list[str]:
    """The keys pushed for `user` on the instance and still valid, as the node's sshd reads
    them from the instance metadata."""
    moment = time.time()
    with LOCK:
        return [k for k, t in _eic_keys.get((instance_id, user), []) if t > moment]


def install() -> None:
    from moto.ec2.responses import EC2Response
    from moto.ec2instanceconnect.responses import Ec2InstanceConnectResponse

    Ec2InstanceConnectResponse.send_ssh_public_key = _send_ssh_public_key  # type: ignore[method-assign]  # moto extension: keys kept
    for name, fn in {
        "create_instance_connect_endpoint": _create_instance_connect_endpoint,
        "describe_instance_connect_endpoints": _describe_instance_connect_endpoints,
        "delete_instance_connect_endpoint": _delete_instance_connect_endpoint,
    }.items():
        setattr(EC2Response, name, fn)


def reset() -> None:
    """Forget every pushed key."""
    _eic_keys.clear()
