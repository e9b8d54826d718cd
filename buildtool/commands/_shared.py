"""What the probe, doctor and install commands share: their options, JSON output, usage errors, and
reading the wheel index."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from buildtool.compat import doctor
from buildtool.compat.wheel_index import WheelIndex, WheelIndexError, load_index

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


def usage(message: str) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(doctor.EXIT_USAGE)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def load_wheel_index(wheels: Path | None, index: str | None) -> WheelIndex:
    if wheels is not None and index is not None:
        usage("--wheels and --index both given; pass one")
    try:
        return load_index(index if index is not None else str(wheels or Path("wheels")))
    except WheelIndexError as exc:
        usage(str(exc))
