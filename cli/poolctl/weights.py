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
import re
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolctl.errors import UsageError, shown
from poolctl.files import replace_file
from poolctl.readfile import open_regular

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
            problem = _name_problem(rel)
            if problem is not None:
                raise UsageError(f"{shown(rel, 200)}: its name {problem}, which a manifest "
                                 "cannot list faithfully; rename it or move it out of the "
                                 "folder")
            found[rel] = path
    return dict(sorted(found.items()))


def _name_problem(rel: str) -> str | None:
    """Why a file's path cannot stand in a manifest as it is, or None: a name with a line
    break or another control character, or bytes that are not UTF-8 (Python carries them as
    surrogates, which JSON would write as text no node's file name matches)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8"
    if not rel.isprintable():
        return "holds a line break or another control character"
    return None


def _sha256(path: Path, size: int, progress: Progress | None, stop: threading.Event
            ) -> tuple[str, int]:
    """(SHA-256, bytes read) of the file, read to at most one chunk past `size`: a file
    whose bytes are not its size (a /proc or /sys file, whose size reads 0, or one growing
    while read) shows as a count that differs, and is never read without end."""
    h = hashlib.sha256()
    read = 0
    try:
        with path.open("rb") as f:
            while read <= size and (chunk := f.read(CHUNK)):
                if stop.is_set():  # Ctrl-C: the other threads end at their next chunk
                    raise KeyboardInterrupt
                h.update(chunk)
                read += len(chunk)
                if progress is not None:
                    progress(len(chunk))
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror}); fix its permissions or "
                         "move it out of the folder") from None
    return h.hexdigest(), read


def _hash_all(paths: list[Path], sizes: list[int], progress: Progress | None
              ) -> list[tuple[str, int]]:
    stop = threading.Event()
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        try:
            return list(pool.map(lambda p, n: _sha256(p, n, progress, stop), paths, sizes))
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
    hashed = _hash_all(list(files.values()), list(sizes.values()), progress)
    for (rel, path), (_, read) in zip(files.items(), hashed, strict=True):
        if read != sizes[rel]:
            raise UsageError(f"{shown(path, 200)}: {sizes[rel]:,} bytes by its size, "
                             f"{read:,}{'+' if read > sizes[rel] else ''} read (a /proc or "
                             "/sys file, or one being written); move it out of the folder, "
                             "or wait until it is written")
    digests = [d for d, _ in hashed]
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
    try:
        replace_file(target, json.dumps(manifest, indent=1, sort_keys=True) + "\n", 0o644)
    except OSError as e:
        raise UsageError(f"{target}: cannot be written ({e.strerror}); write it elsewhere "
                         "with --out FILE and upload it as manifest.json beside the "
                         "weights") from None
    return target


MAX_MANIFEST_BYTES = 64 << 20  # ~500,000 files at ~130 bytes each
MAX_FILE_BYTES = 1 << 50  # 1 PiB: no weights file comes near it
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _rel_problem(rel: str) -> str | None:
    """What makes `rel` no path a manifest may list (relative, '/' separated, inside)."""
    if not rel or not rel.isprintable():
        return "is empty or holds control characters"
    if rel.startswith("/"):
        return "is absolute; list paths relative to the folder"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "has an empty, '.' or '..' part; list plain paths inside the folder"
    return None


def _entries(folder: Path) -> Iterator[tuple[str, int, str]]:
    """(path, bytes, sha256) per listed file, each field checked: a path relative to the
    folder without '..', a size that is a whole number of bytes (0 to MAX_FILE_BYTES) and a
    SHA-256 of 64 hex digits. Anything else is one line naming the field (exit 2)."""
    path = folder / MANIFEST
    fix = f"write it with `poolctl weights manifest {folder}`"
    if not os.path.lexists(path):
        raise UsageError(f"{path}: missing; a node refuses the folder without it; {fix}")
    with open_regular(path, "weights verify", fix, MAX_MANIFEST_BYTES) as fh:
        raw = fh.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise UsageError(f"{path}: over {MAX_MANIFEST_BYTES >> 20} MiB; {fix}")

    def constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        doc = json.loads(raw.decode("utf-8-sig"), parse_constant=constant)
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: unusable (byte {e.start + 1} is not UTF-8); {fix}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: unusable (not JSON: {e.msg} at line {e.lineno} column "
                         f"{e.colno}); {fix}") from None
    except (ValueError, RecursionError) as e:  # NaN, an integer of over 4,300 digits
        raise UsageError(f"{path}: unusable (not JSON: {str(e)[:80]}); {fix}") from None

    def bad(field: str, what: str) -> UsageError:
        return UsageError(f"{path}: {field}: {what}; {fix}")

    if not isinstance(doc, dict) or "files" not in doc:
        raise bad("files", "missing; a manifest is {\"files\": {PATH: {\"sha256\": ..., "
                  "\"bytes\": ...}}}")
    files = doc["files"]
    if not isinstance(files, dict):
        raise bad("files", f"is {_json_kind(files)}, not an object of paths")
    if not files:
        raise UsageError(f"{path}: lists no files; a node refuses it; {fix}")
    items = []
    for rel, entry in files.items():
        name = f"files[{json.dumps(rel)[:80]}]"
        if problem := _rel_problem(rel):
            raise bad(name, f"the path {problem}")
        if not isinstance(entry, dict):
            raise bad(name, f"is {_json_kind(entry)}, not {{\"sha256\": ..., \"bytes\": ...}}")
        size, digest = entry.get("bytes"), entry.get("sha256")
        if (not isinstance(size, int) or isinstance(size, bool)
                or not 0 <= size <= MAX_FILE_BYTES):
            shown = "missing" if size is None else f"{json.dumps(size)[:40]} is not"
            raise bad(f"{name}.bytes", f"{shown} a whole number of bytes from 0 to 2^50")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            shown = "missing" if digest is None else f"{json.dumps(digest)[:40]} is not"
            raise bad(f"{name}.sha256", f"{shown} a SHA-256 of 64 hex digits")
        items.append((rel, size, digest.lower()))
    yield from sorted(items)


def _json_kind(v: object) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true or false",
             int: "a number", float: "a number", type(None): "null"}
    return kinds.get(type(v), type(v).__name__)


def verify(folder: str | Path, progress: Progress | None = None,
           hashing: Hashing | None = None) -> Verified:
    """Check a folder against its manifest as a node does before serving. `hashing` is told
    what there is to hash (the files of the right size), before `progress` is told of the
    first bytes."""
    root = _folder(folder)
    items = list(_entries(root))
    out = Verified(root, len(items), sum(size for _, size, _ in items))
    to_hash: list[tuple[str, Path, str]] = []
    to_read = 0  # bytes of the files to hash: their size is right
    sizes_by = {rel: size for rel, size, _ in items}
    for rel, size, digest in items:
        path = os.path.join(root, rel)  # inside: _entries refuses '..' and absolute paths
        try:
            st = os.stat(path)
        except OSError:
            out.problems.append(f"{rel}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the hash, /dev/zero not end
            out.problems.append(f"{rel}: not a regular file")
            continue
        got = st.st_size
        if got != size:
            out.problems.append(f"{rel}: {got} bytes, manifest says {size}")
            continue
        to_hash.append((rel, Path(path), digest))
        to_read += size
    if hashing is not None:
        hashing(len(to_hash), to_read)
    hashed = _hash_all([p for _, p, _ in to_hash], [sizes_by[rel] for rel, _, _ in to_hash],
                       progress)
    out.problems += [f"{rel}: sha256 mismatch" if read == sizes_by[rel] else
                     f"{rel}: {read}{'+' if read > sizes_by[rel] else ''} bytes read, "
                     f"manifest says {sizes_by[rel]}"
                     for (rel, _, want), (got, read) in zip(to_hash, hashed, strict=True)
                     if got != want or read != sizes_by[rel]]
    out.problems.sort()
    listed = {rel for rel, _, _ in items}
    out.unlisted = [rel for rel in listed_files(root) if rel not in listed]
    return out
