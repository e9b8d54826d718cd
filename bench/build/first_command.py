"""How long README's first command takes to build, today's code against an earlier commit, side by side.

    python bench/build/first_command.py --baseline 21cff51 [--repeats 2] [--record]

README's first command is `pip install -e . && fa build --matrix matrix.yaml --platform x86_64 && fa
doctor`; its cost is the build. Each side (the baseline commit, checked out in a temporary worktree,
and this checkout) runs that `fa build` with an empty compile cache, in turns (A B, then B A when
repeated), so a busy machine slows both alike. What comes from the network (the NVRTC wheels, the
torch headers, PyPI's torch catalog) is fetched once, before, into a cache both sides share: the
figure is the CPU's work, which this script compares, plus one cold fetch (`--fetch`, this checkout
only) for the network's part on this machine.

`--bindings-only` times one part, side by side the same way: the plan's host bindings (g++ against
torch's headers), one after another in an empty cache, each side by its own code; the kernels are
not compiled. It measures a change to the bindings' compile in minutes where the whole command takes
most of an hour on a loaded machine.

Prints a table and writes JSON outside the tree (default: a temporary file); `--record` writes the
figures into docs/figures.md. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NETWORK_PARTS = ("toolkits", "torch-headers", "pypi")  # the cache folders filled from the network


@contextlib.contextmanager
def sides(ref: str, prefix: str) -> Iterator[tuple[Path, dict[str, Path]]]:
    """A scratch folder and the two sides to compare: `ref` checked out in a temporary worktree in it
    ("baseline") and this checkout; both removed on the way out."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    baseline = work / "baseline"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(baseline), ref], check=True
    )
    try:
        yield work, {"baseline": baseline, "this checkout": REPO}
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def _cold_cache(root: Path, shared: Path) -> Path:
    """An empty compile cache whose network-fetched folders are the shared ones."""
    root.mkdir(parents=True)
    for name in NETWORK_PARTS:
        (shared / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(shared / name)
    return root


_PREFETCH = """
import sys
from pathlib import Path
from buildtool.builder import toolkits, torch_headers
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog
plan = make_plan(load_matrix(Path("matrix.yaml")), fetch_torch_catalog(), platform=sys.argv[1])
for major in sorted({j.cuda_major for j in plan.compile_jobs}):
    toolkits.nvrtc_lib_dir(major)
from buildtool.builder import ptxas  # the standalone ptxas, where the build shares programs
for major in sorted({j.cuda_major for j in plan.compile_jobs} & ptxas.SHARED_MAJORS):
    ptxas.ptxas_path(major)
for job in plan.binding_jobs:
    if job.header_source is not None:
        torch_headers.headers_for(job.torch_version, job.header_source)
"""


def _prefetch(shared: Path, platform: str) -> None:
    """Fill `shared` with what the build fetches from the network (this checkout's code does it)."""
    env = {**os.environ, "FA_CACHE": str(shared), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _PREFETCH, platform], cwd=REPO, env=env, check=True)


_BINDINGS = """
import sys
from pathlib import Path
from buildtool.builder import binding, torch_headers
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import binding_forms, kernels_src
plan = make_plan(load_matrix(Path("matrix.yaml")), fetch_torch_catalog(), platform=sys.argv[1])
for job in plan.binding_jobs:
    headers = torch_headers.headers_for(job.torch_version, job.header_source)
    floor = job.torch_minor if job.form == binding_forms.STABLE else None
    binding.build_binding(headers, job.cxx11abi, kernels_src.kernels_dir(), job.platform, floor)
print(len(plan.binding_jobs))
"""


def _bindings(checkout: Path, cache: Path, platform: str) -> dict:
    """The plan's bindings built one after another by `checkout`'s code: CPU seconds of that process
    and its compilers (wait4, so other load does not count), wall seconds."""
    path = os.pathsep.join([str(checkout), str(checkout / "kernels")])
    env = {**os.environ, "FA_CACHE": str(cache), "PYTHONPATH": path}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BINDINGS, platform],
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(
                f"building the bindings in {checkout} failed:\n{err.read().decode(errors='replace')[-3000:]}"
            )
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "bindings": int(out),
        "load_5min": round(os.getloadavg()[1], 1),
    }


