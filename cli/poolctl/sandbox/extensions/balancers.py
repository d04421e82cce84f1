"""The load balancers' data plane (`sandbox start --serve`): one HAProxy per Elastic Load
Balancing v2 load balancer, on a loopback port.

HAProxy (Debian's package, `scripts/setup` installs it) is started when a load balancer has a
listener that forwards to a target group, with a config written from what moto holds: a
frontend on 127.0.0.1:<free port> per listener, a backend per target group with slots for its
targets (`server-template`), its health check (protocol HTTP, the group's path and matcher,
interval / speed, healthy and unhealthy thresholds as HAProxy's rise and fall), least
outstanding requests routing (`balance leastconn`), and cookie stickiness when the group's
`stickiness.enabled` attribute is true (lb_cookie: HAProxy inserts the AWSALB cookie).

From then on the sandbox drives it through its runtime API (the admin socket), never by
reloading: a target registered (an instance InService in its group, which is when Auto
Scaling registers it on AWS) takes a free slot (`set server addr`, `state ready`); a target
deregistered goes to `state drain` (no new requests; those in flight finish) for the group's
deregistration delay / speed, then `state maint`, freeing the slot. The instance itself is
ended only after that (serving_nodes.py), as Auto Scaling waits for the delay.

An HTTPS listener is served with TLS (`bind ... ssl crt`) by its certificate as the
sandbox's ACM holds it (certificate, chain and private key: one ACM requested, or one the user
imported); the key is written to the balancer's folder (mode 600) for HAProxy alone, and the
certificate and chain to `ca.pem` beside it, which /_poolctl/serving names (`CaFile`) so a
client can trust it (`curl --cacert`, `replay --sandbox`). A listener whose default action is
ACM's redirect to HTTPS answers 301 to the HTTPS listener's loopback port, path kept.

Not emulated: path and host rules (the default action only), the listener's SSL policy (HAProxy
offers TLS 1.2 and 1.3 with its defaults), slow start, weights, cross-zone settings.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolctl.sandbox.extensions.common import LOCK, all_backends

NAMES = ("elbv2.haproxy",)
SLOTS = 64  # targets per target group
HAPROXY = "haproxy"


@dataclass
class Backend:
    name: str
    arn: str
    port: int
    delay_s: float
    slots: dict[str, str] = field(default_factory=dict)  # instance id -> slot name
    # slot -> (when it goes to maint, the instance it served)
    draining: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass
class Balancer:
    arn: str
    name: str
    dns: str
    folder: Path
    ports: dict[int, int]  # listener port -> loopback port
    backends: dict[str, Backend]  # target group arn -> backend
    proc: subprocess.Popen[bytes] | None = None
    # the listener port clients are sent to (the forwarding one), and its scheme
    front: int | None = None
    scheme: str = "http"
    ca_file: Path | None = None  # the HTTPS certificate and chain (no key)
    signature: tuple[Any, ...] = ()  # the listeners it was started with (_signature)


balancers: dict[str, Balancer] = {}
_settings: dict[str, Any] = {"root": None, "speed": 1.0}


def configure(root: Path, speed: float) -> None:
    _settings.update(root=Path(root), speed=float(speed))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _attr(tg: Any, key: str, default: str) -> str:
    return str((tg.attributes or {}).get(key, default))


def _config(b: Balancer, tgs: dict[str, Any], listeners: list[Any], speed: float) -> str:
    sock = b.folder / "admin.sock"
    lines = [
        "global",
        f"  stats socket {sock} mode 600 level admin",
        "  maxconn 4000",
        "defaults",
        "  mode http",
        "  timeout connect 5s",
        "  timeout client 3600s",
        "  timeout server 3600s",
        "  timeout http-request 60s",
        "  option dontlognull",
        # An ALB forwards each streamed chunk as it comes. HAProxy by default sends with
        # MSG_MORE when it expects more, and the kernel may hold that for up to 200 ms:
        # measured, the headers and first token of every stream came 200 ms late (2 s of
        # pool time at speed 10, 98 % of the TTFT p90 of an hour's replay on 8 nodes).
        "  option http-no-delay",
        "  maxconn 4000",
    ]
    for listener in listeners:
        local = b.ports[int(listener.port)]
        redirect = _redirect_port(listener)
        if redirect is not None and redirect in b.ports:
            lines += [f"frontend l{listener.port}", f"  bind 127.0.0.1:{local}",
                      f"  http-request redirect prefix https://127.0.0.1:{b.ports[redirect]} "
                      "code 301"]
            continue
        arn = _forward_target(listener)
        if arn is None or arn not in b.backends:
            continue
        tls = ""
        if str(listener.protocol).upper() == "HTTPS":
            pem = _tls_pem(b, listener)
            if pem is None:
                continue  # no certificate the sandbox holds: nothing listens, as on AWS
            tls = f" ssl crt {pem}"
        lines += [f"frontend l{listener.port}", f"  bind 127.0.0.1:{local}{tls}",
                  f"  default_backend {b.backends[arn].name}"]
    for arn, be in b.backends.items():
        tg = tgs[arn]
        interval = max(float(tg.health_check_interval_seconds or 30) / speed, 0.05)
        path = tg.health_check_path or "/"
        matcher = (getattr(tg, "matcher", None) or {}).get("HttpCode", "200")
        rise = int(tg.healthy_threshold_count or 5)
        fall = int(tg.unhealthy_threshold_count or 2)
        timeout = max(float(tg.health_check_timeout_seconds or 5) / speed, 0.05)
        lines += [f"backend {be.name}", "  balance leastconn",
                  f"  option httpchk GET {path}",
                  f"  http-check expect status {matcher.split(',')[0].split('-')[0]}",
                  f"  timeout check {round(timeout * 1000)}ms"]
        sticky = _attr(tg, "stickiness.enabled", "false") == "true"
        if sticky:
            lines.append("  cookie AWSALB insert indirect nocache")
        cookie = " cookie s" if sticky else ""
        lines.append(f"  server-template s 1-{SLOTS} 127.0.0.1:{be.port} disabled check "
                     f"inter {round(interval * 1000)}ms rise {rise} fall {fall}{cookie}")
    return "\n".join(lines) + "\n"


def _forward_target(listener: Any) -> str | None:
    for action in listener.default_actions or []:
        data = action.data if hasattr(action, "data") else action
        if data.get("Type") == "forward":
            if data.get("TargetGroupArn"):
                return str(data["TargetGroupArn"])
            groups = (data.get("ForwardConfig") or {}).get("TargetGroups") or []
            if groups:
                return str(groups[0]["TargetGroupArn"])
    return None


def _signature(listeners: list[Any], tgs: dict[str, Any]) -> tuple[Any, ...]:
    """What HAProxy's config depends on: each listener's port, protocol, certificate and
    default action, and the target groups."""
    return (tuple(sorted((int(li.port), str(li.protocol), str(li.certificate or ""),
                          str(_forward_target(li)), _redirect_port(li)) for li in listeners)),
            tuple(sorted(tgs)))


def _redirect_port(listener: Any) -> int | None:
    """The port a listener's default redirect to HTTPS sends clients to (None: not one)."""
    for action in listener.default_actions or []:
        data = action.data if hasattr(action, "data") else action
        if data.get("Type") == "redirect":
            cfg = data.get("RedirectConfig") or {}
            if str(cfg.get("Protocol", "")).upper() == "HTTPS":
                return int(cfg.get("Port") or 443)
    return None


