"""The `fa` command: a thin shell over the library. Each command lives in its own module under
buildtool/commands/ and is registered here.

Commands raise buildtool.errors.FaError (or a subclass) for anything that stops them, and return an
exit status when their answer is a "no" (doctor's fallback, a failed install); `_Commands.invoke`
below is the one place that prints an error and turns it into the exit code it carries.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from buildtool.commands import build, ci, doctor, index, install, probe
from buildtool.errors import EXIT_FAILED, FaError

DISTRIBUTION = "fa-toolchain"


def print_error(error: FaError) -> None:
    """`error: <message>` on stderr, the message as plain text (a path may hold `[/b]`)."""
    typer.echo(typer.style("error:", fg="red", bold=True) + " " + error.text(), err=True)


class _Commands(typer.core.TyperGroup):
    def invoke(self, ctx: Any) -> Any:  # a click Context (typer vendors click from 0.29 on)
        try:
            status = super().invoke(ctx)
        except FaError as error:
            print_error(error)
            raise typer.Exit(error.exit_code) from None
        if isinstance(status, int) and not isinstance(status, bool) and status:
            raise typer.Exit(status)
        return status


app = typer.Typer(cls=_Commands, no_args_is_help=True, pretty_exceptions_enable=False)


def _print_version(value: bool) -> None:
    if not value:
        return
    where = Path(__file__).resolve().parent
    try:
        typer.echo(f"fa {importlib.metadata.version(DISTRIBUTION)} from {where}")
    except importlib.metadata.PackageNotFoundError:
        typer.echo(f"fa: {DISTRIBUTION} is not installed (running from {where}); `pip install .` installs it")
        raise typer.Exit(EXIT_FAILED) from None
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
