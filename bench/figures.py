"""docs/figures.md: every figure fa quotes (build times, test counts), in one dated place.

Each section is written by the script that measures it (`--record`), between `<!-- begin NAME -->` and
`<!-- end NAME -->`, with the date, the machine and the command; README and the other docs link here
instead of repeating numbers.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures.md"


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"


def record(name: str, body: str, command: str | None = None) -> None:
    """Replace section `name` of docs/figures.md with `body`, headed by today's date, the machine and
    the command that measured it (default: this process's own command line)."""
    command = command or "python " + " ".join(sys.argv)
    stamp = f"Measured {datetime.date.today().isoformat()} on {machine()}: `{command}`"
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = FIGURES.read_text()
    section = f"{begin}\n{stamp}\n\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{FIGURES}: no section {name!r} (add {begin} ... {end} where it belongs)")
    FIGURES.write_text(pattern.sub(lambda _: section, text))
    print(f"recorded {name} in {FIGURES}")
