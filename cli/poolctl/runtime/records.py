"""Rollout records: $POOLCTL_HOME/rollouts/<stack>.json, what `rollout rollback` returns to.
"""

from __future__ import annotations

import json
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


def rollouts_dir() -> Path:

    return poolctl_home() / "rollouts"


def record_path(cfg: Config, pool: Pool, cloud: Cloud) -> Path:
    return rollouts_dir() / f"{naming.stack_name(cfg, pool, cloud)}.json"


def load_record(cfg: Config, pool: Pool, cloud: Cloud) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(cfg, pool, cloud).read_text())
    except (OSError, ValueError):
        return None
    return data.get("current") if isinstance(data, dict) else None


def save_record(cfg: Config, pool: Pool, cloud: Cloud, rec: dict[str, Any],
                new: bool = False) -> None:

    p = record_path(cfg, pool, cloud)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        data = {"history": []}
    if new and data.get("current"):
        data.setdefault("history", []).append(data["current"])
    data["current"] = rec
    write_private(p, json.dumps(data, indent=2) + "\n")


def _annotate(state: RolloutState, rec: dict[str, Any] | None) -> None:
    """Name what rolls (image / model version) when the record matches this rollout."""
    if rec and rec.get("rollout_id") == state.id:
        def v(x: object) -> str:  # a launch template version number (AWS), a template name (GCP)
            return f"v{x}" if str(x).isdigit() else str(x)

        state.from_version = f"{rec['key']}={rec['from']} ({v(rec.get('group_version_from'))})"
        state.to_version = f"{rec['key']}={rec['to']} ({v(rec.get('group_version_to'))})"
