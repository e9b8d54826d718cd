"""Does one NVRTC run per program serve its other targets? For every group of a plan's cubin jobs that
buildtool/builder/ptxas.py share_groups puts together (one program, several plain targets), run NVRTC
for the group's lowest target (cubin and PTX), then for each other target rewrite the PTX's `.target`
line and assemble it with the pinned standalone ptxas; compare that cubin byte for byte with NVRTC's
own for the target, and the rewritten PTX with NVRTC's own compute_XX PTX.

    python bench/build/ptx_share.py [--matrix matrix.yaml] [--platform x86_64] [--jobs 2] [--record]

Prints a table per (CUDA major, targets) and the CPU each route takes (NVRTC for every target, against
NVRTC for the leader and ptxas for the others); exits 1 if an image of a major the build shares
differs, naming it. `--record`
writes the table into docs/figures.md (section ptx-share). `--build` times the build's own
compile_all instead, on those jobs, sharing and with NVRTC alone (A B B A; prints, records nothing). Three NVRTC runs and one ptxas run per
shared target: minutes for the release plan. Not a test: CPU figures depend on the machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from figures import report  # bench/figures.py

from buildtool.builder import ptxas, toolkits
from buildtool.builder.compile import CompileTask, KernelTree, resolve
from buildtool.builder.matrix import load_matrix
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog


def _cpu(who: int) -> float:
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


@dataclass(frozen=True)
class Shared:
    """One follower target of a group: how its shared images compare with NVRTC's own, and the CPU."""

    cuda_major: int
    unit: str
    leader: str  # "sm_80"
    target: str  # "sm_90"
    same_cubin: bool
    same_but_note: bool  # the same bytes once TOOL_NOTE is zeroed in both
    same_ptx: bool  # the rewritten PTX against NVRTC's compute_XX compile
    nvrtc_cpu: float  # NVRTC's own run for the target (cubin and PTX)
    ptxas_cpu: float
    leader_cpu: float  # the leader's NVRTC run (cubin and PTX), counted once per group


TOOL_NOTE = ".note.nv.tkinfo"  # CUDA 12's note of the tool that made a cubin: its name, build, options


def without_tool_note(cubin: bytes) -> bytes:
    """`cubin` with the bytes of its TOOL_NOTE section zeroed (the rest as it is)."""
    import io

    from elftools.elf.elffile import ELFFile

    out = bytearray(cubin)
    for sec in ELFFile(io.BytesIO(cubin)).iter_sections():
        if sec.name == TOOL_NOTE:
            out[sec["sh_offset"] : sec["sh_offset"] + sec["sh_size"]] = bytes(sec["sh_size"])
    return bytes(out)


def _nvrtc(task: CompileTask, target: str, with_ptx: bool) -> tuple[bytes, bytes | None, float]:
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(task.cuda_major)))  # loaded before the clock starts
    t0 = _cpu(resource.RUSAGE_SELF)
    out = nvrtc.compile(
        task.source, task.source_name, target, list(task.options), dict(task.headers), with_ptx=with_ptx
    )
    return out.image, out.ptx, _cpu(resource.RUSAGE_SELF) - t0


def compare_group(leader: CompileTask, followers: list[CompileTask]) -> list[Shared]:
    """Worker body: one group's leader run, then each follower both ways."""
    exe = ptxas.ptxas_path(leader.cuda_major)
    _, ptx, leader_cpu = _nvrtc(leader, leader.target, with_ptx=True)
    assert ptx is not None
    rows = []
    for f in followers:
        own_cubin, _, own_cpu = _nvrtc(f, f.target, with_ptx=True)
        own_ptx, _, _ = _nvrtc(f, f.target.replace("sm_", "compute_"), with_ptx=False)
        rewritten = ptxas.retarget(ptx, f.target)
        t0 = _cpu(resource.RUSAGE_CHILDREN)
        cubin = ptxas.assemble(exe, rewritten, f.target)
        rows.append(
            Shared(
                f.cuda_major,
                f.unit,
                leader.target,
                f.target,
                cubin == own_cubin,
                without_tool_note(cubin) == without_tool_note(own_cubin),
                rewritten == own_ptx,
                own_cpu,
                _cpu(resource.RUSAGE_CHILDREN) - t0,
                leader_cpu,
            )
        )
    return rows


