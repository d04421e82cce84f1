"""jsii's Node kernel starts in a session of its own (poolctl.adaptors.stacks): a terminal's
Ctrl-C, sent to poolctl's foreground process group, never reaches it, so jsii stops it at exit
as usual and no private jsii API is needed. Checked with a stand-in node that reports where
it runs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from poolctl.adaptors.stacks import NODE_ENV, own_session_node


def test_the_kernel_runs_in_a_new_session_with_jsiis_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    node = tmp_path / "node"  # what JSII_NODE named before (a user's own node)
    node.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    "print(os.getpid(), os.getsid(0), os.getpgrp(), *sys.argv[1:])\n")
    node.chmod(0o700)
    monkeypatch.setenv(NODE_ENV, str(node))

    wrapper = own_session_node()

    assert os.environ[NODE_ENV] == wrapper
    assert Path(wrapper).parent == tmp_path / "home" / "bin"
    assert stat.S_IMODE(os.stat(wrapper).st_mode) == 0o700  # private, like all of the home
    # jsii runs [JSII_NODE, "--max-old-space-size=4069", runtime.js]
    out = subprocess.run([wrapper, "--max-old-space-size=4069", "runtime.js"],
                         capture_output=True, text=True, check=True).stdout.split()
    pid, sid, pgrp = map(int, out[:3])
    assert sid == pid == pgrp  # a session (and group) of its own: it leads both
    assert pgrp != os.getpgrp() and sid != os.getsid(0)
    assert out[3:] == ["--max-old-space-size=4069", "runtime.js"]
    # Again (the second stack of a command): the same wrapper, not a wrapper of the wrapper.
    assert own_session_node() == wrapper and os.environ[NODE_ENV] == wrapper
    assert str(node) in Path(wrapper).read_text()
