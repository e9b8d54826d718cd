"""The fa commands: one module each with a `register(app)`, named in COMMANDS, and the one place that
prints an error. cli.py (the console script) and _app.py (the typer application) both read this
module and neither imports the other. Nothing here loads typer or rich: `fa probe` runs without them."""

from __future__ import annotations

import sys

from buildtool.core.textfile import printable
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


# What `fa --help` lists for each command: the first paragraph of its docstring, here so that listing
# them imports none (tests/ci/test_help_text.py checks each against the command's own).
SUMMARIES = {
    "build": "Build the wheels of a matrix (or of the installed torch with --local) and index them.",
    "index": "Rewrite DIRECTORY/index.json and DIRECTORY/simple/ from the wheels in it.",
    "probe": "Describe this machine (OS, Python, torch, driver, GPUs) without importing torch.",
    "doctor": "Which wheel fits, why the others don't, and what the runtime will do on this GPU.",
    "check": "Verify the installed kernels on this machine's GPUs against an fp32 reference.",
    "install": "Install the wheel fa doctor picks for this machine, checked against the index's sha256.",
    "ci": "CI files generated from matrix.yaml.",
}


def say(command: str, doing: str) -> None:
    """A command's first line, on stderr: what it is doing, printed before its first slow step (loading
    the build pipeline or torch, probing, reading wheels), so that no command leaves a user looking at
    nothing for seconds (issue 37: `fa build --dry-run` was silent for 16 s). Stderr keeps stdout for
    the answer (--json stays one JSON document). It quotes paths from the command line: escaped and
    capped as an error's lines are."""
    sys.stderr.write(f"fa {command}: {_shown_message(doing)}\n")
    sys.stderr.flush()


def print_error(error: FaError) -> None:
    """`error: <message>` on stderr, the message as plain text (a path may hold `[/b]`); the prefix red
    on a terminal."""
    prefix = "\x1b[1;31merror:\x1b[0m" if sys.stderr.isatty() else "error:"
    sys.stderr.write(f"{prefix} {_shown_message(error.text())}\n")
    sys.stderr.flush()


MAX_LINE_CHARS = 1000  # a message line quoting a value fa did not check (a path, a URL) is cut here


def _shown_message(text: str) -> str:
    """The message as it may reach a terminal: each line's control characters escaped and its length
    capped, so a value no check quoted (a path from the command line) cannot colour, move or flood it."""
    lines = [printable(line) for line in text.split("\n")]
    return "\n".join(
        line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..." for line in lines
    )
