"""The `fa` command: a thin shell over the library. Each command lives in its own module under
buildtool/commands/ and is registered here; nothing else belongs in this file."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Annotated

import typer

from buildtool.commands import build as build_cmd
from buildtool.commands import ci as ci_cmd
from buildtool.commands import doctor as doctor_cmd

DISTRIBUTION = "fa-toolchain"

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


def _print_version(value: bool) -> None:
    if not value:
        return
    where = Path(__file__).resolve().parent
    try:
        typer.echo(f"fa {importlib.metadata.version(DISTRIBUTION)} from {where}")
    except importlib.metadata.PackageNotFoundError:
        typer.echo(f"fa: {DISTRIBUTION} is not installed (running from {where}); `pip install .` installs it")
        raise typer.Exit(1) from None
    raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Show fa's version and exit."),
    ] = False,
) -> None:
    """Build, choose and install fused attention kernels for PyTorch."""


build_cmd.register(app)
doctor_cmd.register(app)
ci_cmd.register(app)

if __name__ == "__main__":
    app()
