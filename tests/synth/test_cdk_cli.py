"""`cdktn synth` (CDK Terrain's CLI) and `cdktf synth` (the archived CDKTF CLI, which a
user's CI may still install) at the repository root, through the real CLIs and cdktf.json's
app: every example, every placement, one stack each.

A test rather than a step after pytest in scripts/test, so it runs beside the other tests on
the parallel workers and pytest's summary stays the last line of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "synth"
pytestmark = pytest.mark.synth


def _cli(name: str) -> str | None:
    local = ROOT / "node_modules" / ".bin" / name
    return str(local) if local.exists() else shutil.which(name)


@pytest.mark.parametrize("cli", ["cdktn", "cdktf"])
def test_synth_at_the_root_writes_a_stack_per_example_placement(cli, tmp_path):
    from poolctl import naming
    from poolctl_stacks.app import example_configs

    exe = _cli(cli)
    if exe is None:
        pytest.skip(f"the {cli} CLI is not installed (scripts/setup runs `npm ci`)")
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
    # Byte for byte what poolctl's own synth writes (the golden files of tests/synth).
    for name in sorted(written):
        got = json.loads((out / "stacks" / name / "cdk.tf.json").read_text())
        text = json.dumps(got, indent=2, sort_keys=True) + "\n"
        assert text == (GOLDEN / f"{name}.json").read_text(), name
