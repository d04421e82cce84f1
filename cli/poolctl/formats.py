"""The shapes of strings poolctl takes from outside (the config file, flags), checked once.

Each function returns the value (or its parsed parts) or raises ValueError with a message
that says what is wrong and how to write it; the config model turns that into one line
naming the key. Values that pass are plain data: no wildcards, quotes, `${`/`%{`, `..` or
control characters reach an IAM policy, a CEL condition, Terraform or a shell.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

# --------------------------------------------------------------------------- object stores

# Bucket naming rules: S3 (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules)
# and Cloud Storage (cloud.google.com/storage/docs/buckets#naming).
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IPV4ISH = re.compile(r"^\d+\.\d+\.\d+\.\d+$", re.ASCII)
# A plain prefix: folder-like segments of safe characters. No wildcards (`*`, `?` widen IAM
# resources), quotes or backslashes (CEL literals), `$`/`%`/`{` (IAM policy variables,
# Terraform templates), whitespace or control characters.
_SEGMENT = re.compile(r"^[A-Za-z0-9._=+@,-]+$")


@dataclass(frozen=True)
class ObjectPrefix:
    """`s3://bucket/a/b/` as parts; `prefix` is "" (whole bucket) or ends with one `/` so
    that `llama` never matches `llama-old/`."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


def _bucket_problem(bucket: str, scheme: str) -> str | None:
    if scheme == "s3":
        if not _S3_BUCKET.fullmatch(bucket):
            return ("an S3 bucket name is 3-63 lowercase letters, digits, '.' and '-', "
                    "starting and ending with a letter or digit")
        if bucket.startswith(_S3_RESERVED_PREFIXES) or bucket.endswith(_S3_RESERVED_SUFFIXES):
            return "S3 reserves that bucket name prefix/suffix"
    else:
        parts_ok = all(0 < len(p) <= 63 for p in bucket.split("."))
        if not _GCS_BUCKET.fullmatch(bucket) or not parts_ok:
            return ("a Cloud Storage bucket name is 3-63 lowercase letters, digits, '-', '_' "
                    "and '.' (dotted names up to 222, 63 per part), starting and ending with a "
                    "letter or digit")
        if bucket.startswith("goog") or "google" in bucket:
            return "Cloud Storage refuses bucket names starting with 'goog' or holding 'google'"
    if ".." in bucket or _IPV4ISH.fullmatch(bucket):
        return "a bucket name has no '..' and is not an IP address"
    return None


def parse_object_prefix(uri: str, scheme: str) -> ObjectPrefix:
    """Parse `s3://bucket/prefix/` (scheme "s3") or `gs://...` ("gs") by each cloud's rules."""
    head = f"{scheme}://"
    if not uri.startswith(head):
        raise ValueError(f"must start with {head} (the weights' bucket and folder)")
    bucket, _, prefix = uri[len(head):].partition("/")
    if problem := _bucket_problem(bucket, scheme):
        raise ValueError(f"bucket {bucket!r}: {problem}")
    segments = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    for seg in segments:
        if seg in ("", ".", ".."):
            raise ValueError("the folder has an empty, '.' or '..' part; write a plain "
                             "path like models/llama/")
        if not _SEGMENT.fullmatch(seg):
            raise ValueError(f"folder part {seg!r} may hold only letters, digits and "
                             "'._=+@,-' (no wildcards, quotes, '$', '%' or spaces)")
    if len(prefix) > 900:
        raise ValueError("the folder is longer than 900 characters")
    return ObjectPrefix(scheme, bucket, "/".join(segments) + "/" if segments else "")


# ------------------------------------------------------------------------- container images

# The reference grammar of the distribution project (distribution/reference/regexp.go),
# which Docker, containerd and every OCI registry client follow.
_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@{_DIGEST})?$", re.ASCII)
NAME_TOTAL_LENGTH_MAX = 255


def image_reference(ref: str) -> str:
    """`ref` if it is a valid image reference ([registry/]path[:tag][@digest]), else
    ValueError. `rollout start --image` calls it too."""
    m = _REFERENCE.fullmatch(ref)
    if not m:
        raise ValueError("not an image reference; write [registry/]name[:tag][@sha256:digest] "
                         "in lowercase, e.g. vllm/vllm-openai:v0.34.0")
    if len(m["name"]) > NAME_TOTAL_LENGTH_MAX:
        raise ValueError(f"the image name is over {NAME_TOTAL_LENGTH_MAX} characters")
    return ref


def image_name_tag(ref: str) -> tuple[str, str | None] | None:
    """(name, tag or None) of an image reference, by the same grammar; None if it is not one."""
    m = _REFERENCE.fullmatch(ref)
    return (m["name"], m["tag"]) if m else None


# ---------------------------------------------------------------------------- small shapes


def ipv4_cidr(text: str, min_prefix: int = 0, max_prefix: int = 32) -> str:
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ipaddress.AddressValueError:
        raise ValueError("not an IPv4 CIDR; write e.g. 10.0.0.0/8") from None
    except ValueError as e:
        raise ValueError(f"not a usable IPv4 CIDR ({e}); write the network address, e.g. "
                         "10.40.0.0/16") from None
    if "/" not in text:
        raise ValueError(f"give the prefix length too, e.g. {text}/32")
    if not min_prefix <= net.prefixlen <= max_prefix:
        raise ValueError(f"the prefix length must be /{min_prefix} to /{max_prefix}")
    return str(net)


# Readiness paths: ALB and GCE health checks take a path of at most 1024 characters.
_URL_PATH = re.compile(r"^/[A-Za-z0-9._~&()*+,;=:@/-]{0,1023}$")


