"""The environment, fuzzed (issue 23): POOLCTL_*, AWS_*, HOME and TMPDIR unset, pointing at
the wrong kind of thing (a folder, a device, /proc, a path under a file, a user who does not
exist) or plain garbage, for a few cheap commands: `validate`, `plan`, `schema`, `ls
--sandbox` with no sandbox running, and `ls --sandbox` against the session's sandbox (the
one that makes an AWS client, so botocore reads its settings).

Each run succeeds, or stops with exactly one line on stderr and exit 2 (1 for a call the
sandbox refuses, e.g. in a region it does not emulate); never an internal
error (exit 70: tests/inproc.py fails the test on it) or a traceback. Nothing here can leave
the machine: the AWS endpoint stays on loopback (tests/conftest.py), and no value names a
host.
"""

from __future__ import annotations

import os
import pwd
import stat
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poolctl.envcheck import CHECKS
from tests import inproc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"

VARIABLES = sorted({*CHECKS, "POOLCTL_FILE", "POOLCTL_DEBUG", "AWS_PROFILE",
                    "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                    "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_DEFAULTS_MODE",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                    "AWS_CA_BUNDLE", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
                    "AWS_STS_REGIONAL_ENDPOINTS", "HOME", "TMPDIR"})
# A place on this machine of each awkward kind (made per run in `places`).
KINDS = ["folder", "file", "garbage-file", "under-a-file", "fifo", "unreadable", "missing"]
GARBAGE = ["", " ", "0", "-1", "nan", "inf", "1e400", "9" * 5000, "²", "٣", "true",
           "~", "~/x", "~poolctl-no-such-user/x", "/proc/poolctl-x", "/etc", "/dev/null",
           "/dev/zero", "us-east-1; rm -rf /", "$(id)", "\x1b[31mred", "\u202eabc", "é" * 300,
           '{"L-417A185B": 1e400}', '{"a": "b"}', "[", "http://127.0.0.1:9/x?y", "file:///x",
           "a@b", "standard", "adaptive", "legacy"]
VALUES = st.one_of(
    st.none(),  # unset
    st.sampled_from(GARBAGE),
    st.sampled_from(KINDS).map(lambda k: ("place", k)),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
            max_size=16),
)
ENVIRONMENTS = st.dictionaries(st.sampled_from(VARIABLES), VALUES, min_size=1, max_size=4)


def places(root: Path) -> dict[str, str]:
    folder = root / "folder"
    folder.mkdir()
    (root / "file").write_text("x = 1\n")
    (root / "garbage-file").write_bytes(b"[[[ \xff\xfe not ini\n")
    unreadable = root / "unreadable"
    unreadable.write_text("[default]\n")
    unreadable.chmod(0)
    os.mkfifo(root / "fifo")
    return {"folder": str(folder), "file": str(root / "file"),
            "garbage-file": str(root / "garbage-file"),
            "under-a-file": str(root / "file" / "x"), "fifo": str(root / "fifo"),
            "unreadable": str(unreadable), "missing": str(root / "missing" / "x")}


# A FIFO where a file is read blocks the reader for ever: a hang, not a traceback. Refused
# up front for the AWS files (envcheck); `-f`/POOLCTL_FILE naming one is the config loader's
# (issue 23's "`-f` naming a FIFO"), not fuzzed here.
NOT_A_FIFO = {"POOLCTL_FILE"}


def run(argv: list[str], mutations: dict[str, object], base: dict[str, str], tmp: Path,
        no_passwd: bool) -> None:
    where = places(tmp)
    env = dict(base)
    for name, value in mutations.items():
        if value is None:
            env.pop(name, None)
            continue
        if isinstance(value, tuple):
            if value[1] == "fifo" and name in NOT_A_FIFO:
                continue
            value = where[value[1]]
        env[name] = str(value)
    with ExitStack() as stack:
        if no_passwd:  # a container's uid without a password entry: ~ cannot be expanded
            stack.enter_context(mock.patch.object(pwd, "getpwuid", side_effect=KeyError))
        r = inproc.run(argv, env=env, cwd=tmp, timeout=120)
    if r.returncode != 0:  # 2: refused; 1: the sandbox refused a call (a region it lacks)
        lines = r.stderr.strip().splitlines()
        assert r.returncode in (1, 2) and len(lines) == 1, (mutations, r.returncode,
                                                            r.stderr[-2000:])
        assert lines[0].startswith("poolctl: "), (mutations, lines[0])


COMMANDS = {
    "validate": ["validate"],
    "plan": ["plan", "--cloud", "aws"],
    "schema": ["schema"],
    "ls-no-sandbox": ["ls", "--sandbox"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@given(mutations=ENVIRONMENTS, no_passwd=st.booleans())
@example(mutations={"HOME": None}, no_passwd=True)
@example(mutations={"POOLCTL_HOME": "/proc/poolctl-x"}, no_passwd=False)
@example(mutations={"TMPDIR": ("place", "missing")}, no_passwd=False)
def test_environment(command, mutations, no_passwd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("env")
    base = {**os.environ, "POOLCTL_HOME": str(tmp / "home"), "POOLCTL_FILE": str(EXAMPLE)}
    run(COMMANDS[command], mutations, base, tmp, no_passwd)


@given(mutations=ENVIRONMENTS, no_passwd=st.booleans())
@example(mutations={"AWS_PROFILE": "nope"}, no_passwd=False)
@example(mutations={"AWS_CONFIG_FILE": ("place", "garbage-file")}, no_passwd=False)
@example(mutations={"AWS_CONFIG_FILE": ("place", "fifo")}, no_passwd=False)
def test_environment_of_an_aws_client(sandbox, sandbox_home, mutations, no_passwd,
                                      tmp_path_factory):
    """`ls --sandbox` against the session's sandbox: the command makes boto3 clients, which
    read AWS_CONFIG_FILE, AWS_PROFILE and the like even with the sandbox's credentials."""
    tmp = tmp_path_factory.mktemp("env")
    base = {**os.environ, "POOLCTL_HOME": str(sandbox_home)}
    run(["ls", "--sandbox"], mutations, base, tmp, no_passwd)


def test_the_fifo_is_one():
    """The places are of the kinds they are named for (a FIFO, a folder ...)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        where = places(Path(d))
        assert stat.S_ISFIFO(os.stat(where["fifo"]).st_mode)
        assert os.path.isdir(where["folder"]) and not os.path.exists(where["missing"])
