"""A stand-in for one stack's Terraform (`poolctl.deploy.StackRun`), for tests of the
workflows that drive it where Terraform cannot run (GCP: the google provider is not in the
offline mirror) or where only poolctl's side of the steps is under test.

`StoodInStack(name, workdir, on_apply=..., tf=...)` has StackRun's steps: `prepare`, `plan`
(one instance template to replace), `needs_answer`, `question`, `replan`, `apply` (calls
`on_apply()`, the cloud side of the apply), `finish`; its `tf` shows a saved plan
(`PlanShown`). `stand_in(monkeypatch, stack)` makes
`deploy.stack_runs` return it, and records the arguments it was called with.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from poolctl import deploy
from poolctl.terraform import PlanSummary


class PlanShown:
    """What a workflow reads of the stack's Terraform between the answer and the apply:
    `show -json tfplan` answers `plan` (the saved plan); every command is recorded."""

    def __init__(self, plan: dict[str, Any] | None = None) -> None:
        self.plan = plan or {}
        self.calls: list[tuple[str, ...]] = []

    def run(self, phase: str, *args: str, capture: bool = False) -> Any:
        self.calls.append(args)
        return SimpleNamespace(stdout=json.dumps(self.plan) if args[0] == "show" else "")


class StoodInStack:
    def __init__(self, name: str, workdir: str, *, on_apply: Callable[[], None] = lambda: None,
                 tf: PlanShown | None = None) -> None:
        self.name, self.workdir, self.on_apply = name, workdir, on_apply
        self.tf = tf or PlanShown()
        self.steps: list[str] = []
        self.applied = False

    def prepare(self) -> None:
        self.steps.append("prepare")

    def plan(self) -> PlanSummary:
        self.steps.append("plan")
        return PlanSummary(change=Counter({"instance_template": 1}))

    def needs_answer(self, plan_only: bool) -> bool:
        return not plan_only

    def question(self) -> str:
        return f"apply {self.name}: 0 to add, 1 to change, 0 to destroy?"

    def replan(self) -> None:
        self.steps.append("replan")

    def apply(self) -> None:
        self.steps.append("apply")
        self.on_apply()
        self.applied = True

    def finish(self) -> deploy.StackResult:
        self.steps.append("finish")
        return deploy.StackResult(stack=self.name, workdir=self.workdir, applied=self.applied)


def stand_in(monkeypatch: Any, stack: StoodInStack | Callable[..., StoodInStack]
             ) -> list[dict[str, Any]]:
    """`deploy.stack_runs` returns `stack` (or what `stack(new_cfg, targets)` makes); the
    list returned gets each call's keyword arguments and targets."""
    calls: list[dict[str, Any]] = []

    def stack_runs(cfg: Any, targets: list[Any], plans: list[Any], **kw: Any) -> list[Any]:
        calls.append({**kw, "cfg": cfg, "targets": targets})
        return [stack if isinstance(stack, StoodInStack) else stack(cfg, targets)]

    monkeypatch.setattr(deploy, "stack_runs", stack_runs)
    return calls


def start_rollout(cfg: Any, file: Any, pool: Any, cloud: Any, ops: Any, *, outdir: Any,
                  confirm: Callable[[str], bool] = lambda q: True, no_surge: bool = False,
                  **flags: Any) -> Any:
    """`rollout start --image/--model-version/--node-image` driven as the command drives it
    (`commands.rollout.run_start`), `confirm` answering."""
    from poolctl.commands.rollout import run_start
    from poolctl.workflow.rollout import Change, RolloutStart

    return run_start(RolloutStart(cfg, file, pool, cloud, ops,
                                  Change.from_flags(cloud, **flags), no_surge=no_surge,
                                  outdir=outdir, mirror=None), confirm)


def rollback(cfg: Any, file: Any, pool: Any, cloud: Any, ops: Any, *, outdir: Any,
             confirm: Callable[[str], bool] = lambda q: True) -> dict[str, Any]:
    """`rollout rollback` driven as the command drives it; its --json (without the wait)."""
    from poolctl.commands.rollout import run_rollback
    from poolctl.workflow.rollout import RolloutRollback

    return run_rollback(RolloutRollback(cfg, file, pool, cloud, ops, outdir=outdir,
                                        mirror=None), confirm).to_json()


def failing_apply(monkeypatch: Any, message: str = "terraform apply failed") -> None:
    """The stack's apply fails as Terraform's would."""
    from poolctl.errors import OperationFailed

    def fail() -> None:
        raise OperationFailed(message)

    stand_in(monkeypatch, lambda cfg, targets: StoodInStack("stack", ".", on_apply=fail))
