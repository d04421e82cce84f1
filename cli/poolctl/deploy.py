"""Synthesize, then drive Terraform for each (pool, cloud) stack: deploy and destroy."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import poolctl
from poolctl import naming
from poolctl.adaptors.stacks import poolctl_stacks, stacks_app
from poolctl.cloud import Cloud
from poolctl.clouds.base import DeployChecks, Found
from poolctl.clouds.registry import get_ops
from poolctl.config import Config, Pool, Target
from poolctl.contract import aws as contract_aws
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import NotConfirmed
from poolctl.home import private_dir, write_private
from poolctl.progress import log
from poolctl.sizing import PoolPlan, hourly_cost, plan_pool, reserved_nodes
from poolctl.terraform import (
    PlanSummary,
    ResourceChange,
    Terraform,
    cli_config,
    endpoint_override,
    find_binary,
    log_path,
)

# Import blocks for resources an interrupted apply created but did not record (see adopt).
ADOPT_FILE = "poolctl_adopt.tf.json"


@dataclass
class StackResult:
    """One stack's run: its plan (the summary, the size changes and one change a resource, as
    read from `terraform show -json`), whether it was applied, its outputs and timings."""

    stack: str
    workdir: str
    plan: PlanSummary | None = None  # None: not planned (yet)
    applied: bool = False
    outputs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    adopted: list[str] = field(default_factory=list)  # addresses imported by `adopt`
    kept: list[str] = field(default_factory=list)  # runtime sizes the apply keeps, and why
    cost_per_hour_usd: dict[str, Any] = field(default_factory=dict)  # pool_cost
    log: str = ""  # Terraform's output

    @property
    def changes(self) -> list[ResourceChange]:
        return list(self.plan.resources) if self.plan is not None else []

    def to_json(self) -> dict[str, Any]:
        """`deploy --json`'s entry of the stack (docs/commands.md)."""
        plan = self.plan
        return {"stack": self.stack, "workdir": self.workdir,
                "summary": plan.to_json() if plan is not None else {},
                "applied": self.applied, "outputs": self.outputs, "timings": self.timings,
                "adopted": self.adopted, "kept": self.kept,
                "sizes": [c.to_json() for c in plan.sizes] if plan is not None else [],
                "cost_per_hour_usd": self.cost_per_hour_usd, "log": self.log,
                "changes": [c.to_json() for c in self.changes]}


def pool_cost(pool: Pool, cloud: Cloud, summary: PlanSummary, plan: PoolPlan | None = None
              ) -> dict[str, Any]:
    """The pool's cost per hour at the catalog's price per node: at the group's minimum and
    maximum (plus warm nodes kept running) as the plan leaves them (as they were, for a
    destroy; sizes `warm` set included); `plan`'s figures when the plan has no group."""

    plan = plan or plan_pool(pool, cloud)
    nodes = {"min": plan.nodes.min, "max": plan.nodes.max}
    warm_running = plan.warm_running_nodes
    sized = summary.size_values
    for key in ("min", "max"):
        for f in (f"{key}_size", f"autoscaling_policy.{key}_replicas"):
            if isinstance(size := sized.get(f), int):
                nodes[key] = size
    if sized.get("warm_pool.pool_state") == "Running" and isinstance(
            warm_size := sized.get("warm_pool.min_size"), int):
        warm_running = warm_size
    price, reserved = plan.price_per_node_hour_usd, reserved_nodes(pool, cloud)
    return {"instance_type": plan.instance_type, "price_per_node_hour_usd": price,
            "replicas_per_node": plan.replicas_per_node, "nodes": nodes,
            "warm_running_nodes": warm_running,
            "min": hourly_cost(nodes["min"] + warm_running, reserved, price),
            "max": hourly_cost(nodes["max"] + warm_running, reserved, price)}


SYNTH_KEY_FILE = ".poolctl-synth-key"