def url_path(text: str) -> str:
    if not text.startswith("/"):
        raise ValueError("must start with '/', e.g. /health")
    if not _URL_PATH.fullmatch(text):
        raise ValueError("may hold only letters, digits and -._~&()*+,;=:@/ (no spaces, "
                         "quotes, '$', '%', '?' or control characters), at most 1024 characters")
    return text


def matches(pattern: str, what: str) -> Callable[[str], str]:
    """A validator for a plain identifier: `what` says how it is written."""
    rx = re.compile(pattern, re.ASCII)  # \d is 0-9 only, not every script's digits

    def check(text: str) -> str:
        if not rx.fullmatch(text):
            raise ValueError(f"not {what}")
        return text

    return check


# ---------------------------------------------------------------------------- free text


def hidden_character(text: str) -> str | None:
    """The first character of `text` a reader cannot see as written (Python's
    str.isprintable): control characters (a NUL is dropped by bash, an escape sequence
    repaints a terminal), format characters (U+202E and the other bidi controls reorder what
    a reviewer reads, zero-width ones hide), separators other than the space, private-use
    and unassigned code points."""
    if text.isprintable():
        return None
    return next(ch for ch in text if not ch.isprintable())


def plain_text(text: str) -> str:
    """`text` if every character prints as itself (see hidden_character), else ValueError."""
    if (ch := hidden_character(text)) is not None:
        name = unicodedata.name(ch, "a control or unassigned character")
        raise ValueError(f"holds U+{ord(ch):04X} ({name}), which does not print as itself; "
                         "remove it (the value reaches boot scripts, tags and logs)")
    return text


# Terraform evaluates nothing in a backend block: `terraform init` refuses `${...}`, `%{...}`
# and function calls there, so the file must hold the values themselves.
_TF_EXPRESSION = re.compile(r"\$\{|%\{|\b[a-z][a-z0-9_]*\(", re.ASCII)


def terraform_literal(text: str) -> str:
    if _TF_EXPRESSION.search(text):
        raise ValueError("Terraform takes no expressions in a backend block (`${...}`, "
                         "`%{...}`, functions like file()) and refuses them at init; write the "
                         "value itself")
    return text


# ---------------------------------------------------------------------------- AWS shapes

# Region names of every AWS partition (botocore's partitions.json: aws, aws-cn, aws-us-gov,
# the ISO partitions and the European Sovereign Cloud), as AREA[-SUB]-DIRECTION-N.
AWS_REGION = (r"(?:us|eu|ap|sa|ca|me|af|il|mx|cn|eusc)(?:-gov|-iso[bef]?|-de)?"
              r"-(?:east|west|north|south|central|northeast|northwest|southeast|southwest)"
              r"-\d{1,2}")
AWS_PARTITION = r"aws(?:-cn|-us-gov|-iso(?:-[bef])?|-eusc)?"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_ACM_ARN = re.compile(
    rf"arn:{AWS_PARTITION}:acm:(?P<region>{AWS_REGION}):\d{{12}}:certificate/{_UUID}", re.ASCII)


def _arn_region(pattern: re.Pattern[str], text: str, what: str, example: str) -> str:
    m = pattern.fullmatch(text)
    if not m:
        raise ValueError(f"not an {what} ARN; give the whole ARN, e.g. {example}")
    return m["region"]


def acm_certificate_arn(text: str) -> str:
    """The region of an ACM certificate ARN, else ValueError."""
    return _arn_region(_ACM_ARN, text, "ACM certificate", "arn:aws:acm:us-east-1:"
                       "123456789012:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789")


_SNS_ARN = re.compile(
    rf"arn:{AWS_PARTITION}:sns:(?P<region>{AWS_REGION}):\d{{12}}:[A-Za-z0-9_-]{{1,256}}"
    r"(?:\.fifo)?", re.ASCII)


def sns_topic_arn(text: str) -> str:
    """The region of an SNS topic ARN, else ValueError."""
    return _arn_region(_SNS_ARN, text, "SNS topic",
                       "arn:aws:sns:us-east-1:123456789012:pool-alarms")


# ------------------------------------------------------------------------------- secrets

_SM_ARN = re.compile(
    r"^arn:aws(?:-cn|-us-gov)?:secretsmanager:(?P<region>[a-z]{2}(?:-[a-z]+)+-\d):"
    r"\d{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}$", re.ASCII
)
_GSM_NAME = re.compile(
    r"^(?:projects/(?P<project>[a-z][a-z0-9-]{4,28}[a-z0-9]|\d{1,19})/secrets/)?"
    r"(?P<name>[A-Za-z0-9_-]{1,255})$", re.ASCII
)


def aws_secret_arn(text: str) -> str:
    """The region of a complete Secrets Manager ARN, else ValueError."""
    m = _SM_ARN.fullmatch(text)
    if not m:
        raise ValueError("not a Secrets Manager secret ARN; give the complete ARN, e.g. "
                         "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf")
    return m["region"]


def gcp_secret_name(text: str, project: str) -> str:
    """projects/P/secrets/NAME for NAME or projects/P/secrets/NAME, else ValueError."""
    m = _GSM_NAME.fullmatch(text)
    if not m:
        raise ValueError("not a Secret Manager secret; give NAME or projects/PROJECT/secrets/NAME"
                         " (letters, digits, '-' and '_')")
    return f"projects/{m['project'] or project}/secrets/{m['name']}"


def is_loopback(host: str) -> bool:
    """An address of this machine by its literal form (names other than localhost are not
    resolved: what they resolve to may change)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
