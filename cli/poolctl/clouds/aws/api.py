"""AWS plumbing: clients, paginated calls, and every botocore failure as one line.

Clients go where the `CloudEndpoints` they are made with say: AWS itself (the credentials
and region the AWS CLI would use), or one endpoint (the sandbox) with that endpoint's
credentials. Every client retries throttling and 5xx with adaptive backoff (10 attempts:
`poolctl.adaptors.aws`); every list call goes through its paginator. No policy: what poolctl
does with a pool is in the modules beside this one, whose classes build on `AwsApi`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from poolctl.adaptors import aws as sdk
from poolctl.adaptors.aws import botocore_exceptions, botocore_parsers
from poolctl.cloud import Cloud
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError

_DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
           "UnrecognizedClientException", "AuthFailure")
_THROTTLED = ("Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequestsException")
_EXPIRED = ("ExpiredToken", "ExpiredTokenException", "RequestExpired")


def error_code(e: Exception) -> str:
    """The error code of a botocore ClientError ("" for any other exception)."""
    code: str = (getattr(e, "response", None) or {}).get("Error", {}).get("Code", "")
    return code


# The images `stand_in_ami` picks from: moto's default images include Amazon's Deep Learning
# AMIs in every region.
STAND_IN_AMI_NAME = "Deep Learning AMI*"


def stand_in_ami(ec2: Any) -> str | None:
    """The AMI a local endpoint (the sandbox) offers in place of a node image, through its
    EC2 client: the first by id of Amazon's Deep Learning AMIs there, None if it has none.
    Asked by name: all of the sandbox's Amazon images (1,366 in us-east-1) took 2.7 s of CPU
    to list."""
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": [STAND_IN_AMI_NAME]}]
    ).get("Images", [])
    return min((str(i["ImageId"]) for i in images), default=None)


class AwsApi:
    """Clients at the endpoint given, and the calls' one-line failures."""

    def __init__(self, endpoints: CloudEndpoints = REAL_CLOUDS) -> None:
        endpoints.require(Cloud.aws)
        self.endpoints = endpoints
        self._clients: dict[tuple[str, str], Any] = {}
        self._session: Any = None  # a boto3 Session, made on first use

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            if self.endpoints.aws is not None:
                self._clients[key] = sdk.client(service,
                                                **self.endpoints.aws.client_kwargs(region))
            else:
                if self._session is None:
                    self._session = sdk.session()
                self._clients[key] = sdk.client(service, of_session=self._session,
                                                region_name=region)
        return self._clients[key]

    @contextlib.contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Turn botocore failures into one line naming the call and the fix."""
        exc = botocore_exceptions
        try:
            yield
        except exc.ClientError as e:
            err = e.response.get("Error", {})
            code, msg = err.get("Code", "Error"), err.get("Message", str(e))
            if code in _DENIED:
                fix = f"grant the caller permission for {what}, or use other credentials"
            elif code in _THROTTLED:
                fix = "still throttled after 10 attempts with backoff; try again in a minute"
            elif code in _EXPIRED:
                fix = "refresh the credentials (e.g. `aws sso login`)"
            else:
                fix = "see the message; nothing else was changed by this call"
            raise OperationFailed(f"aws {what}: {code}: {msg} ({fix})") from None
        except exc.EndpointConnectionError as e:
            fix = (self.endpoints.unreachable_fix
                   or "check the network, the region and any proxy settings")
            raise OperationFailed(f"aws {what}: cannot reach {e.kwargs.get('endpoint_url')} "
                                  f"({fix})") from None
        except exc.NoCredentialsError:
            raise UsageError(f"aws {what}: no AWS credentials; set AWS_PROFILE or "
                             "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or use --sandbox"
                             ) from None
        except exc.NoRegionError:
            raise UsageError(f"aws {what}: no region; set aws.region in the file") from None
        except exc.BotoCoreError as e:
            raise OperationFailed(f"aws {what}: {e}") from None
        except botocore_parsers.ResponseParserError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise OperationFailed(f"aws {what}: the endpoint answered something that is not "
                                  f"an AWS response ({first}); check the endpoint and retry"
                                  ) from None

    def pages(self, client: Any, op: str, what: str, **kw: Any) -> Iterator[dict[str, Any]]:
        with self.call(what):
            yield from client.get_paginator(op).paginate(**kw)
