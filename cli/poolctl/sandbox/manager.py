"""Start, stop and inspect the local AWS sandbox (moto + poolctl's extensions) on loopback.

State lives in `$POOLCTL_HOME/sandbox` (default `~/.poolctl/sandbox`): `state.json` (pid,
port, endpoint, log path) and `server.log`; `deploy/` and `state/` hold the workdirs and
Terraform state of `deploy --sandbox`, removed when the sandbox stops or a new one starts
(the emulator keeps its resources in memory only). Other commands reach the running sandbox
through `endpoints()`, which the CLI edge (`poolctl.commands.common.endpoints_of`) resolves once for
`--sandbox` and hands to the library as `poolctl.endpoints.CloudEndpoints`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.adaptors.aws import boto3
from poolctl.cloud import Cloud
from poolctl.endpoints import NO_METADATA_ENV, AwsEndpoint, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.home import PRIVATE_UMASK, open_private, private_dir, write_private
from poolctl.node_image import recorded_node_image
from poolctl.sandbox.admin_api import admin
from poolctl.sandbox.serving import lb_address, seed_weights
from poolctl.sandbox.standins import pid_alive
from poolctl.sizing import compile_miss_s, instance_row, start_phases

HOST = "127.0.0.1"
# Not 4566: that is LocalStack's port, and pointing Terraform at the wrong emulator by
# habit is an easy mistake. Override with --port or POOLCTL_SANDBOX_PORT.
DEFAULT_PORT = 4600
DEFAULT_REGION = "us-east-1"
SERVICE = "poolctl-sandbox"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
TEST_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "aws_session_token": "testing",
}
# `poolctl sandbox start` boots nodes by themselves this many times faster than the plan's
# start times; `start()` (the tests' fixture) keeps 0, nodes boot when told.
DEFAULT_BOOT_SPEEDUP = 100.0
BOOT_SPEEDUP_ENV = "POOLCTL_SANDBOX_BOOT_SPEEDUP"


@dataclass
class SandboxInfo:
    running: bool
    endpoint: str | None = None
    pid: int | None = None
    port: int | None = None
    log: str | None = None
    state_dir: str | None = None
    started_at: float | None = None
    already_running: bool = False
    holds: dict[str, Any] = field(default_factory=dict)
    # Terraform state of an emulator that is gone, removed by start or stop.
    removed_state: list[str] = field(default_factory=list)
    # Nodes boot by themselves this many times faster than planned; 0: when told.
    boot_speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def home_dir(home: Path | str | None = None) -> Path:
    if home is not None:
        return Path(home).expanduser()
    return Path(os.environ.get("POOLCTL_HOME") or "~/.poolctl").expanduser()


def state_dir(home: Path | str | None = None) -> Path:
    return home_dir(home) / "sandbox"


def _state_file(home: Path | str | None) -> Path:
    return state_dir(home) / "state.json"


def _read_state(home: Path | str | None) -> dict[str, Any] | None:
    path = _state_file(home)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        return state
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # A torn or foreign file is as good as none: it is rewritten on the next start.
        return None


def health(endpoint: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The sandbox's identity card, or None when nothing (or something else) answers."""
    try:
        with urllib.request.urlopen(f"{endpoint}/_poolctl/health", timeout=timeout) as resp:
            body = json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("service") == SERVICE else None


def _is_ours(state: dict[str, Any]) -> bool:
    """The pid in the state file is still our server (not a recycled pid)."""
    pid = int(state.get("pid") or 0)
    if pid <= 0 or not pid_alive(pid):
        return False
    card = health(state.get("endpoint", ""))
    if card is not None:
        return int(card.get("pid", -1)) == pid
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        return b"poolctl.sandbox.server" in cmdline.read_bytes()
    except OSError:
        return False


def _running_state(home: Path | str | None) -> dict[str, Any] | None:
    state = _read_state(home)
    if state and _is_ours(state):
        return state
    return None


