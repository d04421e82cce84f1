"""The admin endpoints under /_poolctl/ (loopback only, no AWS equivalent), in front of moto.

GET /_poolctl/health: identity card (service, pid, port, moto version, extensions,
boot_speedup). GET|POST|DELETE /_poolctl/quotas (POST body {"quotas": {"L-417A185B": 384},
"region": "us-east-1"}, region optional = all regions); POST /_poolctl/quota-requests/<id>
{"status": "APPROVED"} (APPROVED applies the value). GET /_poolctl/lifecycle-actions (open
actions with tokens, and the log); POST /_poolctl/lifecycle-actions {"AutoScalingGroupName":
optional, "LifecycleActionResult": "CONTINUE"} completes every open launch action, standing
in for the nodes' boot scripts, which never run in the sandbox; it answers {"completed":
[...]}, each with the instance's LifecycleState afterwards (`poolctl sandbox boot-nodes` calls
it). GET /_poolctl/instance-connect?instance_id=I&user=U: the Instance Connect keys still
valid, one a line (the node side of Instance Connect). GET|POST|DELETE /_poolctl/faults
(faults.py). GET /_poolctl/boot: how nodes boot (self_boot.py): the speedup, the registered
start times, the nodes booting and their seconds left; POST {"speedup": 100} changes it (0:
nodes boot only when told). POST /_poolctl/start-times {"region", "project", "pool",
"start_seconds": {"cold": 440.5, "warm_stopped": 260.5, "warm_running": 30}} registers a
pool's start times (`deploy --sandbox` sends its plan's). GET|POST /_poolctl/snapshots and
POST /_poolctl/snapshots/<name>/restore (snapshots.py). GET|POST|DELETE /_poolctl/capacity
(capacity.py): the launch limits with their use and the Capacity Reservations; POST
{"limits": {"p5.48xlarge@us-east-1a": 1, "p5.48xlarge@us-east-1b": null}} sets limits (null
removes one), {"capacity_blocks": [{"instance_type", "zone", "count", "hours"}]} adds Capacity
Blocks (their ids under "created"); groups short of capacity retry at once; DELETE returns to
the start-up limits. GET|POST /_poolctl/clock (schedules.py): the sandbox's time; POST
{"offset_seconds": S} or {"advance_seconds": S} moves it, and the scheduled actions it
reaches run. GET /_poolctl/serving (with --serve, serving_nodes.py and balancers.py): the
nodes (loopback address, running, the boot script's exit code and failure line) and the load
balancers (their loopback endpoint, listeners, targets); the start-times body may carry the
pool's "phases" and "model" for them. /_poolctl/imds/<instance id>/latest/...: a serving
node's instance metadata service (IMDSv2). moto's own POST /moto-api/reset also resets all
of this (the speedup stays).

Every other request goes to moto, through faults.py (held back answers) and retries.py
(a retried attempt answered once).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from poolctl.sandbox.extensions import (
    balancers,
    capacity,
    faults,
    quotas,
    retries,
    schedules,
    serving_nodes,
)
from poolctl.sandbox.extensions.common import LOCK
from poolctl.sandbox.extensions.instance_connect import instance_connect_keys
from poolctl.sandbox.extensions.lifecycle import complete_open_actions, lifecycle_report
from poolctl.sandbox.extensions.self_boot import (
    boot_report,
    boot_speedup,
    register_start_times,
    set_boot_speedup,
)
from poolctl.sandbox.extensions.snapshots import restore_snapshot, snapshot_names, take_snapshot

NAMES = ("admin-endpoints",)


IMDS_PREFIX = "/_poolctl/imds/"


def _imds(environ: dict[str, Any], start_response: Any, path: str, method: str) -> list[bytes]:
    """A node's instance metadata service: /_poolctl/imds/<instance id>/latest/<path>."""
    instance_id, _, rest = path[len(IMDS_PREFIX):].partition("/")
    rest = rest.removeprefix("latest/")
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items()
               if k.startswith("HTTP_")}
    status, text = serving_nodes.imds(instance_id, method, rest, headers)
    data = text.encode()
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
    start_response(f"{status} {reason.get(status, 'OK')}",
                   [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
    return [data]


def admin_middleware(app: Callable[..., Any], info: dict[str, Any]) -> Callable[..., Any]:
    """WSGI wrapper answering /_poolctl/... and passing everything else to moto."""

    def respond(start_response: Any, status: int, body: Any) -> list[bytes]:
        data = json.dumps(body, default=str).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  500: "Internal Server Error"}
        start_response(
            f"{status} {reason.get(status, 'OK')}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/_poolctl/"):
            late = faults.answer_late(app, environ, start_response)
            if late is not None:
                return late
            return retries.answer(app, environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if path.startswith(IMDS_PREFIX):
            return _imds(environ, start_response, path, method)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            raw = environ["wsgi.input"].read(length) if length else b""
            body = json.loads(raw or b"{}")
        except (ValueError, json.JSONDecodeError):
            return respond(start_response, 400, {"error": "the body must be a JSON object"})
        try:
            if path == "/_poolctl/serving":
                return respond(start_response, 200, {**serving_nodes.report(),
                                                     "load_balancers": balancers.report()})
            if path == "/_poolctl/health":
                return respond(start_response, 200, {**info, "boot_speedup": boot_speedup()})
            if path == "/_poolctl/boot":
                if method == "POST":
                    set_boot_speedup(body.get("speedup"))
                elif method != "GET":
                    return respond(start_response, 405, {"error": "GET or POST"})
                return respond(start_response, 200, boot_report())
            if path == "/_poolctl/start-times" and method == "POST":
                missing = [k for k in ("region", "project", "pool", "start_seconds")
                           if k not in body]
                if missing:
                    raise ValueError(f"the body needs {', '.join(missing)}")
                register_start_times(body["region"], body["project"], body["pool"],
                                     dict(body["start_seconds"]))
                serving_nodes.register_pool(body["region"], body["project"], body["pool"],
                                            dict(body.get("phases") or {}),
                                            dict(body.get("model") or {}),
                                            float(body.get("compile_miss_s") or 0.0))
                return respond(start_response, 200, boot_report())
            if path == "/_poolctl/quotas":
                with LOCK:
                    if method == "POST":
                        quotas.set_quotas(dict(body.get("quotas") or {}), body.get("region"))
                    elif method == "DELETE":
                        quotas.reset()
                    elif method != "GET":
                        return respond(start_response, 405, {"error": "GET, POST or DELETE"})
                    return respond(start_response, 200, {"quotas": quotas.applied_values})
            if path == "/_poolctl/capacity":
                created: list[str] = []
                if method == "POST":
                    if not isinstance(body.get("limits", {}), dict):
                        raise ValueError('"limits" is an object: {"p5.48xlarge@us-east-1a": 1}')
                    created = [capacity.add_capacity_block(dict(b)).id
                               for b in body.get("capacity_blocks") or []]
                    capacity.set_limits(dict(body.get("limits") or {}))
                elif method == "DELETE":
                    capacity.reset_limits()
                elif method != "GET":
                    return respond(start_response, 405, {"error": "GET, POST or DELETE"})
                return respond(start_response, 200, {**capacity.report(), "created": created})
            if path == "/_poolctl/clock":
                if method == "POST":
                    return respond(start_response, 200, schedules.set_clock(body))
                if method != "GET":
                    return respond(start_response, 405, {"error": "GET or POST"})
                return respond(start_response, 200, schedules.clock_report())
            if path.startswith("/_poolctl/quota-requests/") and method == "POST":
                with LOCK:
                    request = quotas.set_request_status(path.rsplit("/", 1)[1],
                                                        str(body.get("status")))
                return respond(start_response, 200, {"RequestedQuota": request})
            if path == "/_poolctl/instance-connect":
                q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
                keys = instance_connect_keys(q.get("instance_id", ""), q.get("user", ""))
                return respond(start_response, 200, {"keys": keys})
            if path == "/_poolctl/faults":
                with LOCK:
                    if method == "POST":
                        faults.add_fault(body)
                    elif method == "DELETE":
                        faults.reset()
                    return respond(start_response, 200, faults.report())
            if path == "/_poolctl/snapshots":
                if method == "POST":
                    return respond(start_response, 200, take_snapshot(str(body.get("name", ""))))
                return respond(start_response, 200, {"snapshots": snapshot_names()})
            if (path.startswith("/_poolctl/snapshots/") and path.endswith("/restore")
                    and method == "POST"):
                name = path.removeprefix("/_poolctl/snapshots/").removesuffix("/restore")
                return respond(start_response, 200, restore_snapshot(name))
            if path == "/_poolctl/lifecycle-actions":
                if method == "POST":
                    done = complete_open_actions(
                        body.get("AutoScalingGroupName"),
                        str(body.get("LifecycleActionResult") or "CONTINUE").upper(),
                    )
                    return respond(start_response, 200, {"completed": done})
                return respond(start_response, 200, lifecycle_report())
        except KeyError as exc:
            return respond(start_response, 404, {"error": f"not found: {exc}"})
        except (ValueError, TypeError, AttributeError) as exc:
            return respond(start_response, 400, {"error": str(exc)})
        except Exception as exc:  # a sandbox bug: its name in the answer, its trace in the log
            traceback.print_exc()
            return respond(start_response, 500, {"error": f"{path}: {type(exc).__name__}: {exc}"})
        return respond(start_response, 404, {"error": f"no admin endpoint {method} {path}"})

    return wsgi


def install() -> None:
    """Nothing to patch: the server puts `admin_middleware` in front of moto's app."""


def reset() -> None:
    """Nothing kept here: each endpoint's state is its own module's."""
