"""What a sandbox node lacks, as thin stand-ins on the node's PATH (docs/sandbox.md, "Nodes
serve"): the boot script runs unchanged and calls these where a GPU node would call the real
programs. Each writes a folder (`bin/`) of small executables; `docker` is this module:

    python -m poolctl.sandbox.standins docker ARGS...

- `docker`: `run -d` starts the stand-in engine (`python -m poolctl.sandbox.vllm`) with the
  container's arguments, its `--env-file` and `-e` variables (not the node's credentials), on
  the node's loopback address;
  `rm -f`, `inspect -f {{.RestartCount}}`, `logs --tail N`, `image inspect`, `pull` (the
  plan's image pull time over the sandbox's speed, once: the image stays on the node's root
  volume), `login`. Containers are files under the node's folder.
- `nvidia-smi -L`: the node type's GPUs. `iptables`: rules kept in a file (`-C`, `-I`).
- `mountpoint -q DIR`: the node's NVMe cache is a folder; "mounted" while it exists (the
  sandbox empties it when the instance stops, as EC2 wipes instance store).
- `sleep N`: N / speed seconds: the script's waits run on the sandbox clock.
- `aws`: the real AWS CLI (against the sandbox), after the plan's weights transfer time over
  the speed for `aws s3 cp --recursive` (the weights' folder): a laptop copies the stand-in
  weights in milliseconds. Other copies (the compile cache's one file) take what they take.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

# Environment a node's processes get from the sandbox (serving_nodes.py sets it).
ENV_NODE_DIR = "POOLCTL_NODE_DIR"  # the node's folder: containers, image marker, logs
ENV_SPEED = "POOLCTL_SANDBOX_SPEED"
ENV_IMAGE_S = "POOLCTL_SANDBOX_IMAGE_S"  # the plan's image pull, pool seconds
ENV_WEIGHTS_S = "POOLCTL_SANDBOX_WEIGHTS_S"  # the plan's weights to NVMe, pool seconds
ENV_REAL_AWS = "POOLCTL_SANDBOX_REAL_AWS"


def write_bin(folder: Path, python: str) -> None:
    """The stand-ins as executables in `folder` (created), calling `python` for docker."""
    folder.mkdir(parents=True, exist_ok=True)
    py = shlex.quote(python)
    scripts = {
        "docker": f'#!/bin/bash\nexec {py} -m poolctl.sandbox.standins docker "$@"\n',
        "nvidia-smi": (
            "#!/bin/bash\n"
            '[[ ${1:-} == -L ]] || { echo "nvidia-smi (sandbox): only -L" >&2; exit 2; }\n'
            'for ((i = 0; i < ${POOLCTL_NODE_GPUS:-8}; i++)); do\n'
            '  printf "GPU %d: %s (UUID: GPU-sandbox-%s-%d)\\n" "$i" '
            '"${POOLCTL_NODE_GPU_NAME:-NVIDIA GPU}" "${POOLCTL_NODE_ID:-node}" "$i"\n'
            "done\n"),
        "iptables": (
            "#!/bin/bash\n"
            'rules="$POOLCTL_NODE_DIR/iptables.rules"\n'
            'op=$1; shift\n'
            'case $op in\n'
            '  -C) grep -qxF -- "$*" "$rules" 2>/dev/null ;;\n'
            '  -I|-A) printf "%s\\n" "$*" >>"$rules" ;;\n'
            '  *) echo "iptables (sandbox): only -C, -I, -A" >&2; exit 2 ;;\n'
            "esac\n"),
        "mountpoint": (
            "#!/bin/bash\n"
            '[[ ${1:-} == -q ]] && shift\n'
            '[[ $1 == "$POOLCTL_CACHE_MOUNT" && -d $1 ]]\n'),
        "sleep": (
            "#!/bin/bash\n"
            'exec /bin/sleep "$(awk -v s="${1%s}" -v k="${POOLCTL_SANDBOX_SPEED:-1}" '
            "'BEGIN { printf \"%.3f\", s / k }')\"\n"),
        "aws": (
            "#!/bin/bash\n"
            'if [[ ${1:-} == s3 && ${2:-} == cp && " $* " == *" --recursive "* &&'
            ' -n ${POOLCTL_SANDBOX_WEIGHTS_S:-} ]]; then\n'
            '  /bin/sleep "$(awk -v s="$POOLCTL_SANDBOX_WEIGHTS_S" '
            "-v k=\"${POOLCTL_SANDBOX_SPEED:-1}\" 'BEGIN { printf \"%.3f\", s / k }')\"\n"
            "fi\n"
            'exec "$POOLCTL_SANDBOX_REAL_AWS" "$@"\n'),
    }
    for name, text in scripts.items():
        p = folder / name
        p.write_text(text)
        p.chmod(0o755)


# ---- docker -------------------------------------------------------------------------------

def _node() -> Path:
    raw = os.environ.get(ENV_NODE_DIR)
    if not raw:
        sys.exit("docker (sandbox): POOLCTL_NODE_DIR is not set; this runs on sandbox nodes")
    return Path(raw)


def _speed() -> float:
    try:
        return max(float(os.environ.get(ENV_SPEED, "1")), 1e-9)
    except ValueError:
        return 1.0


def _container(name: str) -> Path:
    return _node() / "containers" / f"{name}.json"


def pid_alive(pid: int) -> bool:
    """The process runs (a zombie has exited: where PID 1 does not reap orphans it lingers
    for good)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_env_file(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v
    return out


# docker run's flags the boot script uses: those taking a value, and switches
_RUN_VALUE = {"--name", "--restart", "--gpus", "--network", "-p", "--publish", "--env-file",
              "--log-driver", "-e", "--env", "-v", "--volume", "--ipc", "--shm-size", "-u",
              "--user", "--entrypoint", "--ulimit", "--runtime"}
_RUN_SWITCH = {"-d", "--detach", "--rm", "-i", "-t", "--init", "--privileged"}


# The node's own AWS credentials: a container does not inherit the host's environment, and has
# no route to the metadata endpoint; what it gets is its env-file's and -e's. (The sandbox's
# endpoint, AWS_ENDPOINT_URL, stays: it is the sandbox's network, not a credential.)
HOST_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                    "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")


