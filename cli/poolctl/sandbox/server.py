"""The sandbox server: moto's server app with poolctl's emulator extensions, on loopback.

    python -m poolctl.sandbox.server --host 127.0.0.1 --port 4600 [--port-file FILE]
                                     [--boot-speedup S] [--capacity TYPE@ZONE=N ...]

`--port 0` binds a free port; `--port-file` receives the bound port once the server
listens (the manager and the test fixture use it, so nobody races for a port).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from poolctl.formats import is_loopback
from poolctl.sandbox import extensions
from poolctl.sandbox.extensions import capacity, serving_nodes
from poolctl.sandbox.manager import SERVICE, parse_capacity

# moto settings the sandbox needs, read when moto builds its backends: without AWS managed
# policies, attaching arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore to the node role
# (the AWS stack does) is NoSuchEntity. Loading them costs ~0.6 s on the first IAM call.
MOTO_SETTINGS = {"MOTO_IAM_LOAD_MANAGED_POLICIES": "true"}


def _configure_moto() -> None:
    """Set MOTO_SETTINGS; call before moto is imported."""
    os.environ.update(MOTO_SETTINGS)




def _watch_parent(pid: int, server: Any) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            server.shutdown()
            return
        except PermissionError:
            pass


def build_app(info: dict[str, Any]) -> Any:
    """moto's domain-dispatching WSGI app, extensions loaded, admin endpoints in front."""
    _configure_moto()
    extensions.install()
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return extensions.admin_middleware(DomainDispatcherApplication(create_backend_app), info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poolctl.sandbox.server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4600)
    parser.add_argument("--port-file", type=Path, default=None)
    parser.add_argument(
        "--parent-pid", type=int, default=None,
        help="exit when this process is gone (test sessions: no server outlives pytest)",
    )
    parser.add_argument(
        "--boot-speedup", type=float, default=0.0,
        help="nodes finish booting by themselves after their plan's start time divided by "
        "this (0: only when told, by `poolctl sandbox boot-nodes`)",
    )
    parser.add_argument(
        "--serve", action="store_true",
        help="nodes run their boot script and serve; HAProxy routes their load balancers")
    parser.add_argument(
        "--speed", type=float, default=10.0,
        help="with --serve: pool seconds per wall second (engines, boots, waits)")
    parser.add_argument(
        "--engine-slowdown", type=float, default=1.0,
        help="with --serve: every engine step this many times as long as the serving model "
        "times it (a GPU that does worse than the pool's model believes)")
    parser.add_argument(
        "--state-dir", type=Path, default=None,
        help="with --serve: where nodes and load balancers keep their folders")
    parser.add_argument(
        "--capacity", action="append", default=[], metavar="TYPE@ZONE=N",
        help="the zone launches at most N instances of the type On-Demand (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        limits = parse_capacity(args.capacity)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not math.isfinite(args.boot_speedup) or args.boot_speedup < 0:
        print(f"--boot-speedup {args.boot_speedup:g}: give a number >= 0 (0: manual boot)",
              file=sys.stderr)
        return 2
    if not math.isfinite(args.speed) or args.speed <= 0:
        print(f"--speed {args.speed:g}: give a number above 0", file=sys.stderr)
        return 2
    if not (math.isfinite(args.engine_slowdown) and 0.1 <= args.engine_slowdown <= 100):
        print(f"--engine-slowdown {args.engine_slowdown:g}: give 0.1 to 100 (1: the model's "
              "own speed)", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(
            f"--host {args.host}: the sandbox listens on loopback only (127.0.0.1 or ::1)",
            file=sys.stderr,
        )
        return 2

    _configure_moto()
    import moto
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    info: dict[str, Any] = {
        "service": SERVICE,
        "pid": os.getpid(),
        "moto_version": moto.__version__,
        "extensions": list(extensions.EXTENSIONS),
        "started_at": time.time(),
    }
    app = build_app(info)

    capacity.set_startup_limits(dict(limits))
    try:
        server = make_server(
            args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler
        )
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    port = server.server_address[1]
    info["port"] = port
    # moto builds some URLs (e.g. SQS queue URLs) from MOTO_PORT.
    os.environ.setdefault("MOTO_PORT", str(port))

    def stop(signum: int, frame: Any) -> None:
        # shutdown() blocks until serve_forever returns, so it runs off the main thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    extensions.start_self_boot(args.boot_speedup)
    if args.serve:
        root = args.state_dir or (args.port_file.parent if args.port_file else Path.cwd())
        serving_nodes.enable(args.speed, f"http://{args.host}:{port}", root,
                             engine_slowdown=args.engine_slowdown)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, server), daemon=True).start()
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)
    print(
        f"{SERVICE} (moto {moto.__version__}) listening on http://{args.host}:{port}",
        flush=True,
    )
    server.serve_forever()
    server.server_close()
    serving_nodes.stop_all()  # every process a node started ends with the sandbox
    print(f"{SERVICE} stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
