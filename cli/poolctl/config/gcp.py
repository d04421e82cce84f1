"""The `gcp:` placement of a pool (capacity, placement) and the GCS backend.
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from poolctl import formats
from poolctl.config.shapes import (
    RESERVED_NODES_DOC,
    BackendGcsBucket,
    BackendKeyPrefix,
    Bool,
    CoreModel,
    GcpBaseImage,
    GcpCertificate,
    GcpImage,
    GcpMachineType,
    GcpNetwork,
    GcpNotificationChannel,
    GcpProject,
    GcpRegion,
    GcpReservationName,
    GcpSubnetwork,
    GcpZone,
    GsUri,
    Int,
    Ipv4Cidr,
    Num,
    ReservedNodes,
    compile_cache_prefix,
    each_once,
    invalid,
)


class GcpCapacity(CoreModel):
    reservations: list[GcpReservationName] | Literal["any", "none"] = Field(
        default="any",
        description="The instance template's reservation affinity: `any` (GCE's default: a "
        "matching reservation is used if there is one), `none` (never one), or the names of "
        "specific reservations in the pool's project (only they are used; a VM beyond them "
        "is not created).",
    )
    reserved_nodes: ReservedNodes = Field(default=0, description=RESERVED_NODES_DOC)

    @property
    def names(self) -> list[str]:
        return list(self.reservations) if isinstance(self.reservations, list) else []

    @model_validator(mode="after")
    def _consistent(self) -> GcpCapacity:
        if isinstance(self.reservations, list):
            if not self.reservations:
                raise invalid("GcpCapacity", ("reservations",),
                              "an empty list names no reservation; name them, or say any or "
                              "none", self.reservations)
            each_once("GcpCapacity", self.reservations)
        if self.reservations == "none" and self.reserved_nodes:
            raise invalid("GcpCapacity", ("reserved_nodes",),
                          "reservations none uses no reservation, so no node is reserved; "
                          "remove reserved_nodes or name the reservations", self.reserved_nodes)
        return self


class GcpPlacement(CoreModel):
    project: GcpProject = Field(description="GCP project id.")
    region: GcpRegion = Field(description="GCP region.")
    machine_type: GcpMachineType = Field(
        description="8-GPU NVLink machine type from the catalog."
    )
    fallback_machine_types: list[GcpMachineType] = Field(
        default_factory=list, max_length=10,
        description="Machine types the MIG creates VMs of, in this order, when machine_type "
        "has no capacity (the MIG's instance flexibility policy; each 8 GPUs over NVLink in "
        "the catalog, holding the model, with the primary's Local SSDs); the pool then keeps "
        "no standby pool.",
    )
    weights_uri: GsUri = Field(
        description="gs://bucket/prefix/ holding the weights and manifest.json (a plain prefix: "
        "no wildcards or quotes)."
    )
    weights_load: Literal["fetch"] = Field(
        default="fetch",
        description="How a node's engine gets the weights: `fetch` (copy to the Local SSD "
        "cache, checked against manifest.json). `stream` is AWS-only for now: on GCE the "
        "serving container has no route to the metadata server's token, and poolctl does not "
        "yet hand it a downscoped one (docs/weights.md).",
    )
    compile_cache_uri: GsUri | None = Field(
        default=None,
        description="gs://bucket/prefix/ where nodes share vLLM's torch.compile cache, one "
        "object per image, model, TP, GPU type and engine settings: the first node to build "
        "it saves it there, later nodes fetch it instead of compiling (the nodes may write "
        "this prefix only). Unset: each node compiles."
    )
    zones: list[GcpZone] = Field(
        default_factory=list, description="Zones of the regional MIG; omit for the catalog's."
    )
    image: GcpImage = Field(
        default="projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-nvidia-550",
        description="Boot image (with GPU drivers) of the nodes: NAME, family/FAMILY, "
        "PROJECT/NAME or projects/PROJECT/global/images/[family/]NAME.",
    )
    base_image: GcpBaseImage | None = Field(
        default=None,
        description="GPU base image `image build` starts from; default: `image` when it is a "
        "family, else the base its build record names.",
    )
    image_builder_type: GcpMachineType | None = Field(
        default=None,
        description="Machine type of the `image build` builder; default n2-standard-4.",
    )
    boot_disk_gb: Int = Field(
        default=200, ge=50, le=65_536, description="Boot disk size in GB (at most 64 TB)."
    )
    network: GcpNetwork = Field(
        default="default",
        description="VPC network: NAME, or projects/HOST/global/networks/NAME (Shared VPC).",
    )
    subnetwork: GcpSubnetwork | None = Field(
        default=None,
        description="Subnetwork: NAME or projects/P/regions/REGION/subnetworks/NAME (in the "
        "placement's region); omit for auto mode.",
    )
    client_cidrs: list[Ipv4Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the internal load balancer (IPv4 CIDRs).",
    )
    certificate: GcpCertificate | None = Field(
        default=None,
        description="Regional SSL certificate (name or self link) for an HTTPS load balancer "
        "on port 443; omit for plain HTTP on port 80 inside the VPC.",
    )
    alert_notification_channel: GcpNotificationChannel | None = Field(
        default=None,
        description="Cloud Monitoring notification channel (projects/PROJECT/"
        "notificationChannels/ID, in the placement's project) the pool's SLO alert policies "
        "notify when they open and close; omit for policies without notification (they "
        "still show in Cloud Monitoring).",
    )
    gpudirect: Bool = Field(
        default=False, description="GPUDirect-TCPX/RDMA NICs; must stay off for inference (rule)."
    )
    standby_suspended: Bool = Field(
        default=False, description="Suspend standby VMs; unsupported for GPU VMs (rule)."
    )
    capacity: GcpCapacity = Field(
        default_factory=GcpCapacity,
        description="Reservations the VMs consume (the instance template's reservation "
        "affinity).",
    )
    price_per_hour_usd: Num | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Override of the catalog's on-demand price per VM.",
    )
    node_access: Literal["none", "iap"] = Field(
        default="none",
        description="How `poolctl nodes check` reaches the nodes: `iap` lets SSH in from "
        "Identity-Aware Proxy's TCP forwarding range only (no public port; the check logs in "
        "with OS Login and a key imported per check); `none`: no SSH path is created.",
    )

    TYPE_KEY: ClassVar[str] = "machine_type"
    STORE_SCHEME: ClassVar[str] = "gs"

    @property
    def type_name(self) -> str:
        return self.machine_type

    @property
    def fallback_types(self) -> list[str]:
        return list(self.fallback_machine_types)
    @cached_property
    def weights(self) -> formats.ObjectPrefix:
        return formats.parse_object_prefix(self.weights_uri, self.STORE_SCHEME)

    @model_validator(mode="after")
    def _compile_cache_apart(self) -> GcpPlacement:
        compile_cache_prefix("GcpPlacement", self.compile_cache_uri, self.weights_uri,
                             self.STORE_SCHEME)
        return self

    @cached_property
    def compile_cache(self) -> formats.ObjectPrefix | None:
        return compile_cache_prefix("GcpPlacement", self.compile_cache_uri, self.weights_uri,
                                    self.STORE_SCHEME)

    @model_validator(mode="after")
    def _subnetwork_in_region(self) -> GcpPlacement:
        sub = self.subnetwork or ""
        if "/regions/" in sub and sub.split("/regions/")[1].split("/")[0] != self.region:
            raise invalid("GcpPlacement", ("subnetwork",),
                          f"names a subnetwork outside the placement's region {self.region}; "
                          f"give one in {self.region}", sub)
        return self

    @model_validator(mode="after")
    def _channel_in_project(self) -> GcpPlacement:
        ch = self.alert_notification_channel
        if ch is not None and ch.split("/")[1] != self.project:
            # An alert policy notifies the channels of its own project.
            raise invalid("GcpPlacement", ("alert_notification_channel",),
                          f"is in project {ch.split('/')[1]}, the pool in {self.project}; an "
                          f"alert policy notifies a channel of its own project: create one "
                          f"in {self.project}", ch)
        return self


class GcpBackend(CoreModel):
    """Terraform's GCS backend: literal values, as for AwsBackend."""

    bucket: BackendGcsBucket = Field(
        description="GCS bucket holding Terraform state (locks natively)."
    )
    prefix: BackendKeyPrefix = Field(
        default="poolctl", description="Object prefix of state (no '/' at either end)."
    )
