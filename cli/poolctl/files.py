"""The one writer of every file poolctl writes or edits (the config, `perf fit --write`,
`init`, manifests, records and state under $POOLCTL_HOME).

Why one: a fixed temporary name (`.<name>.poolctl-tmp`) opened with `write_text` follows a
symlink planted there (a pull request can carry one), and overwrites whatever it points to.
Here a temporary file is made exclusively, with a random name, beside its target
(`tempfile.mkstemp`: O_CREAT | O_EXCL, so a planted name is never opened, let alone
followed), written whole, flushed to disk, and renamed over the target; a failure or an
interrupt leaves the old file and no temporary one.

A target that is a symlink (a config linked into a repository of configs) stays a link: its
final target is updated, in that file's own folder. `create_new` makes a file that must not
exist yet, refusing a dangling symlink in its place (O_EXCL | O_NOFOLLOW).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from poolctl.errors import UsageError, shown


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def resolved_target(path: Path) -> Path:
    """The file a write to `path` changes: `path`, or the final target of a symlink there.
    A link that loops, or one whose target's folder is missing, is one line naming it."""
    path = Path(path)
    if not path.is_symlink():
        return path
    try:
        real = Path(os.path.realpath(path, strict=True))
    except (OSError, RuntimeError):
        raise UsageError(f"{shown(path, 300)}: a symlink to nothing that can be written "
                         f"({shown(os.readlink(path), 300)}); point it at the file, or replace "
                         "it with the file") from None
    if not real.is_file():
        raise UsageError(f"{shown(path, 300)}: links to {shown(real, 300)}, which is not a file; "
                         "point it at the file")
    return real


def replace_file(path: Path, data: str | bytes, mode: int | None = None,
                 follow_link: bool = True) -> Path:
    """Replace the file at `path` (a symlink's final target, the link kept) with `data` all
    at once. `mode`: the file's permissions; None keeps the old file's (a new file gets the
    umask's). `follow_link` False: a symlink at `path` is itself replaced by the file (what
    `init --force` does: nothing lands outside its folder). Returns the file written."""
    target = resolved_target(Path(path)) if follow_link else Path(path)
    if mode is None:
        try:
            st = target.lstat()
            mode = st.st_mode & 0o7777 if stat.S_ISREG(st.st_mode) else _umask_mode()
        except OSError:
            mode = _umask_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".poolctl-tmp",
                               dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def create_new(path: Path, data: str, mode: int = 0o666) -> None:
    """Write a file that must not exist: anything at `path`, a dangling symlink included,
    is FileExistsError, and nothing is followed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(data)
