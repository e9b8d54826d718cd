"""docs/figures.md: every figure fa quotes (build times, test counts), in one dated place.

The page is sections between `<!-- begin NAME -->` and `<!-- end NAME -->`, each opened by a stamp:
`Measured DATE on MACHINE: `COMMAND``. A script under bench/ writes its section with `--record`
(`record` below: the stamp is today's date, this machine and the script's own command line); README and
the other docs link here instead of repeating numbers.

    python bench/figures.py          # each section: when it was measured and the command that refreshes it

tests/ci/test_figures.py checks every section has its stamp and that the figures cheap to compute again
(the plan's counts) are in step with the tree.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures.md"
_SECTION = re.compile(r"<!-- begin (?P<name>[\w-]+) -->\n(?P<body>.*?)\n<!-- end (?P=name) -->", re.DOTALL)
# The stamp's three parts; the command is the first backticked text after the machine.
STAMP = re.compile(
    r"^Measured (?P<date>\d{4}-\d{2}-\d{2}) on (?P<machine>[^:`]+?)[:,] .*?`(?P<command>[^`]+)`", re.DOTALL
)


def cache_out(*parts: str) -> Path:
    """Where a bench script writes what it was not told where to put (--out, --json, $OUT): under the
    user's cache (FA_CACHE, else $XDG_CACHE_HOME/fa or ~/.cache/fa) in bench/, never into the checkout.
    Stdlib only: the GPU machine has no platformdirs (this is XDG's rule, as platformdirs applies it on
    Linux)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.environ.get("FA_CACHE") or os.path.join(xdg, "fa"), "bench", *parts)


@dataclass(frozen=True)
class Section:
    name: str
    body: str  # the stamp and what follows it

    @property
    def stamp(self) -> re.Match[str] | None:
        return STAMP.match(self.body)


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"


def sections(text: str) -> list[Section]:
    return [Section(m["name"], m["body"]) for m in _SECTION.finditer(text)]


def record(name: str, body: str, command: str | None = None, figures: Path = FIGURES) -> None:
    """Replace section `name` of docs/figures.md with `body`, headed by today's date, the machine and
    the command that measured it (default: this process's own command line)."""
    command = command or "python " + " ".join(sys.argv)
    stamp = f"Measured {datetime.date.today().isoformat()} on {machine()}: `{command}`"
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = figures.read_text()
    section = f"{begin}\n{stamp}\n\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{figures}: no section {name!r} (add {begin} ... {end} where it belongs)")
    from buildtool.core import atomic  # the checkout's, as every bench script has it on sys.path

    atomic.write_text(figures, pattern.sub(lambda _: section, text))
    print(f"recorded {name} in {figures}")


def report(name: str, body: str, keep: bool) -> None:
    """Print a script's figures; with `keep` (its --record), also write them as section `name`."""
    print(body)
    if keep:
        record(name, body)


def main() -> int:
    for section in sections(FIGURES.read_text()):
        stamp = section.stamp
        when, command = (stamp["date"], stamp["command"]) if stamp else ("no stamp", "?")
        print(f"{section.name:16} {when:11} {command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
