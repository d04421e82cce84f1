"""poolctl rollout: (being built)."""

import typer

app = typer.Typer(help="rollout", no_args_is_help=True)