def _build(checkout: Path, cache: Path, out: Path, platform: str, jobs: int) -> dict:
    """One `fa build --json` of the checkout's matrix.yaml: its summary plus the wall time and the CPU
    seconds of fa and every process it ran (wait4: the build's own, whatever else runs beside it)."""
    t0 = time.perf_counter()
    cmd = ["build", "--matrix", str(checkout / "matrix.yaml"), "--platform", platform, "--out", str(out)]
    env = {**os.environ, "FA_CACHE": str(cache), "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "buildtool.cli", *cmd, "--jobs", str(jobs), "--json"],
            cwd=checkout,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        load = os.getloadavg()[1]  # the 5-minute load average as the build ends: how busy the machine was
        cpu = usage.ru_utime + usage.ru_stime
        stdout.seek(0)
        stderr.seek(0)
        out_text, err_text = stdout.read().decode(), stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"fa build in {checkout} failed (exit {status}):\n{err_text[-3000:]}")
    summary = json.loads(out_text)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),  # user + system seconds of fa and every process it ran
        "wheels": len(summary["wheels"]),
        "nvrtc_compiles": summary["nvrtc_compiles"],
        "nvrtc_s": summary["nvrtc_seconds"],
        "ptx_with_cubin": summary.get("nvrtc_ptx_with_cubin", 0),
        "ptxas_runs": summary.get("ptxas_runs", 0),
        "cxx_compiles": summary["cxx_compiles"],
        "cxx_s": summary["cxx_seconds"],
        "wheel_files": sorted(w["file"] for w in summary["wheels"]),
        "wheel_sizes": {w["variant"]: w["size"] for w in summary["wheels"]},
        "load_5min": round(load, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the git commit to compare with (e.g. main's)")
    ap.add_argument("--repeats", type=int, default=1, help="cold builds per side (alternating order)")
    ap.add_argument("--platform", default="x86_64")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--fetch", action="store_true", help="also time one cold fetch (network) here")
    ap.add_argument("--json", type=Path, default=None, help="where to write results (default: a temp file)")
    ap.add_argument("--record", action="store_true", help="write the figures into docs/figures.md")
    ap.add_argument("--bindings-only", action="store_true", help="time the plan's bindings only (see above)")
    ap.add_argument(
        "--together",
        action="store_true",
        help="run the two sides' builds at the same time (each --jobs), so both see the same load",
    )
    args = ap.parse_args()

    result: dict = {
        "baseline_ref": args.baseline,
        "platform": args.platform,
        "jobs": args.jobs,
        "together": args.together,
    }
    with sides(args.baseline, "fa-bench-first-") as (work, checkouts):
        runs: dict[str, list[dict]] = {name: [] for name in checkouts}
        shared = work / "net"
        if args.fetch:
            # An empty cache of its own: the network's part, then that cache's fetched folders are shared.
            t0 = time.perf_counter()
            fetched = _build(REPO, work / "cache-fetch", work / "out-fetch", args.platform, args.jobs)
            result["cold_with_fetch"] = {**fetched, "wall_s": round(time.perf_counter() - t0, 1)}
            shared.mkdir()
            for name in NETWORK_PARTS:
                shutil.move(str(work / "cache-fetch" / name), shared / name)
        else:
            _prefetch(shared, args.platform)
        for repeat in range(args.repeats):
            order = list(checkouts) if repeat % 2 == 0 else list(reversed(checkouts))
            if args.together and not args.bindings_only:
                caches = {
                    n: _cold_cache(work / f"cache-{n.replace(' ', '-')}-{repeat}", shared) for n in order
                }
                with concurrent.futures.ThreadPoolExecutor(len(order)) as pool:
                    futures = {
                        n: pool.submit(
                            _build, checkouts[n], caches[n], work / f"out-{n.replace(' ', '-')}-{repeat}",
                            args.platform, args.jobs,
                        )
                        for n in order
                    }  # fmt: skip
                    for name in order:
                        runs[name].append(futures[name].result())
                        print(f"{name} #{repeat + 1}: {runs[name][-1]['wall_s']} s", file=sys.stderr)
                continue
            for name in order:
                tag = f"{name.replace(' ', '-')}-{repeat}"
                cache = _cold_cache(work / f"cache-{tag}", shared)
                if args.bindings_only:
                    runs[name].append(_bindings(checkouts[name], cache, args.platform))
                else:
                    runs[name].append(
                        _build(checkouts[name], cache, work / f"out-{tag}", args.platform, args.jobs)
                    )
                print(f"{name} #{repeat + 1}: {runs[name][-1]['wall_s']} s", file=sys.stderr)

    for name, rs in runs.items():
        result[name] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
            "runs": rs,
        }
    out = args.json or Path(tempfile.gettempdir()) / "fa-bench-first-command.json"
    if args.bindings_only:
        out.write_text(json.dumps(result, indent=2))
        print(_bindings_markdown(result))
        print(f"(JSON: {out})", file=sys.stderr)
        return 0
    base, new = result["baseline"], result["this checkout"]
    result["ratio_baseline_over_this"] = round(base["wall_s_median"] / new["wall_s_median"], 2)
    result["cpu_ratio_baseline_over_this"] = round(base["cpu_s_median"] / new["cpu_s_median"], 2)
    same = base["runs"][0]["wheel_files"] == new["runs"][0]["wheel_files"]
    result["same_wheels"] = same
    out.write_text(json.dumps(result, indent=2))
    print(_markdown(result))
    print(f"(JSON: {out})", file=sys.stderr)
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        record("first-command", _markdown(result))
    return 0


def _markdown(r: dict) -> str:
    rows = []
    for name in ("baseline", "this checkout"):
        first = r[name]["runs"][0]
        rows.append(
            f"| {name} | {r[name]['wall_s_median']} | {r[name]['cpu_s_median']} | {first['nvrtc_compiles']} ({first['nvrtc_s']:.0f} s) | "
            f"{first['ptx_with_cubin']} | {first['cxx_compiles']} ({first['cxx_s']:.0f} s) | {first['wheels']} |"
        )
    lines = [
        (
            f"`fa build --matrix matrix.yaml --platform {r['platform']} --jobs {r['jobs']}` with an empty compile "
            f"cache (network parts fetched before), baseline `{r['baseline_ref']}` and this checkout "
            f"{'at the same time' if r.get('together') else 'in turns'}; "
            f"median of {len(r['baseline']['runs'])} run(s) each."
        ),
        "",
        "| code | wall s (median) | CPU s (median) | NVRTC compiles (summed s) | PTX with its cubin | C++ compiles (summed s) | wheels |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        (
            f"Baseline/this: {r['ratio_baseline_over_this']}x wall, {r['cpu_ratio_baseline_over_this']}x CPU; "
            f"the same wheel files: {r['same_wheels']}."
        ),
    ]
    loads = [run["load_5min"] for name in ("baseline", "this checkout") for run in r[name]["runs"]]
    lines.append(
        f"Load average (5 min) as each build ended: {', '.join(map(str, loads))} on {os.cpu_count()} CPUs: "
        "above that, other work shared the CPUs, and the CPU seconds are the figure to compare."
    )
    lines.append(f"Wheel sizes, this checkout: {_sizes(r['this checkout']['runs'][0]['wheel_sizes'])}.")
    if "cold_with_fetch" in r:
        c = r["cold_with_fetch"]
        lines.append(f"One cold build with the network fetches, this checkout: {c['wall_s']} s.")
    return "\n".join(lines)


