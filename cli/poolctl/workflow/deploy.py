"""A deploy or a destroy, start to end, in one place:

1. the checks before anything is synthesized (`preflight`): the HTTPS listener's certificate,
   the quota the pools' peak needs, the sizes `poolctl warm` set that the apply keeps;
2. each pool's plan, computed once (`plan_pool`) and handed to the stack, the cost lines and
   the checks alike;
3. synthesis and each stack's Terraform (`deploy.StackRun`): init, plan, the answer (the
   command asks it), the step before the apply (GCP keeps the template a rollout runs; a
   destroy deletes what Terraform does not own first), apply;
4. after the apply (`finish`): launches the group could not make, launch windows written
   over an earlier minimum, the instance templates a destroyed GCP pool kept.

Typed records at every seam (`Preflight`, `KeptSizes`, `AfterApply`, `StackResult`); no
callback up to the command: it calls the steps in order and renders what they return.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from poolctl import deploy, runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import DeployChecks, StepsRollouts, TemplatesDeleted
from poolctl.config import Config, Target
from poolctl.deploy import StackResult, StackRun
from poolctl.endpoints import CloudEndpoints
from poolctl.errors import OperationFailed, PoolctlError
from poolctl.progress import log
from poolctl.sizing import PoolPlan, plan_pool
from poolctl.terraform import Terraform


@dataclass(frozen=True)
class KeptSizes:
    """What the apply keeps of the sizes `warm` set: Terraform variables (TF_VAR_...), and
    the lines saying why."""

    env: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preflight:
    """One target's checks before anything is synthesized."""

    target: Target
    plan: PoolPlan
    certificate_note: str | None  # the certificate could not be checked (or --plan-only)
    shortfalls: tuple[str, ...]  # quota lines the pool's peak falls short of
    kept: KeptSizes


@dataclass(frozen=True)
class AfterApply:
    launches_failing: tuple[str, ...] = ()
    windows_rebased: tuple[str, ...] = ()
    deleted_templates: dict[str, TemplatesDeleted] = field(default_factory=dict)


