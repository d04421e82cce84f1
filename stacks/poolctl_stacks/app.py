"""Synthesis: one stack per (pool, cloud). Entry point of `cdktn synth` (see cdktf.json).

This module and `poolctl_stacks.*` are the only places that import cdktn, so the generator
can be replaced without touching the rest of poolctl.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from poolctl import naming
from poolctl.bootscript import render_boot_script
from poolctl.cloud import Cloud
from poolctl.config import Config, Target, load_config
from poolctl.errors import PoolctlError
from poolctl.rules import refuse_invalid
from poolctl.sizing import PoolPlan

if TYPE_CHECKING:  # cdktn loads its Node kernel on import: only where a stack is built
    from cdktn import App

    from poolctl_stacks.base import PoolStack


def stack_class(cloud: Cloud) -> type[PoolStack]:
    # Import per cloud: synthesizing AWS never loads the Google provider and vice versa.
    if cloud == Cloud.aws:
        from poolctl_stacks.aws.stack import AwsPoolStack  # noqa: PLC0415 (a provider's load)

        return AwsPoolStack
    from poolctl_stacks.gcp.stack import GcpPoolStack  # noqa: PLC0415 (a provider's load)

    return GcpPoolStack


def add_stacks(app: App, cfg: Config, targets: list[Target],
               plans: list[PoolPlan] | None = None) -> list[str]:
    """A stack per target, each from its plan (computed here when none is given)."""
    refuse_invalid(cfg, targets)  # the one validation source: the stacks check nothing
    names = []
    for i, target in enumerate(targets):
        pool, cloud = target.pool, target.cloud
        name = naming.stack_name(cfg, pool, cloud)
        stack_class(cloud)(app, name, cfg=cfg, pool=pool,
                           user_data=render_boot_script(cfg, pool, cloud),
                           plan=plans[i] if plans is not None else None)
        names.append(name)
    return names


Synthesis = tuple[Config, list[Target]] | tuple[Config, list[Target], list[PoolPlan] | None]


def synth(configs: Sequence[Synthesis], outdir: str | Path) -> list[Path]:
    """Write `<outdir>/stacks/<stack>/cdk.tf.json` for every target; return the stack dirs."""
    from cdktn import App  # noqa: PLC0415 (cdktn starts its jsii kernel on import)

    # Absolute: the jsii kernel resolves a relative outdir against its own folder, which is
    # the one it started in (another, in a process that synthesizes more than once).
    app = App(outdir=str(Path(outdir).resolve()), skip_validation=False)
    names: list[str] = []
    for cfg, targets, *plans in configs:  # (config, targets[, their plans])
        names += add_stacks(app, cfg, targets, plans[0] if plans else None)
    app.synth()
    return [Path(outdir) / "stacks" / n for n in names]


def example_configs(root: Path) -> list[tuple[Config, list[Target]]]:
    out = []
    for f in sorted(root.glob("examples/*/poolctl.yaml")):
        cfg = load_config(f)
        out.append((cfg, cfg.targets(None, None)))
    return out


def user_config() -> tuple[Config, list[Target]] | None:
    """In a user's repository (`poolctl init`): $POOLCTL_FILE or ./poolctl.yaml, every
    placement, refused on a failed rule as `poolctl synth` refuses it. None in this one."""
    if os.environ.get("POOLCTL_EXAMPLES_ROOT"):
        return None
    path = os.environ.get("POOLCTL_FILE") or "poolctl.yaml"
    if not os.environ.get("POOLCTL_FILE") and not Path(path).is_file():
        return None

    cfg = load_config(path)
    targets = cfg.targets(None, None)
    refuse_invalid(cfg, targets)  # here too, before App() creates the out dir
    return cfg, targets


def main() -> None:
    """`cdktn synth`: the user's poolctl.yaml (see user_config), else, at this repository's
    root, every example, every placement."""
    from cdktn import App  # noqa: PLC0415 (cdktn starts its jsii kernel on import)

    try:
        mine = user_config()
        configs = [mine] if mine else example_configs(
            Path(os.environ.get("POOLCTL_EXAMPLES_ROOT", ".")))
    except PoolctlError as e:  # one line per problem, as the poolctl command prints them
        sys.stderr.write("".join(f"poolctl: {line}\n" for line in str(e).splitlines()))
        sys.exit(e.exit_code)
    app = App()  # after the checks: it creates the out dir (CDKTF_OUTDIR, from the CLI)
    for cfg, targets in configs:
        add_stacks(app, cfg, targets)
    app.synth()


if __name__ == "__main__":
    main()