def _bindings_markdown(r: dict) -> str:
    rows = [
        f"| {name} | {r[name]['runs'][0]['bindings']} | {r[name]['wall_s_median']} | {r[name]['cpu_s_median']} |"
        for name in ("baseline", "this checkout")
    ]
    loads = [run["load_5min"] for name in ("baseline", "this checkout") for run in r[name]["runs"]]
    return "\n".join(
        [
            (
                f"The {r['platform']} plan's bindings, one after another in an empty cache, baseline "
                f"`{r['baseline_ref']}` and this checkout in turns; median of {len(r['baseline']['runs'])} run(s) each."
            ),
            "",
            "| code | bindings | wall s (median) | CPU s (median) |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            f"Load average (5 min) as each side ended: {', '.join(map(str, loads))} on {os.cpu_count()} CPUs.",
        ]
    )


def _sizes(by_variant: dict[str, int]) -> str:
    """The wheels' sizes by kind: per-variant wheels per CUDA major (smallest to largest), the all-wheel,
    the universal wheel."""
    kinds: dict[str, list[int]] = {}
    for variant, size in by_variant.items():
        kind = "universal" if not variant else "all-wheel" if variant == "all" else variant[:4]
        kinds.setdefault(kind, []).append(size)
    parts = []
    for kind, sizes in sorted(kinds.items()):
        low, high = min(sizes) / 2**20, max(sizes) / 2**20
        span = f"{low:.1f} MiB" if round(low, 1) == round(high, 1) else f"{low:.1f} to {high:.1f} MiB"
        parts.append(f"{kind} {span}" if kind != "universal" else f"universal {min(sizes) / 1024:.0f} KiB")
    return ", ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
