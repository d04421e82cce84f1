"""Rollout records: $POOLCTL_HOME/rollouts/<stack>.json, what `rollout rollback` returns to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    RolloutState,
)
from poolctl.config import Config, Pool
from poolctl.home import poolctl_home, write_private

# ---------------------------------------------------------------------------------------
# Rollout records: $POOLCTL_HOME/rollouts/<stack>.json


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as `rollout start` recorded it: the file and key it changed, the values
    and group versions on each side, and how far it got (`status`). Its JSON form is the
    record file's `current` (and each `history` entry)."""

    stack: str
    pool: str
    cloud: Cloud
    file: str  # absolute since paths are resolved; older records may hold it as typed
    key: str  # the file's words: serving.image, model.version, aws.ami_id, ...
    from_value: str | None  # None: a node image the file did not name (the default image)
    to_value: str | None  # None: back to the default node image, its line removed
    line: int | None = None
    group_version_from: str | None = None
    group_version_to: str | None = None
    no_surge: bool = False
    # recorded | applied | started | nothing_to_roll | cancel_requested |
    # rollback_requested | rolled_back, or a RolloutStatus the rollout ended in
    status: str = "recorded"
    rollout_id: str | None = None
    action: str = "start"  # start | rollback
    started_at: str = ""  # ISO 8601, UTC
    restored: bool | None = None  # after a rollback: whether the file was put back

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stack": self.stack, "pool": self.pool, "cloud": str(self.cloud),
            "file": self.file, "key": self.key, "from": self.from_value, "to": self.to_value,
            "line": self.line, "group_version_from": self.group_version_from,
            "group_version_to": self.group_version_to, "no_surge": self.no_surge,
            "status": self.status, "rollout_id": self.rollout_id, "action": self.action,
            "started_at": self.started_at,
        }
        if self.restored is not None:  # absent until a rollback tried, as always written
            out["restored"] = self.restored
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, stack: str, pool: str, cloud: Cloud
                  ) -> RolloutRecord:
        """A record as any poolctl wrote it: keys an older one did not write take their
        defaults; stack, pool and cloud, when missing, those of the file it was found in."""
        def opt(key: str) -> str | None:
            v = data.get(key)
            return None if v is None else str(v)

        line = data.get("line")
        restored = data.get("restored")
        return cls(
            stack=str(data.get("stack") or stack), pool=str(data.get("pool") or pool),
            cloud=Cloud(data.get("cloud") or cloud), file=str(data.get("file") or ""),
            key=str(data.get("key") or ""), from_value=opt("from"), to_value=opt("to"),
            line=line if isinstance(line, int) else None,
            group_version_from=opt("group_version_from"),
            group_version_to=opt("group_version_to"), no_surge=bool(data.get("no_surge")),
            status=str(data.get("status") or "recorded"), rollout_id=opt("rollout_id"),
            action=str(data.get("action") or "start"),
            started_at=str(data.get("started_at") or ""),
            restored=restored if isinstance(restored, bool) else None,
        )


def rollouts_dir() -> Path:
    return poolctl_home() / "rollouts"


def record_path(cfg: Config, pool: Pool, cloud: Cloud) -> Path:
    return rollouts_dir() / f"{naming.stack_name(cfg, pool, cloud)}.json"


def load_record(cfg: Config, pool: Pool, cloud: Cloud) -> RolloutRecord | None:
    try:
        data = json.loads(record_path(cfg, pool, cloud).read_text())
    except (OSError, ValueError):
        return None
    current = data.get("current") if isinstance(data, dict) else None
    if not isinstance(current, dict) or not current:
        return None
    return RolloutRecord.from_json(current, stack=naming.stack_name(cfg, pool, cloud),
                                   pool=pool.name, cloud=Cloud(cloud))


def save_record(cfg: Config, pool: Pool, cloud: Cloud, rec: RolloutRecord,
                new: bool = False) -> None:
    """Write `rec` as the current record; `new`: the one it replaces goes to the history
    (kept as written)."""
    p = record_path(cfg, pool, cloud)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        data = {"history": []}
    if new and data.get("current"):
        data.setdefault("history", []).append(data["current"])
    data["current"] = rec.to_json()
    write_private(p, json.dumps(data, indent=2) + "\n")


def annotate_rollout(state: RolloutState, rec: RolloutRecord | None) -> None:
    """Name what rolls (image / model version) when the record matches this rollout."""
    if rec and rec.rollout_id == state.id:
        def v(x: object) -> str:  # a launch template version number (AWS), a template name (GCP)
            return f"v{x}" if str(x).isdigit() else str(x)

        state.from_version = f"{rec.key}={rec.from_value} ({v(rec.group_version_from)})"
        state.to_version = f"{rec.key}={rec.to_value} ({v(rec.group_version_to)})"
