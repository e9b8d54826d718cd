"""The `fa` command: a thin shell over the library. Each command lives in its own module under
buildtool/commands/ and is registered here; nothing else belongs in this file."""

from __future__ import annotations

import typer

from buildtool.commands import build as build_cmd
from buildtool.commands import ci as ci_cmd
from buildtool.commands import doctor as doctor_cmd

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Build, choose and install fused attention kernels for PyTorch.",
    pretty_exceptions_enable=False,
)

build_cmd.register(app)
doctor_cmd.register(app)
ci_cmd.register(app)

if __name__ == "__main__":
    app()
