"""How long CI takes and how many tests it runs: `bash .ci/run` timed, its pytest summary read.

    python bench/ci.py [--record]

--record writes the figure into docs/figures.md (section `tests`), the one place that quotes it. Run it
on a clean clone (`git clone . /tmp/fa-ci && cd /tmp/fa-ci && python bench/ci.py --record`, then copy
docs/figures.md back) to measure what CI measures. Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from figures import record

_SUMMARY = re.compile(r"^=+ (?P<counts>.*\d+ passed.*) in (?P<seconds>[\d.]+)s", re.MULTILINE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write the figure into docs/figures.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    done = subprocess.run(["bash", ".ci/run"], cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    sys.stdout.write(done.stdout[-3000:])
    match = _SUMMARY.search(done.stdout)
    if done.returncode != 0 or match is None:
        sys.stderr.write(done.stderr[-3000:])
        print(f"bench/ci.py: .ci/run exited {done.returncode}; nothing recorded", file=sys.stderr)
        return 1
    pytest_s = float(match["seconds"])
    body = (
        f"| what | figure |\n| --- | --- |\n"
        f"| tests | {match['counts']} |\n"
        f"| pytest | {pytest_s / 60:.1f} min |\n"
        f"| the whole of `.ci/run` (install, ruff, mypy, `fa ci render --check`, pytest) | {wall / 60:.1f} min |"
    )
    print(body)
    if args.record:
        record("tests", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
