"""CDK Terrain stacks: the only package that imports cdktn (the generator is replaceable)."""

import os
from pathlib import Path

# jsii starts its Node kernel on the first cdktn import and prints a banner when that Node is
# end-of-life (20). The set-up installs Node 22 from npm (JSII_NODE); where the system Node
# is all there is, keep synth output clean.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# The kernel (started after this, on both paths: `poolctl synth` and `cdktn synth` running
# poolctl_stacks.app) loads a provider's submodules as a stack uses them, not all ~2,200 at
# start-up, and lets jsii write its runtime index: synth 4.5 s -> 1.5 s, 835 MB -> 190 MB
# (kernel_hooks.cjs; docs/install.md). NODE_OPTIONS is the variable every Node reads; jsii
# passes this process's environment on.
KERNEL_HOOKS = Path(__file__).with_name("kernel_hooks.cjs")
_REQUIRE = f'--require "{KERNEL_HOOKS}"'
if _REQUIRE not in os.environ.get("NODE_OPTIONS", ""):
    os.environ["NODE_OPTIONS"] = f'{os.environ.get("NODE_OPTIONS", "")} {_REQUIRE}'.strip()
