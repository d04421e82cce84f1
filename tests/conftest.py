"""Shared fixtures.

The sandbox fixtures start ONE real sandbox server (moto + poolctl's extensions, over HTTP on
a free loopback port) for the whole session, with a temporary POOLCTL_HOME so that
`poolctl ... --sandbox` in any test finds it:

    def test_x(sandbox, sandbox_client):        # sandbox: the endpoint URL
        asg = sandbox_client("autoscaling")      # region us-east-1, test credentials

Tests share the server: use unique names, or ask for `sandbox_reset` to start from an empty
emulator (moto's reset plus the sandbox's quota values back to their start-up values).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def sandbox_home(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("poolctl-home")


@pytest.fixture(scope="session")
def sandbox(sandbox_home) -> Iterator[str]:
    """Endpoint URL of a sandbox server running for the whole test session."""
    why = "moto's server is not installed (pip install -e .[sandbox])"
    pytest.importorskip("moto.server", reason=why)
    pytest.importorskip("flask", reason=why)
    from poolctl.sandbox import manager

    previous = os.environ.get("POOLCTL_HOME")
    os.environ["POOLCTL_HOME"] = str(sandbox_home)
    info = manager.start(port=0, home=sandbox_home, parent_pid=os.getpid())
    try:
        yield str(info.endpoint)
    finally:
        manager.stop(home=sandbox_home)
        if previous is None:
            os.environ.pop("POOLCTL_HOME", None)
        else:
            os.environ["POOLCTL_HOME"] = previous


@pytest.fixture
def sandbox_client(sandbox) -> Callable[..., Any]:
    """Factory of boto3 clients aimed at the session's sandbox."""
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    def make(service: str, region: str = "us-east-1") -> Any:
        return boto3.client(service, endpoint_url=sandbox, region_name=region, **TEST_CREDENTIALS)

    return make


def sandbox_admin(endpoint: str, method: str, path: str, body: dict | None = None) -> dict:
    """Call one of the sandbox's /_poolctl/ admin endpoints (or moto's /moto-api/)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw.decode(errors="replace")}


@pytest.fixture
def sandbox_reset(sandbox) -> str:
    """An empty sandbox for this test; returns the endpoint."""
    sandbox_admin(sandbox, "POST", "/moto-api/reset")
    return sandbox
