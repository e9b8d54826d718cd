"""The fa commands: one module each with a `register(app)`, named in COMMANDS, and the one place that
prints an error. cli.py (the console script) and _app.py (the typer application) both read this
module and neither imports the other. Nothing here loads typer or rich: `fa probe` runs without them."""

from __future__ import annotations

import sys

from buildtool.errors import FaError

DISTRIBUTION = "fa-toolchain"

# command -> its module under buildtool/commands/ (each has register(app)), in the order help lists them
COMMANDS = {
    "build": "build",
    "index": "index",
    "probe": "probe",
    "doctor": "doctor",
    "check": "check",
    "install": "install",
    "ci": "ci",
}


def print_error(error: FaError) -> None:
    """`error: <message>` on stderr, the message as plain text (a path may hold `[/b]`); the prefix red
    on a terminal."""
    prefix = "\x1b[1;31merror:\x1b[0m" if sys.stderr.isatty() else "error:"
    sys.stderr.write(f"{prefix} {error.text()}\n")
    sys.stderr.flush()
