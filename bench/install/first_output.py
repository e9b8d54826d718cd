"""How long each fa command keeps a user waiting before it prints anything (issue 37: `fa build
--dry-run` was silent for 16 s, `fa index` for 9 s; the target is a first line within 1 s), and how
long it runs in all. A fresh process per run, as a shell starts it; its stdout and stderr are pipes
read as bytes arrive, so "first output" is the wall time to the first byte on either, and the CPU
time the child had used by then (its utime + stime from /proc/PID/stat at that moment: the figure
that other load on the machine does not inflate).

    python bench/install/first_output.py --wheels DIR              # DIR: a folder `fa build` filled
    python bench/install/first_output.py --wheels DIR --runs 3 --json first-output.json
    python bench/install/first_output.py --wheels DIR --record     # the table into docs/figures.md

`fa index` runs on a copy of DIR in a temporary folder (it rewrites index.json), so nothing is
written into DIR or the checkout. Wall times are the figure here (a user waits in wall time); the
machine's load is part of them, so the CPU seconds (the child's own, from wait4) are shown beside.
Not a test: tests/ci/test_first_output.py checks the order (first line, then the slow step).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FA = [sys.executable, "-m", "buildtool.cli"]


def commands(wheels: Path, scratch: Path) -> dict[str, list[str]]:
    return {
        "fa --help": [*FA, "--help"],
        "fa probe": [*FA, "probe"],
        "fa doctor": [*FA, "doctor", "--wheels", str(wheels)],
        "fa install --dry-run": [*FA, "install", "--dry-run", "--wheels", str(wheels)],
        "fa check": [*FA, "check"],
        "fa build --dry-run": [*FA, "build", "--dry-run"],
        "fa index": [*FA, "index", str(scratch)],
    }


TICK = os.sysconf("SC_CLK_TCK")


def cpu_so_far(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used until now."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of stat


def one_run(cmd: list[str]) -> tuple[float | None, float | None, float, float]:
    """(wall seconds to the first byte on stdout or stderr, or None if it printed nothing; the
    child's CPU seconds by then; wall seconds in all; CPU seconds in all, user + system)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    first = first_cpu = None
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            sel.register(stream, selectors.EVENT_READ)
        open_streams = 2
        while open_streams:
            for key, _ in sel.select():
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                elif first is None:
                    first = time.perf_counter() - t0
                    first_cpu = cpu_so_far(proc.pid)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return first, first_cpu, time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, required=True, help="a folder of wheels fa build made")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = parser.parse_args()
    wheels = args.wheels.resolve()
    if not (wheels / "index.json").is_file():
        raise SystemExit(f"--wheels {wheels}: no index.json there (fix: pass the folder fa build wrote)")
    results: dict[str, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="fa-first-output-") as tmp:
        scratch = Path(tmp) / "wheels"
        shutil.copytree(wheels, scratch, symlinks=True)
        for name, cmd in commands(wheels, scratch).items():
            runs = [one_run(cmd) for _ in range(args.runs)]
            firsts = [f for f, _, _, _ in runs if f is not None]
            first_cpus = [c for _, c, _, _ in runs if c is not None]
            results[name] = {
                "first_output_s": round(statistics.median(firsts), 3) if firsts else None,
                "first_output_cpu_s": round(statistics.median(first_cpus), 3) if first_cpus else None,
                "wall_s": round(statistics.median(w for _, _, w, _ in runs), 3),
                "cpu_s": round(statistics.median(c for _, _, _, c in runs), 3),
            }
            r = results[name]
            shown = (
                f"{r['first_output_s']:.2f} s ({r['first_output_cpu_s']:.2f} s CPU)"
                if r["first_output_s"] is not None and r["first_output_cpu_s"] is not None
                else "nothing printed"
            )
            print(
                f"{name:22} first output {shown:>20}   done {r['wall_s']:6.2f} s wall  "
                f"{r['cpu_s']:6.2f} s CPU  (median of {args.runs})",
                flush=True,
            )
    count = len(list(wheels.glob("*.whl")))
    if args.json:
        args.json.write_text(json.dumps({"wheels": count, "commands": results}, indent=2) + "\n")
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        record("first-output", _markdown(results, args.runs, count))


def _markdown(results: dict[str, dict[str, float | None]], runs: int, count: int) -> str:
    rows = [
        f"| `{name}` | {r['first_output_s'] if r['first_output_s'] is not None else 'nothing'} | "
        f"{r['first_output_cpu_s']} | {r['wall_s']} | {r['cpu_s']} |"
        for name, r in results.items()
    ]
    return "\n".join(
        [
            f"A fresh process per run, median of {runs}, on a folder of {count} wheels (`fa index` on a copy);",
            "seconds from the start to the first byte on stdout or stderr (wall, and the child's CPU by then),",
            "to the end, and the child's CPU in all. On a loaded machine the CPU columns are the figures.",
            "",
            "| command | first output, s wall | first output, s CPU | done, s wall | CPU s |",
            "| --- | --- | --- | --- | --- |",
            *rows,
        ]
    )


if __name__ == "__main__":
    main()