_BUILD = """
import json, sys
from buildtool.builder import ptxas
from buildtool.builder.compile import compile_all
from buildtool.builder.plan import CompileJob
jobs = [CompileJob(*j) for j in json.loads(sys.argv[1])]
if sys.argv[2] == "nvrtc":
    ptxas.PINS.clear()  # no pinned ptxas: share_groups forms no group, every target is an NVRTC run
_, stats = compile_all(jobs, int(sys.argv[3]))
print(json.dumps([len(stats.seconds), len(stats.ptxas)]))
"""


def build_cpu(jobs: list[Any], route: str, workers: int) -> tuple[float, list[int]]:
    """compile_all of `jobs` in a child process with an empty kernel cache (the toolkits shared), by
    `route` ("shared" or "nvrtc"): CPU seconds of it and everything it ran (its rusage once reaped), [NVRTC, ptxas] runs."""
    from buildtool.core import cache

    with tempfile.TemporaryDirectory(prefix="fa-ptx-share-") as tmp:
        (Path(tmp) / "toolkits").symlink_to(cache.cache_dir() / "toolkits")
        env = {
            **os.environ,
            "FA_CACHE": tmp,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")]),
        }
        arg = json.dumps([[j.cuda_major, j.arch, j.image, j.unit] for j in jobs])
        before = _cpu(resource.RUSAGE_CHILDREN)  # this process runs no other child meanwhile
        cmd = [sys.executable, "-c", _BUILD, arg, route, str(workers)]
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"compile_all ({route}) failed:\n{done.stderr[-3000:]}")
    return _cpu(resource.RUSAGE_CHILDREN) - before, json.loads(done.stdout)


