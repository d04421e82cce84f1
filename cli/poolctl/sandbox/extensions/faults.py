"""Faults: the answer to an API action held back after moto performed it.

POST /_poolctl/faults {"action": "CreateLaunchTemplate", "delay_s": 20, "times": 1} (admin.py)
holds back the answer to the next `times` calls of that API action by `delay_s` seconds AFTER
moto performed them: a client that gives up meanwhile (Terraform interrupted) has created the
resource without learning it, as with a connection lost on real AWS (the interrupt tests need
it). `report` lists the faults left and the actions whose answer is held back right now
("holding").
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from poolctl.sandbox.extensions.common import LOCK

NAMES = ("admin-endpoints.faults",)

# API action -> {"delay_s": seconds, "times": calls left}; actions whose answer is being held
# back right now (a test interrupts its client then).
_faults: dict[str, dict[str, float]] = {}
_holding: list[str] = []


def _api_action(environ: dict[str, Any]) -> str | None:
    """The API action of a request (query protocol: Action=..., JSON: X-Amz-Target), with
    the body left readable for moto."""
    target: str | None = environ.get("HTTP_X_AMZ_TARGET")
    if target:
        return target.rsplit(".", 1)[-1]
    query: str = environ.get("QUERY_STRING", "")
    action = parse_qs(query).get("Action")
    if action:
        return action[0]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if not length:
        return None
    raw = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(raw)
    found = parse_qs(raw.decode(errors="replace")).get("Action")
    return found[0] if found else None


def _delayed(app: Callable[..., Any], environ: dict[str, Any], start_response: Any,
             action: str, delay_s: float) -> list[bytes]:
    """moto's answer, complete, handed over `delay_s` seconds after moto acted."""
    seen: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *exc: seen.append((status, headers))))
    with LOCK:
        _holding.append(action)
    try:
        time.sleep(delay_s)
    finally:
        with LOCK:
            _holding.remove(action)
    start_response(*seen[0])
    return [body]


def _take_fault(action: str | None) -> float | None:
    with LOCK:
        fault = _faults.get(action or "")
        if fault is None:
            return None
        fault["times"] -= 1
        if fault["times"] <= 0:
            del _faults[action or ""]
        return float(fault["delay_s"])


def answer_late(app: Callable[..., Any], environ: dict[str, Any], start_response: Any
                ) -> list[bytes] | None:
    """moto's answer held back, when a fault is set for the request's action; else None
    (the request is left for the caller to pass on)."""
    action = _api_action(environ) if _faults else None
    delay = _take_fault(action)
    if delay is None:
        return None
    return _delayed(app, environ, start_response, str(action), delay)


def add_fault(body: dict[str, Any]) -> None:
    """A fault as POST /_poolctl/faults gives it: action, delay_s (10), times (1)."""
    _faults[str(body["action"])] = {
        "delay_s": max(0.0, float(body.get("delay_s", 10))),
        "times": max(1, int(body.get("times", 1)))}


def report() -> dict[str, Any]:
    return {"faults": _faults, "holding": list(_holding)}


def install() -> None:
    """Nothing to patch: admin.admin_middleware sends every AWS call through `answer_late`."""


def reset() -> None:
    """Drop the faults left (an answer being held back still comes late)."""
    _faults.clear()
