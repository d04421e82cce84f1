"""`poolctl ARGS` run inside the test worker, as a child would see it.

Why: the suite is bound by CPU on 2 cores, and a `python -m poolctl` child pays for its
imports each time: about 1 s for boto3, paramiko and pydantic, 2.6 s for
google-cloud-compute, and some 4.5 s more for a synth (cdktf and a new jsii kernel loading
the provider assemblies). In the worker these load once. What a command does stays real:
Terraform, Packer, sshd, the sandbox and the Compute Engine fake are the same processes and
servers as from a child.

`run` gives the command what a child gets: `poolctl.app.main` (the console script's entry,
with its exit codes and one-line errors), argv, exactly the environment given, the working
folder, stdin (empty unless `input`) and its own stdout and stderr, all put back afterwards.
It returns a `subprocess.CompletedProcess`, so callers read it as a child's. A command that
hangs ends the worker after `timeout` with every thread's traceback (faulthandler), as a
child's timeout would fail the test.

What must stay a child: signals (Ctrl-C tests), `--help` import checks (they look at what a
fresh interpreter loads), and anything that reads the process's own identity.

The CLI's last net turns an exception no command handled into one line and exit 70 (issue
23): users get a line, the suite gets a failure. `run` fails the test on such an internal
error unless the test says it provokes one (`internal_error_ok=True`); `check_no_internal_error`
does the same for a child's result.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def check_no_internal_error(result: subprocess.CompletedProcess[str], ok: bool = False
                            ) -> subprocess.CompletedProcess[str]:
    """Fail the test when the command ended in the CLI's net (an exception no command turned
    into a line: a bug), unless the test provokes one (`ok`)."""
    from poolctl.errors import INTERNAL_ERROR

    if (not ok and result.returncode == INTERNAL_ERROR
            and "poolctl: internal error in " in (result.stderr or "")):
        raise AssertionError(f"{' '.join(map(str, result.args))}: an internal error (exit "
                             f"{INTERNAL_ERROR}), a bug of poolctl:\n{result.stderr[-4000:]}")
    return result


def run(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | str | None = None,
        input: str | None = None, timeout: float = 900, internal_error_ok: bool = False
        ) -> subprocess.CompletedProcess[str]:
    from poolctl.app import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_argv, saved_stdin = sys.argv, sys.stdin
    code: int = 0
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["poolctl", *args]
        sys.stdin = io.StringIO(input or "")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, int | None):
                    err.write(f"{e.code}\n")
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.stdin = saved_stdin
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return check_no_internal_error(
        subprocess.CompletedProcess(["poolctl", *args], code, out.getvalue(), err.getvalue()),
        internal_error_ok)


def run_argv(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
             cwd: Path | str | None = None, input: str | None = None, timeout: float = 900,
             capture_output: bool = True, text: bool = True, internal_error_ok: bool = False
             ) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([sys.executable, "-m", "poolctl", ...], capture_output=True,
    text=True, ...)`, run as `run` does (the same keywords, so a call site reads as before)."""
    assert list(argv[:3]) == [sys.executable, "-m", "poolctl"], argv
    assert capture_output and text, "in-process runs always capture text"
    return run(list(argv[3:]), env=dict(os.environ) if env is None else env, cwd=cwd,
               input=input, timeout=timeout, internal_error_ok=internal_error_ok)
