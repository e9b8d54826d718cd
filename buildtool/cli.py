"""The `fa` command: a thin shell over the library. Each command lives in its own module under
buildtool/commands/ and is registered here; nothing else belongs in this file."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Annotated

import typer

from buildtool.commands import build, ci, doctor, index, install, probe

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


build.register(app)
index.register(app)
app.command("probe")(probe.probe_cmd)
app.command("doctor")(doctor.doctor_cmd)
app.command("install")(install.install_cmd)
ci.register(app)

if __name__ == "__main__":
    app()
