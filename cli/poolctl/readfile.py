"""Reading a file a user names (a trace, a weights manifest) in bounded time and memory.

Only a regular file is read: a FIFO blocks its reader until a writer comes, `/dev/zero` and
`/dev/urandom` never end, a folder has no text. The file is opened without blocking first and
judged by what was opened (not by a name that could change between a check and the read), and
read up to a size limit, line by line with a line length limit. Every refusal is a
`UsageError`: one line naming the file and the fix.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from poolctl.errors import UsageError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def open_regular(path: str | os.PathLike[str], label: str, fix: str, max_bytes: int
                 ) -> BinaryIO:
    """The file at `path`, open for reading in binary. `label` starts each message (the
    flag, or the file's role), `fix` ends it (what to give instead)."""
    name = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{label}: {name} not found; {fix}") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise UsageError(f"{label}: {name[:200]} cannot be opened ({why}); {fix}") from None
    try:
        st = os.fstat(fd)
        kind = next((k for test, k in _KINDS if test(st.st_mode)), None)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{label}: {name} is {kind or 'not a regular file'}, not a "
                             f"regular file; {fix}")
        if st.st_size > max_bytes:
            raise UsageError(f"{label}: {name} is {mib(st.st_size)}, over the "
                             f"{mib(max_bytes)} poolctl reads; {fix}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def text_lines(fh: BinaryIO, name: str, max_bytes: int, max_line: int, max_lines: int,
               why_max_lines: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) per line of UTF-8 (a byte-order mark at the start is
    dropped, as `utf-8-sig` does), the newline kept. A file that grew past `max_bytes`
    since it was opened, more than `max_lines` lines, a line over `max_line` bytes or bytes
    that are not UTF-8: one line naming the line number."""
    total = 0
    n = 0
    while raw := fh.readline(max_line + 1):
        n += 1
        total += len(raw)
        if n > max_lines:
            raise UsageError(f"{name}:{n}: file: more than {max_lines:,} lines; "
                             f"{why_max_lines}: cut the file (e.g. with head)")
        if total > max_bytes:
            raise UsageError(f"{name}:{n}: file: over the {mib(max_bytes)} poolctl reads "
                             "(it grew while read); give a smaller file")
        if len(raw) > max_line:
            raise UsageError(f"{name}:{n}: line: longer than {mib(max_line)}; one record "
                             "per line")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{name}:{n}: line: byte {e.start + 1} is not UTF-8 text; save "
                             "the file as UTF-8") from None
        yield n, (text.removeprefix("\ufeff") if n == 1 else text)
