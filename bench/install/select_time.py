"""How long `fa doctor`'s choice takes: choose.select over every environment of the test corpus
(tests/select/envs) against the fixture index of matrix.yaml, as milliseconds per select (median of
repeated rounds). An index page that answers every machine a picker offers calls select thousands of
times, so this is what it costs.

    python bench/install/select_time.py [--rounds 5] [--json FILE]

Compare two checkouts by running each one's copy in turns. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.compat.choose import Request, select
from buildtool.compat.env import env_from_json
from buildtool.core.runtime import schema
from tests.select.fixture_index import fixture_index


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    entries = schema.read_index(fixture_index())
    cases = []
    for path in sorted((REPO / "tests" / "select" / "envs").glob("*.json")):
        data = json.loads(path.read_text())
        req = data.get("request") or {}
        cases.append((env_from_json(data["env"]), Request(**req)))
    per_round = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for env, request in cases:
            select(entries, env, request)
        per_round.append((time.perf_counter() - t0) / len(cases) * 1000)
    result = {
        "envs": len(cases),
        "wheels": len(entries),
        "ms_per_select_median": round(statistics.median(per_round), 2),
        "rounds_ms": [round(x, 2) for x in per_round],
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