# `deploy --sandbox` keeps each stack's workdir and Terraform state here, beside the emulator.
TERRAFORM_DIRS = ("deploy", "state")


def remove_terraform_state(home: Path | str | None = None) -> list[str]:
    """Drop the workdirs and Terraform state of `deploy --sandbox`.

    The emulator keeps everything in memory: once its process is gone, that state names
    resources that no longer exist, and a deploy against a new sandbox would first fail to
    refresh them. Returns the folders removed.
    """
    removed = []
    for name in TERRAFORM_DIRS:
        path = state_dir(home) / name
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The server binds with SO_REUSEADDR (werkzeug's HTTPServer), so the probe must too:
        # without it, the TIME_WAIT connections a busy or just-stopped sandbox leaves on the
        # port read as "in use". A program listening there still fails the bind on Linux.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _port_error(port: int) -> UsageError:
    return UsageError(
        f"--port {port}: the port is in use by another program; "
        "pick a free one with `poolctl sandbox start --port N`"
    )


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def start(
    port: int | None = None,
    home: Path | str | None = None,
    quotas: dict[str, float] | None = None,
    timeout: float = START_TIMEOUT_S,
    parent_pid: int | None = None,
    boot_speedup: float = 0.0,
    capacity: dict[str, int] | None = None,
    serve_speed: float | None = None,
    engine_slowdown: float = 1.0,
) -> SandboxInfo:
    """Start the sandbox in the background; a running one is reported, not restarted.

    `serve_speed`: nodes run their boot script and serve, HAProxy routes, all at that speed
    (pool seconds per wall second); None: nodes are records that boot on a timer.
    `engine_slowdown`: with `serve_speed`, the engines' steps take that many times the
    serving model's (a GPU that does worse than the pool's model believes).

    `port` 0 picks a free port. `quotas` sets the ec2 quota values the server starts with;
    `capacity` its launch limits, {"TYPE@ZONE": N} (moto's reset returns to them).
    `parent_pid`: the server exits by itself once that process is gone (test sessions).
    `boot_speedup`: nodes finish booting by themselves after their plan's start time
    divided by it; 0 (the default): only when told (`boot-nodes`).
    """
    existing = _running_state(home)
    if existing is not None:
        return _info(existing, already_running=True)
    if port is None:
        port = int(os.environ.get("POOLCTL_SANDBOX_PORT") or DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is a number from 1 to 65535 (0 picks a free one)")
    if port and not _port_free(port):
        raise _port_error(port)

    sdir = private_dir(state_dir(home), home_dir(home))
    _state_file(home).unlink(missing_ok=True)  # stale: its process is gone
    port_file = sdir / "port"
    port_file.unlink(missing_ok=True)
    log_path = sdir / "server.log"
    env = {**os.environ, **NO_METADATA_ENV}  # the server never asks a metadata address
    if quotas:
        env["POOLCTL_SANDBOX_QUOTAS"] = json.dumps(quotas)
    argv = [sys.executable, "-m", "poolctl.sandbox.server", "--host", HOST,
            "--port", str(port), "--port-file", str(port_file),
            "--boot-speedup", repr(float(boot_speedup))]
    if parent_pid:
        argv += ["--parent-pid", str(parent_pid)]
    for key, limit in (capacity or {}).items():
        argv += ["--capacity", f"{key}={limit}"]
    if serve_speed is not None:
        argv += ["--serve", "--speed", repr(float(serve_speed)), "--state-dir", str(sdir),
                 "--engine-slowdown", repr(float(engine_slowdown))]
    log_fd = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, home_dir(home))
    with os.fdopen(log_fd, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives the CLI that started it
            close_fds=True,
            umask=PRIVATE_UMASK,  # its port file, like everything under POOLCTL_HOME
        )
    deadline = time.monotonic() + timeout
    endpoint = None
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            port_file.unlink(missing_ok=True)
            if code == 3:
                raise _port_error(port)
            raise OperationFailed(
                f"the sandbox server exited with code {code}: {_log_tail(log_path)} "
                f"(full log: {log_path})"
            )
        if endpoint is None and port_file.exists():
            endpoint = f"http://{HOST}:{int(port_file.read_text())}"
        if endpoint is not None and health(endpoint, timeout=1.0) is not None:
            break
        time.sleep(0.1)
    else:
        _terminate(proc.pid)
        raise OperationFailed(
            f"the sandbox server did not answer within {timeout:.0f} s: {_log_tail(log_path)} "
            f"(full log: {log_path})"
        )
    state = {
        "pid": proc.pid,
        "port": int(port_file.read_text()),
        "endpoint": endpoint,
        "log": str(log_path),
        "started_at": time.time(),
        "serve_speed": serve_speed,  # None: not serving
    }
    write_private(_state_file(home), json.dumps(state, indent=2), home_dir(home))
    info = _info(state)
    info.boot_speedup = float(boot_speedup)
    # A new emulator is empty: state left by an earlier one (killed, or the machine
    # rebooted without `sandbox stop`) describes nothing that exists.
    info.removed_state = remove_terraform_state(home)
    return info


_CAPACITY_ITEM = re.compile(
    r"(?P<type>[a-z0-9][a-z0-9-]*\.[a-z0-9-]+)@(?P<zone>[a-z]{2}(?:-[a-z0-9]+)+[a-z])"
    r"=(?P<n>\d{1,6})")


def parse_capacity(items: list[str] | None) -> dict[str, int]:
    """`--capacity TYPE@ZONE=N` items as {"TYPE@ZONE": N}; ValueError names a bad one."""
    out: dict[str, int] = {}
    for item in items or []:
        m = _CAPACITY_ITEM.fullmatch(item.strip())
        if m is None:
            raise ValueError(f"--capacity {item}: write TYPE@ZONE=N, e.g. "
                             "--capacity p5.48xlarge@us-east-1a=1 (N instances, 0 or more)")
        out[f"{m['type']}@{m['zone']}"] = int(m["n"])
    return out


def set_capacity(endpoint_url: str, limits: dict[str, int]) -> dict[str, Any]:
    """Set launch limits on a running sandbox (POST /_poolctl/capacity)."""
    return admin(endpoint_url, "POST", "/_poolctl/capacity", {"limits": limits},
                 "set the capacity limits")


def _terminate(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # Reaps it when this process is the parent (tests); harmless otherwise.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def shutdown(home: Path | str | None = None) -> tuple[SandboxInfo | None, list[str]]:
    """Stop the sandbox and drop the Terraform state of what it held (gone with it).

    Returns what was stopped (None when none was running) and the folders removed.
    """
    state = _read_state(home)
    stopped = None
    if state and _is_ours(state):
        _terminate(int(state["pid"]))
        stopped = _info(state)
        stopped.running = False
    for name in ("state.json", "port", "state.tmp"):
        (state_dir(home) / name).unlink(missing_ok=True)
    removed = remove_terraform_state(home)
    if stopped is not None:
        stopped.removed_state = removed
    return stopped, removed


def stop(home: Path | str | None = None) -> SandboxInfo | None:
    """Stop the sandbox; returns what was stopped, or None when none was running."""
    return shutdown(home)[0]


def _info(state: dict[str, Any], already_running: bool = False) -> SandboxInfo:
    return SandboxInfo(
        running=True,
        endpoint=state["endpoint"],
        pid=int(state["pid"]),
        port=int(state["port"]),
        log=state.get("log"),
        state_dir=str(Path(state.get("log", "")).parent) if state.get("log") else None,
        started_at=state.get("started_at"),
        already_running=already_running,
    )


def endpoint(home: Path | str | None = None) -> str:
    """The running sandbox's URL; a UsageError saying how to start it otherwise."""
    state = _running_state(home)
    if state is None:
        raise UsageError(
            "--sandbox: the sandbox is not running; start it with `poolctl sandbox start`"
        )
    return str(state["endpoint"])


# The sandbox's nodes boot in seconds (plan / its boot speedup) and a rollout moves one step
# per look: a wait against it polls each second.
POLL_S = 1.0
# Image builds against the sandbox: hold the (simulated) provisioning this long, or fail it
# there, so tests can interrupt a build or fail one mid-way.
IMAGE_HOLD_ENV = "POOLCTL_IMAGE_SANDBOX_HOLD_S"
IMAGE_FAIL_ENV = "POOLCTL_IMAGE_SANDBOX_FAIL"


def endpoints(home: Path | str | None = None) -> CloudEndpoints:
    """`--sandbox` as the library sees it: the running sandbox's endpoint, test credentials
    and region, its state folder for Terraform, and what an emulator changes (fake node
    addresses, stand-in images, fast polls). A UsageError saying how to start it when none
    runs."""

    url = endpoint(home)
    speed = float((_read_state(home) or {}).get("serve_speed") or 1.0)
    raw = os.environ.get(IMAGE_HOLD_ENV) or "0"
    try:
        hold = max(0, int(raw))
    except ValueError:
        raise UsageError(f"{IMAGE_HOLD_ENV}={raw}: not a whole number of seconds; unset it"
                         ) from None
    return CloudEndpoints(
        flag="--sandbox", clouds=frozenset({Cloud.aws}),
        aws=AwsEndpoint(url, region_or_default(), dict(TEST_CREDENTIALS)),
        unreachable_fix="is the sandbox running? `poolctl sandbox start`",
        poll_s=POLL_S, loopback_only=True, stand_in_images=True,
        terraform_home=state_dir(home),
        before_deploy=lambda cfg, pool: register_start_times(cfg, pool, home),
        lb_address=lambda dns: lb_address(url, dns),
        image_build_hold_s=hold, time_scale=speed,
        image_build_fails=os.environ.get(IMAGE_FAIL_ENV, "") not in ("", "0"))


def complete_lifecycle_actions(endpoint_url: str, group: str | None = None,
                               result: str = "CONTINUE") -> list[dict[str, Any]]:
    """Complete the open launch lifecycle actions (of one group, or all) through the admin
    endpoint, as the nodes' boot scripts would; returns what was completed."""
    body = {"AutoScalingGroupName": group, "LifecycleActionResult": result}
    try:
        done = admin(endpoint_url, "POST", "/_poolctl/lifecycle-actions", body,
                     "complete the lifecycle actions")
    except urllib.error.HTTPError as exc:
        raise OperationFailed(f"the sandbox at {endpoint_url} refused to complete the "
                              f"lifecycle actions: {exc}") from exc
    return list(done.get("completed", []))


def set_boot_speedup(endpoint_url: str, speedup: float) -> dict[str, Any]:
    """Change how nodes boot in a running sandbox (0: only when told); its boot report."""
    return admin(endpoint_url, "POST", "/_poolctl/boot", {"speedup": float(speedup)},
                 "change how nodes boot")


def aws_phases(pool: Any) -> dict[str, dict[str, float]]:
    """The plan's start-up phases of a node of `pool` on AWS, by how it starts."""
    return start_phases(pool, instance_row(pool, Cloud.aws), recorded_node_image(pool, Cloud.aws))


def totals(phases: dict[str, dict[str, float]]) -> dict[str, float]:
    return {kind: round(sum(p.values()), 1) for kind, p in phases.items()}


def start_times(pool: Any) -> dict[str, float]:
    """The plan's start time of a node of `pool` on AWS, in seconds, by how it starts: cold
    (a new instance), warm_stopped / warm_running (taken from the warm pool)."""
    return totals(aws_phases(pool))


def register_start_times(cfg: Any, pool: Any, home: Path | str | None = None) -> None:
    """Tell the sandbox how long `pool`'s nodes take to start (`deploy --sandbox` does,
    before its apply launches any): a node boots by itself after that time divided by the
    sandbox's boot speedup."""
    tags = naming.aws_tags(cfg, pool)
    phases = aws_phases(pool)
    body = {"region": pool.aws.region, "project": tags[naming.TAG_PROJECT],
            "pool": tags[naming.TAG_POOL], "start_seconds": totals(phases),
            # for serving nodes (sandbox start --serve): each phase's time, and the model
            # the stand-in engine serves as (what `plan` and `simulate` model)
            "phases": phases, "model": pool.model.model_dump(mode="json", exclude_none=True),
            "compile_miss_s": compile_miss_s(pool, Cloud.aws)}
    url = endpoint(home)
    seed_weights(AwsEndpoint(url, pool.aws.region, dict(TEST_CREDENTIALS)), pool)
    try:
        admin(url, "POST", "/_poolctl/start-times", body, "take the pool's start times")
    except urllib.error.HTTPError as exc:
        raise OperationFailed(
            f"the sandbox at {url} refused the pool's start times ({exc}); restart it with "
            "`poolctl sandbox stop && poolctl sandbox start`") from exc


def region_or_default(region: str | None = None) -> str:
    return region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or (
        DEFAULT_REGION
    )


def client(service: str, region: str | None = None, home: Path | str | None = None) -> Any:
    """A boto3 client of the running sandbox (`poolctl sandbox status`/`boot-nodes`, tests)."""
    return boto3.client(service, endpoint_url=endpoint(home),
                        region_name=region_or_default(region), **TEST_CREDENTIALS)


def inventory(endpoint_url: str, region: str) -> dict[str, Any]:
    """What the sandbox holds in `region`: poolctl's groups, instances by state, load balancers."""
    kw = {"endpoint_url": endpoint_url, "region_name": region, **TEST_CREDENTIALS}
    asg, ec2, elbv2 = (boto3.client(s, **kw) for s in ("autoscaling", "ec2", "elbv2"))
    groups = []
    for page in asg.get_paginator("describe_auto_scaling_groups").paginate(
        Filters=[{"Name": "tag-key", "Values": [naming.TAG_POOL]}]
    ):
        for g in page["AutoScalingGroups"]:
            tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
            groups.append(
                {
                    "name": g["AutoScalingGroupName"],
                    "pool": tags.get(naming.TAG_POOL),
                    "desired": g["DesiredCapacity"],
                    "min": g["MinSize"],
                    "max": g["MaxSize"],
                    "instances": dict(Counter(i["LifecycleState"] for i in g["Instances"])),
                    "warm_pool_size": g.get("WarmPoolSize"),
                }
            )
    states: Counter[str] = Counter()
    for page in ec2.get_paginator("describe_instances").paginate():
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                states[inst["State"]["Name"]] += 1
    lbs = [
        {"name": lb["LoadBalancerName"], "type": lb.get("Type"), "dns": lb.get("DNSName")}
        for page in elbv2.get_paginator("describe_load_balancers").paginate()
        for lb in page["LoadBalancers"]
    ]
    return {
        "region": region,
        "auto_scaling_groups": groups,
        "instances": dict(sorted(states.items())),
        "load_balancers": lbs,
    }


def status(region: str | None = None, home: Path | str | None = None) -> SandboxInfo:
    state = _running_state(home)
    if state is None:
        return SandboxInfo(running=False, state_dir=str(state_dir(home)))
    info = _info(state)
    card = health(info.endpoint or "")
    info.boot_speedup = None if card is None else card.get("boot_speedup")
    try:
        info.holds = inventory(info.endpoint or "", region_or_default(region))
    except Exception as exc:  # botocore raises many types; the report should still print
        raise OperationFailed(
            f"the sandbox at {info.endpoint} is running but did not answer: {exc}"
        ) from exc
    return info