def by_build(tasks: dict[Any, CompileTask], groups: list[tuple[Any, tuple[Any, ...]]], workers: int) -> int:
    """The build's own route against NVRTC alone, on the jobs of the groups the build shares (and
    the PTX jobs of those archs): CPU seconds of each, one after the other, twice (A B B A)."""
    shared = {
        job for lead, fs in groups if tasks[lead].cuda_major in ptxas.SHARED_MAJORS for job in (lead, *fs)
    }
    keys = {(j.cuda_major, j.arch, j.unit) for j in shared}
    jobs = [j for j in tasks if (j.cuda_major, j.arch, j.unit) in keys]
    seen: dict[str, list[float]] = {"shared": [], "nvrtc": []}
    for route in ("shared", "nvrtc", "nvrtc", "shared"):
        cpu, runs = build_cpu(jobs, route, workers)
        seen[route].append(cpu)
        print(f"{route}: {cpu:.1f} CPU s, {runs[0]} NVRTC runs, {runs[1]} ptxas runs ({len(jobs)} jobs)")
    a, b = statistics.median(seen["shared"]), statistics.median(seen["nvrtc"])
    print(
        f"median: shared {a:.1f} CPU s, NVRTC alone {b:.1f} CPU s, saved {b - a:.1f}; load {os.getloadavg()[1]:.1f}"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", type=Path, default=REPO / "matrix.yaml")
    ap.add_argument("--platform", default="x86_64")
    ap.add_argument("--jobs", type=int, default=2, help="groups compared at once (processes)")
    ap.add_argument("--limit", type=int, default=0, help="compare only the first N groups (a quick look)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    ap.add_argument("--build", action="store_true", help="instead: time compile_all, shared and NVRTC alone")
    args = ap.parse_args()
    plan = make_plan(load_matrix(args.matrix), fetch_torch_catalog(), platform=args.platform)
    tree = KernelTree()
    tasks = {job: resolve(job, tree) for job in plan.compile_jobs}
    groups = sorted(ptxas.share_groups(tasks, majors=ptxas.PINS).items(), key=lambda g: str(g[0]))
    if args.limit:
        groups = groups[: args.limit]
    if args.build:
        return by_build(tasks, groups, args.jobs)
    for major in sorted({tasks[leader].cuda_major for leader, _ in groups}):
        toolkits.nvrtc_lib_dir(major), ptxas.ptxas_path(major)  # fetched once, before the workers
    rows: list[Shared] = []
    with cf.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = [pool.submit(compare_group, tasks[lead], [tasks[f] for f in fs]) for lead, fs in groups]
        for fut in cf.as_completed(futs):
            rows.extend(fut.result())

    by_kind: dict[tuple[int, str, str], list[Shared]] = defaultdict(list)
    for r in rows:
        by_kind[r.cuda_major, r.leader, r.target].append(r)
    sass = sum(t.target.startswith("sm_") for t in tasks.values())
    lines = [
        (
            f"The {args.platform} plan of `{args.matrix.name}`: {sass} cubin jobs, {len(groups)} programs with "
            f"more than one target ({len(rows)} shared targets); the standalone ptxas (`{' '.join(('-arch=sm_XX', *ptxas.OPTIONS))}`) of the nvidia-cuda-nvcc "
            "wheel of NVRTC's own version (buildtool/builder/ptxas.py)."
        ),
        "",
        (
            "| CUDA | leader, shared target | targets | same cubin | same but the tool note | same PTX (compute_XX) | NVRTC CPU s, own runs "
            "| ptxas CPU s | saved CPU s |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (major, lead, target), rs in sorted(by_kind.items()):
        own, asm = sum(r.nvrtc_cpu for r in rs), sum(r.ptxas_cpu for r in rs)
        lines.append(
            f"| {major} | {lead}, {target} | {len(rs)} | {sum(r.same_cubin for r in rs)} | {sum(r.same_but_note for r in rs)} "
            f"| {sum(r.same_ptx for r in rs)} | {own:.1f} | {asm:.1f} | {own - asm:.1f} |"
        )
    own, asm = sum(r.nvrtc_cpu for r in rows), sum(r.ptxas_cpu for r in rows)
    kept = [r for r in rows if r.cuda_major in ptxas.SHARED_MAJORS]
    leaders = sum({(r.cuda_major, r.unit, r.leader): r.leader_cpu for r in rows}.values())
    lines += [
        (
            f"| all | | {len(rows)} | {sum(r.same_cubin for r in rows)} | {sum(r.same_but_note for r in rows)} | {sum(r.same_ptx for r in rows)} "
            f"| {own:.1f} | {asm:.1f} | {own - asm:.1f} |"
        ),
        "",
        (
            f"The leaders' own NVRTC runs (cubin and PTX, needed either way): {leaders:.1f} CPU s. A shared "
            f"target's ptxas run takes {asm / max(own, 1e-9):.0%} of the CPU of its own NVRTC run."
        ),
        "",
        (
            f"The build shares CUDA {', '.join(map(str, sorted(ptxas.SHARED_MAJORS)))}'s programs "
            f"(ptxas.SHARED_MAJORS: the majors whose cubins are NVRTC's byte for byte): {len(kept)} targets, "
            f"{sum(r.nvrtc_cpu - r.ptxas_cpu for r in kept):.1f} CPU s saved. `{TOOL_NOTE}` is the note "
            "in which a CUDA 12 cubin names the tool that made it (its build string and options)."
        ),
        "",
        f"Load average at the end (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
    ]
    report("ptx-share", "\n".join(lines), args.record)
    differing = [r for r in kept if not (r.same_cubin and r.same_ptx)]
    for r in sorted(differing, key=str):
        print(
            f"differs (a target the build shares): CUDA {r.cuda_major} {r.unit} {r.target} (cubin {r.same_cubin}, PTX {r.same_ptx})"
        )
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
