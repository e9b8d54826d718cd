"""CPU time of `fa probe --json` (and of `fa --help`), as a user's shell runs it: a fresh interpreter each
time, timed by the kernel's accounting of the child (user + system CPU seconds, from wait4), so other
load on the machine does not count.

    python bench/install/probe_time.py              # 20 runs each, median and min
    python bench/install/probe_time.py --runs 50 --json probe-time.json
    python bench/install/probe_time.py --runs 15 --record   # the table into docs/figures.md (section probe)

The figure that matters is the median CPU time of `fa probe --json` (target: under 0.1 s). Also shows
what a bare `python -c pass` costs here, the floor no command can go under, and the slowest imports
of one run (python -X importtime). Not a test: numbers depend on the machine.
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

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fa probe --json": [sys.executable, "-m", "buildtool.cli", "probe", "--json"],
    "fa --help": [sys.executable, "-m", "buildtool.cli", "--help"],
}


def cpu_seconds(cmd: list[str]) -> tuple[float, float]:
    """(user + system CPU seconds, wall seconds) of one run of `cmd`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, wall


def slowest_imports(cmd: list[str], n: int = 8) -> list[tuple[int, str]]:
    """The `n` largest cumulative import times (microseconds) of one run."""
    done = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, cwd=REPO, check=False
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        if not name.startswith(" "):  # top-level imports only (nested ones are indented)
            rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = parser.parse_args()
    figures = {}
    for name, cmd in COMMANDS.items():
        cpu_seconds(cmd)  # warm the page cache
        runs = [cpu_seconds(cmd) for _ in range(args.runs)]
        cpu = [c for c, _ in runs]
        wall = [w for _, w in runs]
        figures[name] = {
            "cpu_median_s": round(statistics.median(cpu), 4),
            "cpu_min_s": round(min(cpu), 4),
            "wall_median_s": round(statistics.median(wall), 4),
            "runs": args.runs,
        }
        print(
            f"{name:18} CPU median {statistics.median(cpu):.3f} s  min {min(cpu):.3f} s  "
            f"wall median {statistics.median(wall):.3f} s  ({args.runs} runs)"
        )
    print("\nslowest top-level imports of one `fa probe --json` (cumulative, ms):")
    for micros, name in slowest_imports(COMMANDS["fa probe --json"]):
        print(f"  {micros / 1000:7.1f}  {name}")
    print(f"\n{sys.version.split()[0]} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        record("probe", _markdown(figures))


def _markdown(figures: dict[str, dict[str, float]]) -> str:
    rows = [
        f"| `{name}` | {f['cpu_median_s']:.3f} | {f['cpu_min_s']:.3f} | {f['wall_median_s']:.3f} |"
        for name, f in figures.items()
    ]
    runs = next(iter(figures.values()))["runs"]
    return "\n".join(
        [
            f"A fresh interpreter per run, {runs} runs each; CPU seconds are the child's own (wait4), so",
            "other load on the machine does not count; `python -c pass` is the floor no command goes under.",
            "",
            "| command | CPU s, median | CPU s, min | wall s, median |",
            "| --- | --- | --- | --- |",
            *rows,
        ]
    )


if __name__ == "__main__":
    main()
