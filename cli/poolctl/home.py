"""$POOLCTL_HOME (default ~/.poolctl): poolctl's own files, private to the user.

It holds Terraform state and plans of sandbox deploys (state can carry secrets), rollout
records, the sandbox's state and log and the Terraform CLI config. Every writer goes through
this module, so folders are 0700 and files 0600 whatever the umask, and a home made by an
older poolctl with looser modes is tightened on the next write.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from poolctl.errors import UsageError, shown
from poolctl.files import replace_file

# For processes poolctl starts that write under the home (Terraform, the sandbox server).
PRIVATE_UMASK = 0o077
HOME_ENV = "POOLCTL_HOME"


def poolctl_home() -> Path:
    raw = os.environ.get(HOME_ENV)
    return expand_user(raw, HOME_ENV) if raw else expand_user("~/.poolctl", "HOME")


def expand_user(path: str | Path, var: str) -> Path:
    """`path` with `~` expanded; a home folder that cannot be found (HOME unset and no entry in
    the password database, or `~user` of no user) is one line naming the variable."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        if var == "HOME":
            raise UsageError("HOME: not set, and this user has no home folder in the password "
                             f"database; set HOME (or {HOME_ENV} for poolctl's own files)"
                             ) from None
        raise UsageError(f"{var}={shown(path)}: its ~ names no home folder (HOME unset, or "
                         "no such user); give a full path") from None


def cannot_create(folder: Path) -> str | None:
    """Why `folder` cannot be poolctl's to write in, or None: it is (or can become) a folder
    poolctl can create files in. Tried rather than asked (a probe folder, removed at once):
    /proc and read-only mounts pass every permission check."""
    folder = Path(os.path.abspath(folder))
    try:
        existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    except OSError as e:  # a name too long for the system
        return f"not a usable path ({e.strerror or type(e).__name__})"
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".poolctl-probe-", dir=existing))
    except OSError as e:  # /proc, a read-only mount, no permission
        return f"cannot write in {existing} ({e.strerror or type(e).__name__})"
    return None


def is_under_home(path: Path, home: Path | None = None) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(home or poolctl_home()))


def private_dir(path: Path, home: Path | None = None) -> Path:
    """`mkdir -p path`, each folder 0700; folders between the home and `path` (and the home
    itself) are tightened to 0700 too when `path` lies under it."""
    path = Path(os.path.abspath(path))
    home = Path(os.path.abspath(home or poolctl_home()))
    chain = [path, *path.parents]
    if path.is_relative_to(home):
        chain = chain[: chain.index(home) + 1]
    for folder in reversed(chain):
        if not folder.exists():
            try:
                folder.mkdir(mode=0o700, exist_ok=True)
            except OSError as e:
                if not folder.is_relative_to(home):
                    raise
                raise UsageError(f"{HOME_ENV}={home}: cannot make {folder} ({e.strerror}); "
                                 f"set {HOME_ENV} to a folder you can write in") from None
            os.chmod(folder, 0o700)
        elif folder.is_relative_to(home) and folder.stat().st_mode & 0o077:
            os.chmod(folder, 0o700)
    return path


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 home: Path | None = None) -> int:
    """A file descriptor of `path`, created (or tightened) to 0600, its folder private."""
    private_dir(Path(path).parent, home)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def write_private(path: Path, data: str | bytes, home: Path | None = None) -> None:
    """Replace `path` atomically with `data`, 0600 in a 0700 folder (files.replace_file: a
    temporary name of its own, made exclusively, never a planted one followed)."""
    path = Path(path)
    private_dir(path.parent, home)
    replace_file(path, data, mode=0o600)


def tighten(folder: Path) -> None:
    """Drop group and other permissions from everything under `folder` (symlinks aside):
    for files a tool wrote with modes of its own choosing (Terraform writes its lock file
    0644 whatever the umask)."""
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if not os.path.islink(path) and st.st_mode & 0o077:
                os.chmod(path, st.st_mode & 0o700)
