"""`fa ci render`: write the release workflow from matrix.yaml, or (--check) say whether it is stale.
`fa ci pins [--refresh]`: the commits its actions are pinned to (buildtool/release/pins.py).

A thin shell over buildtool/release/workflow.py. Exit codes: 0 written or up to date, 1 out of date
(--check), 2 bad input (the matrix error names the field and the fix).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildtool.builder.matrix import load_matrix
from buildtool.commands import _options
from buildtool.commands._app import MARKUP
from buildtool.core import atomic
from buildtool.core.console import plain_console
from buildtool.errors import FaError
from buildtool.release import pins, workflow

ci_app = typer.Typer(
    no_args_is_help=True, help="CI files generated from matrix.yaml.", rich_markup_mode=MARKUP
)


@ci_app.command("render")
def render_cmd(
    matrix: Annotated[
        Path, typer.Option("--matrix", "-m", help="the build matrix, relative to the repository root")
    ] = Path("matrix.yaml"),
    out: Annotated[Path, typer.Option("--out", "-o", help="the workflow file to write")] = (
        workflow.DEFAULT_OUT
    ),
    check: Annotated[
        bool, typer.Option("--check", help="write nothing; exit 1 if OUT differs from what MATRIX renders")
    ] = False,
) -> None:
    """Render the release workflow (cibuildwheel jobs per shard, then index and publish) from MATRIX."""
    text = workflow.render(workflow.from_matrix(load_matrix(matrix), matrix))
    if check:
        problem = workflow.staleness(out, text)
        if problem is not None:
            command = "fa ci render" + (f" --matrix {matrix}" if matrix != Path("matrix.yaml") else "")
            command += f" --out {out}" if out != workflow.DEFAULT_OUT else ""
            raise FaError(f"{problem}\n  fix: run `{command}` and commit {out}")
        plain_console().print(f"{out} is up to date with {matrix}")
        return
    atomic.write_text(out, text)
    plain_console().print(f"wrote {out} from {matrix}")


@ci_app.command("pins")
def pins_cmd(
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh", help="move each action to the newest release of its major (needs the network)"
        ),
    ] = False,
    pins_file: Annotated[Path, typer.Option("--pins", help="the pins file")] = pins.PINS_FILE,
    base: Annotated[str, typer.Option("--from", help="where the actions' repositories are")] = pins.GITHUB,
) -> None:
    """Show the commits the release workflow's actions are pinned to; --refresh updates them (then run
    `fa ci render`)."""
    base = _options.git_source(base, "--from")
    current = pins.load(pins_file)
    console = plain_console()
    if not refresh:
        for name, pin in sorted(current.items()):
            console.print(f"{name:34} {pin.tag:8} {pin.sha}", soft_wrap=True)
        return
    fresh = pins.refreshed(current, base)
    for name in sorted(fresh):
        old, new = current[name], fresh[name]
        change = "unchanged" if old == new else f"{old.tag} -> {new.tag}"
        console.print(f"{name:34} {change:18} {new.sha}", soft_wrap=True)
    pins.save(fresh, pins_file)
    console.print(f"wrote {pins_file}; now run `fa ci render` and commit both")


def register(app: typer.Typer) -> None:
    app.add_typer(ci_app, name="ci")
