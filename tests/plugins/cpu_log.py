"""Where the suite's CPU goes, per test module (scripts/bench/suite_cpu.py reads it).

Only with POOLCTL_TEST_CPU_LOG=FILE: each worker (or a serial run) appends one JSON line per
module it ran: its tests, wall seconds, when it started and ended (epoch seconds), its own
CPU, the CPU of the processes it ran and waited for (poolctl, Terraform, node ...), and its
sandbox server's. Without the variable this plugin registers nothing.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.order import module_of


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("POOLCTL_TEST_CPU_LOG")
    if path:
        config.pluginmanager.register(CpuLog(Path(path)), "poolctl-cpu-log")


def _sandbox_cpu() -> float:
    """CPU seconds of this session's sandbox server (from /proc), 0 while none runs."""
    home = os.environ.get("POOLCTL_HOME")
    if not home:
        return 0.0
    try:
        pid = json.loads((Path(home) / "sandbox" / "state.json").read_text())["pid"]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, KeyError, IndexError):
        return 0.0


def _cpu_now() -> tuple[float, float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, _sandbox_cpu()


class CpuLog:
    """Sums per module while the session runs, written out at its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.modules: dict[str, dict[str, float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        t0, before = time.time(), _cpu_now()
        yield
        after, t1 = _cpu_now(), time.time()
        acc = self.modules.setdefault(module_of(item), dict.fromkeys(
            ("tests", "wall_s", "cpu_s", "children_cpu_s", "sandbox_cpu_s"), 0.0))
        acc.setdefault("start", t0)
        acc["end"] = t1
        acc["tests"] += 1
        acc["wall_s"] += t1 - t0
        for key, a, b in zip(("cpu_s", "children_cpu_s", "sandbox_cpu_s"), before, after,
                             strict=True):
            acc[key] += max(0.0, b - a)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        with self.path.open("a") as f:
            for module, acc in self.modules.items():
                f.write(json.dumps({"worker": worker, "module": module, "tests": int(acc["tests"]),
                                    **{k: round(v, 2) for k, v in acc.items() if k != "tests"}})
                        + "\n")
