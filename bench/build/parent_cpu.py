"""fa's own CPU in a build: this checkout against an earlier commit, side by side.

    python bench/build/parent_cpu.py --baseline main [--repeats 3] [--platform x86_64] [--profile DIR]

A cold `fa build` spends most of its CPU in NVRTC and g++ (bench/build/first_command.py counts it
all); this measures what is left, fa's own Python: planning, reading the images, packing the wheels,
the all-wheel and the index. Each side (the baseline commit, checked out in a temporary worktree, and
this checkout) runs `fa build --json` of its matrix.yaml into an empty --out with the compile cache as
it is (FA_CACHE, else the user's): fill it first with one build of each side, so that no compile runs
and the figure is fa's process alone (getrusage of itself; its children's CPU is printed beside it,
and is near zero when the cache was filled). The sides take turns; medians of `--repeats`.
`--profile DIR` also writes a cProfile of each side's last run there (python -m pstats to read it).

Prints a table and writes JSON outside the tree (default: a temporary file). Not a test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/build/first_command.py: the baseline's temporary worktree beside this checkout
from first_command import sides

# Runs `fa build` in this process and prints its own CPU and its children's as JSON on stderr's last line.
_WRAPPER = """
import atexit, json, resource, runpy, sys
def report():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}),
          file=sys.stderr)
atexit.register(report)
profile = sys.argv.pop(1)
sys.argv[0] = "fa"
if profile:
    import cProfile
    cProfile.run("runpy.run_module('buildtool.cli', run_name='__main__')", profile)
else:
    runpy.run_module("buildtool.cli", run_name="__main__")
"""


def _run(checkout: Path, platform: str, profile: Path | None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="fa-bench-parent-"))
    try:
        path = os.pathsep.join([str(checkout), str(checkout / "kernels")])
        cmd = [sys.executable, "-c", _WRAPPER, str(profile or ""), "build", "--matrix", "matrix.yaml"]
        cmd += ["--platform", platform, "--out", str(out / "wheels"), "--json"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"fa build in {checkout} failed:\n{proc.stderr[-3000:]}")
        cpu = json.loads(proc.stderr.strip().splitlines()[-1])
        summary = json.loads(proc.stdout)
        return {
            "own_cpu_s": round(cpu["self"], 2),
            "children_cpu_s": round(cpu["children"], 2),
            "wall_s": round(wall, 1),
            "nvrtc_compiles": summary["nvrtc_compiles"],
            "cxx_compiles": summary["cxx_compiles"],
            "wheels": len(summary["wheels"]),
            "load_1min": round(os.getloadavg()[0], 1),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the git commit to compare with (e.g. main)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--platform", default="x86_64")
    ap.add_argument("--profile", type=Path, default=None, help="write each side's last run's cProfile here")
    ap.add_argument("--json", type=Path, default=None, help="where to write results (default: a temp file)")
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    with sides(args.baseline, "fa-bench-parent-") as (_, checkouts):
        names = list(checkouts)
        for i in range(args.repeats):
            for name in names if i % 2 == 0 else reversed(names):
                last = i == args.repeats - 1
                profile = args.profile / f"{name.replace(' ', '_')}.prof" if args.profile and last else None
                runs.setdefault(name, []).append(_run(checkouts[name], args.platform, profile))
                print(f"{name}: {runs[name][-1]}", file=sys.stderr)
    result = {"baseline_ref": args.baseline, "platform": args.platform, "sides": {}}
    print(f"{'side':<14} {'own CPU s':>10} {'children s':>11} {'wall s':>8}  compiles")
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("own_cpu_s", "children_cpu_s", "wall_s")}
        result["sides"][name] = {"median": med, "runs": rows}
        compiles = max(r["nvrtc_compiles"] + r["cxx_compiles"] for r in rows)
        print(
            f"{name:<14} {med['own_cpu_s']:>10.2f} {med['children_cpu_s']:>11.2f} {med['wall_s']:>8.1f}  {compiles}"
        )
    dest = args.json or Path(tempfile.mkstemp(prefix="fa-parent-cpu-", suffix=".json")[1])
    dest.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
