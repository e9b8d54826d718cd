"""Benchmark `fa install --build`: build the one wheel this machine needs and install it, cold and warm.

    python bench/install/install_build.py --arch 8.0 --cuda 12

In a fresh venv that sees the packages installed here (tests/nested_venv.py) and has fa installed in it:
- cold: an empty FA_CACHE except the pinned NVRTC wheels (shared with yours, fetched first and timed
  apart, like bench/build/build.py), so it measures compiling one arch's kernel programs, the binding, the
  wheel, and the install;
- warm: the same command again: every compile is a cache hit; what is left is packaging and pip.
Without a GPU here, --arch and --cuda say what to build for (with a GPU and a CUDA torch they default to
GPU 0's arch and torch's CUDA major). Prints a table and writes JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.builder import toolkits
from buildtool.core import cache
from tests.nested_venv import make_venv


def run_fa(venv: Path, args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(venv / "bin" / "fa"), "install", "--build", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )
    seconds = time.perf_counter() - t0
    try:
        out = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"fa install --build failed:\n{done.stdout}\n{done.stderr}") from None
    if not out.get("ok"):
        raise SystemExit(f"fa install --build failed: {out.get('message')}\n{done.stderr[-2000:]}")
    return seconds, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="8.0", help="the GPU's compute capability to build for")
    ap.add_argument("--cuda", type=int, default=12, help="the CUDA major to build for")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, help="default: the user's cache, bench/install_build.json")
    args = ap.parse_args()
    shared = cache.cache_dir()
    t0 = time.perf_counter()
    toolkits.nvrtc_lib_dir(args.cuda)  # the pinned NVRTC, fetched once per machine (not timed below)
    prep = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="fa-bench-install-") as tmp_name:
        tmp = Path(tmp_name)
        venv = tmp / "venv"
        make_venv(venv)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "-e",
                str(REPO),
            ],
            check=True,
        )
        fa_cache = tmp / "cache"
        fa_cache.mkdir()
        (fa_cache / "toolkits").symlink_to(shared / "toolkits")
        env = dict(os.environ, FA_CACHE=str(fa_cache))
        fa_args = ["--arch", args.arch, "--cuda", str(args.cuda), "--jobs", str(args.jobs)]
        cold, out = run_fa(venv, fa_args, env, tmp)
        warm, again = run_fa(venv, fa_args, env, tmp)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": sys.version.split()[0],
        "arch": args.arch,
        "cuda": args.cuda,
        "jobs": args.jobs,
        "nvrtc_prep_s": round(prep, 1),
        "cold_s": round(cold, 1),
        "warm_s": round(warm, 1),
        "wheel": out["selected"],
        "installed": again["installed"],
    }
    table = Table(title=f"fa install --build --arch {args.arch} --cuda {args.cuda} ({result['machine']})")
    for col in ("run", "seconds", "wheel"):
        table.add_column(col)
    table.add_row("cold (empty cache but NVRTC)", f"{cold:.1f}", out["selected"])
    table.add_row("warm (same command again)", f"{warm:.1f}", again["selected"])
    Console().print(table)
    dest = args.json or shared / "bench" / "install_build.json"  # never into the checkout
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
