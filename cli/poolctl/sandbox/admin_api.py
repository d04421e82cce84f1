"""The sandbox's /_poolctl/ admin endpoints, called from the CLI (manager.py, serving.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from poolctl.errors import OperationFailed


def admin(endpoint_url: str, method: str, path: str, body: dict[str, Any] | None = None,
          what: str = "answer") -> dict[str, Any]:
    """Call one of the sandbox's /_poolctl/ admin endpoints; its JSON answer. An HTTP error
    answer is raised as urllib's HTTPError (callers tell a 404 apart); no answer at all is
    OperationFailed saying what the call was for."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint_url}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return dict(json.loads(resp.read() or b"{}"))
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OperationFailed(f"the sandbox at {endpoint_url} did not {what}: {exc}") from exc
