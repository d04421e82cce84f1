"""`cdktf synth` at the repository root through the real cdktf CLI (cdktf.json's app): every
example, every placement, one stack each.

A test rather than a step after pytest in scripts/test, so it runs beside the other tests on
the parallel workers and pytest's summary stays the last line of the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.synth


def _cdktf() -> str | None:
    local = ROOT / "node_modules" / ".bin" / "cdktf"
    return str(local) if local.exists() else shutil.which("cdktf")


def test_cdktf_synth_at_the_root_writes_a_stack_per_example_placement(tmp_path):
    from poolctl import naming
    from poolctl_stacks.app import example_configs

    exe = _cdktf()
    if exe is None:
        pytest.skip("the cdktf CLI is not installed (scripts/setup runs `npm ci`)")
    expected = {naming.stack_name(cfg, t.pool, t.cloud)
                for cfg, targets in example_configs(ROOT) for t in targets}
    # At least llama-70b-p5 on AWS and GCP, qwen-7b-p4d on AWS, mistral-gcp on GCP.
    assert len(expected) >= 4
    out = tmp_path / "cdktf.out"
    env = {**os.environ, "CHECKPOINT_DISABLE": "1"}
    proc = subprocess.run([exe, "synth", "--output", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    written = {p.parent.name for p in (out / "stacks").glob("*/cdk.tf.json")}
    assert written == expected
