"""The ways a command fails on purpose; the CLI maps them to exit codes and one line each."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, TextIO


class PoolctlError(Exception):
    exit_code = 1


class UsageError(PoolctlError):
    """Bad usage, a config that does not parse or match the schema, a missing prerequisite."""

    exit_code = 2


class OperationFailed(PoolctlError):
    """A rule or check failed, or a cloud / Terraform operation failed."""

    exit_code = 1


class NotConfirmed(OperationFailed):
    """The user answered no at a confirmation: nothing was applied."""


# Whether this run's AWS profile came from `--profile` (app.use_profile), for its one line.
profile_flag = [False]

# Exit code of an exception no command turned into a line: a bug (sysexits.h EX_SOFTWARE).
INTERNAL_ERROR = 70


def known_error(e: BaseException) -> tuple[str, int] | None:
    """(one line, exit code) for what the environment breaks that libraries raise in their
    own types, wherever it surfaces: botocore's settings (a profile, a config file, a region),
    google-auth's credentials, a home folder that cannot be found. Found by class name, so
    that no SDK is imported for this. None: not one of them (a bug: the caller's net)."""
    cls, module = type(e).__name__, type(e).__module__
    if module.startswith("botocore"):
        return _botocore_line(cls, getattr(e, "kwargs", None) or {}, str(e), os.environ)
    if module.startswith("google.auth") and cls == "DefaultCredentialsError":
        return (f"GCP credentials: {_first(e)}; run `gcloud auth application-default login` "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a key file", 2)
    if isinstance(e, RuntimeError) and str(e) == "Could not determine home directory.":
        return ("HOME: not set, and this user has no home folder in the password database; "
                "set HOME (or POOLCTL_HOME for poolctl's own files)", 2)
    return None


def shown(value: object, limit: int = 80) -> str:
    """A value from outside (the environment, a file, a flag) as a line may show it: cut to
    `limit` characters, quoted and escaped when it holds a line break, an ANSI escape or a
    direction override."""
    text = str(value)[:limit]
    return text if text.isprintable() else repr(text)


# What a terminal obeys rather than shows: C0 controls but the line feed and tab, DEL, C1
# controls, and the bidirectional overrides and isolates (a "Trojan Source" line reads
# differently from what it holds).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character a terminal would obey shown escaped (\\x1b,
    \\r, \\u202e); line feeds and tabs kept."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class EscapingStream:
    """stdout or stderr as every command writes to it: strings from outside (a benchmark's
    label, a folder name, a cloud's message, a log line) may hold escape sequences that set
    a window's title or clear the screen; here they are printed escaped, whatever code path
    printed them. `raw` is the stream itself, for poolctl's own live progress line."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def _first(e: BaseException | str) -> str:
    return shown((str(e).strip().splitlines() or [""])[0], 300)


def _botocore_line(cls: str, kw: dict[str, object], text: str, env: Mapping[str, str]
                   ) -> tuple[str, int] | None:
    if cls == "ProfileNotFound":
        var = "--profile" if profile_flag[0] else next(
            (v for v in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE") if env.get(v)), "the AWS profile")
        return (f"{var}={shown(kw.get('profile'))}: no such profile in the AWS config or "
                "credentials file (~/.aws/config, ~/.aws/credentials); fix the name, or "
                + ("drop --profile" if profile_flag[0] else "unset it"), 2)
    if cls == "ConfigParseError":
        return (f"{shown(kw.get('path'))}: not a valid AWS config file ({_first(text)}); fix "
                "it, or point AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE at another file", 2)
    if cls == "InvalidRegionError":
        region = str(kw.get("region_name"))[:80]
        return (f"AWS region {region!r} is not a region name; check --region, AWS_REGION, "
                "AWS_DEFAULT_REGION and the profile's region (e.g. us-east-1)", 2)
    if cls == "NoRegionError":
        return ("no AWS region; pass --region or set AWS_REGION (e.g. us-east-1)", 2)
    if cls == "NoCredentialsError":
        return ("no AWS credentials; set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY, or use --sandbox", 2)
    if cls == "PartialCredentialsError":
        return (f"AWS credentials from {shown(kw.get('provider'))}: {kw.get('cred_var')} is "
                "missing; set it, or use another profile", 2)
    if cls.startswith("Invalid") or cls.endswith(("ConfigError", "ParseError")):
        return (f"AWS settings: {_first(text)}; check the AWS_* variables and the AWS config "
                "file", 2)
    return None
