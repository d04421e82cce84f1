"""The sandbox: ONE real sandbox server per test session (moto + poolctl's extensions, over
HTTP on a free loopback port) with its own POOLCTL_HOME, and the helpers that run the real
CLI against it.

Fixtures: `sandbox` (its endpoint URL), `sandbox_home` (its POOLCTL_HOME), `sandbox_client`
(a factory of boto3 clients aimed at it), `sandbox_reset` (an emptied sandbox for one test).
Helpers: `sandbox_admin` (its /_poolctl/ and /moto-api/ endpoints), `run_poolctl` and
`pool_cli` (the CLI), `poolctl_env`, `terraform_missing` (why a Terraform deploy cannot run).

    def test_x(sandbox, sandbox_client):        # sandbox: the endpoint URL
        asg = sandbox_client("autoscaling")      # region us-east-1, test credentials

Tests of a session share the server: use unique names, or ask for `sandbox_reset`. Under
xdist every worker is a session of its own: its own server, home and free port.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from poolctl.sandbox import manager
from tests import inproc
from tests.inproc import check_no_internal_error

REPO = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    """Tests send Ctrl-C (SIGINT) to the poolctl processes they start. A shell without job
    control starts a background command (`scripts/test &`) with SIGINT ignored, and an
    ignored signal stays ignored in every child: Python then installs no KeyboardInterrupt
    handler and those tests wait forever. Give the suite (each xdist worker runs this too)
    the handler Python would have installed, so children start with the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def sandbox_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("poolctl-home")


@pytest.fixture(scope="session", autouse=True)
def _own_home_and_port(sandbox_home: Path) -> Iterator[None]:
    """Every session (each xdist worker is one) gets its own POOLCTL_HOME, and a sandbox that
    a test starts without --port takes a free port (0) instead of the shared default 4600:
    parallel workers and other users of this machine never meet."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOLCTL_HOME", str(sandbox_home))
        mp.setenv("POOLCTL_SANDBOX_PORT", "0")
        yield


@pytest.fixture(scope="session")
def sandbox(sandbox_home: Path) -> Iterator[str]:
    """Endpoint URL of a sandbox server running for the whole test session."""
    why = "moto's server is not installed (pip install -e .[sandbox])"
    pytest.importorskip("moto.server", reason=why)
    pytest.importorskip("flask", reason=why)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOLCTL_HOME", str(sandbox_home))
        # Manual boot: tests complete the launch hooks at the moments they choose.
        info = manager.start(port=0, home=sandbox_home, parent_pid=os.getpid(), boot_speedup=0)
        try:
            yield str(info.endpoint)
        finally:
            manager.stop(home=sandbox_home)


@pytest.fixture
def sandbox_client(sandbox: str) -> Callable[..., Any]:
    """Factory of boto3 clients aimed at the session's sandbox."""
    return functools.partial(boto3_client, sandbox)


def boto3_client(endpoint: str, service: str, region: str = "us-east-1") -> Any:
    """A boto3 client of `service` aimed at the sandbox at `endpoint`, test credentials."""
    import boto3  # lazily: a second of imports that unit tests do without

    return boto3.client(service, endpoint_url=endpoint, region_name=region,
                        **manager.TEST_CREDENTIALS)


def stand_in_ami(ec2: Any) -> str:
    """The AMI `deploy --sandbox` stands in with, through a sandbox EC2 client (moto's; its
    ids survive a reset)."""
    from poolctl.clouds.aws.api import stand_in_ami as first

    ami = first(ec2)
    assert ami is not None, "the sandbox offers no stand-in AMI"
    return ami


