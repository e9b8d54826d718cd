"""Doctor's items wrap under themselves but never inside a `quoted command`: a person copies it whole
(an 80-column terminal split `fa build --platform aarch64` as `fa` / `build --platform aarch64`)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from buildtool.compat.doctor import _item

FIX = (
    "this index holds no aarch64 wheel (only x86_64): build them with `fa build --platform aarch64`, "
    "then `fa install --index https://example.org/fa/` on the GH200"
)


def _drawn(width: int, text: Text | str) -> list[str]:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    _item(console, text, indent=2)
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", range(50, 101, 3))  # the longest command fits from 50 on
def test_a_quoted_command_stays_on_one_line(width: int) -> None:
    lines = _drawn(width, Text.assemble(("no-wheel", "bold red"), f" {FIX}"))
    assert all(line.count("`") % 2 == 0 for line in lines), lines
    joined = " ".join(line.strip() for line in lines)
    assert "`fa build --platform aarch64`" in joined
    assert "`fa install --index https://example.org/fa/`" in joined
    assert all(line.startswith("    ") for line in lines[1:])  # wrapped lines hang under the item
    assert all(len(line) <= width for line in lines)
    assert "\ue000" not in "".join(lines)  # the stand-in for a kept space never reaches the screen


def test_the_styles_stay_on_their_words() -> None:
    console = Console(width=50, record=True, color_system="standard", file=io.StringIO())
    _item(console, Text.assemble(("no-wheel", "bold red"), f" {FIX}"), indent=2)
    styled = console.export_text(styles=True)
    assert "\x1b[1;31mno-wheel\x1b[0m" in styled
