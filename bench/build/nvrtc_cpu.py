"""Where the NVRTC CPU of README's first command goes: each program's CPU seconds, by direction, head dim
and CUDA major.

    python bench/build/nvrtc_cpu.py [--target 11:sm_80 12:sm_120] [--record]

For the release matrix's x86_64 plan (README's first command), every NVRTC run of the given (CUDA major,
target) pairs is compiled once, in this process, one after another, with the pinned NVRTC of its major,
as the build compiles it (a cubin, with its PTX when the plan ships that PTX too). The figure is the CPU
seconds (user + system) of this process over the compile: NVRTC runs in-process and its threads count,
the rest of the machine's load does not. The default pairs are one arch per major, the two with a
program for every unit: sm_80 with CUDA 11.8, sm_120 with 12.9.

Then the whole plan's NVRTC CPU is estimated from them: each (major, target) pair's runs at the mean of
its major's measured programs of the same direction. nvrtc_phases.py splits a run's wall time into
NVRTC's phases; this script says which programs the CPU goes to.

Prints tables; `--record` writes them into docs/figures.md (section nvrtc-cpu). Not a test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from figures import report  # bench/figures.py

from buildtool.builder import toolkits
from buildtool.builder.compile import CompileTask, KernelTree, pair_ptx_with_cubins, resolve
from buildtool.builder.matrix import load_matrix
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog

DIRECTIONS = ("fwd", "splitkv", "bwd")


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def cpu_seconds(task: CompileTask, with_ptx: bool) -> float:
    """One NVRTC compile of `task` as the build runs it, in CPU seconds of this process."""
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(task.cuda_major)))  # loaded before the clock starts
    t0 = _cpu()
    nvrtc.compile(
        task.source, task.source_name, task.target, list(task.options), dict(task.headers), with_ptx=with_ptx
    )
    return _cpu() - t0


def _split(unit: str) -> tuple[str, int]:
    """ "fwd_fp16_d128" -> ("fwd", 128)."""
    parts = unit.split("_")
    return parts[0], int(parts[-1].removeprefix("d"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", nargs="+", default=["11:sm_80", "12:sm_120"], help="MAJOR:TARGET pairs")
    ap.add_argument("--record", action="store_true", help="write the tables into docs/figures.md")
    args = ap.parse_args()
    wanted = [(int(m), t) for m, t in (x.split(":") for x in args.target)]

    plan = make_plan(load_matrix(REPO / "matrix.yaml"), fetch_torch_catalog(), platform="x86_64")
    tree = KernelTree()
    tasks = {job: resolve(job, tree) for job in plan.compile_jobs}
    ptx_of = {cubin: ptx for ptx, cubin in pair_ptx_with_cubins(tasks).items()}
    runs = {job: t for job, t in tasks.items() if job not in ptx_of.values()}  # one NVRTC compile each

    measured: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)  # (major, target) -> unit -> s
    for major, target in wanted:
        mine = sorted(((j, t) for j, t in runs.items() if (t.cuda_major, t.target) == (major, target)),
                      key=lambda jt: jt[1].unit)  # fmt: skip
        if not mine:
            raise SystemExit(f"the plan has no CUDA {major} run for {target}")
        for job, task in mine:
            measured[major, target][task.unit] = cpu_seconds(task, job in ptx_of)
            print(
                f"CUDA {major} {target} {task.unit}: {measured[major, target][task.unit]:.2f} s",
                file=sys.stderr,
            )

    heads = sorted({_split(u)[1] for per in measured.values() for u in per})
    lines = [
        "CPU seconds of one NVRTC program (fp16 and bf16 averaged), one compile each, in one process:",
        "",
        f"| CUDA, target | direction | {' | '.join(f'd{h}' for h in heads)} | programs | sum, s |",
        f"| --- | --- | {' | '.join('---' for _ in heads)} | --- | --- |",
    ]
    for (major, target), per in measured.items():
        for direction in DIRECTIONS:
            cells = []
            for h in heads:
                xs = [s for u, s in per.items() if _split(u) == (direction, h)]
                cells.append(f"{statistics.mean(xs):.1f}" if xs else "-")
            total = [s for u, s in per.items() if _split(u)[0] == direction]
            lines.append(
                f"| {major}, {target} | {direction} | {' | '.join(cells)} | {len(total)} | {sum(total):.0f} |"
            )
        lines.append(
            f"| {major}, {target} | all | {' | '.join('' for _ in heads)} | {len(per)} | {sum(per.values()):.0f} |"
        )

    # The plan's NVRTC CPU: each run at its major's measured mean for its direction.
    mean = {
        (major, d): statistics.mean(s for u, s in per.items() if _split(u)[0] == d)
        for (major, _), per in measured.items()
        for d in DIRECTIONS
    }
    by_pair: dict[tuple[int, str], list[float]] = defaultdict(list)
    for task in runs.values():
        key = (task.cuda_major, _split(task.unit)[0])
        if key in mean:
            by_pair[task.cuda_major, task.target].append(mean[key])
    lines += [
        "",
        (
            "The plan's NVRTC runs, each at the mean CPU of its major's measured programs of its direction "
            "(an estimate for the targets not measured):"
        ),
        "",
        "| CUDA, target | NVRTC runs | CPU s (estimated) |",
        "| --- | --- | --- |",
        *(
            f"| {m}, {t} | {len(xs)} | {sum(xs):.0f} |"
            for (m, t), xs in sorted(by_pair.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        ),
        (
            f"| all | {sum(len(x) for x in by_pair.values())} of {len(runs)} | "
            f"{sum(sum(x) for x in by_pair.values()):.0f} |"
        ),
        "",
        f"Load average at the end (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
    ]
    report("nvrtc-cpu", "\n".join(lines), args.record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
