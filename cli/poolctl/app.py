"""The `poolctl` command: a thin shell over the library.

Each command parses its options, calls the library and renders. Heavy imports (cdktn, boto3,
google-cloud) happen inside the commands that need them, so `--help`, `validate` and `plan`
stay fast.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import typer
import typer.core
import typer.main
from typer._click.utils import make_default_short_help  # the click typer vendors

from poolctl import __version__
from poolctl.envcheck import check_environment
from poolctl.errors import (
    INTERNAL_ERROR,
    EscapingStream,
    PoolctlError,
    UsageError,
    known_error,
    printable,
    profile_flag,
    shown,
)


@dataclass(frozen=True)
class Entry:
    """One command of the root, loaded when it runs (or its own help is asked for): `attr`
    of `module` is a command function or a sub-app. `summary` is what the root's help lists,
    the first sentence of its docstring (tests/unit/test_cli.py keeps the two equal)."""

    name: str
    module: str
    attr: str
    summary: str


# In the order the root's help lists them.
COMMANDS = (
    Entry("validate", "check", "validate",
          "Check the file and every rule; print each failed check with a hint."),
    Entry("plan", "check", "plan",
          "Sizing, memory, quota and cost per pool and cloud; no cloud calls."),
    Entry("schema", "check", "schema", "The JSON Schema of poolctl.yaml, for editors."),
    Entry("catalog", "catalog", "catalog", "Instance types (GPUs, HBM, NVLink, NVMe, vCPU, "
          "price, quota) and model presets."),
    Entry("init", "init", "init", "Write a commented poolctl.yaml, a cdktf.json (`cdktn "
          "synth` runs poolctl's synthesis) and a CI workflow (.github/workflows/poolctl.yml)."),
    Entry("simulate", "simulate", "simulate",
          "Replay traffic through the pool's serving model and scaling policy."),
    Entry("replay", "replay", "replay", "Send a trace through a pool's endpoint and report "
          "TTFT, TPOT, errors and goodput."),
    Entry("synth", "build", "synth",
          "Write DIR/stacks/<stack>/cdk.tf.json for each pool and cloud."),
    Entry("deploy", "build", "deploy", "Synth, then Terraform/OpenTofu init, plan and apply."),
    Entry("destroy", "build", "destroy",
          "Destroy what deploy created (plan -destroy, confirm, apply)."),
    Entry("warm", "ops", "warm",
          "Prepare N replicas of spare capacity before a launch, now or for a window."),
    Entry("status", "ops", "status",
          "Nodes in service / warm / pending, rollout progress, queue, and the SLO as served."),
    Entry("ls", "pools", "ls", "Pools deployed in a region, found by their poolctl "
          "tags/labels (no file needed)."),
    Entry("logs", "pools", "logs", "The pool's logs: its CloudWatch Logs group (AWS) or its "
          "VMs' Cloud Logging entries (GCP)."),
    Entry("sandbox", "sandbox", "app", "A local AWS emulator (moto + poolctl's extensions) "
          "on loopback: the target of --sandbox."),
    Entry("quota", "quota", "app", "Quota needed vs."),
    Entry("capacity", "capacity", "app",
          "Capacity: zones offering the type, reservations, the peak beyond them."),
    Entry("rollout", "rollout", "app", "Roll a new image or model version through the pool."),
    Entry("nodes", "nodes", "app", "The nodes of a pool: start-up phases; checks over SSH."),
    Entry("image", "image", "app",
          "Pre-pulled node images built with Packer (see images/README.md)."),
    Entry("weights", "weights", "app",
          "The weights folder a pool's weights_uri holds, and its manifest."),
    Entry("perf", "perf", "app", "The serving model against measurements."),
)
_BY_NAME = {e.name: e for e in COMMANDS}


def load_command(entry: Entry) -> Any:
    """The click command of `entry`, its module imported now."""
    obj = getattr(importlib.import_module(f"poolctl.commands.{entry.module}"), entry.attr)
    if isinstance(obj, typer.Typer):
        obj.rich_markup_mode = None  # as the root: plain click help (see `app` below)
        group = typer.main.get_group(obj)
        group.name = entry.name
        return group
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    one.command(name=entry.name)(obj)
    return typer.main.get_command(one)


class LazyGroup(typer.core.TyperGroup):
    """The root: a command's module (and the library under it: the config model, clouds,
    runtime) loads only when that command runs, so `poolctl --help` imports typer and little
    else (click's LazyGroup pattern)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [e.name for e in COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = _BY_NAME.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(entry)
        return self.commands[cmd_name]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        limit = formatter.width - 6 - max(len(e.name) for e in COMMANDS)
        rows = [(e.name, make_default_short_help(e.summary, limit))
                for e in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="poolctl",
    cls=LazyGroup,
    help="Provision and operate GPU inference pools on AWS and GCP through Terraform.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain click help: rich's help renderer alone costs ~100 ms of start-up.
    rich_markup_mode=None,
)


def command_tree() -> Any:
    """The whole click tree, every command loaded (for tests and tools that walk it)."""
    root: Any = typer.main.get_command(app)
    for entry in COMMANDS:
        root.get_command(None, entry.name)
    return root


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"poolctl {__version__}\n")
        raise typer.Exit()


# --debug (a root option) or POOLCTL_DEBUG=1: an internal error prints its traceback too.
DEBUG_ENV = "POOLCTL_DEBUG"
_debug: list[bool] = [False]  # set by the root callback, read by main (one per run)


