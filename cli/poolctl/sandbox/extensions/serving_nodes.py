"""Nodes that serve (`sandbox start --serve`): a poolctl node's boot script runs for real.

When an instance of a group tagged by poolctl starts (a launch, or a start from the warm
pool: the moments its launch lifecycle actions open), the sandbox runs the instance's user
data, byte for byte, as `bash user-data boot` (the command the script's systemd unit runs;
the sandbox plays systemd: it starts that unit and the queue timer), after the plan's node
boot time over the speed. The node is a process group of its own with:

- its own loopback address, 127.A.B.C, where its engine listens (POOLCTL_SERVING_HOST in the
  script, POOLCTL_NODE_ADDRESS for the engine): A.B is the sandbox's own port (A = port / 256,
  B = port % 256), so two sandboxes on one machine never hand out the same address (their
  engines listen on the pool's port, 8000 for both), and C counts the nodes from 2;
- its own folder under the sandbox's state (`nodes/<instance id>/`): `state/` (the script's
  state), `cache/` (the NVMe cache: a folder, emptied when the instance stops), `root/`
  (the image, kept across a stop, as an EBS root volume keeps it), `bin/` (the stand-ins,
  poolctl/sandbox/standins.py) and `boot.log`, the script's output;
- the instance metadata service at the sandbox's `/_poolctl/imds/<instance id>/latest/`
  (IMDSv2: a GET without a session token is 401), and the sandbox as its AWS endpoint, so the
  script's `aws` calls (S3 weights, Secrets Manager, put-metric-data,
  complete-lifecycle-action) are real calls to the sandbox.

Beside the boot unit runs the queue timer: `bash user-data publish-queue` 30 s of pool time
after boot, then every 15 s start to start, as the script's poolctl-queue.timer does, but no
more often than every 5 wall seconds (`queue_period_wall`): each run starts the real aws CLI,
about 0.4 s of CPU, and 8 nodes at speed 10 publishing every 1.5 s would take 2.2 cores for it
alone, more than this project's machine has (measured: TTFT inflated 4x). Every CloudWatch period of
60 s still gets a datapoint (at most 54 s of pool time apart). When the instance is
terminated the node's processes get SIGTERM once its load balancer targets have drained (the target
groups' deregistration delay over the speed), SIGKILL 5 s later; when it stops (warm pool),
at once, and its cache empties. Stopping the sandbox stops every node.

Not emulated: systemd itself (the script's `install` step writes to /etc and /usr/local:
never run here), reboots, the instance store's RAID (a folder), GPUs (the engine is the
stand-in, poolctl/sandbox/vllm).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from poolctl import naming
from poolctl.bootscript import failed_line
from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.sandbox import standins
from poolctl.sandbox.extensions import autoscaler, balancers, schedules
from poolctl.sandbox.extensions.common import LOCK, all_backends, ec2_state, warm_states
from poolctl.sandbox.extensions.launches import actions_of, all_states, boot_clock

NAMES = ("serving.nodes",)
QUEUE_PERIOD_S = 15.0  # the script's poolctl-queue.timer: OnUnitActiveSec=15
QUEUE_FIRST_S = 30.0  # ... and OnBootSec=30
QUEUE_MIN_WALL_S = 5.0  # each run starts the aws CLI (0.4 s of CPU): see the docstring
METRIC_PERIOD_S = 60.0  # the stacks' alarms and target tracking: one datapoint per period
# The node's init, as systemd would run the script's units: after the node boot phase
# ($1 s), the boot unit (`user-data boot`, its exit code kept in boot.rc) and, beside it, the
# queue timer (first after $2 s, then every $3 s). $0: the user data; $4: the node's folder.
# $1 boot delay (s), $2 first queue run (s), $3 queue period (microseconds), $4 the folder.
# The queue runs start $3 apart, start to start, as systemd's OnUnitActiveSec counts: a run
# (curl and an aws CLI start, seconds of wall time on a busy machine) no longer pushes the
# next one out, which left one-minute periods at speed 10 without a datum.
INIT = """/bin/sleep "$1"
bash "$0" boot >>"$4/boot.log" 2>&1 &
boot=$!
(/bin/sleep "$2"
  while :; do
    t0=${EPOCHREALTIME/./}
    bash "$0" publish-queue >>"$4/queue.log" 2>&1
    left=$(($3 - ${EPOCHREALTIME/./} + t0))
    if ((left > 0)); then /bin/sleep "$((left / 1000000)).$(printf %06d $((left % 1000000)))"; fi
  done) &
