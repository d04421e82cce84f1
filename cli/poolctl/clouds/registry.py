"""Which code runs each cloud: one typed record per `Cloud` (dstack's `configurators.py` is
the model).

The cloud-neutral code (`poolctl.runtime`, the commands) reaches a cloud only through this
module and `base.py`'s interface, never by importing `clouds.aws` or `clouds.gcp`: what a
cloud can do beyond `CloudOps` is the capability classes its operations class inherits,
read here without making one. Importing this module loads no cloud SDK (`poolctl.adaptors`
load them on first use).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poolctl.cloud import Cloud
from poolctl.clouds.aws import ops as aws
from poolctl.clouds.base import CAPABILITIES, CloudOps
from poolctl.clouds.gcp import ops as gcp
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import UsageError

# (where the calls go, the contact email Cloud Quotas requests carry) -> the cloud's ops.
MakeOps = Callable[[CloudEndpoints, str | None], CloudOps]


@dataclass(frozen=True)
class CloudDriver:
    """One cloud as poolctl runs it."""

    cloud: Cloud
    ops_class: type[CloudOps]
    make_ops: MakeOps

    @property
    def capabilities(self) -> tuple[type, ...]:
        """The capabilities (poolctl.clouds.base) the cloud's operations class offers."""
        return tuple(c for c in CAPABILITIES if issubclass(self.ops_class, c))


DRIVERS: dict[Cloud, CloudDriver] = {
    # AWS Service Quotas takes no contact email.
    Cloud.aws: CloudDriver(Cloud.aws, aws.AwsOps,
                           lambda endpoints, _contact_email: aws.make_ops(endpoints)),
    Cloud.gcp: CloudDriver(Cloud.gcp, gcp.GcpOps, gcp.make_ops),
}


def driver(cloud: Cloud) -> CloudDriver:
    found = DRIVERS.get(cloud)
    if found is None:
        raise UsageError(f"--cloud {cloud}: unknown cloud; use aws or gcp")
    return found


def get_ops(cloud: Cloud, endpoints: CloudEndpoints = REAL_CLOUDS, *,
            contact_email: str | None = None) -> CloudOps:
    """The cloud's CloudOps, calling where `endpoints` say (each cloud's make_ops refuses
    endpoints that do not reach it). `contact_email`: Cloud Quotas (GCP) requires one on
    increase requests; AWS Service Quotas takes none."""
    return driver(cloud).make_ops(endpoints, contact_email)
