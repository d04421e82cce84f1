"""Runtime operations on a deployed pool, cloud-neutral: quota, warm, status, rollout, one
module each (`common`, `quota`, `warm`, `status`, `fileedit` for the config file's in-place
edits, `records` for the rollout records, `rollout`); this package re-exports what commands
and tests use.

What differs per cloud sits behind `poolctl.clouds.base.CloudOps`, reached through
`poolctl.clouds.registry` (`get_ops`) only; no cloud SDK loads before a cloud is called.
Every operation returns a record
whose `to_json()` is what the command prints with `--json`; progress goes to stderr.

Arithmetic in one place:
- replicas become whole nodes, rounded UP (`nodes_for`), and the result says so;
- quota "needed" is what can run at once: nodes in service + running warm nodes (+ surge in a
  rollout, + warm nodes while they launch); stopped warm nodes do not count;
- an increase asks for `granted + shortfall`: enough for `needed` beside what others use.
"""

from __future__ import annotations

from poolctl.clouds.registry import get_ops
from poolctl.runtime.common import (
    DEFAULT_POLL_S,
    POLL_ENV,
    ROLLOUT_DONE_OK,
    poll_interval,
    watch_hint,
)
from poolctl.runtime.fileedit import (
    NODE_IMAGE_KEYS,
    ROLLOUT_KEYS,
    ROLLOUT_LABELS,
    edit_scalar,
    record_in_file,
    rollout_key,
    set_scalar,
    unset_scalar,
    write_key,
)
from poolctl.runtime.quota import (
    fallback_line,
    fallback_quota_lines,
    quota_check,
    quota_request,
    scaled_needs,
    shared_quota_lines,
    shortfall_line,
)
from poolctl.runtime.records import (
    RolloutRecord,
    annotate_rollout,
    load_record,
    record_path,
    rollouts_dir,
    save_record,
)
from poolctl.runtime.rollout import (
    Checkpoint,
    RolloutStep,
    RolloutView,
    cleanup_versions,
    deploy_before_apply,
    restore_file,
    return_surge,
    rollout_cancel,
    rollout_final_line,
    rollout_progress_line,
    rollout_quota,
    rollout_status,
    rollout_words,
    wait_rollout,
)
from poolctl.runtime.status import (
    DRIFT_QUEUE_MAX,
    DRIFT_WARN,
    forecast_error,
    node_json,
    status,
)
from poolctl.runtime.warm import (
    WarmResult,
    deploy_keeps,
    deploy_launches,
    deploy_quota,
    deploy_windows,
    load_warm_record,
    running_nodes,
    wait_warm,
    warm,
    warm_record_path,
    warm_targets,
)
from poolctl.runtime.windows import (
    NOT_RUNNING,
    WindowsResult,
    cancel_window,
    check_warm_window,
    destroy_before_apply,
    list_windows,
    schedule_window,
    window_line,
)

__all__ = [
    "DEFAULT_POLL_S",
    "DRIFT_QUEUE_MAX",
    "DRIFT_WARN",
    "NODE_IMAGE_KEYS",
    "NOT_RUNNING",
    "POLL_ENV",
    "ROLLOUT_DONE_OK",
    "ROLLOUT_KEYS",
    "ROLLOUT_LABELS",
    "Checkpoint",
    "RolloutRecord",
    "RolloutStep",
    "RolloutView",
    "WarmResult",
    "WindowsResult",
    "annotate_rollout",
    "cancel_window",
    "check_warm_window",
    "cleanup_versions",
    "deploy_before_apply",
    "deploy_keeps",
    "deploy_launches",
    "deploy_quota",
    "deploy_windows",
    "destroy_before_apply",
    "edit_scalar",
    "fallback_line",
    "fallback_quota_lines",
    "forecast_error",
    "get_ops",
    "list_windows",
    "load_record",
    "load_warm_record",
    "node_json",
    "poll_interval",
    "quota_check",
    "quota_request",
    "record_in_file",
    "record_path",
    "restore_file",
    "return_surge",
    "rollout_cancel",
    "rollout_final_line",
    "rollout_key",
    "rollout_progress_line",
    "rollout_quota",
    "rollout_status",
    "rollout_words",
    "rollouts_dir",
    "running_nodes",
    "save_record",
    "scaled_needs",
    "schedule_window",
    "set_scalar",
    "shared_quota_lines",
    "shortfall_line",
    "status",
    "unset_scalar",
    "wait_rollout",
    "wait_warm",
    "warm",
    "warm_record_path",
    "warm_targets",
    "watch_hint",
    "window_line",
    "write_key",
]
