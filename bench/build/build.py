"""Benchmark `fa build`: cold and warm build of a matrix, against a naive per-cell build.

    python bench/build/build.py --matrix bench/build/build_small.yaml --jobs 2

- cold: an empty compile cache (toolkits and torch headers are fetched first, in a prep step timed
  separately, so "cold" measures compiling and packaging, not the network);
- warm: the same build again with nothing changed (everything a cache hit);
- naive: what a build that compiles each matrix cell on its own would do (flash-attn's release
  matrix builds per (Python, torch, CUDA, ABI) job): every cell compiles all kernel programs of its
  CUDA major plus its own binding. Its work is counted exactly; its time is ESTIMATED by summing the
  per-program NVRTC times and per-binding g++ times measured in the cold build (serial compute
  seconds), and compared with the cold build's own serial compute seconds. Nothing is run per cell.

Prints a table and writes JSON. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from figures import cache_out, record  # bench/figures.py

from buildtool.builder import toolkits, torch_headers
from buildtool.builder.compile import KernelTree, compile_all
from buildtool.builder.matrix import load_matrix
from buildtool.builder.pipeline import BuildSummary, execute
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import atomic


def _use_cache(root: Path, shared: Path) -> None:
    """A fresh compile cache that shares the network-fetched parts (toolkits, torch headers)."""
    root.mkdir(parents=True)
    for name in ("toolkits", "torch-headers"):
        (shared / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(shared / name)
    os.environ["FA_CACHE"] = str(root)


def _prep(plan: Plan, shared: Path) -> float:
    """Fetch toolkits and torch headers into `shared` (timed apart from the builds)."""
    os.environ["FA_CACHE"] = str(shared)
    t0 = time.perf_counter()
    for major in sorted({j.cuda_major for j in plan.compile_jobs}):
        toolkits.nvrtc_lib_dir(major)
    for job in plan.binding_jobs:
        if job.header_source is not None:
            torch_headers.headers_for(job.torch_version, job.header_source)
    return time.perf_counter() - t0


def _build(plan: Plan, out: Path, jobs: int, tree: KernelTree) -> tuple[BuildSummary, float]:
    t0 = time.perf_counter()
    summary = execute(plan, out, jobs, tree, show_progress=False)
    return summary, time.perf_counter() - t0


def _per_program_seconds(plan: Plan, tree: KernelTree) -> dict:
    """NVRTC seconds per compile job, re-read from a cold compile (execute() keeps only sums)."""
    _, stats = compile_all(plan.compile_jobs, workers=1, tree=tree)
    return stats.seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", type=Path, default=REPO / "matrix.yaml")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--json", type=Path, help="where to write results (default: the user's cache, bench/build.json)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary caches and wheels")
    ap.add_argument("--record", action="store_true", help="write the figures into docs/figures.md")
    args = ap.parse_args()

    tree = KernelTree()
    plan = make_plan(load_matrix(args.matrix), fetch_torch_catalog())
    work = Path(tempfile.mkdtemp(prefix="fa-bench-build-"))
    shared = work / "net"
    try:
        prep_s = _prep(plan, shared)
        _use_cache(work / "cache-cold", shared)
        cold, cold_s = _build(plan, work / "wheels", args.jobs, tree)
        warm, warm_s = _build(plan, work / "wheels", args.jobs, tree)
        # Per-program times for the naive estimate: one more cold compile, serial, so each program's
        # time is its own (not inflated by sharing 2 cores with another worker).
        _use_cache(work / "cache-programs", shared)
        per_program = _per_program_seconds(plan, tree)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    binding_s = cold.cxx_seconds / max(1, cold.cxx_compiles)
    cells = [c for w in plan.wheels for c in w.cells]
    programs_per_major = Counter(j.cuda_major for j in plan.compile_jobs)
    seconds_per_major = Counter()
    for job, s in per_program.items():
        seconds_per_major[job.cuda_major] += s
    naive_programs = sum(programs_per_major[c.cuda] for c in cells)
    naive_compute_s = sum(seconds_per_major[c.cuda] + binding_s for c in cells)
    cold_compute_s = sum(per_program.values()) + cold.cxx_seconds
    result = {
        "matrix": str(args.matrix),
        "machine": {"cpus": os.cpu_count(), "jobs": args.jobs, "python": platform.python_version()},
        "prep_fetch_s": round(prep_s, 1),
        "cold": {
            "wall_s": round(cold_s, 1),
            "nvrtc_compiles": cold.nvrtc_compiles,
            "cxx_compiles": cold.cxx_compiles,
            "compute_s": round(cold_compute_s, 1),
        },
        "warm": {
            "wall_s": round(warm_s, 1),
            "nvrtc_compiles": warm.nvrtc_compiles,
            "cxx_compiles": warm.cxx_compiles,
        },
        "naive_estimated": {
            "cells": len(cells),
            "nvrtc_compiles": naive_programs,
            "cxx_compiles": len(cells),
            "compute_s": round(naive_compute_s, 1),
            "method": "sum of per-program NVRTC and per-binding g++ seconds measured cold",
        },
        "ratio_naive_over_cold_compute": round(naive_compute_s / cold_compute_s, 1)
        if cold_compute_s
        else None,
        "ratio_cold_over_warm_wall": round(cold_s / warm_s, 1) if warm_s else None,
        "wheels": [
            {"file": w.file, "size": w.size, "platform_tag": w.platform_tag, "cells": w.cells}
            for w in cold.wheels
        ],
    }
    atomic.write_json((args.json or cache_out("build.json")).resolve(), result)
    _print(result)
    if args.record:
        record("build", _markdown(result))
    return 0


def _markdown(r: dict) -> str:
    """The figures as docs/figures.md shows them."""
    n = r["naive_estimated"]
    sizes = ", ".join(sorted({f"{w['size'] / 2**20:.1f} MiB" for w in r["wheels"]}))
    return (
        f"Matrix `{r['matrix']}`, `--jobs {r['machine']['jobs']}`.\n\n"
        "| build | wall s | compute s | NVRTC compiles | C++ compiles |\n| --- | --- | --- | --- | --- |\n"
        f"| cold (empty compile cache) | {r['cold']['wall_s']} | {r['cold']['compute_s']} | "
        f"{r['cold']['nvrtc_compiles']} | {r['cold']['cxx_compiles']} |\n"
        f"| warm (nothing changed) | {r['warm']['wall_s']} | - | {r['warm']['nvrtc_compiles']} | "
        f"{r['warm']['cxx_compiles']} |\n"
        f"| naive per-cell ({n['cells']} cells, estimated) | - | {n['compute_s']} | {n['nvrtc_compiles']} | "
        f"{n['cxx_compiles']} |\n\n"
        f"Naive/cold compute: {r['ratio_naive_over_cold_compute']}x; toolkit and header fetch (timed apart): "
        f"{r['prep_fetch_s']} s; {len(r['wheels'])} wheels, sizes {sizes}."
    )


def _print(r: dict) -> None:
    t = Table(
        title=f"fa build benchmark: {r['matrix']} ({r['machine']['cpus']} CPUs, --jobs {r['machine']['jobs']})"
    )
    for col in ("build", "wall s", "compute s", "NVRTC compiles", "C++ compiles"):
        t.add_column(col, justify="right" if col != "build" else "left")
    t.add_row(
        "cold (empty cache)",
        str(r["cold"]["wall_s"]),
        str(r["cold"]["compute_s"]),
        str(r["cold"]["nvrtc_compiles"]),
        str(r["cold"]["cxx_compiles"]),
    )
    t.add_row(
        "warm (nothing changed)",
        str(r["warm"]["wall_s"]),
        "-",
        str(r["warm"]["nvrtc_compiles"]),
        str(r["warm"]["cxx_compiles"]),
    )
    n = r["naive_estimated"]
    t.add_row(
        f"naive per-cell ({n['cells']} cells, estimated)",
        "-",
        str(n["compute_s"]),
        str(n["nvrtc_compiles"]),
        str(n["cxx_compiles"]),
    )
    t.caption = (
        f"naive/cold compute: {r['ratio_naive_over_cold_compute']}x; cold/warm wall: "
        f"{r['ratio_cold_over_warm_wall']}x; toolkit+header fetch (prep): {r['prep_fetch_s']} s"
    )
    w = Table(title="wheels")
    for col in ("wheel", "size", "platform", "cells"):
        w.add_column(col)
    for x in r["wheels"]:
        w.add_row(x["file"], f"{x['size'] / 1024:.1f} KiB", x["platform_tag"], str(x["cells"]))
    Console().print(t, w)


if __name__ == "__main__":
    raise SystemExit(main())
