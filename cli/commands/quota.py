"""poolctl quota: (being built)."""

import typer

app = typer.Typer(help="quota", no_args_is_help=True)
