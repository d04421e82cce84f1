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


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"poolctl {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    # eager: handled while parsing, before click asks for a command
    version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                 callback=_print_version, is_eager=True),
) -> None:
    from poolctl.envcheck import check_environment

    # Before any command acts: a bad POOLCTL_* value must not surface halfway through one.
    check_environment()


def main() -> None:
    from poolctl.errors import PoolctlError

    try:
        rv = app(standalone_mode=False)
    except PoolctlError as e:
        for line in str(e).splitlines() or [type(e).__name__]:
            sys.stderr.write(f"poolctl: {line}\n")
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("poolctl: aborted\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("poolctl: interrupted\n")
        sys.exit(130)
    except Exception as e:
        # Usage errors of click (or typer's vendored click): they print themselves.
        if hasattr(e, "show") and isinstance(code := getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(code)
        raise
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
