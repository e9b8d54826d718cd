"""What a build with nothing changed costs: `fa build ARGS` run again and again on a filled cache.

    python bench/build/noop_build.py --out DIR [--runs 5] [--checkout PATH] -- --matrix matrix.yaml --platform x86_64

The first run fills what is missing (it may be a whole cold build: run it where the cache already holds
the build, FA_CACHE or the default cache) and is not counted; each next run is a no-op rebuild. CPU
seconds are the kernel's accounting of the `fa build` process and its children (wait4), so other load
on the machine does not count; wall seconds do count it. `--checkout` runs another checkout's fa (an
earlier commit's worktree) on the same cache and DIR: before and after side by side. Writes JSON under
the user's cache (or --json). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.core import atomic, cache


def _run(checkout: Path, args: list[str]) -> tuple[float, float]:
    """(CPU s, wall s) of one `fa build ARGS` by `checkout`'s code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "kernels")])}
    # Not `python -m`: that puts the current folder first on sys.path, and from inside a checkout its fa
    # would run whatever --checkout says.
    run = f"import sys; sys.path[0] = {str(checkout)!r}; from buildtool.cli import main; main()"
    cmd = [sys.executable, "-c", run, "build", *args, "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the wheel folder (fa build --out)")
    ap.add_argument("--runs", type=int, default=5, help="no-op runs after the first")
    ap.add_argument("--checkout", type=Path, default=REPO, help="whose fa to run (default: this one)")
    ap.add_argument("--json", type=Path, default=None, help="default: <cache>/bench/noop_build.json")
    ap.add_argument("build_args", nargs="*", help="after --: the rest of `fa build`'s options")
    args = ap.parse_args()
    build = [*args.build_args, "--out", str(args.out)]
    _run(args.checkout, build)  # fills what is missing; not counted
    runs = [_run(args.checkout, build) for _ in range(args.runs)]
    cpu = [c for c, _ in runs]
    wall = [w for _, w in runs]
    result = {
        "command": "fa build " + " ".join(build),
        "checkout": str(args.checkout.resolve()),
        "runs": args.runs,
        "cpu_s": [round(c, 3) for c in cpu],
        "cpu_s_median": round(statistics.median(cpu), 3),
        "wall_s_median": round(statistics.median(wall), 3),
        "load_avg_5min": round(os.getloadavg()[1], 1),
        "cpus": os.cpu_count(),
    }
    dest = args.json or cache.cache_dir() / "bench" / "noop_build.json"
    atomic.write_json(dest.resolve(), result)
    print(json.dumps(result, indent=2))
    print(f"written: {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
