"""Where a kernel compile's time goes, and what sharing could save: the measurements behind the choice
of how to make the cold first build faster.

    python bench/build/nvrtc_phases.py [--per-major 12] [--record]

For README's first command (the release matrix.yaml, x86_64) it measures, with the pinned NVRTCs:

- phases: a sample of the plan's NVRTC programs (every k-th, per CUDA major) compiled once each with
  NVRTC's `-time` (12.x and newer), split into the C++ front end (parsing the headers, instantiating),
  the NVVM optimizer and the PTX-to-SASS translation. Precompiled headers and several kernels per
  program save front-end time only; the front end's share bounds what they can give.
- precompiled headers: two units of one source in one process with `-pch`: does the second reuse the
  first one's header, though their -D defines differ?
- one program per distinct (arch, source, options): how many of the plan's compile jobs share a key.
- sm_80 and sm_86 (and sm_90) programs with equal source and options: the same PTX (but its .target)?
  the same SASS (each kernel's .text section)? If the cubins differ, one cannot stand in for the other
  without changing the wheels.
- a worker's start: spawning a process and loading NVRTC, once per worker per build.

Prints a table; `--record` writes it into docs/figures.md. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from elftools.elf.elffile import ELFFile  # pyelftools: reads the cubins' sections
from figures import report  # bench/figures.py

from buildtool.builder import toolkits
from buildtool.builder.compile import CompileTask, KernelTree, pair_ptx_with_cubins, resolve
from buildtool.builder.matrix import load_matrix
from buildtool.builder.nvrtc import NvrtcError, open_nvrtc
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog

PHASES = ("CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation")


def _compile(task: CompileTask, *extra: str, target: str | None = None) -> tuple[bytes, str, float]:
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(task.cuda_major)))
    t0 = time.perf_counter()
    out = nvrtc.compile(
        task.source, task.source_name, target or task.target, [*task.options, *extra], dict(task.headers)
    )
    return out.image, out.log, time.perf_counter() - t0


def phases(tasks: list[CompileTask]) -> dict[str, float]:
    """Each phase's summed milliseconds over `tasks` (NVRTC's own -time report), plus the wall total."""
    sums: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, task in enumerate(tasks):
            report = Path(tmp) / f"{i}.csv"
            _, _, seconds = _compile(task, f"-time={report}")
            sums["wall"] += seconds * 1000
            for line in report.read_text().splitlines()[1:]:
                _, phase, ms, _ = (x.strip() for x in line.split(","))
                sums[phase] += float(ms)
    return dict(sums)


def pch_reused(a: CompileTask, b: CompileTask) -> bool:
    """Whether NVRTC's automatic precompiled header made for `a` serves `b` (in one process)."""
    with tempfile.TemporaryDirectory() as tmp:
        _compile(a, "-pch", f"--pch-dir={tmp}")
        _, log, _ = _compile(b, "-pch", f"--pch-dir={tmp}")
    return "#629" not in log and "creating precompiled header" not in log


def _text_sections(cubin: bytes) -> dict[str, bytes]:
    elf = ELFFile(io.BytesIO(cubin))
    return {s.name: s.data() for s in elf.iter_sections() if s.name.startswith(".text")}


def _ptx_body(ptx: bytes) -> list[str]:
    return [x for x in ptx.decode().splitlines() if not x.startswith((".target", ".version"))]


def arch_twins(task_80: CompileTask, others: list[CompileTask]) -> list[tuple[str, bool, bool]]:
    """For each other arch's program with sm_80's source and options: (arch, same PTX but its target
    line, same SASS in every kernel's .text)."""
    ptx_80 = _ptx_body(_compile(task_80, target="compute_80")[0])
    sass_80 = _text_sections(_compile(task_80)[0])
    rows = []
    for task in others:
        arch = task.target.removeprefix("sm_")
        ptx = _ptx_body(_compile(task, target=f"compute_{arch}")[0])
        rows.append((task.target, ptx == ptx_80, _text_sections(_compile(task)[0]) == sass_80))
    return rows


def _twins(runs: list[CompileTask]) -> list[CompileTask]:
    """The sm_86 and sm_90 programs whose CUDA major, source and options an sm_80 program has."""
    sm80 = {(t.cuda_major, t.source_name, t.options) for t in runs if t.target == "sm_80"}
    return [
        t for t in runs if t.target in ("sm_86", "sm_90") and (t.cuda_major, t.source_name, t.options) in sm80
    ]


def _with_phases(rows: list[str]) -> list[int]:
    return [int(r.split("|")[1]) for r in rows if "n/a" not in r]


def _open_in_child(lib_dir: str) -> None:
    open_nvrtc(lib_dir)


