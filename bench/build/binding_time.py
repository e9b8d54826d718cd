"""The CPU one ATen binding compile takes, this checkout against an earlier commit, side by side.

    python bench/build/binding_time.py --baseline main [--torch 2.4 2.8 2.9] [--abi 1] [--runs 3] [--record]

A release build compiles one binding per (torch minor, C++ ABI, CPU), each against that torch's headers,
and none of it is shared between them (the torch-free sources are: binding.shared_objects). This times
that compile alone: for each torch minor and ABI, each side (the baseline commit, checked out in a
temporary worktree, and this checkout) builds the binding with its own code in a compile cache of its
own, whose bindings are removed before every run; the shared objects, stub libraries and the compiler's
identity are made before the clock starts. The figure is the CPU seconds (user + system) of the
compiler processes the build waited for (getrusage of the children: wait4's accounting, so other load
on the machine does not count), median of `--runs`, the sides taking turns.

Prints a table and writes JSON outside the tree (default: a temporary file); `--record` writes the
table into docs/figures.md (section binding-time). Not a test: numbers depend on the machine.
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
from pathlib import Path

# bench/build/first_command.py: an empty cache sharing the network's parts
from first_command import _cold_cache, sides

REPO = Path(__file__).resolve().parents[2]

# Run by each side's own code (PYTHONPATH) in its own cache (FA_CACHE): one binding, timed alone.
_ONE = """
import json, resource, sys
from buildtool.builder import binding, torch_headers
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import cpus, kernels_src
minor, abi = sys.argv[1], sys.argv[2] == "1"
build = fetch_torch_catalog().minors[minor].builds[cpus.host()]
headers = torch_headers.headers_for(build.oldest, build.header_source)
root = kernels_src.kernels_dir()
binding.shared_objects(abi, root, cpus.host())
binding.stub_dir()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
built = binding.build_binding(headers, abi, root)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
assert not built.cached, built
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
print(json.dumps({"torch": headers.torch_version, "cpu_s": round(cpu, 2), "wall_s": round(built.seconds, 2),
                  "peak_rss_mb": round(after.ru_maxrss / 1024), "size": built.path.stat().st_size}))
"""


def _one(checkout: Path, cache: Path, minor: str, abi: int) -> dict:
    """One cold binding compile by `checkout`'s code in `cache` (its bindings removed first)."""
    shutil.rmtree(cache / "bindings", ignore_errors=True)
    env = {
        **os.environ,
        "FA_CACHE": str(cache),
        "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "kernels")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _ONE, minor, str(abi)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"building the torch {minor} binding in {checkout} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.splitlines()[-1]), "load_1min": round(os.getloadavg()[0], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the git commit to compare with (e.g. main)")
    ap.add_argument("--torch", nargs="+", default=["2.4", "2.8", "2.9"], help="torch minors (ATen form)")
    ap.add_argument("--abi", nargs="+", type=int, choices=(0, 1), default=[1], help="C++ ABIs")
    ap.add_argument("--runs", type=int, default=3, help="compiles per side and torch minor (median)")
    ap.add_argument("--json", type=Path, default=None, help="where to write results (default: a temp file)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = ap.parse_args()

    from buildtool.core import cache as fa_cache  # the user's cache holds the headers and the catalog

    rows: list[dict] = []
    with sides(args.baseline, "fa-bench-binding-") as (work, checkouts):
        caches = {n: _cold_cache(work / f"cache-{i}", fa_cache.cache_dir()) for i, n in enumerate(checkouts)}
        for minor in args.torch:
            for abi in args.abi:
                runs: dict[str, list[dict]] = {n: [] for n in checkouts}
                for r in range(args.runs):
                    for name in list(checkouts) if r % 2 == 0 else list(reversed(checkouts)):
                        runs[name].append(_one(checkouts[name], caches[name], minor, abi))
                        print(
                            f"torch {minor} abi {abi} {name} #{r + 1}: {runs[name][-1]['cpu_s']} s",
                            file=sys.stderr,
                        )
                rows.append(
                    {
                        "torch": minor,
                        "abi": abi,
                        **{f"{n}_cpu_s": statistics.median(x["cpu_s"] for x in runs[n]) for n in checkouts},
                        "runs": runs,
                    }
                )

    result = {"baseline_ref": args.baseline, "runs_per_side": args.runs, "rows": rows}
    out = args.json or Path(tempfile.gettempdir()) / "fa-bench-binding-time.json"
    out.write_text(json.dumps(result, indent=2))
    body = _markdown(result)
    print(body)
    print(f"(JSON: {out})", file=sys.stderr)
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        record("binding-time", body)
    return 0


def _markdown(r: dict) -> str:
    lines = [
        "| torch | C++ ABI | baseline CPU s | this checkout CPU s | change |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        base, new = row["baseline_cpu_s"], row["this checkout_cpu_s"]
        lines.append(
            f"| {row['torch']} | {row['abi']} | {base:.1f} | {new:.1f} | {100 * (new - base) / base:+.0f}% |"
        )
    loads = [x["load_1min"] for row in r["rows"] for side in row["runs"].values() for x in side]
    lines += [
        "",
        (
            f"One ATen binding compile (g++ of forms/aten.cpp against that torch's headers, and the link), "
            f"baseline `{r['baseline_ref']}` and this checkout in turns; CPU seconds of the compiler processes "
            f"(user + system, children's rusage), median of {r['runs_per_side']} run(s) each; load "
            f"{min(loads)} to {max(loads)} (1 min)."
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