def _tls_pem(b: Balancer, listener: Any) -> Path | None:
    """Write the listener's certificate, chain and key for HAProxy (`tls-PORT.pem`, mode 600)
    and the certificate and chain alone to `ca.pem`; the first's path, or None when the
    sandbox's ACM holds no such certificate."""
    from moto.acm.models import acm_backends

    arn = str(listener.certificate or "")
    parts = arn.split(":")
    if len(parts) < 6:
        return None
    try:
        bundle = acm_backends[parts[4]][parts[3]]._certificates.get(arn)
    except KeyError:
        return None
    if bundle is None or not bundle.key:
        return None
    public = bundle.cert + (b"\n" + bundle.chain if bundle.chain else b"")
    pem = b.folder / f"tls-{listener.port}.pem"
    fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(public.rstrip(b"\n") + b"\n" + bundle.key)
    b.ca_file = b.folder / "ca.pem"
    b.ca_file.write_bytes(public)
    return pem


def _runtime(b: Balancer, *commands: str) -> str:
    """Send commands to HAProxy's admin socket; its answer."""
    sock = b.folder / "admin.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(("; ".join(commands) + "\n").encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode(errors="replace")


def _start(b: Balancer, tgs: dict[str, Any], listeners: list[Any]) -> None:
    b.folder.mkdir(parents=True, exist_ok=True)
    cfg = b.folder / "haproxy.cfg"
    cfg.write_text(_config(b, tgs, listeners, float(_settings["speed"])))
    exe = shutil.which(HAPROXY) or shutil.which(HAPROXY, path="/usr/sbin:/sbin")
    if exe is None:
        print("balancers: haproxy is not installed (scripts/setup installs it)", flush=True)
        return
    log = open(b.folder / "haproxy.log", "ab")  # noqa: SIM115 - the child holds it
    try:
        b.proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    finally:
        log.close()
    # Until its runtime API answers: the socket's file appears before HAProxy listens on it
    # (and a restarted HAProxy finds its predecessor's file there).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if b.proc.poll() is not None:
            return
        try:
            _runtime(b, "show info")
            return
        except OSError:
            time.sleep(0.02)