def synth_key(cfg: Config, targets: list[Target]) -> str:
    """What a synthesized stack depends on: the parsed config, the targets, poolctl's own
    code and data (stacks, boot templates, catalog) and the generator's versions."""

    h = hashlib.sha256(cfg.model_dump_json().encode())
    h.update(repr([(t.pool.name, t.cloud) for t in targets]).encode())
    for pkg in (poolctl, poolctl_stacks):
        for root in pkg.__path__:
            for f in sorted(Path(root).rglob("*")):
                if f.suffix in {".py", ".j2", ".yaml", ".json"} and f.is_file():
                    h.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes())
    for dist in ("cdktn", "cdktn-provider-aws", "cdktn-provider-google"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            pass
    return h.hexdigest()


def synth_targets(cfg: Config, targets: list[Target], outdir: Path,
                  plans: list[PoolPlan] | None = None) -> list[Path]:
    """Synthesize, or reuse stacks synthesized from the same inputs: the generator costs
    5-20 s of CPU (jsii), which a `deploy --plan-only` or a rollout's second apply need not
    pay again."""
    key = synth_key(cfg, targets)
    dirs = [Path(outdir) / "stacks" / naming.stack_name(cfg, t.pool, t.cloud) for t in targets]
    marks = [d / SYNTH_KEY_FILE for d in dirs]
    if all((d / "cdk.tf.json").is_file() and m.is_file() and m.read_text() == key
           for d, m in zip(dirs, marks, strict=True)):
        log(f"stacks unchanged since the last synth in {outdir}/stacks: reusing them")
        return dirs
    log(f"synthesizing {len(targets)} stack(s) into {outdir}/stacks ...")
    # the only road to cdktn; each stack built from its plan (the file's view: `plan_pool`
    # without a node image, so the JSON is the same on every machine)
    made: list[Path] = stacks_app.synth([(cfg, targets, plans)], outdir)
    for d in made:
        (d / SYNTH_KEY_FILE).write_text(key)
    return made


def endpoint_workdir(stack_dir: Path, region: str, endpoints: CloudEndpoints
                     ) -> tuple[Path, dict[str, str]]:
    """The stack's Terraform folder when its calls go to one AWS endpoint (the sandbox): a copy
    of the synthesized stack in `endpoints.terraform_home` with an override aiming the provider
    there (state in a local file beside it) and, where the endpoint has no SSM AMI parameter,
    its first Amazon image as the node image."""
    assert endpoints.aws is not None and endpoints.terraform_home is not None
    home = endpoints.terraform_home
    work = private_dir(home / "deploy" / stack_dir.name)
    write_private(work / "cdk.tf.json", (stack_dir / "cdk.tf.json").read_bytes())
    state = private_dir(home / "state") / f"{stack_dir.name}.tfstate"
    write_private(work / "endpoint_override.tf.json",
                  json.dumps(endpoint_override(region, endpoints.aws, state), indent=2))
    env: dict[str, str] = {}
    if endpoints.stand_in_images:
        env = contract_aws.sandbox_env(_checks(Cloud.aws, endpoints).stand_in_image(region))
    # AWS_ENDPOINT_URL as well as the override's per-service endpoints: a service the stack
    # starts to use before ENDPOINT_SERVICES lists it still reaches the endpoint, never AWS.
    env.update(endpoints.aws.env(region))
    return work, env


def _checks(cloud: Cloud, endpoints: CloudEndpoints) -> DeployChecks:
    ops = get_ops(cloud, endpoints)
    assert isinstance(ops, DeployChecks)  # asked for AWS only, whose ops check deploys
    return ops


def adopt(tf: Terraform, work: Path, cfg: Config, pool: Pool, cloud: Cloud,
          endpoints: CloudEndpoints = REAL_CLOUDS) -> list[Found]:
    """Import blocks for what an earlier, interrupted apply created but did not record.

    Only resources the state lacks are looked up, so a deploy of a complete stack makes no
    cloud call here. Adopted: those whose contract tags prove poolctl created them for this
    pool (`poolctl.clouds.aws.adopt`). GCP: not looked up yet."""
    imports = work / ADOPT_FILE
    imports.unlink(missing_ok=True)  # last run's imports are in the state by now
    if cloud != Cloud.aws:
        return []
    config = json.loads((work / "cdk.tf.json").read_text())
    state = tf.state_resources()
    if all(f"{kind}.{name}" in state for kind, blocks in config.get("resource", {}).items()
           for name in blocks):
        return []

    tags = naming.aws_tags(cfg, pool)
    contract = {k: tags[k] for k in (naming.TAG_PROJECT, naming.TAG_POOL)}
    stack = naming.stack_name(cfg, pool, cloud)
    assert pool.aws is not None  # targets pair a pool with its own placements
    found = _checks(cloud, endpoints).adoptable(
        pool.aws.region, config, state, contract,
        on_denied=lambda address, code: log(
            f"== {stack}: not looking for {address} left by an interrupted apply ({code}); "
            "if it exists, Terraform reports it"))
    if found:
        write_private(imports, json.dumps(
            {"import": [{"to": f.address, "id": f.id} for f in found]}, indent=2))
    for f in found:
        log(f"== {stack}: adopting {f.what} ({f.id}): created "
            f"by an earlier apply that did not record it (its poolctl tags match); imported "
            f"as {f.address}, not created again")
    return found


class StackRun:
    """One stack's Terraform, step by step, for the workflow that drives it (a deploy, a
    destroy, a rollout's apply): `prepare` (workdir, init, adoption), `plan`, then `apply`
    once the caller has its answer, and `finish` (outputs, timings). No callback: the
    caller renders the plan and asks between the steps."""

    def __init__(self, cfg: Config, target: Target, stack_dir: Path, *, plan: PoolPlan,
                 endpoints: CloudEndpoints, destroy: bool, mirror: str | None,
                 extra_env: dict[str, str], kept: list[str], verbose: bool,
                 synth_s: float) -> None:
        self.cfg, self.target, self.plan_ = cfg, target, plan
        self.destroy, self.endpoints, self.synth_s = destroy, endpoints, synth_s
        pool, cloud = target.pool, target.cloud
        self.name = naming.stack_name(cfg, pool, cloud)
        env: dict[str, str] = {}
        work = self.stack_dir = stack_dir
        if cloud == Cloud.aws and endpoints.aws is not None:
            assert pool.aws is not None  # targets pair a pool with its own placements
            work, env = endpoint_workdir(stack_dir, pool.aws.region, endpoints)
            if pool.aws.ami_id:  # a node image (`image build --sandbox`) beats the stand-in
                env.pop(contract_aws.NODE_AMI_ID.env, None)
        if endpoints.before_deploy is not None:
            # Before the apply launches nodes: the sandbox boots them in the plan's time.
            endpoints.before_deploy(cfg, pool)
        env.update(extra_env)
        self.work = work
        self.tf = Terraform(work, mirror=mirror, extra_env=env, label=self.name,
                            verbose=verbose,
                            log=log_path(self.name, "destroy" if destroy else "deploy"))
        self.result = StackResult(stack=self.name, workdir=str(work), kept=kept,
                                  log=str(self.tf.log))
        self.summary: PlanSummary | None = None

    @property
    def binary(self) -> str:
        return Path(self.tf.bin).name

    def prepare(self) -> None:
        """Init (skipped when nothing it depends on changed), and the import blocks for what
        an interrupted apply left behind (a deploy's)."""
        name, tf = self.name, self.tf
        log(f"\n== {name}: Terraform's output goes to {tf.log}"
            + (" (and here)" if tf.verbose else ""))
        for line in self.result.kept:
            log(f"== {name}: {line}")
        if tf.init_current():
            log(f"== {name}: {self.binary} init skipped: providers, lock file and backend "
                "unchanged since the last init")
        else:
            log(f"== {name}: {self.binary} init")
            tf.init()
        if self.destroy:
            (self.work / ADOPT_FILE).unlink(missing_ok=True)
        else:
            self.result.adopted = [f.address for f in adopt(
                tf, self.work, self.cfg, self.target.pool, self.target.cloud, self.endpoints)]

    def plan(self) -> PlanSummary:
        log(f"== {self.name}: {self.binary} plan{' -destroy' if self.destroy else ''}")
        summary = self.tf.plan(destroy=self.destroy)
        res = self.result
        res.plan = summary
        summary.cost = res.cost_per_hour_usd = pool_cost(self.target.pool, self.target.cloud,
                                                         summary, self.plan_)
        self.summary = summary
        return summary

    def needs_answer(self, plan_only: bool) -> bool:
        """Whether the plan is to be applied, so the caller asks `question` first; else the
        line saying why not (no changes, --plan-only)."""
        assert self.summary is not None  # asked after the plan
        if self.summary.empty:
            log(f"== {self.name}: no changes")
            return False
        if plan_only:
            log(f"== {self.name}: --plan-only, nothing applied (plan saved in "
                f"{self.work}/tfplan)")
            return False
        return True

    def refused(self) -> NotConfirmed:
        return NotConfirmed(f"{self.name}: not confirmed; nothing was applied")

    def question(self) -> str:
        """What the caller asks before `apply`."""
        assert self.summary is not None  # asked after the plan
        add, change, gone = self.summary.totals()
        adopting = sum(self.summary.imports.values())
        return (f"{'destroy' if self.destroy else 'apply'} {self.name}: {add} to add, "
                f"{change} to change, {gone} to destroy"
                + (f", {adopting} to import (adopt)" if adopting else "") + "?")

    def replan(self) -> None:
        """After a state change between the answer and the apply (GCP keeps the template a
        rollout replaces): plan again, which only drops what the change took out of
        Terraform's hands. A destroy never re-plans."""
        if self.destroy:
            return
        log(f"== {self.name}: {self.binary} plan (again, after the state change)")
        self.summary = self.tf.plan()
        self.result.plan = self.summary

    def apply(self) -> None:
        log(f"== {self.name}: {self.binary} apply")
        self.tf.apply(phase="destroy" if self.destroy else "apply")
        self.result.applied = True

    def finish(self) -> StackResult:
        res = self.result
        if not self.destroy:
            res.outputs = self.tf.outputs()
        res.timings = {"synth": round(self.synth_s, 1),
                       **{k: round(v, 1) for k, v in self.tf.timings.items()}}
        log(f"== {self.name}: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.timings.items()))
        if self.destroy and res.applied and self.work != self.stack_dir:
            shutil.rmtree(self.work, ignore_errors=True)  # the endpoint's copy, now empty
        return res


def stack_runs(cfg: Config, targets: list[Target], plans: list[PoolPlan], *, outdir: Path,
               endpoints: CloudEndpoints, destroy: bool, mirror: str | None,
               kept: list[tuple[dict[str, str], list[str]]] | None = None,
               extra_env: dict[str, str] | None = None, verbose: bool = False
               ) -> list[StackRun]:
    """The targets' stacks synthesized (each from its plan) and ready to run. Missing
    prerequisites fail before the synth (seconds of work), not after it."""
    for t in targets:
        endpoints.require(t.cloud)
    find_binary()
    cli_config(mirror)
    t0 = time.monotonic()
    dirs = synth_targets(cfg, targets, outdir, plans)
    synth_s = time.monotonic() - t0
    kept = kept or [({}, []) for _ in targets]
    return [StackRun(cfg, t, d, plan=p, endpoints=endpoints, destroy=destroy, mirror=mirror,
                     extra_env={**k_env, **(extra_env or {})}, kept=k_lines, verbose=verbose,
                     synth_s=synth_s)
            for t, d, p, (k_env, k_lines) in zip(targets, dirs, plans, kept, strict=True)]
