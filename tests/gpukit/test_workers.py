"""The restartable workers (tests/gpu/workers.py) with a toy worker: every item gets one result
whether its worker answers, reports a CUDA error, dies, hangs, never starts or runs out of time."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import workers

TOY = """
import os, sys, time
sys.path.insert(0, {gpu!r})
import workers
items = {items!r}
start = int(sys.argv[sys.argv.index("--start") + 1])
if os.environ.get("TOY_NO_START"):
    sys.exit(7)

def run(i):
    kind = items[i]
    if kind == "crash":
        os._exit(9)
    if kind == "hang":
        time.sleep(60)
    print("noise on stdout must not break the protocol")
    return {{"verdict": "cuda-error" if kind == "cuda" else "ok", "pid": os.getpid()}}

sys.exit(workers.serve(len(items), start, run))
"""


def _spec(tmp_path: Path, items: list[str], **env: str) -> workers.WorkerSpec:
    script = tmp_path / "toy.py"
    gpu = str(Path(workers.__file__).parent)
    script.write_text(TOY.format(gpu=gpu, items=items))
    return workers.WorkerSpec(
        [sys.executable, str(script)], {**os.environ, **env}, item_timeout=3, start_timeout=20
    )


def _run(spec: workers.WorkerSpec, n: int, deadline: float | None = None) -> tuple[list[dict], list[int]]:
    seen: list[int] = []
    results = workers.run_items(
        n,
        spec,
        lambda _i, verdict, msg: {"verdict": verdict, "message": msg},
        lambda i, _r: seen.append(i),
        deadline=deadline,
    )
    return results, seen


def test_every_failure_costs_only_its_item(tmp_path: Path) -> None:
    items = ["ok", "cuda", "ok", "crash", "ok", "hang", "ok"]
    results, seen = _run(_spec(tmp_path, items), len(items))
    assert [r["verdict"] for r in results] == ["ok", "cuda-error", "ok", "crash", "ok", "hang", "ok"]
    assert sorted(seen) == list(range(len(items)))  # each reported once
    assert "worker exited with 9" in results[3]["message"]
    assert "no answer in 3s" in results[5]["message"]
    # A new worker after the CUDA error, the crash and the hang: four processes in all.
    assert len({results[i]["pid"] for i in (0, 2, 4, 6)}) == 4


def test_a_worker_that_cannot_start_leaves_every_item_not_run(tmp_path: Path) -> None:
    results, _ = _run(_spec(tmp_path, ["ok", "ok"], TOY_NO_START="1"), 2)
    assert [r["verdict"] for r in results] == ["not-run", "not-run"]
    assert "exited with 7 before its first item" in results[0]["message"]


def test_the_deadline_skips_what_is_left(tmp_path: Path) -> None:
    items = ["ok", "hang", "ok", "ok"]
    spec = _spec(tmp_path, items)
    spec.item_timeout = 30  # the deadline, not the hang's timeout, must end this
    t0 = time.monotonic()
    results, _ = _run(spec, len(items), deadline=time.monotonic() + 4)
    assert time.monotonic() - t0 < 15
    assert [r["verdict"] for r in results] == ["ok", "skipped", "skipped", "skipped"]