def _container_base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in HOST_CREDENTIALS}


def host_path(value: str, mounts: dict[str, str]) -> str:
    """An environment value that names a path inside a mounted folder, as the host sees it:
    the stand-in engine runs on the host, not in the container's file system."""
    for inside, host in mounts.items():
        if value == inside or value.startswith(inside + "/"):
            return host + value[len(inside):]
    return value


def docker_run(argv: list[str]) -> int:
    env: dict[str, str] = {}
    mounts: dict[str, str] = {}  # a path in the container -> the host folder mounted there
    name = None
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag, eq, inline = argv[i].partition("=")
        if flag in _RUN_SWITCH:
            i += 1
            continue
        if flag not in _RUN_VALUE:
            print(f"docker (sandbox): run: unknown flag {flag}", file=sys.stderr)
            return 125
        value = inline if eq else argv[i + 1]
        i += 1 if eq else 2
        if flag == "--name":
            name = value
        elif flag == "--env-file":
            env.update(_read_env_file(value))
        elif flag in ("-e", "--env"):
            k, _, v = value.partition("=")
            env[k] = v
        elif flag in ("-v", "--volume"):
            host, _, inside = value.partition(":")
            inside = inside.split(":")[0]
            mounts[inside.rstrip("/")] = host.rstrip("/")
            if inside == "/root/.cache":
                # the engine's cache folder (its torch.compile cache): a host folder here
                env["POOLCTL_VLLM_CACHE_DIR"] = host
    if i >= len(argv):
        print("docker (sandbox): run: no image given", file=sys.stderr)
        return 125
    args = argv[i + 1:]
    env = {k: host_path(v, mounts) for k, v in env.items()}
    name = name or f"c{int(time.time() * 1000)}"
    record = _container(name)
    if record.exists():
        print(f"docker (sandbox): the container name {name} is in use", file=sys.stderr)
        return 125
    record.parent.mkdir(parents=True, exist_ok=True)
    log = record.with_suffix(".log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "poolctl.sandbox.vllm", *args],
            env={**_container_base_env(), **env}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    record.write_text(json.dumps({"pid": proc.pid, "image": argv[i], "args": args}))
    print(f"{name}-{proc.pid:012d}")
    return 0


def docker(argv: list[str]) -> int:
    if not argv:
        return 2
    cmd, rest = argv[0], argv[1:]
    node = _node()
    marker = node / "root" / "image"
    if cmd == "image" and rest[:1] == ["inspect"]:
        if not marker.exists():
            print(f"Error: No such image: {rest[-1]}", file=sys.stderr)
            return 1
        layers = node / "root" / "layers"
        print(json.dumps({"UpperDir": str(layers)}) if "--format" in rest else "[]")
        return 0
    if cmd == "pull":
        time.sleep(float(os.environ.get(ENV_IMAGE_S, "0") or 0) / _speed())
        (node / "root" / "layers").mkdir(parents=True, exist_ok=True)
        (node / "root" / "layers" / "layer.tar").write_bytes(b"\0" * 4096)
        marker.write_text(rest[-1] + "\n")
        print(f"{rest[-1]}")
        return 0
    if cmd == "login":
        sys.stdin.read()
        print("Login Succeeded")
        return 0
    if cmd == "run":
        return docker_run(rest)
    if cmd in ("rm", "inspect"):
        name = rest[-1]
        record = _container(name)
        if not record.exists():
            print(f"Error response from daemon: No such container: {name}" if cmd == "rm"
                  else f"Error: No such object: {name}", file=sys.stderr)
            return 1
        pid = int(json.loads(record.read_text())["pid"])
        if cmd == "inspect":
            # A server that exited restarts under --restart on-failure until docker gives
            # up; the stand-in has no daemon to restart it, so an exited one reports docker's
            # give-up count at once (wait_ready stops at 3).
            print(0 if pid_alive(pid) else 3)
            return 0
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL if "-f" in rest else signal.SIGTERM)
        record.unlink()
        return 0
    if cmd == "logs":
        name = rest[-1]
        n = int(rest[rest.index("--tail") + 1]) if "--tail" in rest else 10**9
        log = _container(name).with_suffix(".log")
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        for line in lines[-n:]:
            print(line, file=sys.stderr)
        return 0
    print(f"docker (sandbox): {cmd} is not stood in for", file=sys.stderr)
    return 2


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] != "docker":
        print("usage: python -m poolctl.sandbox.standins docker ARGS", file=sys.stderr)
        return 2
    return docker(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
