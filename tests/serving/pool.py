"""A serving sandbox with one pool deployed, for the serving e2e modules: each module starts
its own (nothing shared between modules, so they run in any order or worker)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from poolctl.sandbox import manager
from tests.configs import pool_yaml
from tests.plugins.sandbox import boto3_client, run_poolctl, sandbox_admin
from tests.serving.standin import call

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
KEY = "sandbox-pool-key-1"
KEY_VAR = "POOLCTL_TEST_POOL_KEY"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180.0,
             every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def azure_trace(path: Path, rate: float, seconds: float, prompt: int, output: int) -> None:
    """An Azure-format trace: `rate` requests a second of fixed lengths for `seconds`."""
    t0 = datetime(2023, 11, 16, 18, 0, 0)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(int(rate * seconds)):
            t = t0 + timedelta(seconds=i / rate)
            f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{prompt},{output}\n")


def serving(url: str) -> Any:
    """The sandbox's serving report (/_poolctl/serving)."""
    return sandbox_admin(url, "GET", "/_poolctl/serving")


@contextmanager
def serving_pool(home: Path, speed: float, **yaml: Any) -> Iterator[dict[str, Any]]:
    """`sandbox start --serve` in `home`, the test pool (`pool_yaml(**yaml)`, AWS only, an API
    key in Secrets Manager) deployed; yields home, url (the sandbox), lb (the pool's loopback
    endpoint, once a node answers through it), cfg and secret (the API key's ARN). On exit
    the sandbox stops and no process it started may outlive it."""
    info = manager.start(port=0, home=home, parent_pid=os.getpid(), serve_speed=speed)
    url = str(info.endpoint)
    arn = boto3_client(url, "secretsmanager").create_secret(
        Name="chat-70b-key", SecretString=KEY)["ARN"]
    cfg = home / "poolctl.yaml"
    text = pool_yaml(with_gcp=False, **yaml)
    cfg.write_text(text.replace("      port: 8000\n",
                                f"      port: 8000\n      api_key_secret: {arn}\n"))
    try:
        r = run_poolctl(home, "deploy", "--sandbox", "--auto-approve", "-f", str(cfg),
                        "--cloud", "aws", "--out", str(home / "cdktf.out"))
        assert r.returncode == 0, r.stderr[-3000:]

        def ready() -> str | None:
            lbs = [lb for lb in serving(url)["load_balancers"] if lb["Running"]]
            if not lbs or not any(lbs[0]["Targets"].values()):
                return None
            ok = call(lbs[0]["Endpoint"], "/v1/models", key=KEY)[0] == 200
            return str(lbs[0]["Endpoint"]) if ok else None

        lb = wait_for("a node serving behind the load balancer", ready)
        yield {"home": home, "url": url, "lb": lb, "cfg": cfg, "secret": arn}
    finally:
        manager.stop(home=home)
        left = subprocess.run(["pgrep", "-af", str(home)], capture_output=True, text=True)
        assert left.stdout.strip() == "", left.stdout
