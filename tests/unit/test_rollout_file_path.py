"""A rollout records the file it edited by its absolute path: `rollout rollback` run from
another directory (where another poolctl.yaml may sit) restores the file the rollout
changed, and only that one."""

from __future__ import annotations

from pathlib import Path

import pytest

from poolctl import runtime
from poolctl.config import parse_config
from poolctl.errors import OperationFailed
from tests.unit.test_runtime_math import FILE, RolloutOps

NEW = "vllm/vllm-openai:v0.12.0"


class ApplyOps(RolloutOps):
    def rollout_apply_env(self, group, plan, no_surge=False):
        return {}


def _no(question):
    raise AssertionError(f"asked {question!r}")


def test_rollback_from_another_directory_restores_the_recorded_file(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    team, other = tmp_path / "team", tmp_path / "other"
    for d in (team, other):
        d.mkdir()
        (d / "poolctl.yaml").write_text(FILE)  # the same pool in a second checkout

    def apply_fails(*args, **kwargs):
        raise OperationFailed("terraform apply failed")

    monkeypatch.setattr("poolctl.deploy.run_stacks", apply_fails)
    cfg = parse_config(FILE)
    monkeypatch.chdir(team)
    with pytest.raises(OperationFailed, match="the apply did not finish"):
        runtime.rollout_start(cfg, Path("poolctl.yaml"), cfg.pools[0], "aws",
                              ApplyOps(None), image=NEW, confirm=lambda q: True,
                              sandbox=True, outdir=Path("cdktf.out"))
    assert NEW in (team / "poolctl.yaml").read_text()
    record = runtime.load_record(cfg, cfg.pools[0], "aws")
    assert record["file"] == str((team / "poolctl.yaml").resolve())

    monkeypatch.chdir(other)
    out = runtime.rollout_rollback(cfg, Path("poolctl.yaml"), cfg.pools[0], "aws",
                                   ApplyOps(None), confirm=_no, sandbox=True,
                                   outdir=Path("cdktf.out"))
    assert out["how"] == "file"
    assert (team / "poolctl.yaml").read_text() == FILE  # restored
    assert (other / "poolctl.yaml").read_text() == FILE  # never touched


def test_a_record_with_a_relative_path_is_not_guessed(tmp_path, monkeypatch, capsys):
    """Records written before paths were absolute: say so, edit nothing."""
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "poolctl.yaml").write_text(FILE.replace("v0.11.0", "v0.12.0"))
    cfg = parse_config(FILE)
    runtime.save_record(cfg, cfg.pools[0], "aws", {
        "stack": "acme-chat-70b-aws", "file": "poolctl.yaml", "key": "serving.image",
        "from": "vllm/vllm-openai:v0.11.0", "to": NEW, "status": "applied",
        "rollout_id": None, "action": "start"}, new=True)
    runtime.rollout_rollback(cfg, Path("poolctl.yaml"), cfg.pools[0], "aws", ApplyOps(None),
                             confirm=_no, sandbox=True, outdir=Path("cdktf.out"))
    assert NEW in (tmp_path / "poolctl.yaml").read_text()
    assert "set serving.image=vllm/vllm-openai:v0.11.0 in it by hand" in capsys.readouterr().err
