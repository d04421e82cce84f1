"""vLLM's Run:ai Model Streamer load (`--load-format runai_streamer`, `--model s3://...`) as the
stand-in does it: vLLM v0.34.0's checks of `--model-loader-extra-config`
(vllm/model_executor/model_loader/runai_streamer_loader.py), then every object under the
prefix read from the object store with the container's own credentials (the standard
variables, else the shared credentials file its env-file names, read at each load), never
the node's (a container has no route to the metadata endpoint). The endpoint is the
sandbox's (RUNAI_STREAMER_S3_ENDPOINT, or AWS_ENDPOINT_URL, which vLLM copies into it), on
127.0.0.0/8 only. The time the read takes on a node is the plan's (POOLCTL_ENGINE_START_S);
the sandbox's few bytes arrive at once."""

from __future__ import annotations

import configparser
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from poolctl.adaptors.aws import botocore_exceptions, client
from poolctl.formats import is_loopback

LOAD_FORMAT = "runai_streamer"
SCHEMES = ("s3://", "gs://", "az://")  # vllm/transformers_utils/runai_utils.py
EXTRA_KEYS = frozenset({"distributed", "concurrency", "memory_limit"})


class StreamError(Exception):
    """What vLLM (or the streamer) would stop with; the message is theirs where they have one."""


@dataclass(frozen=True)
class Streamed:
    identity: str  # the credentials' principal (sts get-caller-identity's Arn)
    objects: int
    bytes: int


def check_extra_config(raw: str | None) -> dict[str, object]:
    """`--model-loader-extra-config` as RunaiModelStreamerLoader.__init__ validates it."""
    if raw is None:
        return {}
    try:
        extra = json.loads(raw)
    except ValueError:
        raise StreamError(f"argument --model-loader-extra-config: invalid loads value: "
                          f"{raw!r}") from None
    if not isinstance(extra, dict):
        raise StreamError(f"argument --model-loader-extra-config: invalid loads value: {raw!r}")
    if unexpected := set(extra) - EXTRA_KEYS:
        raise StreamError(f"Unexpected extra config keys for runai_streamer: {unexpected}")
    if "distributed" in extra and not isinstance(extra["distributed"], bool):
        raise StreamError(f"distributed must be a bool, got {extra['distributed']!r}")
    c = extra.get("concurrency", 1)
    if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
        raise StreamError(f"concurrency must be a positive integer, got {c!r}")
    m = extra.get("memory_limit", -1)
    if isinstance(m, bool) or not isinstance(m, int) or m < -1:
        raise StreamError(f"memory_limit must be an integer >= -1, got {m!r}")
    return extra


def _endpoint(env: Mapping[str, str]) -> str:
    url = env.get("RUNAI_STREAMER_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or ""
    if not is_loopback(urlsplit(url).hostname or ""):
        raise StreamError(f"the sandbox streams from its own endpoint on 127.0.0.0/8 only, "
                          f"not {url or 'AWS'!r} (RUNAI_STREAMER_S3_ENDPOINT or "
                          "AWS_ENDPOINT_URL)")
    return url


def credentials(env: Mapping[str, str]) -> tuple[str, str, str | None]:
    """(key id, secret, session token) as the streamer's boto3 session finds them, in its
    chain's order, at the load: the environment's variables, then the shared credentials file
    (AWS_SHARED_CREDENTIALS_FILE; the profile AWS_PROFILE, else `default`), read now, so a
    file renewed since the last load is the one used. Never the instance metadata endpoint:
    the container has no route to it."""
    key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key_id and secret:
        return key_id, secret, env.get("AWS_SESSION_TOKEN") or None
    # No ~/.aws/credentials: the image's home has none, and here `~` is the host's.
    named = env.get("AWS_SHARED_CREDENTIALS_FILE")
    path = Path(named) if named else None
    profile = env.get("AWS_PROFILE") or "default"
    ini = configparser.ConfigParser(interpolation=None)
    try:
        ini.read_string(path.read_text() if path else "")
    except (OSError, configparser.Error):
        ini.clear()
    section = ini[profile] if ini.has_section(profile) else {}
    key_id, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
    if not key_id or not secret:
        # the AWS SDK's own words when no provider in its chain has credentials
        raise StreamError("Unable to locate credentials: the container has none of its own "
                          "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a shared "
                          f"credentials file: {path or 'none named'} has no [{profile}] "
                          "keys) and no route to the instance metadata endpoint")
    return key_id, secret, section.get("aws_session_token") or None


def stream(model: str, env: Mapping[str, str]) -> Streamed:
    """Read every object under `model` (s3://bucket/prefix/) with `env`'s credentials."""
    if not model.startswith("s3://"):
        raise StreamError(f"{model}: the sandbox streams from S3 only (its object store)")
    url = _endpoint(env)
    key_id, secret, token = credentials(env)
    kw = {"endpoint_url": url, "aws_access_key_id": key_id, "aws_secret_access_key": secret,
          "aws_session_token": token, "region_name": env.get("AWS_REGION") or "us-east-1"}
    bucket, _, prefix = model[len("s3://"):].partition("/")
    errors = (botocore_exceptions.ClientError, botocore_exceptions.BotoCoreError)
    try:
        who = client("sts", **kw).get_caller_identity()["Arn"]
        s3 = client("s3", **kw)
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])]
        if not any(k.endswith(".safetensors") for k in keys):
            # vLLM's RunaiModelStreamerLoader._prepare_weights
            raise StreamError(f"Cannot find any safetensors model weights with `{model}`")
        size = 0
        for k in keys:
            body = s3.get_object(Bucket=bucket, Key=k)["Body"]
            while chunk := body.read(1 << 20):
                size += len(chunk)
    except errors as e:
        raise StreamError(f"{model}: {e}") from None
    return Streamed(identity=str(who), objects=len(keys), bytes=size)
