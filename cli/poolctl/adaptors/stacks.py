"""The CDK Terrain stacks (`poolctl_stacks`), imported on first use: they load cdktn and the
providers' jsii assemblies (seconds of start-up), which only synthesis needs.

Before that first import, jsii's Node kernel is told to start in a session of its own
(`JSII_NODE`, the jsii runtime's documented setting for the node it runs): a terminal's
Ctrl-C goes to the foreground process group, which would kill the kernel with poolctl, and
jsii's exit hook would then print a broken pipe's traceback. In its own session the kernel
lives until poolctl ends, and jsii stops it as it always does."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

from poolctl.adaptors.common import LazyModule
from poolctl.files import replace_file
from poolctl.home import poolctl_home, private_dir

_MISSING = "the stack generator is not installed; run `pip install 'poolctl[synth]'`"
NODE_ENV = "JSII_NODE"
# The wrapper: a new session (setsid(2): never a group leader, so it cannot fail), then the
# node jsii would have run, with jsii's arguments.
_SESSION = "import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])"
_WRAPPER = "jsii-node-"


def own_session_node() -> str:
    """Point JSII_NODE at a wrapper (under $POOLCTL_HOME/bin, 0700) that runs the node jsii
    would run (JSII_NODE's own value, else `node`) in a new session. Returns its path. The
    wrapper's name carries a hash of its text: commands run at once with another node or
    Python never rewrite each other's."""
    node = os.environ.get(NODE_ENV, "node")
    if Path(node).name.startswith(_WRAPPER):
        return node  # already wrapped (a second stack of the same command)
    text = ("#!/bin/sh\n# poolctl: jsii's Node kernel in a session of its own "
            "(poolctl.adaptors.stacks)\n"
            f"exec {shlex.quote(sys.executable)} -I -S -c {shlex.quote(_SESSION)} "
            f"{shlex.quote(node)} \"$@\"\n")
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    script = poolctl_home() / "bin" / f"{_WRAPPER}{digest}"
    if not script.is_file() or script.read_text() != text:
        private_dir(script.parent)
        replace_file(script, text, mode=0o700)
    os.environ[NODE_ENV] = str(script)
    return str(script)


class _Generator(LazyModule):
    """A module that loads cdktn: the kernel's session is set before it starts."""

    def load(self) -> ModuleType:
        if not self.loaded:
            own_session_node()
        return super().load()


poolctl_stacks = _Generator("poolctl_stacks", _MISSING)
stacks_app = _Generator("poolctl_stacks.app", _MISSING)
