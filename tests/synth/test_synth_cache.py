"""Deploys and rollouts reuse stacks synthesized from the same inputs (`synth_key`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from poolctl.config import load_config
from poolctl.deploy import SYNTH_KEY_FILE, synth_key, synth_targets

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen-7b-p4d" / "poolctl.yaml"


def _cfg(text: str | None = None, tmp: Path | None = None):
    if text is None:
        return load_config(EXAMPLE)
    assert tmp is not None  # a text is written into the test's folder
    f = tmp / "poolctl.yaml"
    f.write_text(text)
    return load_config(f)


def test_key_follows_config_targets_and_code(tmp_path, monkeypatch):
    import poolctl

    cfg = _cfg()
    targets = cfg.targets(None, None)
    key = synth_key(cfg, targets)
    assert synth_key(_cfg(), targets) == key  # the same inputs, the same key
    changed = _cfg(EXAMPLE.read_text().replace("max_replicas: 32", "max_replicas: 24"), tmp_path)
    assert changed.pools[0].scaling.max_replicas == 24
    assert synth_key(changed, changed.targets(None, None)) != key
    assert synth_key(cfg, []) != key
    # A boot template edited (as in a poolctl upgrade) changes every key.
    copy = tmp_path / "poolctl"
    shutil.copytree(poolctl.__path__[0], copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "boot" / "node.sh.j2").open("a") as f:
        f.write("# changed\n")
    monkeypatch.setattr(poolctl, "__path__", [str(copy)])
    assert synth_key(cfg, targets) != key


@pytest.mark.synth
def test_second_synth_of_unchanged_inputs_reuses_the_stacks(tmp_path, capsys):
    cfg = _cfg()
    targets = cfg.targets(None, None)
    out = tmp_path / "out"
    dirs = synth_targets(cfg, targets, out)
    stack = dirs[0] / "cdk.tf.json"
    assert "synthesizing" in capsys.readouterr().err
    before = stack.stat().st_mtime_ns
    assert synth_targets(cfg, targets, out) == dirs
    assert "reusing them" in capsys.readouterr().err
    assert stack.stat().st_mtime_ns == before
    # A stale key (another poolctl wrote the stack) means a new synth.
    (dirs[0] / SYNTH_KEY_FILE).write_text("stale")
    synth_targets(cfg, targets, out)
    assert "synthesizing" in capsys.readouterr().err
    assert (dirs[0] / SYNTH_KEY_FILE).read_text() == synth_key(cfg, targets)
