"""What a build with nothing changed costs: `fa build ARGS` run again and again on a filled cache.

    python bench/build/noop_build.py --out DIR [--runs 5] [--baseline COMMIT] [--record] -- --matrix matrix.yaml --platform x86_64

The first run fills what is missing (it may be a whole cold build: run it where the cache already holds
the build, FA_CACHE or the default cache) and is not counted; each next run is a no-op rebuild. CPU
seconds are the kernel's accounting of the `fa build` process and its children (wait4), so other load
on the machine does not count; wall seconds do count it. Each fa runs with its bytecode cached (under
the user's cache), as an installed one does. Each run also counts the files under DIR it
wrote (a changed state: inode, size, mtime or ctime), which a no-op rebuild should leave at 0.
`--baseline COMMIT` runs that commit's fa (unpacked by `git archive` into a temporary folder) on the same
cache and a copy of DIR of its own (their wheels may differ), in turns with this checkout's: before
and after side by side. Writes JSON under the
user's cache (or --json); `--record` writes the table into docs/figures.md (section noop-build). Not a
test: numbers depend on the machine. A floor row times `python -c "import typer._adapters"` in the same
turns: the part of each figure that is the interpreter and the CLI framework, not fa's work.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.core import atomic, cache


def _states(out: Path) -> dict[str, list[int] | None]:
    return {str(p): cache.file_state(p) for p in out.rglob("*") if p.is_file()} if out.is_dir() else {}


# What every fa command with options costs before any of fa's own work: the interpreter (with this
# machine's site-packages), typer, and the pydantic typer's option parsing loads.
FLOOR = "import typer._adapters"


def _env(checkout: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "kernels")])}
    # Bytecode cached, as an installed fa has it (pip compiles it), but under the user's cache, never in
    # the checkout; a PYTHONDONTWRITEBYTECODE here would add every module's compile to every run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache.cache_dir() / "bench" / "pycache")
    return env


def _cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of one run of `cmd`, its children's CPU included (wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def _run(checkout: Path, args: list[str], out: Path) -> tuple[float, float, int]:
    """(CPU s, wall s, files under `out` written) of one `fa build ARGS --out OUT` by `checkout`'s code."""
    # Not `python -m`: that puts the current folder first on sys.path, and from inside a checkout its fa
    # would run whatever --baseline says.
    run = f"import sys; sys.path[0] = {str(checkout)!r}; from buildtool.cli import main; main()"
    before = _states(out)
    cpu, wall = _cpu(
        [sys.executable, "-c", run, "build", *args, "--out", str(out), "--no-progress"], _env(checkout)
    )
    written = sum(state != before.get(path) for path, state in _states(out).items())
    return cpu, wall, written


def _unpacked(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive), as a checkout of its own: no worktree is added to the repo."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    return into


def _figures(runs: list[tuple[float, float, int]]) -> dict[str, object]:
    cpu = [c for c, _, _ in runs]
    return {
        "cpu_s": [round(c, 3) for c in cpu],
        "cpu_s_median": round(statistics.median(cpu), 3),
        "wall_s_median": round(statistics.median(w for _, w, _ in runs), 3),
        "files_written": [n for _, _, n in runs],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the wheel folder (fa build --out)")
    ap.add_argument("--runs", type=int, default=5, help="no-op runs after the first")
    ap.add_argument("--baseline", help="a git commit whose fa runs in turns with this checkout's")
    ap.add_argument("--json", type=Path, default=None, help="default: <cache>/bench/noop_build.json")
    ap.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    ap.add_argument("build_args", nargs="*", help="after --: the rest of `fa build`'s options")
    args = ap.parse_args()
    out = args.out.resolve()
    build = list(args.build_args)  # --out: each side's own folder (_run)
    with tempfile.TemporaryDirectory(prefix="fa-noop-baseline-") as tmp:
        sides = {"this checkout": REPO}
        if args.baseline:
            commit = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            baseline = _unpacked(args.baseline, Path(tmp, "baseline"))
            sides = {f"baseline {args.baseline} ({commit})": baseline, **sides}
        # A folder per side: two sides whose wheels differ (fa_attn's own files are in every wheel) would
        # each rewrite the other's on every turn, and neither run would be a no-op. The baseline's starts
        # as a copy of DIR, so its first run rewrites only what differs.
        outs = {
            name: out if checkout == REPO else Path(tmp, "out-baseline") for name, checkout in sides.items()
        }
        for name, checkout in sides.items():
            if outs[name] != out and out.is_dir():
                shutil.copytree(out, outs[name], symlinks=True)
            _run(checkout, build, outs[name])  # fills what is missing; not counted
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
        floor: list[tuple[float, float, int]] = []
        for _ in range(args.runs):  # in turns: the machine's load falls on both sides alike
            for name, checkout in sides.items():
                runs[name].append(_run(checkout, build, outs[name]))
            floor.append((*_cpu([sys.executable, "-c", FLOOR], _env(REPO)), 0))
    result = {
        "command": "fa build " + " ".join([*build, "--out", str(out)]),
        "runs": args.runs,
        "wheels": len(list(out.glob("*.whl"))),
        "sides": {name: _figures(r) for name, r in runs.items()},
        "floor": {"python -c": FLOOR, **_figures(floor)},
        "load_avg_5min": round(os.getloadavg()[1], 1),
        "cpus": os.cpu_count(),
    }
    dest = args.json or cache.cache_dir() / "bench" / "noop_build.json"
    atomic.write_json(dest.resolve(), result)
    print(json.dumps(result, indent=2))
    print(f"written: {dest}", file=sys.stderr)
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        record("noop-build", _markdown(result, args.build_args))
    return 0


def _markdown(result: dict, build_args: list[str]) -> str:
    rows = [
        f"| {name} | {s['cpu_s_median']} | {s['wall_s_median']} | {max(s['files_written'])} |"
        for name, s in result["sides"].items()
    ]
    floor = result["floor"]
    rows.append(
        f'| floor: `python -c "{FLOOR}"` (every fa command with options pays it) | '
        f"{floor['cpu_s_median']} | {floor['wall_s_median']} | - |"
    )
    head = (
        f"`fa build {' '.join(build_args)}` run again on a folder of {result['wheels']} wheels it built, "
        f"with a filled cache; median of {result['runs']} runs per side, the sides in turns (load average "
        f"{result['load_avg_5min']} on {result['cpus']} CPUs: CPU seconds, from wait4, are the figure; "
        "the target is at most 1 s)."
    )
    return "\n".join(
        [
            head,
            "",
            "| fa | CPU s | wall s | files written, most in a run |",
            "| --- | --- | --- | --- |",
            *rows,
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