@app.callback()
def _root(
    # eager: handled while parsing, before click asks for a command
    version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                 callback=_print_version, is_eager=True),
    debug: bool = typer.Option(False, "--debug", help="On an internal error (a bug: exit "
                               "70), print its traceback for the report. Also POOLCTL_DEBUG=1."),
    profile: str | None = typer.Option(
        None, "--profile", metavar="NAME", show_default=False,
        help="The AWS named profile for every AWS call, Terraform's and Packer's included, "
        "as `aws --profile` (its credentials, not the environment's); also after the "
        "command."),
) -> None:

    _debug[0] = debug
    if profile is not None:
        use_profile(profile)
    # Before any command acts: a bad POOLCTL_* value must not surface halfway through one.
    check_environment()


def main() -> None:
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, EscapingStream):
        sys.stdout = EscapingStream(sys.stdout)
    if not isinstance(sys.stderr, EscapingStream):
        sys.stderr = EscapingStream(sys.stderr)
    try:
        _main()
    except KeyboardInterrupt:
        # Ctrl-C wherever it lands, handling another error included: exit 130, quietly.
        sys.exit(130)
    finally:
        sys.stdout, sys.stderr = saved


# AWS profile names: what the AWS CLI writes in ~/.aws/config section names.
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+=,-]{0,63}")
# Credentials the environment may hold, which `--profile` puts aside as the AWS CLI does.
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
             "AWS_DEFAULT_PROFILE")


def use_profile(name: str) -> None:
    """`--profile NAME`: AWS_PROFILE for boto3 and the tools poolctl runs (their environment
    is this process's), the environment's own keys set aside."""
    if not _PROFILE.fullmatch(name):
        raise UsageError(f"--profile: {shown(name)} is not a profile name (letters, digits and "
                         "_.@+=,- as in ~/.aws/config); give the name of one")
    os.environ["AWS_PROFILE"] = name
    for key in _ENV_KEYS:
        os.environ.pop(key, None)
    profile_flag[0] = True


def lift_profile(argv: list[str]) -> list[str]:
    """`--profile NAME` wherever it is given (before `--`), as the root option it is: the AWS
    CLI takes it after the command too."""
    end = argv.index("--") if "--" in argv else len(argv)
    head, lifted, i = [], [], 0
    while i < end:
        a = argv[i]
        if a == "--profile" and i + 1 < end:
            lifted += argv[i:i + 2]
            i += 2
            continue
        if a.startswith("--profile="):
            lifted.append(a)
        else:
            head.append(a)
        i += 1
    return [*lifted, *head, *argv[end:]]


def _main() -> None:

    _debug[0] = False
    try:
        rv = app(args=lift_profile(sys.argv[1:]), standalone_mode=False, prog_name="poolctl")
    except PoolctlError as e:
        _fail(str(e), e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("poolctl: aborted\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("poolctl: interrupted\n")
        sys.exit(130)
    except Exception as e:
        # Errors of click (typer's vendored click), found by their methods: one line naming
        # the flag; the help when no arguments asked for it.
        fmt, show = getattr(e, "format_message", None), getattr(e, "show", None)
        if callable(fmt) and isinstance(code := getattr(e, "exit_code", None), int):
            if type(e).__name__ == "NoArgsIsHelpError" and callable(show):
                show()
                sys.exit(code)
            _fail(_usage_line(e, str(fmt())), code)

        if (known := known_error(e)) is not None:
            _fail(*known)
        _internal_error(e)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    # Lines end at "\n" only; any other control character (a carriage return, an ANSI escape,
    # a direction override from a value the message quotes) is shown escaped, never obeyed.
    for line in message.split("\n") if message else ["failed"]:
        sys.stderr.write(f"poolctl: {printable(line)}\n")
    sys.exit(1 if code and _detailed_exitcode(sys.argv[1:]) else code)


def _detailed_exitcode(argv: list[str]) -> bool:
    """`deploy/destroy --detailed-exitcode` (Terraform's convention): 2 says "changes
    present", so every failure, a usage error or an internal one included, exits 1."""
    args = argv[:argv.index("--")] if "--" in argv else argv
    return "--detailed-exitcode" in args


def _usage_line(e: Exception, message: str) -> str:
    """A click usage error as one line: the flag, what was wrong with it, and where the
    command's help is."""
    param, ctx = getattr(e, "param", None), getattr(e, "ctx", None)
    if type(e).__name__ == "BadParameter" and param is not None and param.opts:
        # typer's own types raise through pydantic, which prefixes its ValueErrors
        why = str(getattr(e, "message", message)).removeprefix("Value error, ")
        return f"{'/'.join(param.opts)}: {' '.join(why.split())}"
    where = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
    return " ".join(message.split()).rstrip(".") + where


def _internal_error(e: BaseException) -> None:
    """The last net: an exception no command turned into a line is a bug of poolctl. The
    user gets one line and exit 70 (EX_SOFTWARE); the traceback with --debug."""

    if _debug[0] or os.environ.get(DEBUG_ENV, "") not in ("", "0"):

        traceback.print_exception(e, file=sys.stderr)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    _fail(f"internal error in {_command_name(sys.argv[1:])}: {type(e).__name__}: {first}; "
          "please report it with --debug output", INTERNAL_ERROR)


def _command_name(argv: list[str]) -> str:
    """`warm`, `sandbox start` ...: the words of argv that name a command."""
    group: Any = typer.main.get_command(app)
    words: list[str] = []
    for arg in argv:
        if arg.startswith("-"):
            continue
        if not hasattr(group, "list_commands") or arg not in group.list_commands(None):
            break
        words.append(arg)
        group = group.get_command(None, arg)
    return " ".join(words) or "poolctl"


if __name__ == "__main__":
    main()