class Deploy:
    """One `poolctl deploy` (or `destroy`) of `targets`."""

    def __init__(self, cfg: Config, targets: list[Target], endpoints: CloudEndpoints, *,
                 destroy: bool, plan_only: bool, outdir: Path, mirror: str | None,
                 skip_quota_check: bool = False, verbose: bool = False) -> None:
        self.cfg, self.targets, self.endpoints = cfg, targets, endpoints
        self.destroy, self.plan_only, self.outdir = destroy, plan_only, outdir
        self.mirror, self.skip_quota_check, self.verbose = mirror, skip_quota_check, verbose
        self.started = time.time()
        # The file's view of each pool, once: stack, cost lines and checks read the same.
        self.plans = [plan_pool(t.pool, t.cloud) for t in targets]
        self._before_apply: Callable[[Terraform], bool] | None = None

    # -- 1. before anything is synthesized --------------------------------------------

    def preflight(self) -> list[Preflight]:
        """The checks of every target (none for a destroy). Raises what stops the deploy
        at once: a wrong certificate (reported only with --plan-only), quotas that cannot be
        read; a quota shortfall is in the records (`refusal` says whether it stops it)."""
        if self.destroy:
            return [Preflight(t, p, None, (), KeptSizes())
                    for t, p in zip(self.targets, self.plans, strict=True)]
        notes = [self._certificate(t) for t in self.targets]
        out = []
        for t, plan, note in zip(self.targets, self.plans, notes, strict=True):
            ops = runtime.get_ops(t.cloud, self.endpoints)
            short: list[str] = []
            if not self.skip_quota_check:
                try:
                    short = [f"{t.pool.name}/{t.cloud}: {line}"
                             for line in runtime.deploy_quota(self.cfg, t.pool, t.cloud, ops)]
                except OperationFailed as e:
                    raise OperationFailed(f"{e}; or deploy with --skip-quota-check") from None
            env, reasons = runtime.deploy_keeps(self.cfg, t.pool, t.cloud, ops, plan)
            out.append(Preflight(t, plan, note, tuple(short), KeptSizes(env, tuple(reasons))))
        return out

    def refusal(self, checked: list[Preflight]) -> OperationFailed | None:
        """What stops the deploy after the checks: a quota shortfall (not with --plan-only,
        which only reports it)."""
        short = [s for p in checked for s in p.shortfalls]
        if not short or self.plan_only:
            return None
        return OperationFailed(
            f"deploy: not enough quota for the pools' peak ({len(short)} shortfall(s) "
            "above); nothing was applied. File an increase with `poolctl quota request`, "
            "or deploy anyway with --skip-quota-check")

    def _certificate(self, t: Target) -> str | None:
        """The AWS placement's certificate exists, is issued and is in its region; else the
        apply would point port 80 at an HTTPS listener that never comes."""
        placement = t.pool.aws
        if t.cloud != Cloud.aws or placement is None or not placement.certificate_arn:
            return None
        ops = runtime.get_ops(t.cloud, self.endpoints)
        assert isinstance(ops, DeployChecks)  # AWS's ops check what a deploy needs
        idx = [p.name for p in self.cfg.pools].index(t.pool.name)
        try:
            return ops.certificate_note(f"pools[{idx}].aws.certificate_arn",
                                        placement.certificate_arn, placement.region)
        except PoolctlError as e:
            if not self.plan_only:
                raise
            return str(e)

    # -- 2, 3. synthesis and each stack's Terraform -----------------------------------

    def stacks(self, checked: list[Preflight]) -> list[StackRun]:
        """The stacks synthesized from the plans, ready for their steps."""
        self._before_apply = (
            runtime.destroy_before_apply(self.cfg, self.targets, self.endpoints)
            if self.destroy else runtime.deploy_before_apply(self.targets))
        # looked up at each call, not bound at import: a test's stand-in (tests/fakes/stack.py)
        # replaces deploy.stack_runs for one test and must not stay bound here after it
        return deploy.stack_runs(
            self.cfg, self.targets, [p.plan for p in checked], outdir=self.outdir,
            endpoints=self.endpoints, destroy=self.destroy, mirror=self.mirror,
            kept=[(dict(p.kept.env), list(p.kept.reasons)) for p in checked],
            verbose=self.verbose)

    def apply(self, run: StackRun) -> None:
        """After the answer: the step before the apply (a state change plans again), then
        the apply."""
        if self._before_apply is not None and self._before_apply(run.tf):
            run.replan()
        run.apply()

    # -- 4. after the apply ------------------------------------------------------------

    def finish(self, results: list[StackResult]) -> AfterApply:
        if self.destroy:
            return AfterApply(deleted_templates=self._kept_versions(results))
        failing, rebased = [], []
        for t, plan, r in zip(self.targets, self.plans, results, strict=True):
            if not r.applied:
                continue
            ops = runtime.get_ops(t.cloud, self.endpoints)
            if line := runtime.deploy_launches(self.cfg, t.pool, t.cloud, ops, self.started):
                failing.append(line)
            if line := runtime.deploy_windows(self.cfg, t.pool, t.cloud, ops, plan):
                log(f"== {r.stack}: {line}")
                rebased.append(line)
        return AfterApply(launches_failing=tuple(failing), windows_rebased=tuple(rebased))

    def _kept_versions(self, results: list[StackResult]) -> dict[str, TemplatesDeleted]:
        """A cloud whose rollouts poolctl steps (GCP) keeps each rollout's previous version
        outside Terraform's state (the rollback target); once the pool is destroyed, delete
        those too."""
        out: dict[str, TemplatesDeleted] = {}
        for t, r in zip(self.targets, results, strict=True):
            ops = runtime.get_ops(t.cloud, self.endpoints)
            if not r.applied or not isinstance(ops, StepsRollouts):
                continue
            done = ops.delete_pool_templates(self.cfg, t.pool)
            for line in done.failed:
                log(f"poolctl: {r.stack}: {line}")
            if done.deleted:
                log(f"{r.stack}: deleted kept instance templates: {', '.join(done.deleted)}")
            out[r.stack] = done
        return out
