"""Ctrl-C at random points of the commands that write (issue 31): `plan --search --write
--workers 2` exits 130 with one line, its workers stopped, the file untouched or whole;
never a worker's traceback, a hang, or the file written after the interrupt.

The command runs as a child in a session of its own, as in a terminal; the interrupt goes to
the whole process group (what a terminal's Ctrl-C does) or to the main process alone
(`kill -INT`). Delays are drawn with a fixed seed, so a run is repeatable.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE = ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv"


def _group_gone(pgid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _interrupt(args: list[str], cwd: Path, after: str, delay: float, whole_group: bool,
               home: Path) -> subprocess.CompletedProcess[str]:
    """Run `poolctl ARGS`; `delay` s after its stderr first shows `after` (at once when it
    never does), SIGINT to its group or its main process; then wait for it to end."""
    env = {**os.environ, "POOLCTL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "poolctl", *args], cwd=cwd, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    err: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            err.append(line)
            if after in line:
                seen.set()
        seen.set()  # ended without it

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen.wait(60)
    time.sleep(delay)
    try:
        if whole_group:
            os.killpg(p.pid, signal.SIGINT)
        else:
            os.kill(p.pid, signal.SIGINT)
    except ProcessLookupError:
        pass  # it had finished
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"{args[0]}: still running 30 s after SIGINT (delay {delay:.2f} s):\n"
                    f"{''.join(err)[-2000:]}")
    reader.join(10)
    assert p.stdout is not None
    out = p.stdout.read()
    assert _group_gone(p.pid, 10), "a worker outlived the interrupted command"
    return subprocess.CompletedProcess(args, p.returncode, out, "".join(err))


RNG = random.Random(31)
# From the first group evaluated on (the workers are busy) to past the search's end.
POINTS = [(round(RNG.uniform(0, 2.5), 2), whole) for whole in (True, False)
          for _ in range(3)]


@pytest.mark.parametrize(("delay", "whole_group"), POINTS,
                         ids=[f"{d}s-{'group' if g else 'main'}" for d, g in POINTS])
def test_sigint_during_plan_search_write(tmp_path, delay, whole_group):
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text())
    before = cfg.read_text()
    trace = tmp_path / "t.csv"
    trace.write_text("".join(AZURE.read_text().splitlines(keepends=True)[:3000]))
    r = _interrupt(["plan", "-f", str(cfg), "--cloud", "aws", "--traffic", str(trace),
                    "--search", "--write", "--workers", "2"], tmp_path,
                   "search chat-70b/aws: 1/", delay, whole_group, tmp_path)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    after = cfg.read_text()
    # 130, quietly (no line of its own, as a shell's Ctrl-C); -2: the interpreter was still
    # starting, before poolctl's code ran
    if r.returncode in (130, -signal.SIGINT):
        assert "poolctl:" not in r.stderr and "wrote " not in r.stderr, r.stderr[-2000:]
        assert after == before, "written after the interrupt"
    else:  # it finished before the signal came: the file is the whole edited one
        assert r.returncode == 0 and "wrote " in r.stderr, r.stderr[-2000:]
        assert after != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["poolctl.yaml", "t.csv"]
