"""What every runtime operation shares: how often to poll, which cloud's operations to load
(lazily: `--help` never loads a cloud SDK), and the hint a long wait ends with.
"""

from __future__ import annotations

import os

from poolctl.clouds import Cloud
from poolctl.clouds.base import (
    CloudOps,
    RolloutStatus,
)
from poolctl.config import Pool
from poolctl.errors import UsageError

# Seconds between polls while waiting; the sandbox's clock moves per call, so tests set it low.
POLL_ENV = "POOLCTL_POLL_S"
DEFAULT_POLL_S = 15.0
# The sandbox's nodes boot in seconds (plan / its boot speedup) and a rollout moves one step
# per look: a wait against it polls each second.
SANDBOX_POLL_S = 1.0
ROLLOUT_DONE_OK = {RolloutStatus.successful}


def poll_interval(sandbox: bool = False) -> float:
    raw = os.environ.get(POLL_ENV)
    if not raw:
        return SANDBOX_POLL_S if sandbox else DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{POLL_ENV}={raw}: not a number of seconds; unset it or give e.g. 15"
                         ) from None
    return max(0.0, value)


def get_ops(cloud: Cloud, sandbox: bool, *, contact_email: str | None = None) -> CloudOps:
    """The cloud's CloudOps; its SDK loads only here. `contact_email`: Cloud Quotas (GCP)
    requires one on increase requests; AWS Service Quotas takes none."""
    if cloud == Cloud.aws:
        from poolctl.clouds import aws

        return aws.make_ops(sandbox=sandbox)
    if cloud == Cloud.gcp:
        if sandbox:
            raise UsageError("--sandbox: the sandbox emulates AWS only; use --cloud aws")
        from poolctl.clouds import gcp

        return gcp.make_ops(sandbox=sandbox, contact_email=contact_email)
    raise UsageError(f"--cloud {cloud}: unknown cloud; use aws or gcp")


def watch_hint(cloud: Cloud, file: str | os.PathLike | None, pool: Pool, sandbox: bool,
               what: str = "status") -> str:
    parts = ["poolctl", *what.split(), "--cloud", cloud]
    if file:
        parts += ["-f", str(file)]
    parts += ["--pool", pool.name]
    if sandbox:
        parts.append("--sandbox")
    return " ".join(parts)