def sandbox_admin(endpoint: str, method: str, path: str, body: dict | None = None) -> dict:
    """Call one of the sandbox's /_poolctl/ admin endpoints (or moto's /moto-api/)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:  # the sandbox's one-line reason, in the failure
        exc.msg = f"{exc.msg}: {exc.read().decode(errors='replace')[:2000]}"
        raise
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw.decode(errors="replace")}


@pytest.fixture
def sandbox_reset(sandbox: str) -> str:
    """An empty sandbox for this test; returns the endpoint."""
    sandbox_admin(sandbox, "POST", "/moto-api/reset")
    return sandbox


# -- the CLI and Terraform ----------------------------------------------------------------


@functools.cache
def provider_mirror() -> str | None:
    """POOLCTL_PROVIDER_MIRROR, else the mirror scripts/env.sh discovers on this machine."""
    named = os.environ.get("POOLCTL_PROVIDER_MIRROR")
    if named:
        return named if Path(named).is_dir() else None
    try:
        script = 'source scripts/env.sh >/dev/null 2>&1; echo "${POOLCTL_PROVIDER_MIRROR:-}"'
        found = subprocess.run(
            ["bash", "-c", script],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if found and Path(found).is_dir() else None


def terraform_binary() -> str | None:
    named = os.environ.get("POOLCTL_TERRAFORM")
    if named:
        return shutil.which(named)
    return shutil.which("terraform") or shutil.which("tofu")


def terraform_missing() -> str | None:
    """Why a Terraform deploy to the sandbox cannot run on this machine, or None."""
    if terraform_binary() is None:
        named = os.environ.get("POOLCTL_TERRAFORM")
        if named:
            return f"POOLCTL_TERRAFORM={named} is not an executable"
        return "no terraform or tofu binary on PATH, and POOLCTL_TERRAFORM is unset"
    if provider_mirror() is None:
        return ("no offline provider mirror: POOLCTL_PROVIDER_MIRROR is unset and "
                "scripts/env.sh found none")
    return None


def poolctl_env(home: Path | str, **extra: str) -> dict[str, str]:
    """Environment for `python -m poolctl` aimed at the session sandbox's POOLCTL_HOME."""
    env = {**os.environ, "POOLCTL_HOME": str(home), **extra}
    mirror = provider_mirror()
    if mirror:
        env["POOLCTL_PROVIDER_MIRROR"] = mirror
    return env


def run_poolctl(home: Path | str, *args: str, timeout: float = 900, child: bool = False,
                **extra: str) -> subprocess.CompletedProcess:
    """The real CLI, in this worker as a child would run it (tests/inproc.py: its imports and
    the jsii kernel load once per worker), or with `child` in a subprocess (signals, the
    console script itself); synthesis goes under POOLCTL_HOME, never into the repo."""
    env = poolctl_env(home, **extra)
    if not child:
        return inproc.run(args, env=env, cwd=home, timeout=timeout)
    return check_no_internal_error(subprocess.run(
        [sys.executable, "-m", "poolctl", *args], capture_output=True, text=True,
        env=env, cwd=str(home), timeout=timeout,
    ))


def pool_cli(home: Path | str, pool_file: Path) -> Any:
    """`run(*args, ok=True)`: `poolctl ARGS -f pool_file --sandbox` (polling fast; in this
    worker, `run_poolctl`), asserting its exit code (True: 0, an int: that one, False: any).
    Commands that synthesize (deploy, rollout start/rollback) write beside the file."""
    out = pool_file.parent / "cdktf.out"

    def run(*args: str, ok: bool | int = True, timeout: float = 900) -> Any:
        argv = [*args, "-f", str(pool_file), "--sandbox"]
        if args[0] == "deploy" or (args[0] == "rollout" and args[1] in ("start", "rollback")):
            argv += ["--out", str(out)]
        res = run_poolctl(home, *argv, timeout=timeout, POOLCTL_POLL_S="0.05")
        expect = 0 if ok is True else ok
        if expect is not False:
            assert res.returncode == expect, (
                f"poolctl {' '.join(args)}: exit {res.returncode}, expected {expect}\n"
                f"{res.stderr[-3000:]}")
        return res

    return run
