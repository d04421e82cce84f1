"""A rollout records the file it edited by its absolute path: `rollout rollback` run from
another directory (where another poolctl.yaml may sit) restores the file the rollout
changed, and only that one."""

from __future__ import annotations

from pathlib import Path

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import Group, QuotaLine
from poolctl.config import parse_config
from poolctl.endpoints import REAL_CLOUDS
from poolctl.errors import OperationFailed
from tests.configs import pool_yaml
from tests.fakes.stack import failing_apply, rollback, start_rollout

FILE = pool_yaml(with_gcp=False)
NEW = "vllm/vllm-openai:v0.12.0"


class ApplyOps:
    """The cloud as a rollout that has not started sees it: a group, room in the quota."""

    cloud = "aws"
    endpoints = REAL_CLOUDS

    def find_group(self, cfg, pool):
        return Group(cloud="aws", name="acme-chat-70b", region="us-east-1", min_nodes=1,
                     max_nodes=7, desired_nodes=1, warm_min_nodes=2, warm_state="stopped",
                     version="1")

    def rollout_state(self, group):
        return None

    def quota_lines(self, cfg, pool, needs):
        return [QuotaLine(n.name, n.unit, n.scope, n.needed, 10_000, in_use=0,
                          pool_in_use=0) for n in needs]

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

    failing_apply(monkeypatch)
    cfg = parse_config(FILE)
    monkeypatch.chdir(team)
    with pytest.raises(OperationFailed, match="the apply did not finish"):
        start_rollout(cfg, Path("poolctl.yaml"), cfg.pools[0], Cloud.aws, ApplyOps(),
                      image=NEW, outdir=Path("cdktf.out"))
    assert NEW in (team / "poolctl.yaml").read_text()
    record = runtime.load_record(cfg, cfg.pools[0], "aws")
    assert record.file == str((team / "poolctl.yaml").resolve())

    monkeypatch.chdir(other)
    out = rollback(cfg, Path("poolctl.yaml"), cfg.pools[0], Cloud.aws, ApplyOps(),
                   confirm=_no, outdir=Path("cdktf.out"))
    assert out["how"] == "file"
    assert (team / "poolctl.yaml").read_text() == FILE  # restored
    assert (other / "poolctl.yaml").read_text() == FILE  # never touched


def test_a_record_with_a_relative_path_is_not_guessed(tmp_path, monkeypatch, capsys):
    """Records written before paths were absolute: say so, edit nothing."""
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "poolctl.yaml").write_text(FILE.replace("v0.11.0", "v0.12.0"))
    assert NEW in (tmp_path / "poolctl.yaml").read_text()
    cfg = parse_config(FILE)
    runtime.save_record(cfg, cfg.pools[0], "aws", runtime.RolloutRecord(
        stack="acme-chat-70b-aws", pool=cfg.pools[0].name, cloud=Cloud.aws,
        file="poolctl.yaml", key="serving.image", from_value="vllm/vllm-openai:v0.11.0",
        to_value=NEW, status="applied"), new=True)
    rollback(cfg, Path("poolctl.yaml"), cfg.pools[0], Cloud.aws, ApplyOps(), confirm=_no,
             outdir=Path("cdktf.out"))
    assert NEW in (tmp_path / "poolctl.yaml").read_text()
    assert "set serving.image=vllm/vllm-openai:v0.11.0 in it by hand" in capsys.readouterr().err
