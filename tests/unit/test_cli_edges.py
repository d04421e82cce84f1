"""Issue 23, the CLI's edges: flags, paths and the environment each refused with one line
naming the flag or variable and the fix (exit 2), before anything is written; and the last
net, which turns an exception no command handled into one line and exit 70.

Each case ended in a traceback (or was accepted wrongly) before; they run in this worker
(tests/inproc.py), which fails a test on any internal error it does not provoke itself.
"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from tests import inproc
from tests.configs import pool_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "POOLCTL_HOME": str(tmp_path / "home")}


def one_line(r, code: int = 2) -> str:
    """The single stderr line of a refused command (exit `code`), without the prefix."""
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("poolctl: ") and "Traceback" not in r.stderr
    return lines[0].removeprefix("poolctl: ")


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- flags --------------------------------------------------------------------------------


def test_logs_since_of_5000_digits(env, tmp_path):
    r = inproc.run(["logs", "--cloud", "aws", "-f", str(EXAMPLE), "--since", "1" * 5000 + "s"],
                   env=env, cwd=tmp_path)
    line = one_line(r)
    assert line.startswith("--since '1111") and "up to 3650d" in line and len(line) < 200


def test_logs_since_beyond_ten_years(env, tmp_path):
    line = one_line(inproc.run(["logs", "--cloud", "aws", "-f", str(EXAMPLE),
                                "--since", "3651d"], env=env, cwd=tmp_path))
    assert line.startswith("--since '3651d': give a duration up to 3650d")


@pytest.mark.parametrize(("argv", "needle"), [
    (["warm", "--replicas", "nan"], "--replicas: 'nan': give a number of replicas from 0 to"),
    (["warm", "--replicas", "1", "--timeout", "inf"], "--timeout: 'inf': give seconds from 0"),
    (["warm", "--replicas", "١٢"], "--replicas: '١٢': give a number of replicas"),
    (["nodes", "check", "--timeout", "0"], "--timeout: '0': give seconds above 0 to 3600"),
    (["nodes", "check", "--port", "70000"], "--port/-p: '70000': give a port from 1 to 65535"),
    (["image", "prune", "--keep", "-1"], "--keep: '-1': give a number of images from 0"),
    (["sandbox", "start", "--boot-speedup", "nan"], "--boot-speedup: 'nan': give a speedup"),
    (["sandbox", "start", "--quota", "L-417A185B=nan"], "--quota L-417A185B=nan: write "
     "CODE=VCPUS"),
    (["ls", "--cloud", "aws", "--region", "us-east-1;rm"], "--region: 'us-east-1;rm' is not a "
     "region name"),
    (["ls", "--cloud", "gcp", "--region", "r1", "--project", "a;b"], "--project: 'a;b' is not "
     "a GCP project id"),
    (["warm", "--bogus"], "No such option: --bogus; see `poolctl warm --help`"),
])
def test_bad_flag_values_are_one_line(env, tmp_path, argv, needle):
    line = one_line(inproc.run([*argv, "-f", str(EXAMPLE)] if argv[0] in ("warm", "nodes")
                               else argv, env=env, cwd=tmp_path))
    assert line.startswith(needle), line


def test_warm_refuses_spare_capacity_that_can_never_serve(env, tmp_path):
    """A pool of 1 to 4 nodes of 4 replicas: 3 spare nodes (12 replicas) can ever serve; 80
    replicas (20 nodes) were accepted, and kept 17 nodes that never would. Refused before
    any cloud call (none is reachable here)."""
    f = tmp_path / "poolctl.yaml"
    f.write_text(pool_yaml(min_replicas=4, max_replicas=16, warm=4))
    line = one_line(inproc.run(["warm", "--replicas", "80", "--cloud", "aws", "-f", str(f)],
                               env=env, cwd=tmp_path))
    assert line == ("--replicas 80: pool 'chat-70b' grows to at most 4 node(s) and keeps 1 in "
                    "service, so at most 3 spare node(s) (12 replicas) can ever serve; ask for "
                    "at most 12, or raise scaling.max_replicas and deploy")


# -- paths --------------------------------------------------------------------------------


def test_init_dir_under_proc(env, tmp_path):
    line = one_line(inproc.run(["init", "--dir", "/proc/poolctl-x"], env=env, cwd=tmp_path))
    assert line.startswith("--dir: /proc/poolctl-x: cannot write in /proc")
    assert not Path("/proc/poolctl-x").exists()


def test_synth_out_under_proc_or_a_file(env, tmp_path):
    line = one_line(inproc.run(["synth", "-f", str(EXAMPLE), "--out", "/proc/poolctl-x"],
                               env=env, cwd=tmp_path))
    assert line.startswith("--out: /proc/poolctl-x: cannot write in /proc")
    (tmp_path / "file").write_text("")
    line = one_line(inproc.run(["synth", "-f", str(EXAMPLE), "--out",
                                str(tmp_path / "file" / "out")], env=env, cwd=tmp_path))
    assert line.startswith(f"--out: {tmp_path / 'file'} is a file, not a folder")


def test_synth_makes_a_nested_out_folder(env, tmp_path, monkeypatch):
    """The synthesizer (jsii) makes only the last folder of --out: a new a/b failed on
    ENOENT. The CLI makes it, after the checks (a refused file leaves none)."""
    seen = []

    def fake_synth(cfg, tgts, out):
        seen.append(out.is_dir())
        return []

    monkeypatch.setattr("poolctl.commands.build.synth_targets", fake_synth)
    out = tmp_path / "a" / "b"
    r = inproc.run(["synth", "-f", str(EXAMPLE), "--out", str(out)], env=env, cwd=tmp_path)
    assert r.returncode == 0 and seen == [True], r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(pool_yaml(instance_type="g6e.48xlarge"))  # a failed rule
    r = inproc.run(["synth", "-f", str(bad), "--out", str(tmp_path / "c" / "d")], env=env,
                   cwd=tmp_path)
    assert r.returncode == 1 and not (tmp_path / "c").exists()


def test_schema_out_refusals_write_nothing(env, tmp_path):
    cases = {
        str(tmp_path): f"--out: {tmp_path} is a folder; give a file name",
        str(tmp_path / "missing" / "f.json"): f"--out: {tmp_path / 'missing'} is not a folder",
        "/dev/zero": "--out: /dev/zero is not a regular file",
        "/proc/poolctl-x.json": "--out: cannot write /proc/poolctl-x.json (",
    }
    before = listing(tmp_path)
    for out, needle in cases.items():
        line = one_line(inproc.run(["schema", "--out", out], env=env, cwd=tmp_path))
        assert line.startswith(needle), line
    assert listing(tmp_path) == before


def test_schema_out_replaces_only_its_own_file(env, tmp_path):
    theirs = tmp_path / "passwd"
    theirs.write_text("root:x:0:0::/root:/bin/bash\n")
    link = tmp_path / "link.json"
    link.symlink_to(theirs)
    for target in (theirs, link):
        line = one_line(inproc.run(["schema", "--out", str(target)], env=env, cwd=tmp_path))
        assert line == (f"--out: {target} exists and is not a poolctl schema; give another "
                        "file, or pass --force to replace it")
    assert theirs.read_text() == "root:x:0:0::/root:/bin/bash\n"
    ours = tmp_path / "poolctl.schema.json"
    for _ in range(2):  # new, then a schema poolctl wrote: replaced without --force
        r = inproc.run(["schema", "--out", str(ours)], env=env, cwd=tmp_path)
        assert r.returncode == 0 and r.stderr == ""
        assert json.loads(ours.read_text())["title"] == "poolctl.yaml"
    r = inproc.run(["schema", "--out", str(link), "--force"], env=env, cwd=tmp_path)
    assert r.returncode == 0 and not link.is_symlink()  # the link replaced, not followed
    assert theirs.read_text() == "root:x:0:0::/root:/bin/bash\n"
    assert listing(tmp_path) == ["link.json", "passwd", "poolctl.schema.json"]  # no temp file


# -- the environment ----------------------------------------------------------------------


@pytest.mark.parametrize(("var", "value", "needle"), [
    ("POOLCTL_HOME", "/proc/poolctl-x", "POOLCTL_HOME=/proc/poolctl-x: cannot write in /proc"),
    ("POOLCTL_HOME", "~poolctl-no-such-user/x", "POOLCTL_HOME=~poolctl-no-such-user/x: its ~ "
     "names no home folder"),
    ("TMPDIR", "/nonexistent", "TMPDIR=/nonexistent: not a folder you can write in"),
    ("AWS_REGION", "us-east-1; rm -rf /",
     "AWS_REGION=us-east-1; rm -rf /: not an AWS region name"),
    ("AWS_DEFAULT_REGION", "../x", "AWS_DEFAULT_REGION=../x: not an AWS region name"),
])
def test_bad_environment_is_one_line(env, tmp_path, var, value, needle):
    line = one_line(inproc.run(["validate", "-f", str(EXAMPLE)], env={**env, var: value},
                               cwd=tmp_path))
    assert line.startswith(needle), line


@pytest.fixture
def no_home(monkeypatch, env):
    """HOME unset, and no password entry for this user (a container's random uid)."""
    def missing(uid):
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", missing)
    env = dict(env)
    env.pop("HOME", None)
    return env


def test_home_unset_without_a_password_entry(no_home, tmp_path):
    env = {k: v for k, v in no_home.items() if k != "POOLCTL_HOME"}
    line = one_line(inproc.run(["ls", "--sandbox"], env=env, cwd=tmp_path))
    assert line.startswith("HOME: not set, and this user has no home folder")
    line = one_line(inproc.run(["validate", "-f", str(EXAMPLE)],
                               env={**no_home, "POOLCTL_PROVIDER_MIRROR": "~/mirror"},
                               cwd=tmp_path))
    assert line.startswith("POOLCTL_PROVIDER_MIRROR=~/mirror: not a directory")


def test_aws_settings_are_one_line(env, tmp_path):
    """botocore's own refusals, raised where the clouds' code makes its session (before any
    request), are one line naming the setting."""
    ls = ["ls", "--cloud", "aws", "--region", "us-east-1"]
    line = one_line(inproc.run(ls, env={**env, "AWS_PROFILE": "nope"}, cwd=tmp_path))
    assert line.startswith("AWS_PROFILE=nope: no such profile in the AWS config")
    garbage = tmp_path / "aws-config"
    garbage.write_text("this is [not an ini file\n")
    line = one_line(inproc.run(ls, env={**env, "AWS_CONFIG_FILE": str(garbage)}, cwd=tmp_path))
    # the path is shortened in the line when long (a pytest tmp path may be)
    assert ": not a valid AWS config file" in line and "AWS_CONFIG_FILE" in line, line
    assert line.startswith(str(garbage)[:30]), line
    profile = tmp_path / "aws-config-region"
    profile.write_text("[default]\nregion = us-east-1;rm\n")
    env = {k: v for k, v in env.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    line = one_line(inproc.run(["ls", "--cloud", "aws"],
                               env={**env, "AWS_CONFIG_FILE": str(profile)}, cwd=tmp_path))
    assert line.startswith("AWS region 'us-east-1;rm' is not a region name; check --region")


# -- the last net -------------------------------------------------------------------------


def boom(file):
    raise ZeroDivisionError("division by zero\nsecond line")


def test_an_escaped_exception_is_one_line_and_exit_70(env, tmp_path, monkeypatch):
    monkeypatch.setattr("poolctl.commands.check.load", boom)
    quiet = {k: v for k, v in env.items() if k != "POOLCTL_DEBUG"}
    r = inproc.run(["validate"], env=quiet, cwd=tmp_path, internal_error_ok=True)
    assert one_line(r, 70) == ("internal error in validate: ZeroDivisionError: division by "
                               "zero; please report it with --debug output")
    for argv, extra in ((["--debug", "validate"], {}), (["validate"], {"POOLCTL_DEBUG": "1"})):
        r = inproc.run(argv, env={**quiet, **extra}, cwd=tmp_path, internal_error_ok=True)
        assert r.returncode == 70
        assert r.stderr.startswith("Traceback (most recent call last):")
        assert 'raise ZeroDivisionError("division by zero\\nsecond line")' in r.stderr
        assert r.stderr.splitlines()[-1].startswith("poolctl: internal error in validate: ")


def test_the_suite_fails_on_an_internal_error(env, tmp_path, monkeypatch):
    """The net is for users; a test that ends in it fails unless it provokes it."""
    monkeypatch.setattr("poolctl.commands.check.load", boom)
    with pytest.raises(AssertionError, match=r"poolctl validate: an internal error \(exit 70\)"):
        inproc.run(["validate"], env=env, cwd=tmp_path)


def test_internal_error_names_a_subcommand(env, tmp_path, monkeypatch):
    def fail(*a, **k):
        raise KeyError("x")

    monkeypatch.setattr("poolctl.sandbox.manager.status", fail)
    r = inproc.run(["sandbox", "status", "--json"], env={**env, "POOLCTL_DEBUG": ""},
                   cwd=tmp_path, internal_error_ok=True)
    assert one_line(r, 70).startswith("internal error in sandbox status: KeyError: 'x';")


def test_an_arn_prints_as_it_is_not_as_an_emoji(capsys):
    # Secrets Manager ARNs hold ":secret:", one of rich's emoji codes
    from poolctl.commands.common import console

    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:chat-70b-key-AbCdEf"
    console().print(f"boot failed: {arn}", markup=False, soft_wrap=True)  # as status prints it
    assert capsys.readouterr().out.strip() == f"boot failed: {arn}"
