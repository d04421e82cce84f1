"""Run checkov on a synthesized stack; every skip is named with its reason by the caller."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def checkov_bin() -> str | None:
    here = Path(sys.executable).parent / "checkov"
    return str(here) if here.exists() else shutil.which("checkov")


def run_checkov(stack_dir: Path, skips: dict[str, str]) -> list[dict]:
    """Failed checks of `checkov --framework terraform_json` on `stack_dir`, minus `skips`
    (check id -> why it does not apply). Returns the failures as dicts."""
    exe = checkov_bin()
    assert exe, "checkov is not installed (pip install checkov)"
    cmd = [exe, "-d", str(stack_dir), "--framework", "terraform_json", "--skip-download",
           "--output", "json", "--quiet", "--compact"]
    if skips:
        cmd += ["--skip-check", ",".join(sorted(skips))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not proc.stdout.strip():
        raise AssertionError(f"checkov produced no output: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout)
    reports = data if isinstance(data, list) else [data]
    failed = []
    for rep in reports:
        failed += rep.get("results", {}).get("failed_checks", [])
    return [{"id": f["check_id"], "name": f["check_name"], "resource": f["resource"]}
            for f in failed]