def _in_service() -> set[str]:
    from moto.autoscaling.models import autoscaling_backends

    out: set[str] = set()
    for backend in all_backends(autoscaling_backends):
        for group in list(backend.autoscaling_groups.values()):
            for st in group.instance_states:
                if st.lifecycle_state == "InService":
                    out.add(st.instance.id)
    return out


def _snapshot() -> list[tuple[Any, dict[str, Any], list[Any], dict[str, set[str]]]]:
    """Under LOCK: (load balancer, its target groups by arn, its listeners, the InService
    instance targets of each group)."""
    from moto.elbv2.models import elbv2_backends

    live = _in_service()
    out = []
    for backend in all_backends(elbv2_backends):
        for lb in list(backend.load_balancers.values()):
            listeners = list(lb.listeners.values())
            tgs = {}
            for listener in listeners:
                arn = _forward_target(listener)
                if arn and arn in backend.target_groups:
                    tgs[arn] = backend.target_groups[arn]
            if not tgs:
                continue
            targets = {arn: {t for t in tg.targets if t in live} for arn, tg in tgs.items()}
            out.append((lb, tgs, listeners, targets))
    return out


def sync(address_of: Any) -> None:
    """Bring every HAProxy to what the load balancers hold; `address_of(instance id)` is a
    node's loopback address (None: not serving)."""
    if _settings["root"] is None:
        return
    with LOCK:
        snap = _snapshot()
    speed = float(_settings["speed"])
    now = time.monotonic()
    seen = set()
    for lb, tgs, listeners, targets in snap:
        seen.add(lb.arn)
        b = balancers.get(lb.arn)
        sig = _signature(listeners, tgs)
        kept: dict[int, int] = {}
        if b is not None and b.signature != sig:
            # Listeners changed (a certificate added, a redirect): HAProxy starts again with
            # them, each listener on its port as before; the targets register again below.
            _stop(balancers.pop(lb.arn))
            kept, b = b.ports, None
        if b is None:
            b = Balancer(lb.arn, lb.name, lb.dns_name,
                         Path(_settings["root"]) / "balancers" / lb.name,
                         {int(li.port): kept.get(int(li.port)) or _free_port()
                          for li in listeners},
                         {arn: Backend(f"tg{k}", arn, int(tg.port or 80), float(
                             _attr(tg, "deregistration_delay.timeout_seconds", "300")))
                          for k, (arn, tg) in enumerate(tgs.items())})
            b.signature = sig
            front = next((li for li in listeners if _forward_target(li) in tgs), None)
            if front is not None:
                b.front = int(front.port)
                b.scheme = "https" if str(front.protocol).upper() == "HTTPS" else "http"
            balancers[lb.arn] = b
            _start(b, tgs, listeners)
        if b.proc is None or b.proc.poll() is not None:
            continue
        # The slots change only once HAProxy has taken the commands: a refused one (HAProxy
        # not listening yet) is tried again at the next sync instead of being lost.
        cmds: list[str] = []
        ready: list[tuple[Backend, str, str]] = []  # (backend, instance, slot)
        drain: list[tuple[Backend, str, str]] = []
        maint: list[tuple[Backend, str]] = []
        for arn, be in b.backends.items():
            want = {i for i in targets.get(arn, set()) if address_of(i)}
            used = set(be.slots.values()) | set(be.draining)
            for inst in sorted(want - set(be.slots)):
                free = next((f"s{k}" for k in range(1, SLOTS + 1) if f"s{k}" not in used),
                            None)
                if free is None:
                    break
                used.add(free)
                ready.append((be, inst, free))
                cmds += [f"set server {be.name}/{free} addr {address_of(inst)} port {be.port}",
                         f"set server {be.name}/{free} state ready"]
            for inst in sorted(set(be.slots) - want):
                drain.append((be, inst, be.slots[inst]))
                cmds.append(f"set server {be.name}/{be.slots[inst]} state drain")
            for slot, (until, _) in list(be.draining.items()):
                if now >= until:
                    maint.append((be, slot))
                    cmds.append(f"set server {be.name}/{slot} state maint")
        if cmds:
            try:
                _runtime(b, *cmds)
            except OSError as exc:
                print(f"balancers: {b.name}: runtime API: {exc} (tried again at the next sync)",
                      flush=True)
                continue
        for be, inst, slot in ready:
            be.slots[inst] = slot
        for be, inst, slot in drain:
            del be.slots[inst]
            be.draining[slot] = (now + be.delay_s / speed, inst)
        for be, slot in maint:
            del be.draining[slot]
    for arn in [a for a in balancers if a not in seen]:
        _stop(balancers.pop(arn))


