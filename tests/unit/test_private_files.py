"""Everything poolctl writes under $POOLCTL_HOME is private: 0700 folders, 0600 files, through
one helper (`poolctl.home`), whatever the umask. The sandbox's files are checked here, the
files of a Terraform deploy in tests/e2e/test_deploy_sandbox.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from poolctl import home, runtime
from poolctl.cloud import Cloud
from poolctl.config import parse_config
from tests.configs import pool_yaml


@pytest.fixture
def loose_umask():
    """The usual umask, under which plain mkdir/write give 0755 folders and 0644 files."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def not_private(root: Path) -> list[str]:
    """Every entry under `root` (itself included) that group or others may read; symlinks
    (Terraform links providers from the mirror) carry no modes of their own."""
    bad = []
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink() and mode(p) & 0o077:
            bad.append(f"{p.relative_to(root.parent)} {oct(mode(p))}")
    return bad


def test_private_dir_and_write_private(tmp_path, monkeypatch, loose_umask):
    h = tmp_path / "home"
    h.mkdir(mode=0o755)  # made by an older poolctl
    monkeypatch.setenv("POOLCTL_HOME", str(h))
    target = h / "a" / "b" / "file.json"
    target.parent.parent.mkdir(mode=0o755)
    (target.parent.parent / "old.json").write_text("{}")  # not written again: left alone
    home.write_private(target, "{}")
    assert (mode(h), mode(h / "a"), mode(h / "a" / "b"), mode(target)) == (
        0o700, 0o700, 0o700, 0o600)
    target.chmod(0o644)
    home.write_private(target, b"[]")  # replaced, and private again
    assert (target.read_text(), mode(target)) == ("[]", 0o600)
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]  # no temp file left
    fd = home.open_private(h / "logs" / "x.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.close(fd)
    assert (mode(h / "logs"), mode(h / "logs" / "x.log")) == (0o700, 0o600)
    # Outside the home only the folders it creates are made private.
    outside = tmp_path / "out" / "f"
    home.write_private(outside, "x")
    assert (mode(tmp_path / "out"), mode(outside)) == (0o700, 0o600)
    assert mode(tmp_path) == stat.S_IMODE(os.stat(tmp_path).st_mode)  # untouched


def test_rollout_records_are_private(tmp_path, monkeypatch, loose_umask):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    cfg = parse_config(pool_yaml(with_gcp=False))
    rec = runtime.RolloutRecord(stack="s", pool=cfg.pools[0].name, cloud=Cloud.aws, file="/x",
                                key="serving.image", from_value="a", to_value="b")
    runtime.save_record(cfg, cfg.pools[0], "aws", rec, new=True)
    path = runtime.record_path(cfg, cfg.pools[0], "aws")
    assert path.is_file()
    assert not_private(tmp_path / "home") == []


def test_terraform_cli_config_is_private(tmp_path, monkeypatch, loose_umask):
    from poolctl.terraform import cli_config

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    mirror = tmp_path / "mirror" / "registry.terraform.io"
    (mirror / "hashicorp" / "aws").mkdir(parents=True)
    rc = cli_config(str(mirror.parent))
    assert rc == tmp_path / "home" / "terraform.rc"
    assert not_private(tmp_path / "home") == []
    rc.chmod(0o644)  # an older poolctl's: tightened on the next run
    cli_config(str(mirror.parent))
    assert mode(rc) == 0o600


def test_sandbox_state_and_log_are_private(sandbox, sandbox_home):
    sdir = Path(sandbox_home) / "sandbox"
    written = [sdir / name for name in ("state.json", "server.log", "port")]
    assert all(p.is_file() for p in written[:2])
    assert {str(p): oct(mode(p)) for p in [sdir, *written] if p.exists()} == {
        str(p): oct(0o600 if p.is_file() else 0o700) for p in [sdir, *written] if p.exists()}
