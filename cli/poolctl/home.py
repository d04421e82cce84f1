"""$POOLCTL_HOME (default ~/.poolctl): poolctl's own files, private to the user.

It holds Terraform state and plans of sandbox deploys (state can carry secrets), rollout
records, the sandbox's state and log and the Terraform CLI config. Every writer goes through
this module, so folders are 0700 and files 0600 whatever the umask, and a home made by an
older poolctl with looser modes is tightened on the next write.
"""

from __future__ import annotations

import os
from pathlib import Path

# For processes poolctl starts that write under the home (Terraform, the sandbox server).
PRIVATE_UMASK = 0o077


def poolctl_home() -> Path:
    return Path(os.environ.get("POOLCTL_HOME") or "~/.poolctl").expanduser()


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
            folder.mkdir(mode=0o700, exist_ok=True)
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
    """Replace `path` atomically with `data`, 0600 in a 0700 folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.poolctl-tmp")
    with os.fdopen(open_private(tmp, home=home), "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    tmp.replace(path)


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
