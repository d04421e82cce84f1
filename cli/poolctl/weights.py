"""The folder a pool's `weights_uri` holds, and its `manifest.json`.

Each node copies the folder at `weights_uri` to its NVMe cache and checks the copy against
the manifest before it serves (`verify_weights` in `boot/_node_lib.sh.j2`): every file the
manifest lists must be there with that size and SHA-256; files it does not list are copied
but not checked; a manifest that is missing, unreadable or lists nothing fails the boot.
`write_manifest` makes the manifest for a local folder before it is uploaded; `verify`
checks a folder the way a node does (a download, or the folder before the upload).

    {"files": {"<path relative to the folder, / separated>": {"sha256": "<hex>", "bytes": N}}}
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolctl.errors import UsageError

MANIFEST = "manifest.json"
# Names a node writes into its copy (the `.poolctl-complete` marker): never listed.
NODE_MARKERS = ".poolctl-"
CHUNK = 1 << 24  # 16 MiB reads, as the node's check
# Files hashed at once: hashlib and file reads release the GIL, so threads use every core
# and keep a disk's queue full; more than a few per core only adds memory (a chunk each).
HASH_THREADS = max(2, min(16, 2 * (os.cpu_count() or 1)))

Progress = Callable[[int], None]  # bytes hashed since the last call
Hashing = Callable[[int, int], None]  # (files, bytes) about to be hashed, told once


@dataclass
class Verified:
    """What `verify` found: `problems` fail a node's boot, `unlisted` do not."""

    folder: Path
    files: int  # listed in the manifest
    bytes: int  # their size, as listed
    problems: list[str] = field(default_factory=list)  # "<path>: <what is wrong>"
    unlisted: list[str] = field(default_factory=list)  # in the folder, not in the manifest

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "files": self.files, "bytes": self.bytes,
                "verified": self.files - len(self.problems), "problems": self.problems,
                "unlisted": self.unlisted}


def _folder(folder: str | Path) -> Path:
    root = Path(folder)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise UsageError(f"{root}: {what}; give the folder that holds the model's weights")
    return root


def listed_files(folder: str | Path) -> dict[str, Path]:
    """The files a manifest lists: every file under the folder (links to files followed,
    linked folders not entered), but the manifest itself and the nodes' markers, by their
    path relative to the folder ('/' separated), sorted."""
    root = _folder(folder)
    found: dict[str, Path] = {}

    def failed(err: OSError) -> None:
        raise UsageError(f"{err.filename}: cannot be read ({err.strerror}); fix its "
                         "permissions or move it out of the folder")

    for dirpath, dirnames, filenames in os.walk(root, onerror=failed):
        dirnames.sort()
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST or name.startswith(NODE_MARKERS) or not path.is_file():
                continue
            found[rel] = path
    return dict(sorted(found.items()))


def _sha256(path: Path, progress: Progress | None, stop: threading.Event) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                if stop.is_set():  # Ctrl-C: the other threads end at their next chunk
                    raise KeyboardInterrupt
                h.update(chunk)
                if progress is not None:
                    progress(len(chunk))
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror}); fix its permissions or "
                         "move it out of the folder") from None
    return h.hexdigest()


def _hash_all(paths: list[Path], progress: Progress | None) -> list[str]:
    stop = threading.Event()
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        try:
            return list(pool.map(lambda p: _sha256(p, progress, stop), paths))
        except BaseException:
            stop.set()
            raise


def build_manifest(folder: str | Path, progress: Progress | None = None,
                   hashing: Hashing | None = None) -> dict[str, Any]:
    """The manifest of a folder (see the module's docstring). `hashing` is told what there
    is to hash once the folder is listed, before `progress` is told of the first bytes."""
    files = listed_files(folder)
    if not files:
        raise UsageError(f"{folder}: holds no files to list; give the folder that holds the "
                         "model's weights")
    sizes = {rel: path.stat().st_size for rel, path in files.items()}
    if hashing is not None:
        hashing(len(files), sum(sizes.values()))
    digests = _hash_all(list(files.values()), progress)
    return {"files": {rel: {"sha256": digest, "bytes": sizes[rel]}
                      for rel, digest in zip(files, digests, strict=True)}}


def manifest_path(folder: str | Path, out: str | Path | None = None) -> Path:
    """Where `write_manifest` writes: `out`, else `manifest.json` in the folder."""
    target = Path(out) if out is not None else Path(folder) / MANIFEST
    if target.is_dir():
        raise UsageError(f"--out {target}: is a folder; give the file to write, e.g. "
                         f"{target / MANIFEST}")
    return target


def write_manifest(folder: str | Path, progress: Progress | None = None,
                   out: str | Path | None = None, hashing: Hashing | None = None) -> Path:
    """Write the manifest to `out` (default: `manifest.json` in the folder, replacing one
    there), all at once: a reader never sees half of it. Readable by all: it is uploaded
    with the weights."""
    target = manifest_path(folder, out)
    manifest = build_manifest(folder, progress, hashing)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{target}: cannot be written ({e.strerror}); write it elsewhere "
                         "with --out FILE and upload it as manifest.json beside the "
                         "weights") from None
    return target


def _entries(folder: Path) -> Iterator[tuple[str, int, str]]:
    """(path, bytes, sha256) per listed file, as the node reads them; one line naming what
    is wrong (exit 2) for a manifest the node could not use either."""
    path = folder / MANIFEST
    fix = f"write it with `poolctl weights manifest {folder}`"
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        items = sorted((str(rel), int(w["bytes"]), str(w["sha256"]).lower())
                       for rel, w in files.items())
    except FileNotFoundError:
        raise UsageError(f"{path}: missing; a node refuses the folder without it; {fix}"
                         ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: unusable ({type(e).__name__}: {e}); a node refuses it "
                         f"too; {fix}") from None
    if not items:
        raise UsageError(f"{path}: lists no files; a node refuses it; {fix}")
    yield from items


def verify(folder: str | Path, progress: Progress | None = None,
           hashing: Hashing | None = None) -> Verified:
    """Check a folder against its manifest as a node does before serving. `hashing` is told
    what there is to hash (the files of the right size), before `progress` is told of the
    first bytes."""
    root = _folder(folder)
    items = list(_entries(root))
    out = Verified(root, len(items), sum(size for _, size, _ in items))
    base = os.path.normpath(root)
    to_hash: list[tuple[str, Path, str]] = []
    to_read = 0  # bytes of the files to hash: their size is right
    for rel, size, digest in items:
        path = os.path.normpath(os.path.join(root, rel))
        if not path.startswith(base + os.sep):
            out.problems.append(f"{rel}: outside the weights folder")
            continue
        try:
            got = os.path.getsize(path)
        except OSError:
            out.problems.append(f"{rel}: missing")
            continue
        if got != size:
            out.problems.append(f"{rel}: {got} bytes, manifest says {size}")
            continue
        to_hash.append((rel, Path(path), digest))
        to_read += size
    if hashing is not None:
        hashing(len(to_hash), to_read)
    digests = _hash_all([p for _, p, _ in to_hash], progress)
    out.problems += [f"{rel}: sha256 mismatch" for (rel, _, want), got in
                     zip(to_hash, digests, strict=True) if got != want]
    out.problems.sort()
    listed = {rel for rel, _, _ in items}
    out.unlisted = [rel for rel in listed_files(root) if rel not in listed]
    return out
