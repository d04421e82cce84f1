#!/usr/bin/env python3
"""Benchmark of Terraform's CPU per command under Go's garbage-collector setting (GOGC): the
example pool is deployed to a private sandbox once, then `terraform plan` (a refresh of every
resource, the AWS provider started as on every deploy) runs `--repeat` times per GOGC value.
CPU is user + system of Terraform and its provider processes (waited children).

    source scripts/env.sh && python scripts/bench/terraform_gogc.py [--repeat 3]

Why: poolctl runs Terraform with GOGC=400 (poolctl/terraform.py) unless GOGC is set. Numbers,
not assertions; the sandbox listens on loopback only and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
STACK = "acme-chat-70b-aws"


def poolctl(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "poolctl", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gogc", nargs="+", default=["100", "200", "400", "off"])
    ap.add_argument("--gomaxprocs", nargs="+", default=["default"],
                    help="GOMAXPROCS values to try with each GOGC (default: Go's own)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, POOLCTL_HOME=home, POOLCTL_SANDBOX_PORT="0")
        poolctl(env, "sandbox", "start", "--manual-boot")
        try:
            out = Path(home) / "out"
            poolctl(env, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve",
                    "-f", str(EXAMPLE), "--out", str(out))
            os.environ.update(POOLCTL_HOME=home)  # what the sandbox manager reads
            from poolctl.deploy import endpoint_workdir
            from poolctl.sandbox import manager
            from poolctl.terraform import Terraform

            # The working folder and environment `deploy --sandbox` gave Terraform.
            workdir, tf_env = endpoint_workdir(out / "stacks" / STACK, "us-east-1",
                                               manager.endpoints())
            tf = Terraform(workdir, extra_env=tf_env)
            print(f"{'GOGC':>6} {'GOMAXPROCS':>10} {'cpu s (median)':>15} {'runs':>30}")
            for gogc in args.gogc:
                for procs in args.gomaxprocs:
                    env_run = {k: v for k, v in tf.env.items() if k != "GOMAXPROCS"}
                    env_run["GOGC"] = gogc
                    if procs != "default":
                        env_run["GOMAXPROCS"] = procs
                    runs = []
                    for _ in range(args.repeat):
                        before = children_cpu()
                        subprocess.run([tf.bin, "plan", "-input=false", "-lock=false",
                                        "-out=bench.tfplan"], cwd=workdir, env=env_run,
                                       check=True, stdout=subprocess.DEVNULL)
                        runs.append(children_cpu() - before)
                    print(f"{gogc:>6} {procs:>10} {statistics.median(runs):15.2f} "
                          f"{' '.join(f'{r:.2f}' for r in runs):>30}")
        finally:
            poolctl(env, "sandbox", "stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
