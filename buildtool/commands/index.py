"""`fa index`: rewrite a wheel directory's index.json and simple/ pages from the wheels in it (for
example after merging the shards of a release build).

Exit codes: 0 indexed, 1 a file there is not a readable fa-attn wheel, 2 not a directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from buildtool.build import index
from buildtool.commands.build import _fail
from buildtool.core.schema import WheelDirError


def register(app: typer.Typer) -> None:
    @app.command("index")
    def index_cmd(
        directory: Annotated[Path, typer.Argument(help="a directory of fa-attn wheels (e.g. merged shards)")],
    ) -> None:
        """Rewrite DIRECTORY/index.json and DIRECTORY/simple/ from the wheels in it."""
        if not directory.is_dir():
            raise _fail(2, f"{directory}: not a directory\n  fix: pass the folder holding the .whl files")
        try:
            data = index.write_index(directory)
        except WheelDirError as e:
            raise _fail(1, str(e)) from None
        Console().print(f"indexed {len(data['wheels'])} wheels in {directory}")
