"""How long CI takes and how many tests it runs: `bash .ci/run` timed, its pytest summary read.

    python bench/ci.py [--record]

--record writes the figure into docs/figures.md (section `tests`), the one place that quotes it. Run it
on a clean clone (`git clone . /tmp/fa-ci && cd /tmp/fa-ci && python bench/ci.py --record`, then copy
docs/figures.md back) to measure what CI measures. Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from figures import report

# pytest's last line: "1195 passed, 125 skipped in 1956.14s (0:32:36)" (with -q, no "=" rules around it).
_SUMMARY = re.compile(r"^(?:=+ )?(?P<counts>\d+ passed[^\n]*?) in (?P<seconds>[\d.]+)s", re.MULTILINE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write the figure into docs/figures.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    done = subprocess.run(["bash", ".ci/run"], cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    sys.stdout.write(done.stdout[-3000:])
    # The last summary is the whole suite's: .ci/run first runs a few tests from a clone in an odd folder.
    match = ([None, *_SUMMARY.finditer(done.stdout)])[-1]
    if done.returncode != 0 or match is None:
        sys.stderr.write(done.stderr[-3000:])
        why = f"exited {done.returncode}" if done.returncode else "printed no pytest summary"
        print(f"bench/ci.py: .ci/run {why}; nothing recorded", file=sys.stderr)
        return 1
    report("tests", body(match["counts"], float(match["seconds"]), wall, os.getloadavg()[1]), args.record)
    return 0


def body(counts: str, pytest_s: float, wall: float, load: float) -> str:
    return (
        f"| what | figure |\n| --- | --- |\n"
        f"| tests | {counts} |\n"
        f"| pytest | {pytest_s / 60:.1f} min |\n"
        f"| the whole of `.ci/run` (install, ruff, mypy, `fa ci render --check`, pytest) | {wall / 60:.1f} min |\n\n"
        f"Load average (5 min) as it ended: {load:.1f} on {os.cpu_count()} CPUs (above that, other "
        "work shared the CPUs and the minutes are longer than CI's)."
    )


if __name__ == "__main__":
    raise SystemExit(main())
