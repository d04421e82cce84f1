"""POOLCTL_* environment values (and the AWS region and TMPDIR poolctl's tools rely on),
checked before any command acts.

Each variable is read where it is used, often deep inside an operation (after a synth, a
Terraform init or a cloud call); a bad value found there leaves work half done. The CLI
calls `check_environment()` first, so a bad value stops the command before anything
changes, with one line naming the variable. Kept free of heavy imports: it runs on every
command.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from poolctl.errors import UsageError, shown
from poolctl.home import cannot_create


def _seconds(raw: str) -> str | None:
    try:
        value = float(raw)
    except ValueError:
        return "not a number of seconds; unset it or give e.g. 15"
    return None if math.isfinite(value) and value >= 0 else "give a finite number >= 0"


def _speedup(raw: str) -> str | None:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    return None if math.isfinite(value) and value >= 0 else \
        "not a speedup; give a number >= 0, e.g. 100 (0: nodes boot when told)"


def _port(raw: str) -> str | None:
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or not 0 <= int(raw) <= 65535:
        return "not a port; give a number from 1 to 65535 (0 picks a free one)"
    return None


def _program(raw: str) -> str | None:
    return None if shutil.which(raw) else ("not found; give a path to terraform or tofu, or "
                                           "unset it")


def _expanded(raw: str) -> Path | None:
    try:
        return Path(raw).expanduser()
    except RuntimeError:  # HOME unset and no password entry, or ~user of no user
        return None


def _folder(raw: str) -> str | None:
    p = _expanded(raw)
    return None if p is not None and p.is_dir() else \
        "not a directory; give the folder that holds registry.terraform.io/hashicorp/..."


def _home(raw: str) -> str | None:

    p = _expanded(raw)
    if p is None:
        return "its ~ names no home folder (HOME unset, or no such user); give a full path"
    try:
        exists, is_dir = p.exists(), p.is_dir()
    except OSError as e:  # a name too long, a loop of links
        return f"not a usable path ({e.strerror}); give a folder (created if missing)"
    if exists and not is_dir:
        return "names a file; give a folder (created if missing)"
    if is_dir:
        ok = os.access(p, os.W_OK | os.X_OK)
        return None if ok else "not writable by this user; give a folder you can write in"
    problem = cannot_create(p)
    return f"{problem}; give a folder you can write in (created if missing)" if problem \
        else None


def _tmpdir(raw: str) -> str | None:
    # Python falls back to /tmp by itself; Node (jsii, for synth), Terraform and Packer do not.
    if os.path.isdir(raw) and os.access(raw, os.W_OK | os.X_OK):
        return None
    return "not a folder you can write in; unset it, or create it (Node, Terraform and " \
           "Packer write temporary files there)"


# A region name as botocore accepts it (it becomes part of an endpoint's host name): what
# --region takes, for AWS and GCP alike.
REGION_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
# An AWS region's own shape (us-east-1, us-gov-west-1, cn-north-1, us-isob-east-1).
AWS_REGION_RE = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}", re.ASCII)


def _region(raw: str) -> str | None:
    return None if AWS_REGION_RE.fullmatch(raw) else \
        "not an AWS region name; give one like us-east-1, or unset it"


def _quotas(raw: str) -> str | None:
    try:
        values = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return 'not JSON; give an object like {"L-417A185B": 1536}'
    ok = isinstance(values, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in values.values())
    return None if ok else 'give an object of quota codes to numbers, e.g. {"L-417A185B": 1536}'


def _endpoint(raw: str) -> str | None:
    if re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?", raw):
        return None
    return "not an endpoint; give http(s)://HOST[:PORT]"


def _email(raw: str) -> str | None:
    return None if re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", raw) else "not an email address"


CHECKS: dict[str, Callable[[str], str | None]] = {
    "POOLCTL_POLL_S": _seconds,
    "POOLCTL_SANDBOX_PORT": _port,
    "POOLCTL_TERRAFORM": _program,
    "POOLCTL_PROVIDER_MIRROR": _folder,
    "POOLCTL_HOME": _home,
    "POOLCTL_SANDBOX_QUOTAS": _quotas,
    "POOLCTL_SANDBOX_BOOT_SPEEDUP": _speedup,
    "POOLCTL_GCE_ENDPOINT": _endpoint,
    "POOLCTL_QUOTA_CONTACT_EMAIL": _email,
    "AWS_REGION": _region,
    "AWS_DEFAULT_REGION": _region,
    "TMPDIR": _tmpdir,
}


def environment_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """The first bad value of `CHECKS` as one line, or None. Unset or empty means default."""
    env = os.environ if environ is None else environ
    for name, check in CHECKS.items():
        raw = env.get(name)
        if not raw:
            continue
        try:
            problem = check(raw)
        except (OSError, ValueError) as e:  # a path too long for the system, 5,000 digits
            problem = f"not a usable value ({getattr(e, 'strerror', None) or e})"
        if problem:
            return f"{name}={shown(raw)}: {problem}"
    return None


def check_environment() -> None:
    if problem := environment_problem():

        raise UsageError(problem)
