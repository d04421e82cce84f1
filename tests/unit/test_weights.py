"""`poolctl weights manifest / verify` (poolctl.weights): the manifest each node checks its
copy of the weights against. That the node's own check (the boot script's verify_weights)
accepts these manifests and finds the same problems is tested beside the boot script, in
tests/unit/test_boot_runtime.py::test_verify_manifest.

Digests are the published SHA-256 test vectors (FIPS 180-2, appendix B): "abc" and "".
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from poolctl import weights
from poolctl.errors import UsageError
from tests import inproc

ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def poolctl(*args: str):
    return inproc.run_argv([sys.executable, "-m", "poolctl", *args], capture_output=True,
                           text=True, timeout=60)


@pytest.fixture
def folder(tmp_path) -> Path:
    """config.json ("abc"), an empty file in a sub-folder, a node's marker (never listed),
    and a link to a folder outside (not entered)."""
    root = tmp_path / "llama"
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_bytes(b"abc")
    (root / "tokenizer" / "empty.txt").write_bytes(b"")
    (root / ".poolctl-complete").write_text("s3://x/ 1\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_text("not weights")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    return root


def test_manifest_lists_every_file_with_size_and_sha256(folder):
    assert weights.build_manifest(folder) == {"files": {
        "config.json": {"sha256": ABC, "bytes": 3},
        "tokenizer/empty.txt": {"sha256": EMPTY, "bytes": 0},
    }}


def test_the_cli_writes_it_readable_by_all_and_says_how_to_upload(folder):
    res = poolctl("weights", "manifest", str(folder))
    assert res.returncode == 0, res.stderr
    out = folder / "manifest.json"
    assert json.loads(out.read_text())["files"]["config.json"] == {"sha256": ABC, "bytes": 3}
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert f"wrote {out}: 2 files, 3 bytes" in res.stdout
    assert f"aws s3 sync {folder} s3://" in res.stdout
    assert f"weights: hashing 2 files, 3 bytes in {folder}" in res.stderr
    # Written again over itself: the old manifest is not listed in the new one.
    again = poolctl("weights", "manifest", str(folder), "--json")
    assert json.loads(again.stdout) == {"manifest": str(out), "files": 2, "bytes": 3}
    assert set(json.loads(out.read_text())["files"]) == {"config.json", "tokenizer/empty.txt"}
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_verify_passes_then_names_each_problem_and_exits_1(folder):
    weights.write_manifest(folder)
    ok = poolctl("weights", "verify", str(folder), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"folder": str(folder), "files": 2, "bytes": 3,
                                     "verified": 2, "problems": [], "unlisted": []}

    (folder / "config.json").write_bytes(b"abd")  # same size, other digest
    (folder / "tokenizer" / "empty.txt").unlink()
    (folder / "added.bin").write_bytes(b"x")
    res = poolctl("weights", "verify", str(folder))
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        "  config.json: sha256 mismatch",
        "  tokenizer/empty.txt: missing",
        "1 file is not in the manifest (nodes copy them but do not check them): added.bin",
        "0 of 2 files verified (3 bytes)",
    ]
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("poolctl:")]
    assert line.startswith(f"poolctl: weights: 2 of 2 files in {folder} do not match")


def test_a_size_change_is_found_without_hashing(folder, monkeypatch):
    weights.write_manifest(folder)
    (folder / "config.json").write_bytes(b"abcd")
    hashed: list[int] = []
    result = weights.verify(folder, hashed.append)
    assert result.problems == ["config.json: 4 bytes, manifest says 3"]
    assert hashed == []  # the only other file is empty: nothing to read


def one(size: str = "3", sha256: str = f'"{ABC}"', path: str = "a") -> str:
    """A manifest listing one file, its fields written as given (JSON text)."""
    return '{"files": {' + json.dumps(path) + ': {"bytes": ' + size + ', "sha256": ' + sha256 \
        + "}}}"


BAD_MANIFESTS = [
    (None, "manifest.json: missing; a node refuses the folder without it"),
    ("not json", "manifest.json: unusable (not JSON: Expecting value at line 1 column 1)"),
    ('{"files": {}}', "manifest.json: lists no files"),
    ('{"files": []}', "manifest.json: files: is a list, not an object of paths"),
    ("[]", "manifest.json: files: missing"),
    # issue 23: each field checked, one line naming it (1e400 was an OverflowError)
    (one("1e400"), 'files["a"].bytes: Infinity is not a whole number of bytes from 0 to 2^50'),
    (one("NaN"), "manifest.json: unusable (not JSON: NaN is not a JSON number)"),
    ('{"files": {"a": {"bytes": "many"}}}',
     'files["a"].bytes: "many" is not a whole number of bytes'),
    (one("3.0"), 'files["a"].bytes: 3.0 is not'),
    (one("true"), 'files["a"].bytes: true is not'),
    (one("-1"), 'files["a"].bytes: -1 is not'),
    (one(str(2**50 + 1)), 'files["a"].bytes: 1125899906842625 is not'),
    ('{"files": {"a": {"bytes": 3}}}', 'files["a"].sha256: missing a SHA-256 of 64 hex digits'),
    (one(sha256='"00"'), 'files["a"].sha256: "00" is not a SHA'),
    (one(sha256=f'"{"g" * 64}"'), 'files["a"].sha256: "ggg'),
    ('{"files": {"a": 3}}', 'files["a"]: is a number, not {"sha256": ..., "bytes": ...}'),
    (one(path="../elsewhere/secret"),
     """files["../elsewhere/secret"]: the path has an empty, '.' or '..' part"""),
    (one(path="/etc/passwd"), 'files["/etc/passwd"]: the path is absolute'),
    (one(path="a\0b"), 'files["a\\u0000b"]: the path is empty or holds control characters'),
    (one(path=""), 'files[""]: the path is empty'),
    (one(path="a//b"), 'files["a//b"]: the path has an empty'),
    (one("1" + "0" * 5000), "manifest.json: unusable (not JSON: Exceeds the limit (4300 digits)"),
]


@pytest.mark.parametrize("manifest, words", BAD_MANIFESTS,
                         ids=[str(m)[:40] for m, _ in BAD_MANIFESTS])
def test_a_manifest_a_node_would_refuse_is_one_line_exit_2(folder, manifest, words):
    if manifest is not None:
        (folder / "manifest.json").write_text(manifest)
    res = poolctl("weights", "verify", str(folder))
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    [line] = res.stderr.splitlines()
    assert words in line and f"poolctl weights manifest {folder}" in line


@pytest.mark.parametrize("kind", ["fifo", "folder", "/dev/zero"])
def test_a_manifest_that_is_no_regular_file_is_refused_unread(folder, kind):
    import os

    target = folder / "manifest.json"
    if kind == "fifo":
        os.mkfifo(target)  # read, it would block until a writer comes
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(kind)  # read, it never ends
    res = poolctl("weights", "verify", str(folder))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith(f"poolctl: weights verify: {target} is ")
    assert "not a regular file" in line


def test_a_listed_file_that_is_no_regular_file_is_a_problem_not_a_read(folder):
    import os

    os.mkfifo(folder / "pipe")
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "manifest.json").write_text(json.dumps({"files": {
        "pipe": {"bytes": 0, "sha256": EMPTY}, "zero": {"bytes": 0, "sha256": EMPTY}}}))
    assert weights.verify(folder).problems == ["pipe: not a regular file",
                                               "zero: not a regular file"]


def test_a_manifest_over_the_size_cap_is_refused(folder, monkeypatch):
    weights.write_manifest(folder)
    size = (folder / "manifest.json").stat().st_size
    monkeypatch.setattr(weights, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(UsageError, match=rf"manifest.json is {size:,} bytes, over the "
                       rf"{size - 1:,} bytes poolctl reads"):
        weights.verify(folder)


def test_a_manifest_with_a_byte_order_mark_is_read(folder):
    weights.write_manifest(folder)
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text("\ufeff" + text.replace(ABC, ABC.upper()))
    assert weights.verify(folder).ok


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "nope", "does not exist"),
    (lambda tmp: (tmp / "file").write_text("x") and tmp / "file", "is not a folder"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "holds no files to list"),
])
def test_a_folder_that_cannot_be_listed_is_one_line_exit_2(tmp_path, make, words):
    path = make(tmp_path)
    res = poolctl("weights", "manifest", str(path))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"poolctl: {path}: {words}; give the folder that holds the model's weights"]
    assert not (tmp_path / "manifest.json").exists()


def test_an_unreadable_file_is_one_line(folder, monkeypatch):
    # As a file of mode 000 for a user other than root (the tests run as root in CI).
    real_open = Path.open

    def refuse(self, *args, **kwargs):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(UsageError, match=r"config.json: cannot be read \(Permission denied\); "
                       "fix its permissions"):
        weights.build_manifest(folder)


def test_many_files_hash_in_parallel_to_the_same_manifest(tmp_path):
    # More files than threads, one of them over a read chunk: each digest lands on its own
    # path (hashlib's own answer per file, computed here one by one).
    import hashlib

    root = tmp_path / "w"
    root.mkdir()
    blobs = {f"shard-{i:02d}.bin": bytes([i]) * (i * 100_003 + (weights.CHUNK if i == 1 else 0))
             for i in range(weights.HASH_THREADS + 3)}
    for name, data in blobs.items():
        (root / name).write_bytes(data)
    seen: list[int] = []
    got = weights.build_manifest(root, seen.append)["files"]
    assert got == {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                   for name, data in blobs.items()}
    assert sum(seen) == sum(len(d) for d in blobs.values())


def test_a_read_only_folder_gets_its_manifest_written_elsewhere(folder, tmp_path, monkeypatch):
    # As a folder the user may not write to (a mounted dataset; the tests run as root, who
    # may write anywhere): the rename into it is refused.
    real_replace = weights.os.replace

    def refuse(src, dst):
        if Path(dst).parent == folder:
            raise PermissionError(13, "Permission denied")
        return real_replace(src, dst)

    monkeypatch.setattr(weights.os, "replace", refuse)
    with pytest.raises(UsageError, match=r"manifest.json: cannot be written \(Permission "
                       r"denied\); write it elsewhere with --out FILE"):
        weights.write_manifest(folder)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".poolctl-complete", "config.json", "linked", "tokenizer"]  # no temporary file left

    out = tmp_path / "llama.manifest.json"
    res = poolctl("weights", "manifest", str(folder), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["files"]["config.json"] == {"sha256": ABC, "bytes": 3}
    assert f"aws s3 cp {out} s3://BUCKET/PREFIX/manifest.json" in res.stdout
    folder_out = poolctl("weights", "manifest", str(folder), "--out", str(tmp_path))
    assert folder_out.returncode == 2
    assert folder_out.stderr.startswith(f"poolctl: --out {tmp_path}: is a folder")