def worker_start(major: int) -> float:
    """Seconds to spawn a worker process and load NVRTC in it (what compile.compile_all pays per worker)."""
    lib_dir = str(toolkits.nvrtc_lib_dir(major))
    t0 = time.perf_counter()
    proc = multiprocessing.get_context("spawn").Process(target=_open_in_child, args=(lib_dir,))
    proc.start()
    proc.join()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-major", type=int, default=12, help="programs timed per CUDA major")
    ap.add_argument("--record", action="store_true", help="write the figures into docs/figures.md")
    args = ap.parse_args()

    plan = make_plan(load_matrix(REPO / "matrix.yaml"), fetch_torch_catalog(), platform="x86_64")
    tree = KernelTree()
    tasks = {job: resolve(job, tree) for job in plan.compile_jobs}
    with_cubin = pair_ptx_with_cubins(tasks)
    runs = [t for job, t in tasks.items() if job not in with_cubin]  # one NVRTC compile each
    keys = Counter(t.key for t in tasks.values())

    rows = []
    spent: Counter[str] = Counter()  # estimated seconds over all runs of the majors with a phase report
    for major in sorted({t.cuda_major for t in runs}):
        mine = [t for t in runs if t.cuda_major == major]
        sample = mine[:: max(1, len(mine) // args.per_major)][: args.per_major]
        try:
            sums = phases(sample)
        except NvrtcError as e:  # NVRTC 11.8 has no -time
            print(f"CUDA {major}: no phase report ({str(e).splitlines()[0]})", file=sys.stderr)
            sums = {"wall": 1000 * sum(_compile(t)[2] for t in sample)}
        parts = [sums.get(p) for p in PHASES]
        if all(p is not None for p in parts):
            per_run = sums["wall"] / 1000 / len(sample)
            spent["all"] += per_run * len(mine)
            spent["front end"] += per_run * len(mine) * sums[PHASES[0]] / sums["wall"]
            spent["nvvm shareable"] += per_run * len(_twins(mine)) * sums[PHASES[1]] / sums["wall"]
        share = [f"{100 * p / sums['wall']:.0f}%" if p is not None else "n/a" for p in parts]
        rows.append(
            f"| {major} | {len(mine)} | {len(sample)} | {sums['wall'] / 1000 / len(sample):.2f} | "
            f"{' | '.join(share)} | {worker_start(major):.2f} |"
        )

    fwd = [t for t in runs if t.cuda_major == 12 and t.source_name == "csrc/fwd.cu"]
    reuse = pch_reused(fwd[0], next(t for t in fwd if t.options != fwd[0].options))
    twin_rows = []
    for task in [t for t in fwd if t.target == "sm_80"][:: max(1, len(fwd) // 40)][:3]:
        same = [t for t in fwd if t.target in ("sm_86", "sm_90") and t.options == task.options]
        for target, same_ptx, same_sass in arch_twins(task, same):
            twin_rows.append(f"| {task.unit} | sm_80 vs {target} | {same_ptx} | {same_sass} |")

    body = "\n".join(
        [
            (
                f"The release matrix's x86_64 plan: {len(tasks)} compile jobs, {len(runs)} NVRTC runs (the "
                f"other {len(with_cubin)} PTX images come out of their cubin's run); {len(keys)} distinct "
                f"(NVRTC, target, source, headers, options) keys: "
                f"{'no job repeats another' if len(keys) == len(tasks) else f'{len(tasks) - len(keys)} repeats'}."
            ),
            "",
            "| CUDA | NVRTC runs | timed | wall s per run | C++ front end | NVVM optimizer | PTX to SASS | worker start, s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            (
                f"Automatic precompiled headers (`-pch`, CUDA 12): a second unit of the same source reuses the "
                f"first one's header: {reuse} (NVRTC says the command-line options, each unit's -D defines, differ)."
            ),
            "",
            (
                f"Bounds, over CUDA {' and '.join(str(m) for m in _with_phases(rows))}'s runs: the C++ front end is "
                f"{100 * spent['front end'] / spent['all']:.0f}% of the NVRTC time, the most that precompiled "
                f"headers or several kernels per program could save; the NVVM optimizer of the sm_86 and sm_90 "
                f"programs whose source and options are sm_80's is {100 * spent['nvvm shareable'] / spent['all']:.0f}%, "
                "the most that sharing their PTX could save (NVRTC takes C++ only: the SASS would need a PTX "
                "assembler outside NVRTC, whose cubins were not compared with NVRTC's here)."
            ),
            "",
            "| unit | programs with equal source and options | same PTX (but .target) | same SASS |",
            "| --- | --- | --- | --- |",
            *twin_rows,
        ]
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report("nvrtc-phases", f"{body}\n\nLoad average at the end (1, 5, 15 min): {load}.", args.record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
