"""boto3 and botocore, imported on first use (see `poolctl.adaptors`).

`client` and `session` are the only ways poolctl makes boto3 objects: every client retries
throttling and 5xx with adaptive backoff, 10 attempts.
"""

from __future__ import annotations

from typing import Any

from poolctl.adaptors.common import LazyModule

# boto3 is one of poolctl's own dependencies: missing, the installation is broken.
_MISSING = "boto3 is not installed; reinstall poolctl (pip install poolctl)"

boto3 = LazyModule("boto3", _MISSING)
botocore_config = LazyModule("botocore.config", _MISSING)
botocore_exceptions = LazyModule("botocore.exceptions", _MISSING)
botocore_parsers = LazyModule("botocore.parsers", _MISSING)

RETRIES = {"mode": "adaptive", "max_attempts": 10}


def retry_config() -> Any:
    return botocore_config.Config(retries=dict(RETRIES))


def session() -> Any:
    """A boto3 Session: credentials and region as the AWS CLI finds them."""
    return boto3.session.Session()


def client(service: str, *, of_session: Any = None, **kwargs: Any) -> Any:
    """A boto3 client of `service` (made by `of_session` when given, else by boto3's default
    session) retrying as above; `kwargs` as boto3 takes them (region_name, endpoint_url,
    keys)."""
    return (of_session or boto3).client(service, config=retry_config(), **kwargs)


def default_region() -> str | None:
    """The region the AWS CLI would use (AWS_REGION, the profile's), or None."""
    region: str | None = session().region_name
    return region
