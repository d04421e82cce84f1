"""The CDKTF stacks (`poolctl_stacks`), imported on first use: they load cdktf and the
providers' jsii assemblies (seconds of start-up), which only synthesis needs."""

from __future__ import annotations

from poolctl.adaptors.common import LazyModule

_MISSING = "the stack generator is not installed; run `pip install 'poolctl[synth]'`"

poolctl_stacks = LazyModule("poolctl_stacks", _MISSING)
stacks_app = LazyModule("poolctl_stacks.app", _MISSING)
