"""`fa index`: rewrite a wheel directory's index.json and simple/ pages from the wheels in it (for
example after merging the shards of a release build).

Exit codes: 0 indexed, 1 a file there is not a readable fa-attn wheel, 2 not a directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildtool.commands import _options, say
from buildtool.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("index")
    def index_cmd(
        given: Annotated[
            str,
            typer.Argument(metavar="DIRECTORY", help="a directory of fa-attn wheels (e.g. merged shards)"),
        ],
    ) -> None:
        """Rewrite DIRECTORY/index.json and DIRECTORY/simple/ from the wheels in it."""
        if not given.strip():  # Path("") is ".": an empty value (an unset variable) would index here
            raise UsageError(
                "DIRECTORY: is empty\n  fix: pass the folder holding the .whl files (`fa index .` for "
                "this one)"
            )
        directory = _options.path(Path(given), "DIRECTORY")
        if not directory.is_dir():
            raise UsageError(f"{directory}: not a directory\n  fix: pass the folder holding the .whl files")
        say("index", f"reading and checking the wheels in {directory}")
        from buildtool.builder import index, index_page
        from buildtool.core.console import counted, plain_console

        # WheelDirError (exit 1): a file there is not our wheel. Asked to rewrite the index: replaces
        # index.json and simple/ that fa made (here, or a shard's copied in), never a user's own, never
        # through a link.
        data = index.write_index(directory, take_over=True)
        count = len(data["wheels"]) + len(data["all_wheels"])
        console = plain_console()
        console.print(f"indexed {counted(count, 'wheel')} in {directory}")
        if not index_page.is_ours(directory / index_page.PAGE):
            console.print(
                f"{directory / index_page.PAGE} is not fa's page: left as it is (move it away and run "
                "fa index again for the page that picks a machine's wheel)"
            )
