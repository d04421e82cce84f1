"""Progress of long operations (Terraform phases, waits) on stderr, so stdout and --json stay
clean.

On a terminal: one live line (rich) with a spinner and the elapsed time, redrawn several
times a second whatever the operation does; lines printed meanwhile (`note`) scroll above it.
Elsewhere (CI logs, pipes, tests): one line per change of state, with the seconds elapsed,
never the same state twice in a row.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from poolctl.errors import printable

if TYPE_CHECKING:
    from rich.progress import Progress as Bar
    from rich.progress import TaskID


def log(msg: str) -> None:
    """One line on stderr, at once: what long operations tell the user beside their
    progress line (stdout stays for results and --json)."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


class Progress:
    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self.last: str | None = None
        self._lock = threading.Lock()  # Terraform's output is read on two threads
        self._bar: Bar | None = None
        self._task: TaskID | None = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> Progress:
        if self.live and self._bar is None:
            from rich.console import Console  # noqa: PLC0415 (rich on a terminal only)
            from rich.progress import Progress as Bar  # noqa: PLC0415 (rich on a terminal only)
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415 (rich on a terminal only)

            self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                            TimeElapsedColumn(), transient=True, refresh_per_second=4,
                            console=Console(file=getattr(self.stream, "raw", self.stream),
                                            highlight=False, emoji=False))
            self._bar.start()
            self._task = self._bar.add_task("", total=None)
        return self

    def stop(self) -> None:
        """End the live line (idempotent), leaving the last state (not a quiet one) as a line
        of its own, as off a terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            if self.last is not None:
                self.stream.write(f"{self.last} ({self.elapsed:.0f} s)\n")
                self.stream.flush()

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def update(self, state: str, *, quiet: bool = False) -> None:
        """The operation's state now. Off a terminal it is printed when it changed, with the
        elapsed seconds, unless `quiet` (states too fine-grained for a log: the live line
        only)."""
        with self._lock:
            if self._bar is not None:
                assert self._task is not None  # start() adds the task with the bar
                # controls escaped here: the live line writes to the raw stream
                self._bar.update(self._task, description=printable(state))
            elif state != self.last and not quiet:
                self.stream.write(f"{state} ({self.elapsed:.0f} s)\n")
                self.stream.flush()
            if not quiet:
                self.last = state

    def note(self, line: str) -> None:
        """A line of its own (above the live line on a terminal)."""
        with self._lock:
            if self._bar is not None:
                self._bar.console.print(printable(line), markup=False, highlight=False,
                                        soft_wrap=True)
            else:
                self.stream.write(line + "\n")
                self.stream.flush()
