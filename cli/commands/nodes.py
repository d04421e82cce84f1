"""poolctl nodes: (being built)."""

import typer

app = typer.Typer(help="nodes", no_args_is_help=True)
