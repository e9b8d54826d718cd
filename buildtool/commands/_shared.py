"""What the probe, doctor and install commands share: their options, JSON output and reading the
wheel index."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildtool.commands import _options
from buildtool.errors import UsageError

if TYPE_CHECKING:
    from buildtool.compat.wheel_index import WheelIndex

WheelsOpt = Annotated[
    Path | None,
    typer.Option(
        "--wheels", help="Directory of wheels (index.json or the wheels themselves). Default: ./wheels"
    ),
]
IndexOpt = Annotated[
    str | None,
    typer.Option("--index", help="http(s) or file URL of a directory holding index.json and the wheels"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout")]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def load_wheel_index(wheels: Path | None, index: str | None) -> WheelIndex:
    """The index named by --wheels or --index (raises UsageError, exit 2, when it cannot be read)."""
    from buildtool.compat.wheel_index import load_index  # after the command's first line (say)

    if wheels is not None and index is not None:
        raise UsageError("--wheels and --index both given; pass one")
    if wheels is not None:
        _options.path(wheels, "--wheels")
    return load_index(index if index is not None else str(wheels or Path("wheels")))
