"""The stand-in engine as a process of its own on a loopback port, for the serving tests."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
# The example pool's line (examples/llama-70b-p5): TP 2 x DP 4 on one p5.48xlarge.
EXAMPLE_ARGS = ["--model", MODEL, "--tensor-parallel-size", "2", "--data-parallel-size", "4",
                "--max-model-len", "16384", "--gpu-memory-utilization", "0.92",
                "--max-num-batched-tokens", "8192", "--max-num-seqs", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standin(args: list[str], speed: float = 10.0, **env: str) -> Iterator[str]:
    """`python -m poolctl.sandbox.vllm ARGS --port P`; yields http://127.0.0.1:P once /health
    answers, stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolctl.sandbox.vllm", *args, "--port", str(port)],
        env={**os.environ, "POOLCTL_SANDBOX_SPEED": str(speed), **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the stand-in exited {proc.returncode}: "
                                     f"{proc.stdout.read() if proc.stdout else ''}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the stand-in did not answer /health in 60 s"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def call(url: str, path: str, body: dict | None = None, key: str | None = None,
         ca: Path | None = None, headers: dict[str, str] | None = None
         ) -> tuple[int, bytes]:
    """(status, body) of a JSON request to `url + path` (POST when `body`), with the key;
    an https URL is verified against `ca` (a self-signed certificate) strictly."""
    req = urllib.request.Request(url + path, data=None if body is None else
                                 json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {}),
                                          **(headers or {})})
    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    try:
        with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
