"""Where a command's cloud calls go, resolved once at the CLI edge and handed down as data.

The library never asks whether it runs against the sandbox. It takes `CloudEndpoints`:
`REAL_CLOUDS` (each SDK's own endpoints and credential chain) unless `--sandbox` chose the
local emulator, which `poolctl.sandbox.manager.endpoints()` resolves (endpoint, test
credentials, region, state folder) in `poolctl.commands.common.endpoints_of`. Outside
`poolctl sandbox ...`, that is the only place that imports the sandbox package. Every
difference an emulator makes is a field here, named for what it changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poolctl.cloud import Cloud
from poolctl.errors import UsageError

if TYPE_CHECKING:
    from poolctl.config import Config, Pool


# Keeps the AWS and Google SDKs, in poolctl and in what it starts (Terraform, Packer, the AWS
# CLI, the sandbox server), from probing the clouds' metadata addresses (169.254.169.254,
# metadata.google.internal) for credentials or a region: aimed at an emulator, nothing may
# leave the machine. Names as botocore, the Go SDKs and google-auth (which compares
# NO_GCE_CHECK with "true") read them; port 9 on loopback refuses at once.
NO_METADATA_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_ROOT": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


@dataclass(frozen=True)
class LocalAddress:
    """Where a sandbox's load balancer answers on this machine."""

    scheme: str  # http, or https when its listener has a certificate
    host: str  # 127.0.0.1
    port: int
    ca_file: str | None = None  # with https: the certificate a client trusts


@dataclass(frozen=True)
class AwsEndpoint:
    """One endpoint for every AWS service, with its own credentials (an emulator's)."""

    url: str
    region: str  # when neither the command nor the config names one
    credentials: Mapping[str, str] = field(default_factory=dict)  # boto3 keyword names

    def client_kwargs(self, region: str | None = None) -> dict[str, Any]:
        """boto3.client(service, **these)."""
        return {"endpoint_url": self.url, "region_name": region or self.region,
                **self.credentials}

    def env(self, region: str | None = None) -> dict[str, str]:
        """A child process's environment (Terraform, Packer, the AWS CLI) aimed here:
        AWS_ENDPOINT_URL as well, so that a service not configured one by one still comes
        here, never to AWS."""
        r = region or self.region
        names = {"aws_access_key_id": "AWS_ACCESS_KEY_ID",
                 "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
                 "aws_session_token": "AWS_SESSION_TOKEN"}
        return {"AWS_ENDPOINT_URL": self.url, "AWS_REGION": r, "AWS_DEFAULT_REGION": r,
                **NO_METADATA_ENV,
                **{names[k]: v for k, v in self.credentials.items() if k in names}}


@dataclass(frozen=True)
class CloudEndpoints:
    """The clouds a command reaches and how. The defaults are the real clouds."""

    # The flag that chose them, named in hints ("poolctl warm status --sandbox") and
    # refusals; "" for the real clouds.
    flag: str = ""
    clouds: frozenset[Cloud] = frozenset(Cloud)
    # None: boto3's own chain (environment, profile, instance role) and AWS's endpoints.
    aws: AwsEndpoint | None = None
    # What to say when its endpoint cannot be reached; None: check the network.
    unreachable_fix: str | None = None
    # Seconds between status polls when the command sets none; None: the command's default.
    poll_s: float | None = None
    # Node addresses it reports are not real: connect only to 127.0.0.0/8 (nodes check).
    loopback_only: bool = False
    # It has no SSM AMI parameters and runs no instance: deploys and image builds use its
    # first Amazon image, and Packer's provisioners do not run.
    stand_in_images: bool = False
    # Terraform works and keeps its state in this folder (a local backend beside the
    # emulator) instead of the synth folder with the stack's own backend.
    terraform_home: Path | None = None
    # Called before a deploy's apply may launch the pool's nodes (the sandbox learns how long
    # they take to boot, and boots them in that time).
    before_deploy: Callable[[Config, Pool], None] | None = None
    # Where a load balancer (by its DNS name) answers on this machine: the sandbox's HAProxy
    # on a loopback port; None: at its DNS name, or not serving.
    lb_address: Callable[[str], LocalAddress | None] | None = None
    # Image builds only: hold the build this long, or fail it, where provisioning would run
    # (tests interrupt and fail builds with these).
    # Pool seconds per wall second: a serving sandbox runs S times faster, so `status
    # --window 10` reads 10 minutes of the pool's time, 10 / S of the machine's.
    time_scale: float = 1.0
    image_build_hold_s: int = 0
    image_build_fails: bool = False
    # Compute Engine's base URL, for OS Login, Monitoring, Logging and Cloud Quotas too;
    # None: Google's. A plain-http one (a local fake) is called without credentials.
    gce_url: str | None = None

    def require(self, cloud: Cloud) -> None:
        """Refuse a cloud these endpoints do not reach (the sandbox emulates AWS only)."""
        if Cloud(cloud) not in self.clouds:
            reach = " / ".join(f"--cloud {c}" for c in sorted(self.clouds))
            raise UsageError(f"{self.flag}: the sandbox emulates {self.reaches()} only; "
                             f"use {reach}")

    def reaches(self) -> str:
        return " and ".join(c.upper() for c in sorted(self.clouds))

    def aws_region(self, region: str | None = None) -> str | None:
        """The region a command without a file works in: as given, the environment's, or
        the endpoint's own."""
        return (region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                or (self.aws.region if self.aws else None))


REAL_CLOUDS = CloudEndpoints()

# Points the GCP calls elsewhere than Google (tests' Compute Engine fake), as AWS_ENDPOINT_URL
# does boto3's; read at the edge only (`real_clouds`), checked by poolctl.envcheck.
GCE_ENDPOINT_ENV = "POOLCTL_GCE_ENDPOINT"


def real_clouds(environ: Mapping[str, str] = os.environ) -> CloudEndpoints:
    """The real clouds, with the GCP endpoint override the environment sets, if any."""
    url = environ.get(GCE_ENDPOINT_ENV)
    return replace(REAL_CLOUDS, gce_url=url) if url else REAL_CLOUDS
