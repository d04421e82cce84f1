"""Synthesis: one stack per (pool, cloud). Entry point of `cdktf synth` (see cdktf.json).

This module and `poolctl.stacks.*` are the only places that import cdktf, so the generator
can be replaced without touching the rest of poolctl.
"""

from __future__ import annotations

import os
from pathlib import Path

from poolctl import naming
from poolctl.config import Config, Pool, load_config


def stack_class(cloud: str):
    # Import per cloud: synthesizing AWS never loads the Google provider and vice versa.
    if cloud == "aws":
        from poolctl.stacks.aws.stack import AwsPoolStack

        return AwsPoolStack
    from poolctl.stacks.gcp.stack import GcpPoolStack

    return GcpPoolStack


def add_stacks(app, cfg: Config, targets: list[tuple[Pool, str]]) -> list[str]:
    from poolctl.bootscript import render_boot_script

    names = []
    for pool, cloud in targets:
        name = naming.stack_name(cfg, pool, cloud)
        stack_class(cloud)(app, name, cfg=cfg, pool=pool,
                           user_data=render_boot_script(cfg, pool, cloud))
        names.append(name)
    return names


def synth(configs: list[tuple[Config, list[tuple[Pool, str]]]], outdir: str | Path) -> list[Path]:
    """Write `<outdir>/stacks/<stack>/cdk.tf.json` for every target; return the stack dirs."""
    from cdktf import App

    app = App(outdir=str(outdir), skip_validation=False)
    names: list[str] = []
    for cfg, targets in configs:
        names += add_stacks(app, cfg, targets)
    app.synth()
    return [Path(outdir) / "stacks" / n for n in names]


def example_configs(root: Path) -> list[tuple[Config, list[tuple[Pool, str]]]]:
    out = []
    for f in sorted(root.glob("examples/*/poolctl.yaml")):
        cfg = load_config(f)
        out.append((cfg, cfg.targets(None, None)))
    return out


def main() -> None:
    """`cdktf synth` at the repository root: every example, every placement."""
    from cdktf import App

    app = App()  # cdktf CLI passes the out dir through CDKTF_OUTDIR
    root = Path(os.environ.get("POOLCTL_EXAMPLES_ROOT", "."))
    for cfg, targets in example_configs(root):
        add_stacks(app, cfg, targets)
    app.synth()


if __name__ == "__main__":
    main()
