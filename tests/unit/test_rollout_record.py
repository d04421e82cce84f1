"""RolloutRecord: the JSON form of a rollout record, and records older poolctls wrote."""

from __future__ import annotations

import json

from poolctl import naming, runtime
from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.runtime import RolloutRecord
from tests.configs import pool_yaml

REC = RolloutRecord(
    stack="acme-chat-70b-aws", pool="chat-70b", cloud=Cloud.aws, file="/srv/poolctl.yaml",
    key="serving.image", from_value="vllm/vllm-openai:v0.11.0",
    to_value="vllm/vllm-openai:v0.12.0", line=16, group_version_from="3",
    group_version_to="4", no_surge=True, status="started", rollout_id="r-1",
    action="start", started_at="2026-02-01T09:00:00+00:00",
)
WHERE = {"stack": "acme-chat-70b-aws", "pool": "chat-70b", "cloud": Cloud.aws}


def test_json_round_trip_keeps_the_keys_and_their_order():
    data = REC.to_json()
    # The keys `rollout start` has always written, in its order (`rollout status --json`
    # prints them as the record's); `restored` only once a rollback tried.
    assert list(data) == ["stack", "pool", "cloud", "file", "key", "from", "to", "line",
                          "group_version_from", "group_version_to", "no_surge", "status",
                          "rollout_id", "action", "started_at"]
    assert RolloutRecord.from_json(json.loads(json.dumps(data)), **WHERE) == REC
    restored = RolloutRecord.from_json({**data, "restored": False}, **WHERE)
    assert restored.restored is False and restored.to_json()["restored"] is False


def test_node_image_record_keeps_none():
    # a node image the file did not name: `from` null, and back to it is `to` null
    rec = RolloutRecord.from_json({**REC.to_json(), "key": "aws.ami_id", "from": None},
                                  **WHERE)
    assert (rec.from_value, rec.to_json()["from"]) == (None, None)


def test_old_record_file_reads_with_defaults(tmp_path, monkeypatch):
    """A record as an early poolctl wrote it: the file as typed (relative), no pool, cloud,
    line, group versions, no_surge, action or started_at."""
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    cfg = parse_config(pool_yaml(with_gcp=False))
    pool = cfg.pools[0]
    stack = naming.stack_name(cfg, pool, Cloud.aws)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / f"{stack}.json").write_text("""{
  "history": [],
  "current": {
    "stack": "STACK",
    "file": "poolctl.yaml",
    "key": "serving.image",
    "from": "vllm/vllm-openai:v0.11.0",
    "to": "vllm/vllm-openai:v0.12.0",
    "status": "applied",
    "rollout_id": null
  }
}
""".replace("STACK", stack))
    rec = runtime.load_record(cfg, pool, Cloud.aws)
    assert rec == RolloutRecord(
        stack=stack, pool=pool.name, cloud=Cloud.aws, file="poolctl.yaml",
        key="serving.image", from_value="vllm/vllm-openai:v0.11.0",
        to_value="vllm/vllm-openai:v0.12.0", line=None, group_version_from=None,
        group_version_to=None, no_surge=False, status="applied", rollout_id=None,
        action="start", started_at="", restored=None)


def test_save_moves_the_current_record_to_history(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    cfg = parse_config(pool_yaml(with_gcp=False))
    pool = cfg.pools[0]
    runtime.save_record(cfg, pool, Cloud.aws, REC, new=True)
    second = RolloutRecord.from_json({**REC.to_json(), "rollout_id": "r-2"}, **WHERE)
    runtime.save_record(cfg, pool, Cloud.aws, second, new=True)
    data = json.loads(runtime.record_path(cfg, pool, Cloud.aws).read_text())
    assert data["history"] == [REC.to_json()]
    assert runtime.load_record(cfg, pool, Cloud.aws) == second


def test_missing_or_empty_record_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    cfg = parse_config(pool_yaml(with_gcp=False))
    assert runtime.load_record(cfg, cfg.pools[0], Cloud.aws) is None
    path = runtime.record_path(cfg, cfg.pools[0], Cloud.aws)
    path.parent.mkdir(parents=True)
    path.write_text('{"history": [], "current": {}}')
    assert runtime.load_record(cfg, cfg.pools[0], Cloud.aws) is None