wait "$boot"
echo "$?" >"$4/boot.rc"
wait
"""
NODE_LIMIT = 254  # 127.A.B.2 to 127.A.B.255
KILL_GRACE_S = 5.0

_serve: dict[str, Any] = {"on": False, "speed": 1.0, "endpoint": "", "root": None,
                          "net": "127.77.0", "slowdown": 1.0}
# (region, project, pool) -> what deploy --sandbox registered: phases and the model
pools: dict[tuple[str, str, str], dict[str, Any]] = {}


def queue_period_wall(speed: float) -> float:
    """Wall seconds between two runs of a node's queue timer: its 15 s of pool time, spaced
    to at least QUEUE_MIN_WALL_S but never more than 90 % of a metric period apart."""
    return max(QUEUE_PERIOD_S / speed,
               min(QUEUE_MIN_WALL_S, 0.9 * METRIC_PERIOD_S / speed))


@dataclass
class Node:
    instance_id: str
    region: str
    group: str
    key: tuple[str, str, str]
    address: str
    folder: Path
    instance_type: str
    boot_since: float = 0.0
    proc: subprocess.Popen[bytes] | None = None
    pgid: int | None = None
    exit_code: int | None = None
    served: bool = False  # the boot script finished with 0
    tokens: set[str] = field(default_factory=set)


nodes: dict[str, Node] = {}
_count = {"n": 0}
_TICK = threading.Lock()
_over: set[str] = set()  # instances past NODE_LIMIT, said once each


def enable(speed: float, endpoint: str, root: Path, engine_slowdown: float = 1.0) -> None:
    """Serve (called by the server before it answers): nodes boot for real from now on.
    `engine_slowdown`: their engines' steps take this many times the serving model's."""
    port = urlsplit(endpoint).port or 0
    _serve.update(on=True, speed=float(speed), endpoint=endpoint, root=Path(root),
                  slowdown=float(engine_slowdown),
                  net=f"127.{port // 256}.{port % 256}")
    balancers.configure(Path(root), float(speed))
    autoscaler.enable(float(speed))
    schedules.pace(float(speed))
    threading.Thread(target=_loop, name="poolctl-serving-nodes", daemon=True).start()


def serving() -> bool:
    return bool(_serve["on"])


def speed() -> float:
    return float(_serve["speed"])


def register_pool(region: str, project: str, pool: str, phases: dict[str, Any],
                  model: dict[str, Any], compile_miss_s: float = 0.0) -> None:
    """`compile_miss_s`: what torch.compile adds to a start without a compile cache (the
    pool shares one: the plan's phases count its hit)."""
    with LOCK:
        pools[(str(region), str(project), str(pool))] = {
            "phases": dict(phases), "model": dict(model),
            "compile_miss_s": float(compile_miss_s)}


def _group_key(backend: Any, group: Any) -> tuple[str, str, str] | None:
    tags = {t["Key"]: t["Value"] for t in group.tags}
    if naming.TAG_POOL not in tags:
        return None
    return (backend.region_name, tags.get(naming.TAG_PROJECT, ""), tags[naming.TAG_POOL])


def _user_data(instance: Any) -> bytes | None:
    raw = instance.user_data
    if isinstance(raw, list):
        raw = raw[0] if raw else None
    if not raw:
        return None
    if hasattr(raw, "as_bytes"):  # moto's Base64EncodedString
        raw = raw.as_bytes()
    if isinstance(raw, bytes):
        raw = raw.decode()
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return str(raw).encode()
    if data[:2] == b"\x1f\x8b":  # gzip: cloud-init decompresses it before it runs it
        try:
            return gzip.decompress(data)
        except (OSError, EOFError):
            return None
    return data


def _new_address() -> str | None:
    """The next node's address; None once the sandbox has handed out NODE_LIMIT (the node
    then stays a record, as nodes of a sandbox without --serve are)."""
    k = _count["n"]
    if k >= NODE_LIMIT:
        return None
    _count["n"] += 1
    return f"{_serve['net']}.{k + 2}"


def _phases(node: Node, kind: str) -> dict[str, float]:
    reg = pools.get(node.key, {}).get("phases", {})
    found: dict[str, float] = reg.get(kind) or reg.get("cold") or {}
    return found


def _start(node: Node, script: bytes, kind: str) -> None:
    """Run the node's user data as `boot`, after the plan's boot phase over the speed."""
    f = node.folder
    for sub in ("state", "cache", "root", "bin", "containers"):
        (f / sub).mkdir(parents=True, exist_ok=True)
    (f / "user-data").write_bytes(script)
    real_aws = shutil.which("aws", path=os.environ.get("PATH")) or "aws"
    standins.write_bin(f / "bin", sys.executable)
    phases = _phases(node, kind)
    reg = pools.get(node.key, {})
    row = load_catalog().get(Cloud.aws, node.instance_type)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "POOLCTL_"))},
        "PATH": f"{f / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(f / "root"),
        "AWS_ENDPOINT_URL": _serve["endpoint"],
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "POOLCTL_IMDS_URL": f"{_serve['endpoint']}/_poolctl/imds/{node.instance_id}/latest",
        "POOLCTL_STATE_DIR": str(f / "state"),
        "POOLCTL_CACHE_MOUNT": str(f / "cache"),
        "POOLCTL_NVME_DEVICES": "none",
        "POOLCTL_SERVING_HOST": node.address,
        "POOLCTL_NODE_ADDRESS": node.address,
        "POOLCTL_NODE_DIR": str(f),
        "POOLCTL_NODE_ID": node.instance_id,
        "POOLCTL_NODE_INSTANCE_TYPE": node.instance_type,
        "POOLCTL_NODE_GPUS": str(row.gpus if row is not None else 8),
        "POOLCTL_NODE_GPU_NAME": f"NVIDIA {row.gpu}" if row is not None else "NVIDIA GPU",
        standins.ENV_SPEED: repr(speed()),
        standins.ENV_IMAGE_S: repr(float(phases.get("image", 0.0))),
        standins.ENV_WEIGHTS_S: repr(float(phases.get("weights_to_nvme", 0.0))),
        standins.ENV_REAL_AWS: real_aws,
        "POOLCTL_ENGINE_START_S": repr(float(phases.get("load_to_gpu", 0.0))
                                       + float(phases.get("engine_init", 0.0))),
        "POOLCTL_SANDBOX_MODEL": json.dumps(reg.get("model") or {}),
        "POOLCTL_ENGINE_COMPILE_MISS_S": repr(float(reg.get("compile_miss_s") or 0.0)),
        "POOLCTL_ENGINE_SLOWDOWN": repr(float(_serve["slowdown"])),
        # the script's own clock (boot/_lib.sh.j2 `since`): pool seconds, as everything else
        "POOLCTL_TIME_SCALE_MILLI": str(round(speed() * 1000)),
        # its uptime (`uptime_s`): from now, the node's power-on (the kernel is the machine's)
        "POOLCTL_BOOTED_AT_US": str(time.time_ns() // 1000),
    }
    (f / "boot.rc").unlink(missing_ok=True)
    log = open(f / "node.log", "ab")  # noqa: SIM115 - the child holds it; closed below
    try:
        node.proc = subprocess.Popen(
            ["bash", "-c", INIT, str(f / "user-data"),
             f"{float(phases.get('boot', 0.0)) / speed():.3f}",
             f"{QUEUE_FIRST_S / speed():.3f}", str(round(queue_period_wall(speed()) * 1e6)),
             str(f)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=str(f / "root"), start_new_session=True)
    finally:
        log.close()
    node.pgid = node.proc.pid
    node.exit_code = None
    node.served = False


def _kill(node: Node, sig: int) -> None:
    if node.pgid is None:
        return
    try:
        os.killpg(node.pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(node: Node) -> bool:
    """Whether any process of the node's group is left. The leader is this server's child:
    reaped first, as a zombie still counts as a member of its group."""
    if node.pgid is None:
        return False
    if node.proc is not None:
        node.proc.poll()
    try:
        os.killpg(node.pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _stop(stopping: list[Node], wipe_cache: bool) -> None:
    """SIGTERM every node's processes at once, SIGKILL what is left KILL_GRACE_S later (as
    `docker stop` and systemd do), so stopping many nodes takes one grace, not one each."""
    for node in stopping:
        _kill(node, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    left = [n for n in stopping if _alive(n)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [n for n in left if _alive(n)]
    for node in left:
        _kill(node, signal.SIGKILL)
    for node in stopping:
        if node.proc is not None:
            try:
                node.proc.wait(1)
            except subprocess.TimeoutExpired:
                pass
        node.pgid = None
        node.served = False
        shutil.rmtree(node.folder / "containers", ignore_errors=True)
        if wipe_cache:
            shutil.rmtree(node.folder / "cache", ignore_errors=True)


def _scan() -> tuple[list[tuple[Node, bytes, str]], list[tuple[Node, str]]]:
    """Under LOCK: nodes to start (node, user data, kind) and nodes whose instance stopped or
    ended (node, ec2 state)."""
    from moto.autoscaling.models import autoscaling_backends

    starts: list[tuple[Node, bytes, str]] = []
    seen: set[str] = set()
    for backend in all_backends(autoscaling_backends):
        for group in list(backend.autoscaling_groups.values()):
            key = _group_key(backend, group)
            if key is None:
                continue
            for state in all_states(group):
                inst = state.instance
                seen.add(inst.id)
                if ec2_state(inst) not in ("pending", "running"):
                    continue  # ended or stopping: nothing boots on it
                boot = boot_clock(state)
                if not boot or not actions_of(state):
                    continue
                node = nodes.get(inst.id)
                if node is not None and node.boot_since == boot["since"]:
                    continue
                if boot["kind"] == "warm_running" and node is not None and node.served:
                    node.boot_since = boot["since"]
                    continue  # serving already; its queue timer completes the hook
                script = _user_data(inst)
                if script is None:
                    continue
                if node is None:
                    address = _new_address()
                    if address is None:
                        _note_limit(inst.id)
                        continue
                    root = Path(_serve["root"]) / "nodes" / inst.id
                    node = Node(inst.id, backend.region_name, group.name, key,
                                address, root, inst.instance_type)
                    nodes[inst.id] = node
                node.boot_since = boot["since"]
                starts.append((node, script, boot["kind"]))
    ended: list[tuple[Node, str]] = []
    from moto.ec2.models import ec2_backends

    for node in list(nodes.values()):
        if node.pgid is None:
            continue
        state = "terminated"
        for backend in all_backends(ec2_backends):
            if backend.region_name != node.region:
                continue
            try:
                inst = backend.get_instance(node.instance_id)
            except Exception:  # moto: InvalidInstanceID.NotFound once it is purged
                continue
            state = ec2_state(inst)
        if state in ("terminated", "shutting-down", "stopped", "stopping"):
            ended.append((node, state))
    return starts, ended


def _note_limit(instance_id: str) -> None:
    if instance_id not in _over:
        _over.add(instance_id)
        print(f"serving nodes: {instance_id} does not boot: this sandbox has served "
              f"{NODE_LIMIT} nodes, its limit (restart it: sandbox stop, sandbox start --serve)",
              flush=True)


def tick(now: float | None = None) -> None:
    with _TICK:  # stop_all waits for a tick under way: nothing starts after it
        _tick(now)


def _tick(now: float | None) -> None:
    if not _serve["on"]:
        return  # stopped (or never serving): start nothing
    now = time.monotonic() if now is None else now
    with LOCK:
        starts, ended = _scan()
    # Stopped and started again between two looks (a warm node taken at once): the old boot
    # ends first, as it does on EC2, its instance store with it.
    _stop([node for node, _, _ in starts if node.pgid is not None], wipe_cache=True)
    for node, script, kind in starts:
        _start(node, script, kind)
    balancers.sync(address_of)  # before the ends below: a node ends once its targets drained
    # A stopped instance ends at once; a terminated one once its targets drained (Auto
    # Scaling waits for the deregistration delay).
    _stop([node for node, state in ended if state in ("stopped", "stopping")
           or (until := balancers.drain_until(node.instance_id)) is None or now >= until],
          wipe_cache=True)
    for node in list(nodes.values()):
        if node.pgid is not None and node.exit_code is None:
            try:
                node.exit_code = int((node.folder / "boot.rc").read_text())
            except (OSError, ValueError):
                continue
            node.served = node.exit_code == 0


def _loop() -> None:
    while True:
        try:
            tick()
            autoscaler.tick()
            schedules.run_due_everywhere()
        except Exception as exc:  # moto raises many types; the thread must outlive one
            print(f"serving nodes: {exc!r}", flush=True)
        time.sleep(0.1)


def stop_all() -> None:
    """The sandbox stops: nothing starts again, every node's processes and every HAProxy
    end."""
    with _TICK:
        _serve["on"] = False
    balancers.stop_all()
    _stop([n for n in list(nodes.values()) if n.pgid is not None], wipe_cache=False)


def address_of(instance_id: str) -> str | None:
    node = nodes.get(instance_id)
    return None if node is None else node.address


def failure_line(instance_id: str) -> str | None:
    """The node's boot failure, as its log says it (`poolctl: FAILED: ...`), or None."""
    node = nodes.get(instance_id)
    if node is None:
        return None
    try:
        return failed_line((node.folder / "boot.log").read_text(errors="replace"))
    except OSError:
        return None


# ---- the instance metadata service, per node (IMDSv2) -------------------------------------

def imds(instance_id: str, method: str, rest: str, headers: dict[str, str]
         ) -> tuple[int, str]:
    """(status, body) of the node's metadata request `rest` (after /latest/)."""
    node = nodes.get(instance_id)
    if node is None:
        return 404, "Not Found"
    if method == "PUT":
        if rest != "api/token" or not headers.get("x-aws-ec2-metadata-token-ttl-seconds"):
            return 400, "Bad Request"
        token = secrets.token_urlsafe(24)
        node.tokens.add(token)
        return 200, token
    if headers.get("x-aws-ec2-metadata-token") not in node.tokens:
        return 401, "Unauthorized"
    if rest == "meta-data/instance-id":
        return 200, node.instance_id
    if rest == "meta-data/instance-type":
        return 200, node.instance_type
    if rest == "meta-data/local-ipv4":
        return 200, node.address
    if rest == "user-data":
        return 200, (node.folder / "user-data").read_text()
    if rest == "meta-data/autoscaling/target-lifecycle-state":
        with LOCK:
            return 200, _target_state(node)
    return 404, "Not Found"


def _target_state(node: Node) -> str:
    from moto.autoscaling.models import autoscaling_backends

    for backend in all_backends(autoscaling_backends):
        group = backend.autoscaling_groups.get(node.group)
        if group is None or backend.region_name != node.region:
            continue
        for state in warm_states(group):
            if state.instance.id == node.instance_id:
                pool_state = group.warm_pool.pool_state if group.warm_pool else "Stopped"
                return f"Warmed:{pool_state}"
        return "InService"
    return "Terminated"


def report() -> dict[str, Any]:
    # A copy: the serving loop adds nodes while this reads boot logs (the GIL is let go).
    listed = list(nodes.values())
    return {"serving": serving(), "speed": speed(),
            "engine_slowdown": float(_serve["slowdown"]), "nodes": [
        {"InstanceId": n.instance_id, "AutoScalingGroupName": n.group, "Address": n.address,
         "Running": n.pgid is not None, "BootExitCode": n.exit_code,
         "Failure": failure_line(n.instance_id)} for n in listed],
        **autoscaler.report()}


CONSOLE_BYTES = 64 * 1024  # EC2 keeps the last 64 KB of a console


def install() -> None:
    """GetConsoleOutput answers a serving node's boot log (the script logs to the console:
    its unit's StandardOutput=journal+console), in EC2's shape; other instances keep moto's
    sample. The server calls `enable` with --serve."""
    from moto.core.types import Base64EncodedString
    from moto.ec2.responses.general import General

    orig = General.get_console_output

    def get_console_output(self: Any) -> Any:
        node = nodes.get(self._get_param("InstanceId"))
        if node is None:
            return orig(self)
        from moto.core.responses import ActionResult
        from moto.core.utils import utcnow

        try:
            raw = (node.folder / "boot.log").read_bytes()[-CONSOLE_BYTES:]
        except OSError:
            raw = b""
        return ActionResult({"InstanceId": node.instance_id, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(
                                 raw.decode(errors="replace"))})

    General.get_console_output = get_console_output  # type: ignore[method-assign]  # moto extension: a node's own console


def reset() -> None:
    """moto's reset: every node ends and is forgotten; a serving sandbox goes on serving."""
    was = dict(_serve)
    stop_all()
    nodes.clear()
    pools.clear()
    if was["on"]:
        _serve.update(on=True)
        balancers.configure(Path(was["root"]), float(was["speed"]))
