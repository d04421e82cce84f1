"""A retried attempt of a call moto already answered gets that first answer.

The SDKs mark every attempt of one call with the same invocation id (amz-sdk-invocation-id)
and its number (amz-sdk-request: attempt=N). On a loaded machine a client may give up on an
answer moto is still writing and send the call again; for a call that creates something (a
launch template version, a rule, an alias) moto would then do it twice. A later attempt of a
call moto already answered (or is answering) gets that answer, as a lost answer's retry is
meant to: a client that gave up on a slow answer must not create a second launch template
version, rule or alias (the AWS provider retries under load). Bounded: the newest
RETRY_MEMORY calls (every answer is kept, DescribeImages ones too, and a retry follows its
first attempt within seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from poolctl.sandbox.extensions.common import LOCK

NAMES = ("retried-attempts-answered-once",)

RETRY_MEMORY = 256
_attempts: dict[str, dict[str, Any]] = {}  # invocation id -> {"done": Event, "answer"}


def _attempt(environ: dict[str, Any]) -> tuple[str | None, int]:
    inv = environ.get("HTTP_AMZ_SDK_INVOCATION_ID")
    req = environ.get("HTTP_AMZ_SDK_REQUEST", "")
    for part in req.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "attempt" and value.isdigit():
            return inv, int(value)
    return inv, 1


def _answer_once(app: Callable[..., Any], environ: dict[str, Any], start_response: Any,
                 inv: str, attempt: int) -> list[bytes]:
    with LOCK:
        seen = _attempts.get(inv)
        first = seen is None
        if seen is None:
            seen = _attempts[inv] = {"done": threading.Event(), "answer": None}
            while len(_attempts) > RETRY_MEMORY:
                del _attempts[next(iter(_attempts))]
    if not first and attempt > 1:
        seen["done"].wait(120)
        answer = seen["answer"]
        if answer is not None:
            print(f"retry: attempt {attempt} of call {inv} answered as the first", flush=True)
            start_response(*answer[:2])
            return [answer[2]]
    got: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *exc: got.append((status, headers))))
    status, headers = got[0]
    if first:
        # A 5xx may mean nothing was done: a retry of it runs again.
        seen["answer"] = None if status.startswith("5") else (status, headers, body)
        seen["done"].set()
    start_response(status, headers)
    return [body]


def answer(app: Callable[..., Any], environ: dict[str, Any], start_response: Any) -> Any:
    """moto's answer to an AWS call; a call the SDK marks is answered once per invocation."""
    inv, attempt = _attempt(environ)
    if inv:
        return _answer_once(app, environ, start_response, inv, attempt)
    return app(environ, start_response)


def install() -> None:
    """Nothing to patch: admin.admin_middleware sends every AWS call through `answer`."""


def reset() -> None:
    _attempts.clear()
