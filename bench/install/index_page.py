"""What the index page costs `fa index`: the picker's answers for the repo matrix's wheels (every per-variant
wheel of matrix.yaml, the all-wheels and the universal wheel, as tests/select/fixture_index.py builds
them), side by side with the same machines answered without a memo, and the page's size.

    python bench/install/index_page.py [--rounds 3] [--sample 300] [--json FILE]

Prints medians over the rounds: CPU seconds (process time: the machine may be shared) to render the whole page (picker.page_data + the template), the
machines it answers, the distinct answers, the page's bytes, and ms per machine with the memo against
ms per machine without it (choose.select alone, on a random sample of the same machines). Not a test:
the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.builder import index_page
from buildtool.compat import picker
from buildtool.compat.choose import select
from buildtool.core.runtime import schema
from tests.select.fixture_index import all_wheel_index, fixture_index


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample", type=int, default=300, help="machines answered without the memo, per round")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    data = fixture_index()
    data["all_wheels"] = all_wheel_index()["all_wheels"]
    entries = schema.read_index(data)
    machines = list(picker.machines(entries))
    rng = random.Random(0)
    page_s, with_memo_ms, without_memo_ms, size = [], [], [], 0
    for _ in range(args.rounds):
        t0 = time.process_time()
        page = index_page.render(entries)
        page_s.append(time.process_time() - t0)
        size = len(page.encode())
        with_memo_ms.append(page_s[-1] / len(machines) * 1000)
        sample = rng.sample(machines, min(args.sample, len(machines)))
        t0 = time.process_time()
        for machine in sample:
            select(entries, machine.env)
        without_memo_ms.append((time.process_time() - t0) / len(sample) * 1000)
    answers = picker.page_data(entries)["answers"]
    result = {
        "wheels": len(entries),
        "machines": len(machines),
        "answers": len(answers),
        "page_bytes": size,
        "page_s_median": round(statistics.median(page_s), 2),
        "ms_per_machine_with_memo": round(statistics.median(with_memo_ms), 3),
        "ms_per_machine_select_alone": round(statistics.median(without_memo_ms), 3),
        "rounds_page_s": [round(x, 2) for x in page_s],
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
