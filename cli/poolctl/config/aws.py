"""The `aws:` placement of a pool (network, capacity, placement) and the S3 backend.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, ClassVar, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from poolctl import formats
from poolctl.config.shapes import (
    RESERVED_NODES_DOC,
    AcmCertificateArn,
    AmiId,
    AwsInstanceType,
    AwsRegion,
    AzId,
    BackendAwsRegion,
    BackendDynamoDbTable,
    BackendKeyPrefix,
    BackendS3Bucket,
    Bool,
    CapacityReservationId,
    CoreModel,
    Int,
    Ipv4Cidr,
    KeyPrefix,
    Num,
    ReservationGroupArn,
    ReservedNodes,
    S3Bucket,
    S3Uri,
    SnsTopicArn,
    SsmName,
    SubnetId,
    VpcCidr,
    VpcId,
    compile_cache_prefix,
    each_once,
    invalid,
)


class AwsNetwork(CoreModel):
    vpc_id: VpcId | None = Field(
        default=None, description="Existing VPC (with subnet_ids); omit to create one."
    )
    subnet_ids: list[SubnetId] = Field(
        default_factory=list, max_length=64,
        description="Existing private subnets of vpc_id, in 2 or more zones (the load balancer "
        "spans them); only with vpc_id.",
    )
    vpc_cidr: VpcCidr = Field(
        default="10.40.0.0/16",
        description="IPv4 CIDR (/16 to /24) of the VPC poolctl creates when vpc_id is unset.",
    )
    availability_zones: Int = Field(
        default=2, ge=2, le=6, description="Zones the created VPC spans (one private subnet each)."
    )
    availability_zone_ids: list[AzId] = Field(
        default_factory=list,
        description="Zone IDs (e.g. use1-az4) of the created VPC's subnets, one each; they name "
        "the same zones in every account. Omit for the region's first `availability_zones` "
        "zone names (a, b, ...).",
    )
    client_cidrs: list[Ipv4Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8"],
        description="Who may reach the (internal) load balancer (IPv4 CIDRs).",
    )

    # What shapes the VPC poolctl creates: meaningless with an existing one.
    _CREATED_VPC_ONLY: ClassVar[tuple[str, ...]] = (
        "vpc_cidr", "availability_zones", "availability_zone_ids")

    @model_validator(mode="after")
    def _existing_vpc(self) -> AwsNetwork:
        """The stack uses subnet_ids only with vpc_id (and needs them then): neither may be
        ignored silently."""
        subnets = self.subnet_ids
        if subnets and self.vpc_id is None:
            raise invalid("AwsNetwork", ("subnet_ids",),
                          "given without aws.network.vpc_id, so they would be ignored and a new "
                          "VPC created; add vpc_id (the subnets' VPC) or remove subnet_ids",
                          subnets)
        if self.vpc_id is None:
            return self
        if len(set(subnets)) < 2:
            raise invalid("AwsNetwork", ("subnet_ids",),
                          f"aws.network.vpc_id {self.vpc_id} needs subnet_ids: 2 or more "
                          "different private subnets of it, in different zones (the load "
                          "balancer spans them)", subnets)
        if len(set(subnets)) < len(subnets):
            raise invalid("AwsNetwork", ("subnet_ids",), "names a subnet twice; list each once",
                          subnets)
        for key in self._CREATED_VPC_ONLY:
            if key in self.model_fields_set:
                raise invalid("AwsNetwork", (key,),
                              "shapes the VPC poolctl creates, but aws.network.vpc_id names an "
                              "existing one; remove it (or remove vpc_id and subnet_ids)",
                              getattr(self, key))
        return self

    @model_validator(mode="after")
    def _zone_ids(self) -> AwsNetwork:
        ids = self.availability_zone_ids
        if ids and (len(ids) < 2 or len(set(ids)) < len(ids)):
            raise invalid("AwsNetwork", ("availability_zone_ids",),
                          "list at least 2 different zone IDs (the load balancer needs 2)", ids)
        if ids and "availability_zones" in self.model_fields_set and (
                self.availability_zones != len(ids)):
            raise invalid("AwsNetwork", ("availability_zones",),
                          "give availability_zone_ids or availability_zones, not both "
                          "(the IDs set the zone count)", self.availability_zones)
        return self


def _reservations_form(v: object) -> str | None:
    """Which form of aws.capacity.reservations `v` is written in (None: neither)."""
    if isinstance(v, str):
        return "ReservationGroup"
    return "ReservationIds" if isinstance(v, list | tuple) else None


class AwsCapacity(CoreModel):
    reservations: Annotated[
        Annotated[list[CapacityReservationId], Tag("ReservationIds")]
        | Annotated[ReservationGroupArn, Tag("ReservationGroup")],
        # One error for a value of neither form, not one per form.
        Discriminator(_reservations_form, custom_error_type="reservations_form",
                      custom_error_message="must be a list of reservation ids (cr-...) or one "
                      "resource group ARN"),
    ] = Field(
        default_factory=list,
        description="On-Demand Capacity Reservations the pool launches into: their ids "
        "(cr-...), or the ARN of one resource group of them; omit for none.",
    )
    preference: Literal["reservations-first", "reservations-only", "none"] | None = Field(
        default=None,
        description="`reservations-first` (the default when reservations are named): the "
        "reservations, then On-Demand; `reservations-only`: a launch beyond them fails; `none`: "
        "never a reservation, not even a matching open one (On-Demand only).",
    )
    reserved_nodes: ReservedNodes = Field(default=0, description=RESERVED_NODES_DOC)
    capacity_block: CapacityReservationId | None = Field(
        default=None,
        description="A Capacity Block for ML (its Capacity Reservation id, cr-...) every node "
        "launches into, with market type capacity-block: launches succeed only while the "
        "block is active and EC2 ends its instances 30 minutes before the block ends; "
        "`warm --reserve --yes` buys one and schedules the window inside it. Instead of "
        "reservations and preference.",
    )

    @property
    def reservation_ids(self) -> list[str]:
        return [] if isinstance(self.reservations, str) else list(self.reservations)

    @property
    def group_arn(self) -> str | None:
        return self.reservations if isinstance(self.reservations, str) else None

    @property
    def mode(self) -> Literal["reservations-first", "reservations-only", "none", "open"]:
        """What launches do: the preference, else reservations-first when any are named,
        else `open` (EC2's default: a matching open reservation is used if there is one)."""
        if self.preference is not None:
            return self.preference
        return "reservations-first" if self.reservations else "open"

    @model_validator(mode="after")
    def _consistent(self) -> AwsCapacity:
        if self.capacity_block is not None and (self.reservations or self.preference):
            # A launch template targets one reservation; a block admits only its own.
            raise invalid("AwsCapacity", ("capacity_block",),
                          "is the only reservation a Capacity Block pool launches into; "
                          "remove aws.capacity.reservations and preference, or the block",
                          self.capacity_block)
        if isinstance(self.reservations, list):
            each_once("AwsCapacity", self.reservations)
        if self.preference == "reservations-only" and not self.reservations:
            raise invalid("AwsCapacity", ("preference",),
                          "reservations-only needs aws.capacity.reservations (ids or a "
                          "resource group ARN); name them or choose reservations-first",
                          self.preference)
        if self.preference == "none" and self.reservations:
            raise invalid("AwsCapacity", ("preference",),
                          "none launches outside every reservation, so the named reservations "
                          "would be ignored; remove them or choose reservations-first",
                          self.preference)
        if self.preference == "none" and self.reserved_nodes:
            raise invalid("AwsCapacity", ("reserved_nodes",),
                          "preference none launches outside every reservation, so no node is "
                          "reserved; remove reserved_nodes or choose another preference",
                          self.reserved_nodes)
        return self


class AwsPlacement(CoreModel):
    region: AwsRegion = Field(description="AWS region.")
    instance_type: AwsInstanceType = Field(
        description="8-GPU NVLink instance type from the catalog."
    )
    weights_uri: S3Uri = Field(
        description="s3://bucket/prefix/ holding the weights and manifest.json (a plain prefix: "
        "no wildcards or quotes)."
    )
    weights_load: Literal["fetch", "stream", "auto"] = Field(
        default="fetch",
        description="How a node's engine gets the weights: `fetch` copies weights_uri to the "
        "NVMe cache, checks every file against manifest.json, then loads from NVMe; `stream` "
        "has vLLM read weights_uri straight into GPU memory (`--load-format runai_streamer`, "
        "the copy to HBM overlapping the download) with short-lived credentials of a role "
        "that may only read weights_uri, while the node copies them to NVMe behind it for its "
        "next start; `auto`: whichever the plan's start model says is faster for this type "
        "and layout. `stream` trusts the bucket: nothing is checked before the engine loads.",
    )
    compile_cache_uri: S3Uri | None = Field(
        default=None,
        description="s3://bucket/prefix/ where nodes share vLLM's torch.compile cache, one "
        "object per image, model, TP, GPU type and engine settings: the first node to build "
        "it saves it there, later nodes fetch it instead of compiling (the nodes may write "
        "this prefix only). Unset: each node compiles."
    )
    ami_id: AmiId | None = Field(
        default=None,
        description="Node image; omit for the Deep Learning AMI named by `ami_ssm_parameter`.",
    )
    ami_ssm_parameter: SsmName = Field(
        default="/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        description="SSM parameter resolved at deploy time when ami_id is unset.",
    )
    root_volume_gb: Int = Field(
        default=200, ge=50, le=16_384,
        description="Encrypted gp3 root volume in GiB (OS, drivers, images), at most 16 TiB.",
    )
    volume_initialization_rate_mib_s: Int | None = Field(
        default=None, ge=100, le=300,
        description="EBS provisioned rate for volume initialization (100-300 MiB/s) of the root "
        "volume: a pre-pulled image's layers arrive at this rate instead of lazily; billed.",
    )
    image_builder_type: AwsInstanceType | None = Field(
        default=None,
        description="Instance type of the `image build` builder (a cheap CPU type: the base "
        "image carries the GPU driver); default m6i.xlarge.",
    )
    network: AwsNetwork = Field(default_factory=AwsNetwork, description="Where the pool runs.")
    capacity: AwsCapacity = Field(
        default_factory=AwsCapacity,
        description="Capacity Reservations the nodes launch into, and whether launches may "
        "go beyond them.",
    )
    fallback_instance_types: list[AwsInstanceType] = Field(
        default_factory=list, max_length=10,
        description="Types the group launches, in this order, when instance_type has no "
        "capacity (each 8 GPUs over NVLink in the catalog, holding the model); the pool then "
        "has no warm pool: AWS refuses one beside the mixed instances policy this needs.",
    )
    certificate_arn: AcmCertificateArn | None = Field(
        default=None,
        description="ACM certificate (its whole ARN, in the placement's region) for an HTTPS "
        "listener (HTTP redirects to it); omit for plain HTTP inside the VPC.",
    )
    alarm_topic_arn: SnsTopicArn | None = Field(
        default=None,
        description="SNS topic (its whole ARN, in the placement's region) the pool's SLO "
        "alarms notify when they fire and when they clear; omit for alarms without "
        "notification (they still show in CloudWatch and `status`).",
    )
    access_logs_bucket: S3Bucket | None = Field(
        default=None,
        description="S3 bucket for the load balancer's access logs (yours: same region, SSE-S3, "
        "a policy admitting ELB log delivery); omit for none.",
    )
    access_logs_prefix: KeyPrefix | None = Field(
        default=None, description="Key prefix of the access logs in access_logs_bucket."
    )
    efa_interfaces: Int = Field(
        default=0, ge=0, le=32,
        description="EFA interfaces per node; must stay 0 for inference (rule).",
    )
    placement_group_strategy: Literal["none", "spread", "partition", "cluster"] = Field(
        default="none", description="Placement group; `cluster` is a training layout (rule)."
    )
    price_per_hour_usd: Num | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Override of the catalog's on-demand price per node.",
    )
    ssm_access: Bool = Field(
        default=False,
        description="Let operators open SSM Session Manager shells on the nodes (the role then "
        "gets the Session Manager permissions, nothing else of SSM).",
    )
    node_access: Literal["none", "instance-connect"] = Field(
        default="none",
        description="How `poolctl nodes check` reaches the nodes: `instance-connect` adds an EC2 "
        "Instance Connect Endpoint and SSH from it only (no public port, no key pair; a key is "
        "pushed per check); `none`: no SSH path is created.",
    )

    # What the cloud-neutral code asks of either placement, without `if aws ... else ...`.
    TYPE_KEY: ClassVar[str] = "instance_type"  # the key naming the node type, for messages
    STORE_SCHEME: ClassVar[str] = "s3"  # the object store weights_uri points into

    @property
    def type_name(self) -> str:
        return self.instance_type

    @property
    def fallback_types(self) -> list[str]:
        return list(self.fallback_instance_types)
    @model_validator(mode="after")
    def _alarm_topic_in_region(self) -> AwsPlacement:
        arn = self.alarm_topic_arn
        if arn is not None and (region := formats.sns_topic_arn(arn)) != self.region:
            # CloudWatch alarms notify topics of their own region only.
            raise invalid("AwsPlacement", ("alarm_topic_arn",),
                          f"is in {region}, the pool in {self.region}; an alarm notifies a "
                          f"topic of its own region: create one in {self.region}", arn)
        return self

    @model_validator(mode="after")
    def _certificate_in_region(self) -> AwsPlacement:
        arn = self.certificate_arn
        if arn is not None and (region := formats.acm_certificate_arn(arn)) != self.region:
            # A load balancer takes certificates of its own region only.
            raise invalid("AwsPlacement", ("certificate_arn",),
                          f"is in {region}, the pool in {self.region}; a load balancer takes "
                          f"a certificate of its own region: import or request one in "
                          f"{self.region}", arn)
        return self

    @model_validator(mode="after")
    def _block_one_type(self) -> AwsPlacement:
        if self.capacity.capacity_block is not None and self.fallback_instance_types:
            # A block holds instances of one type; a fallback type could never launch in it.
            raise invalid("AwsPlacement", ("fallback_instance_types",),
                          "a Capacity Block holds instance_type only; remove the fallback "
                          "types or aws.capacity.capacity_block", self.fallback_instance_types)
        return self

    @model_validator(mode="after")
    def _reservation_group_in_region(self) -> AwsPlacement:
        arn = self.capacity.group_arn
        if arn is not None and arn.split(":")[3] != self.region:
            # A launch targets reservation groups of its own region only.
            raise invalid("AwsPlacement", ("capacity", "reservations"),
                          f"is a resource group in {arn.split(':')[3]}, the pool in "
                          f"{self.region}; name a group of {self.region}'s reservations", arn)
        return self

    @cached_property
    def weights(self) -> formats.ObjectPrefix:
        return formats.parse_object_prefix(self.weights_uri, self.STORE_SCHEME)

    @model_validator(mode="after")
    def _compile_cache_apart(self) -> AwsPlacement:
        compile_cache_prefix("AwsPlacement", self.compile_cache_uri, self.weights_uri,
                             self.STORE_SCHEME)
        return self

    @cached_property
    def compile_cache(self) -> formats.ObjectPrefix | None:
        return compile_cache_prefix("AwsPlacement", self.compile_cache_uri, self.weights_uri,
                                    self.STORE_SCHEME)


class AwsBackend(CoreModel):
    """Terraform's S3 backend. Terraform evaluates nothing in a backend block: every value
    is the literal itself, of the shape S3 and DynamoDB name things."""

    bucket: BackendS3Bucket = Field(description="S3 bucket holding Terraform state.")
    region: BackendAwsRegion = Field(description="Region of the state bucket.")
    key_prefix: BackendKeyPrefix = Field(
        default="poolctl", description="Key prefix of state objects (no '/' at either end)."
    )
    dynamodb_table: BackendDynamoDbTable | None = Field(
        default=None, description="Lock table; omit to lock with S3 lock files (use_lockfile)."
    )
