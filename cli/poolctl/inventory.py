"""What `status` (endpoint), `ls` and `logs` report, cloud-neutral.

Each cloud's operations (`CloudOps.endpoint`, `.list_pools`, `.log_events`, in the
`inventory` module of `poolctl.clouds.aws` and `.gcp`) find the resources by the contract's
tags/labels and fill these records; this module reaches no cloud.
Everything a cloud answers (DNS names, tags, log lines) is data: printed commands quote it.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from poolctl.cloud import Cloud
from poolctl.errors import UsageError

# The header vLLM checks with --api-key / VLLM_API_KEY; the curl line names a shell variable
# the user sets, never the secret.
API_KEY_VAR = "VLLM_API_KEY"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass
class Endpoint:
    """The pool's load balancer as clients reach it."""

    scheme: str  # http | https
    host: str  # DNS name (AWS) or address (GCP)
    port: int
    internal: bool = True  # reachable from inside the network only
    api_key_secret: str | None = None  # where the key lives (ARN / secret name), not the key
    ca_file: str | None = None  # a certificate to trust (the sandbox's, self-signed)

    @property
    def url(self) -> str:
        port = "" if _DEFAULT_PORTS.get(self.scheme) == self.port else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}"

    def curl(self) -> str:
        """A test request: the served models (vLLM's OpenAI API)."""
        parts = ["curl", "-sS"]
        if self.ca_file:
            parts += ["--cacert", shlex.quote(self.ca_file)]
        if self.api_key_secret:
            parts += ["-H", f'"Authorization: Bearer ${API_KEY_VAR}"']
        return " ".join([*parts, shlex.quote(f"{self.url}/v1/models")])

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "url": self.url, "api_key": self.api_key_secret is not None,
                "curl": self.curl()}


@dataclass
class PoolRow:
    """One deployed pool as `ls` finds it, from its group's tags/labels alone."""

    project: str
    pool: str
    cloud: Cloud
    region: str
    group: str
    nodes: dict[str, int] = field(default_factory=dict)  # min, desired, max, in_service
    model: str | None = None
    image: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LogEvent:
    timestamp_ms: int
    source: str  # log stream (AWS) / instance (GCP)
    message: str
    id: str = ""

    def line(self) -> str:
        return printable(f"{rfc3339_ms(self.timestamp_ms)} {self.source} "
                         f"{self.message.rstrip()}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Control characters but tab and newline: a log line or tag is data, and must not drive the
# terminal it is printed on (escape sequences).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def rfc3339_ms(ms: int) -> str:
    """UTC with milliseconds and Z, as the clouds write times."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_SINCE = re.compile(r"(\d+)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_seconds(text: str) -> int:
    """`--since 10m` (s, m, h, d; combined: 1h30m) in seconds."""
    t = text.strip().lower()
    parts = _SINCE.findall(t)
    if not parts or _SINCE.sub("", t).strip():
        raise UsageError(f"--since {text!r}: give a duration such as 30s, 10m, 2h or 1d")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def stream_events(fetch: Callable[[int], Iterable[LogEvent]], start_ms: int,
                  emit: Callable[[LogEvent], object], interval_s: float, once: bool) -> None:
    """Emit the events from `start_ms` on, then (unless `once`) poll for new ones every
    `interval_s` until Ctrl-C, which ends it with a line saying so (exit 0). `fetch(ms)`
    returns the events at or after `ms`, oldest first; events already emitted at the newest
    timestamp come again and are dropped."""
    last = start_ms
    seen: set[tuple[str, str, int, str]] = set()
    try:
        while True:
            for ev in fetch(last):
                key = (ev.source, ev.id, ev.timestamp_ms, ev.message)
                if ev.timestamp_ms < last or key in seen:
                    continue
                if ev.timestamp_ms > last:
                    last, seen = ev.timestamp_ms, set()
                seen.add(key)
                emit(ev)
            if once:
                return
            time.sleep(interval_s)
    except KeyboardInterrupt:
        sys.stderr.write("poolctl: stopped following the logs (Ctrl-C)\n")
