"""The `poolctl` command: a thin shell over the library.

Each command parses its options, calls the library and renders. Heavy imports (cdktf, boto3,
google-cloud) happen inside the commands that need them, so `--help`, `validate` and `plan`
stay fast.
"""

from __future__ import annotations

import sys

import typer

from poolctl import __version__
from poolctl.commands import (
    build,
    capacity,
    catalog,
    check,
    image,
    init,
    nodes,
    ops,
    perf,
    pools,
    quota,
    rollout,
    sandbox,
    simulate,
    weights,
)

app = typer.Typer(
    name="poolctl",
    help="Provision and operate GPU inference pools on AWS and GCP through Terraform.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain click help: rich's help renderer alone costs ~100 ms of start-up.
    rich_markup_mode=None,
)

app.command()(check.validate)
app.command()(check.plan)
app.command()(check.schema)
app.command()(catalog.catalog)
app.command()(init.init)
app.command()(simulate.simulate)
app.command()(build.synth)
app.command()(build.deploy)
app.command()(build.destroy)
app.command()(ops.warm)
app.command()(ops.status)
app.command()(pools.ls)
app.command()(pools.logs)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(quota.app, name="quota")
app.add_typer(capacity.app, name="capacity")
app.add_typer(rollout.app, name="rollout")
app.add_typer(nodes.app, name="nodes")
app.add_typer(image.app, name="image")
app.add_typer(weights.app, name="weights")
app.add_typer(perf.app, name="perf")


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
) -> None:
    from poolctl.envcheck import check_environment

    _debug[0] = debug
    # Before any command acts: a bad POOLCTL_* value must not surface halfway through one.
    check_environment()


def main() -> None:
    from poolctl.errors import PoolctlError

    _debug[0] = False
    try:
        rv = app(standalone_mode=False, prog_name="poolctl")
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
        from poolctl.errors import known_error

        if (known := known_error(e)) is not None:
            _fail(*known)
        _internal_error(e)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    # Lines end at "\n" only; any other control character (a carriage return, an ANSI escape,
    # a direction override from a value the message quotes) is shown escaped, never obeyed.
    for line in message.split("\n") if message else ["failed"]:
        safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
        sys.stderr.write(f"poolctl: {safe}\n")
    sys.exit(code)


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
    import os

    from poolctl.errors import INTERNAL_ERROR

    if _debug[0] or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    _fail(f"internal error in {_command_name(sys.argv[1:])}: {type(e).__name__}: {first}; "
          "please report it with --debug output", INTERNAL_ERROR)


def _command_name(argv: list[str]) -> str:
    """`warm`, `sandbox start` ...: the words of argv that name a command."""
    group: object = typer.main.get_command(app)
    words: list[str] = []
    for arg in argv:
        commands = getattr(group, "commands", None)
        if arg.startswith("-"):
            continue
        if not isinstance(commands, dict) or arg not in commands:
            break
        words.append(arg)
        group = commands[arg]
    return " ".join(words) or "poolctl"


if __name__ == "__main__":
    main()
