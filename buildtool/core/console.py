"""The consoles fa prints tables and progress on: plain text in, never rich markup.

Every string fa prints may hold user text (a path, a GPU name, a compiler log); rich would read
`[/b]` in it as markup and fail, or `[red]` as a colour. Styles come only from `Text` objects."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def plain_console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, markup=False, highlight=False)


def counted(n: int, noun: str) -> str:
    """ "1 wheel", "20 wheels": a count and its noun, for people."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def mib(n: int) -> str:
    """A size as fa prints every size: "9.2 MiB" (binary, 1 MiB = 1,048,576 bytes)."""
    return f"{n / (1 << 20):.1f} MiB"


def size_text(size: int | None) -> str:
    """A file's size for people: MiB from 0.1 MiB up, else its bytes; "unknown" without one."""
    if size is None:
        return "unknown"
    return mib(size) if size >= (1 << 20) // 10 else counted(size, "byte")


def progress_columns(count: ProgressColumn) -> tuple[ProgressColumn, ...]:
    """The columns of every fa progress bar: what it is doing, the bar, `count` (done of total, or
    bytes), the time elapsed, then the time left ("eta") rich estimates from the recent rate."""
    eta = TimeRemainingColumn(compact=True, elapsed_when_finished=False)
    return (TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn(), TextColumn("eta"), eta)
