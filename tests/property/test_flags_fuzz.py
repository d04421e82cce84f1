"""Every numeric option of every command, fed hostile values (issue 23): NaN, inf, zero,
negatives, huge numbers, `1_000`, non-ASCII digits, empty strings, 5,000 digits.

The commands are found by walking the CLI itself (typer's click command tree), so an option
added later is fuzzed without a change here. For each value the option's own parsing decides
(click's `make_context`, which converts every parameter without running the command):
- refused: a click usage error, and `poolctl` prints exactly one line naming the flag, exit 2;
- accepted: a finite number from 0 to 2**32 (past any count, port, second, token count or
  seed poolctl takes): NaN, inf, negatives and 10**30 never reach a command.
Anything else (an exception of another kind) is a traceback, and fails here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poolctl.errors import PoolctlError
from tests import inproc

MAX_SANE = 2**32
MAX_SEED = 2**63 - 1  # a seed is any 64-bit value: it sizes nothing

HOSTILE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "0", "-0", "0.0", "-1", "-1e-300",
           "1e-300", "1e308", "1e400", str(10**30), "9" * 5000, "1_000", "١٢", "１２", "²",
           "", " ", "0x10", "1e", "1,5", "--", "true", "1 2", "+5", "5."]
VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
            max_size=12),
)


def numeric_options() -> list[tuple[tuple[str, ...], Any, Any]]:
    """(command path, click command, option) for every int/float option in the CLI."""
    from poolctl.app import command_tree

    found = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, (*path, name))
            return
        for p in cmd.params:
            td = getattr(p, "type_descriptor", None)
            if td is not None and td.annotation in (int, float) and p.opts:
                found.append((path, cmd, p))

    walk(command_tree(), ())
    return found


OPTIONS = numeric_options()


def test_the_walk_finds_the_options():
    """The walk sees the tree: the numeric options the contract's commands take are there
    (a change in typer's internals would otherwise leave nothing to fuzz)."""
    names = {(" ".join(path), p.opts[0]) for path, _, p in OPTIONS}
    assert {("warm", "--replicas"), ("warm", "--timeout"), ("simulate", "--rate"),
            ("plan", "--rate"), ("nodes check", "--port"), ("image prune", "--keep"),
            ("rollout start", "--timeout"), ("sandbox start", "--port")} <= names


@pytest.mark.parametrize(("path", "cmd", "param"), OPTIONS,
                         ids=[f"{' '.join(p)} {o.opts[0]}" for p, _, o in OPTIONS])
@given(value=VALUES)
@example(value="nan")
@example(value="inf")
@example(value=str(10**30))
def test_numeric_flag(path, cmd, param, value, tmp_path_factory):
    flag = next(o for o in param.opts if o.startswith("--"))
    # a placeholder for each required argument (e.g. `perf fit RESULT`): the flag is what fails
    given = [*("placeholder" for p in cmd.params
               if p.param_type_name == "argument" and p.required), f"{flag}={value}"]
    try:
        ctx = cmd.make_context(" ".join(path), list(given))
    except Exception as e:  # a usage error (click's or poolctl's), or a traceback in waiting
        usage = hasattr(e, "format_message") or isinstance(e, PoolctlError)
        if not (usage and getattr(e, "exit_code", None) == 2):
            raise
    else:
        got = ctx.params[param.name]
        assert isinstance(got, int | float) and not isinstance(got, bool), (given, got)
        most = MAX_SEED if param.name == "seed" else MAX_SANE
        assert math.isfinite(got) and 0 <= got <= most, f"{given} accepted as {got!r}"
        return
    # Refused: what the user sees is one line naming the flag.
    home = tmp_path_factory.mktemp("home")
    r = inproc.run([*path, *given], env={**os.environ, "POOLCTL_HOME": str(home)},
                   cwd=Path(home), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (given, r.returncode, r.stderr[-1000:])
    assert lines[0].startswith("poolctl: ") and flag in lines[0], (given, lines[0])