def _stop(b: Balancer) -> None:
    if b.proc is not None and b.proc.poll() is None:
        b.proc.terminate()
        try:
            b.proc.wait(5)
        except subprocess.TimeoutExpired:
            b.proc.kill()
            b.proc.wait()


def drain_until(instance_id: str) -> float | None:
    """When the last target of `instance_id` finishes draining (time.monotonic), or None when
    no load balancer routes to it."""
    ends = [until for b in list(balancers.values()) for be in b.backends.values()
            for until, inst in dict(be.draining).values() if inst == instance_id]
    return max(ends, default=None)


def stop_all() -> None:
    _settings["root"] = None  # no sync starts another one from now on
    _stop_processes()


def _stop_processes() -> None:
    for b in list(balancers.values()):
        _stop(b)
    balancers.clear()


def _health(b: Balancer) -> dict[str, dict[str, str]]:
    """Each target's state as HAProxy's checks see it (`show stat`'s status: UP, DOWN,
    "DOWN 1/2" while rising, DRAIN, ...), by backend and instance."""
    running = b.proc is not None and b.proc.poll() is None
    try:
        text = _runtime(b, "show stat") if running else ""
    except OSError:
        text = ""
    rows = [line.split(",") for line in text.splitlines() if line and "," in line]
    if not rows or not rows[0][0].startswith("# "):
        return {}
    col = {name: k for k, name in enumerate([rows[0][0][2:], *rows[0][1:]])}
    status = {(r[col["pxname"]], r[col["svname"]]): r[col["status"]] for r in rows[1:]
              if len(r) > col["status"]}
    out: dict[str, dict[str, str]] = {}
    for be in b.backends.values():
        slots = {**{slot: inst for slot, (_, inst) in dict(be.draining).items()},
                 **{slot: inst for inst, slot in dict(be.slots).items()}}
        out[be.name] = {inst: status.get((be.name, slot), "?") for slot, inst in slots.items()}
    return out


def report() -> list[dict[str, Any]]:
    # Copies: `sync` changes the balancers and their slots outside LOCK while this asks each
    # HAProxy for its stats.
    return [{"LoadBalancerName": b.name, "DNSName": b.dns,
             "Endpoint": (f"{b.scheme}://127.0.0.1:{b.ports[b.front]}"
                          if b.front in b.ports else None),
             "Listeners": {str(k): f"127.0.0.1:{v}" for k, v in b.ports.items()},
             "CaFile": None if b.ca_file is None else str(b.ca_file),
             "Running": b.proc is not None and b.proc.poll() is None,
             "Targets": {be.name: sorted(dict(be.slots)) for be in b.backends.values()},
             "Health": _health(b)}
            for b in list(balancers.values())]


def install() -> None:
    """Nothing to patch: serving_nodes' loop calls `sync`."""


def reset() -> None:
    """Every HAProxy ends with the load balancers (moto's reset); serving goes on."""
    _stop_processes()

