"""Shapes of the config's strings, strict scalars and bounds, and the base of every
config model: what the models of `poolctl.yaml` are written in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    ValidationError,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from poolctl import formats

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
# Strict scalars: YAML's `true` is not 1 and `4.0` is not a count; numbers are finite.
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]  # an integer is a number too; a boolean is not
Bool = Annotated[bool, Strict()]
# Bounds that keep every number the clouds and the sizing see finite and sane.
MAX_REPLICAS = 10_000
MAX_SECONDS = 86_400
ImageRef = Annotated[str, AfterValidator(formats.image_reference)]
# Free text that reaches boot scripts, tags, labels or logs: every character prints as itself.
Text = Annotated[str, AfterValidator(formats.plain_text)]
Ipv4Cidr = Annotated[str, AfterValidator(formats.ipv4_cidr)]
UrlPath = Annotated[str, AfterValidator(formats.url_path)]


@dataclass(frozen=True)
class Shape:
    """The shape of an identifier: `formats.matches(pattern, what)` checks it (one line
    saying how it is written), and the JSON Schema carries the pattern, for editors and for
    the configs the property tests draw from it."""

    pattern: str
    what: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            formats.matches(self.pattern, self.what), handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        out = handler(schema)
        # JSON Schema patterns search (anchors make them whole), and `\d` is 0-9 in both
        out["pattern"] = "^(?:" + self.pattern.replace("\\d", "[0-9]") + ")$"
        return dict(out)


# Identifiers of a fixed shape: Annotated[str, Shape(PATTERN, WHAT)], written out (not built
# by a function) so that type checkers read them as types.
_AWS_REGION = Shape(formats.AWS_REGION, "an AWS region like us-east-1")
AwsRegion = Annotated[str, _AWS_REGION]
# Instance and machine types as the clouds name them (p5.48xlarge, m6i.xlarge; a3-highgpu-8g,
# n2-standard-4); whether poolctl knows the type is the catalog's rule.
AwsInstanceType = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{0,30}\.[a-z0-9]{1,20}", "an EC2 instance type like p5.48xlarge")]
GcpMachineType = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{0,61}[a-z0-9]", "a machine type like a3-highgpu-8g")]
GcpRegion = Annotated[str, Shape(
    r"[a-z]+-[a-z]+\d{1,2}", "a GCP region like us-central1")]
GcpZone = Annotated[str, Shape(
    r"[a-z]+-[a-z]+\d{1,2}-[a-z]", "a GCP zone like us-central1-a")]
GcpProject = Annotated[str, Shape(
    r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a GCP project id (6-30 lowercase letters, digits, '-')")]
VpcId = Annotated[str, Shape(
    r"vpc-[0-9a-f]{1,17}", "a VPC id like vpc-0123456789abcdef0")]
SubnetId = Annotated[str, Shape(
    r"subnet-[0-9a-f]{1,17}", "a subnet id like subnet-0123456789abcdef0")]
AmiId = Annotated[str, Shape(
    r"ami-[0-9a-f]{8,17}", "an AMI id like ami-0123456789abcdef0")]
SsmName = Annotated[str, Shape(
    r"/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*",
    "an SSM parameter name like /aws/service/.../ami-id")]
ModelId = Annotated[str, Shape(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?",
    "a model id like org/name (letters, digits, '.', '_', '-')")]
_GCE_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_GCE_API = r"(https://(www|compute)\.googleapis\.com/compute/v1/)?"
# Image projects: project ids, and the older domain-scoped ones (example.com:project).
_GCE_PROJECT = r"([a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"
# What an instance template's source image takes: an image or a family (`family/F`), bare,
# under [projects/P/]global/images/ (URLs too), or as P/NAME.
GcpImage = Annotated[str, Shape(
    rf"({_GCE_API}projects/{_GCE_PROJECT}/global/images/|global/images/)?(family/)?{_GCE_NAME}"
    rf"|{_GCE_PROJECT}/{_GCE_NAME}",
    "a Compute Engine image: NAME, family/FAMILY, or projects/PROJECT/global/images/NAME "
    "(or .../images/family/FAMILY)")]
# What `image build` starts from (poolctl.images.gcp_base): a family or an image, bare or
# under projects/P/global/images/.
GcpBaseImage = Annotated[str, Shape(
    rf"(projects/{_GCE_PROJECT}/global/images/)?(family/)?{_GCE_NAME}",
    "a Compute Engine image: family/FAMILY or NAME, optionally under "
    "projects/PROJECT/global/images/")]
GcpNetwork = Annotated[str, Shape(
    rf"{_GCE_NAME}|{_GCE_API}projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]"
    rf"/global/networks/{_GCE_NAME}",
    "a network: NAME or projects/PROJECT/global/networks/NAME")]
GcpSubnetwork = Annotated[str, Shape(
    rf"{_GCE_NAME}|{_GCE_API}projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]"
    rf"/regions/[a-z]+-[a-z]+\d{{1,2}}/subnetworks/{_GCE_NAME}",
    "a subnetwork: NAME or projects/PROJECT/regions/REGION/subnetworks/NAME")]
VpcCidr = Annotated[str, AfterValidator(lambda v: formats.ipv4_cidr(v, 16, 24))]
S3Uri = Annotated[str, AfterValidator(lambda v: formats.parse_object_prefix(v, "s3") and v)]
GsUri = Annotated[str, AfterValidator(lambda v: formats.parse_object_prefix(v, "gs") and v)]
AzId = Annotated[str, Shape(
    r"[a-z]{2,5}\d{1,2}-az\d{1,2}", "an availability zone ID like use1-az4")]
_S3_BUCKET = AfterValidator(lambda v: formats.parse_object_prefix(f"s3://{v}/", "s3") and v)
_GCS_BUCKET = AfterValidator(lambda v: formats.parse_object_prefix(f"gs://{v}/", "gs") and v)
S3Bucket = Annotated[str, _S3_BUCKET]
_KEY_PREFIX = Shape(
    r"[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*",
    "a key prefix like pools/chat (no '/' at either end)")
KeyPrefix = Annotated[str, _KEY_PREFIX]
AcmCertificateArn = Annotated[str, AfterValidator(
    lambda v: formats.acm_certificate_arn(v) and v)]
SnsTopicArn = Annotated[str, AfterValidator(lambda v: formats.sns_topic_arn(v) and v)]
# Backend settings: literal values (Terraform refuses expressions there, naming none of
# them), then each its shape.
_TF_LITERAL = AfterValidator(formats.terraform_literal)
BackendS3Bucket = Annotated[str, _TF_LITERAL, _S3_BUCKET]
BackendGcsBucket = Annotated[str, _TF_LITERAL, _GCS_BUCKET]
BackendAwsRegion = Annotated[str, _TF_LITERAL, _AWS_REGION]
BackendKeyPrefix = Annotated[str, _TF_LITERAL, _KEY_PREFIX]
BackendDynamoDbTable = Annotated[str, _TF_LITERAL, Shape(
    r"[A-Za-z0-9_.-]{3,255}", "a DynamoDB table name (3-255 letters, digits, '_', '-', '.')")]
# On-Demand Capacity Reservations (EC2 API reference, CapacityReservation: cr- and 17 hex
# digits) and the resource groups of them a launch may target.
CapacityReservationId = Annotated[str, Shape(
    r"cr-[0-9a-f]{17}", "an On-Demand Capacity Reservation id like cr-0123456789abcdef0")]
ReservationGroupArn = Annotated[str, Shape(
    rf"arn:{formats.AWS_PARTITION}:resource-groups:{formats.AWS_REGION}:\d{{12}}"
    r":group/[A-Za-z0-9_.-]{1,128}",
    "a resource group ARN like arn:aws:resource-groups:us-east-1:123456789012:group/NAME")]
# A GCE reservation's name (Compute API reference, reservations: RFC 1035, 1-63 characters).
GcpReservationName = Annotated[str, Shape(
    r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", "a reservation name like p5-reserved (RFC 1035)")]
GcpCertificate = Annotated[str, Shape(
    r"((https://www\.googleapis\.com/compute/v1/)?projects/[a-z][a-z0-9-]{4,28}[a-z0-9]"
    r"/regions/[a-z]+-[a-z]+\d{1,2}/sslCertificates/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?",
    "a regional SSL certificate: NAME or projects/P/regions/R/sslCertificates/NAME")]

# A Cloud Monitoring notification channel (Monitoring API reference, notificationChannels:
# projects/PROJECT/notificationChannels/ID, the id numeric).
GcpNotificationChannel = Annotated[str, Shape(
    r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/notificationChannels/\d{1,30}",
    "a notification channel like projects/my-project/notificationChannels/1234567890")]


# A key path in the file: keys and list indexes, as pydantic's error locations.
Loc = tuple[int | str, ...]


def invalid(title: str, loc: Loc, message: str, value: object) -> ValidationError:
    """A validation error at `loc` (relative to the model raising it), so a check that needs
    several fields still names the one key to fix."""
    err = PydanticCustomError("invalid", "{message}", {"message": message})
    return ValidationError.from_exception_data(
        title, [InitErrorDetails(type=err, loc=loc, input=value)]
    )
Dtype = Literal["float32", "bfloat16", "float16", "fp8", "int8", "int4", "mxfp4", "nvfp4"]
# Bytes per element: weights use the model dtype, the KV cache its own (see kv_cache_dtype).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "mxfp4": 4.25 / 8,  # 4-bit values plus one 8-bit scale per 32 (OCP microscaling)
    "nvfp4": 4.5 / 8,  # 4-bit values plus one FP8 (E4M3) scale per 16 (NVIDIA's NVFP4)
}
# Weight dtypes whose matrix products run on FP4 tensor cores where the GPU has them.
FP4_DTYPES = ("mxfp4", "nvfp4")


class CoreModel(BaseModel):
    """Base of every config model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


ReservedNodes = Annotated[Int, Field(ge=0, le=10_000)]
RESERVED_NODES_DOC = ("Nodes the reservations hold, for `plan`, `simulate` and `status`, which "
                      "ask no cloud: capacity held, and the fixed cost (a reservation is paid "
                      "whether used or not); `capacity check` reads the cloud's count.")


def each_once(title: str, names: list[str]) -> None:
    if len(set(names)) < len(names):
        raise invalid(title, ("reservations",), "names a reservation twice; list each once",
                      names)


def compile_cache_prefix(title: str, cc: str | None, weights_uri: str, scheme: str
                         ) -> formats.ObjectPrefix | None:
    """A placement's `compile_cache_uri`, parsed; refused where it overlaps `weights_uri`:
    the nodes write the compile cache and only read the weights."""
    if cc is None:
        return None
    if cc.startswith(weights_uri) or weights_uri.startswith(cc):
        raise invalid(title, ("compile_cache_uri",),
                      f"{cc} overlaps weights_uri {weights_uri}: nodes write the compile cache "
                      "and only read the weights; give it a prefix of its own (e.g. beside "
                      "the weights' folder)", cc)
    return formats.parse_object_prefix(cc, scheme)
