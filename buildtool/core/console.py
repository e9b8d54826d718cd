"""The consoles fa prints tables and progress on: plain text in, never rich markup.

Every string fa prints may hold user text (a path, a GPU name, a compiler log); rich would read
`[/b]` in it as markup and fail, or `[red]` as a colour. Styles come only from `Text` objects."""

from __future__ import annotations

from rich.console import Console


def plain_console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, markup=False, highlight=False)


def counted(n: int, noun: str) -> str:
    """ "1 wheel", "20 wheels": a count and its noun, for people."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
