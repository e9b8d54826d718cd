"""`fa check --emulate`: fa_attn.check's unit checks (the same problems, the same fp32 reference and
FA2 rule) with each unit built from kernels/ (or another kernel source folder, `csrc`) and run on the
CPU emulator. A launch the emulator refuses (out of bounds, race, hang) fails that unit with the
emulator's message; the others go on. Small shapes only: the emulator runs a thread at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fa_attn.runtime.decision import GRID_CODES, KernelLaunch
from fa_attn.verify.check import (
    NOT_PAGED,
    CheckReport,
    Job,
    Progress,
    UnitReport,
    line_progress,
    run_job,
    summarize,
    verdict_of,
)
from fa_attn.verify.check import problems as check_problems
from fa_attn.verify.unitcheck import key_block, query_block

from buildtool.core import cuda_facts
from buildtool.core.runtime import versions
from buildtool.emucheck.harness import emulator
from buildtool.emucheck.ops import kernels_on_cpu
from buildtool.errors import FaError, UsageError

ARCHES = ("7.5", "8.0", "8.6", "8.9", "9.0", "9.0a", "10.0", "12.0")
# The arch-specific targets `fa check --emulate` runs: those tests/emu's emu_harness lists in ARCH_SPECIFIC, whose
# units it launches as the binding does (sm_90a: FaParams and the Q, K, V tensor maps of tensor_maps.h).


def emulated_jobs(arch: str, only: tuple[str, ...]) -> list[tuple[Job, Any]]:
    """(job, tiles unit) of every unit of `arch` whose name contains one of `only` (all when empty)."""
    emulator()
    import tiles

    units = [u for u in tiles.units(arch) if not only or any(o in u.name for o in only)]
    if not units:
        names = ", ".join(u.name for u in tiles.units(arch)[:6])
        raise UsageError(f"--unit {','.join(only)}: no unit of sm {arch} matches (units: {names}, ...)")
    jobs = []
    tag = cuda_facts.sm_name(arch)
    paged = "paged_kv" in tiles.features(arch)  # an arch without paged KV has no paged problems
    for u in units:
        module = f"/emulated/{tag}/{u.name}.cubin"
        launch = [u.head_dim]  # as decision.KernelLaunch.of lays it out
        for e in u.entries.values():
            launch += [e.threads, e.block_m, e.block_n, e.smem_bytes, GRID_CODES[e.grid]]
        job = Job(
            f"{tag}/{u.name}", u.direction, u.dtype, module, ",".join(u.entries), tuple(launch), 0,
            tiles.head_dims(u)[0], paged,
        )  # fmt: skip
        jobs.append((job, u))
    return jobs


def check_emulated(
    arch: str,
    only: tuple[str, ...] = (),
    csrc: Path | None = None,
    on_unit: Progress | None = None,
    problems: tuple[str, ...] = (),
) -> CheckReport:
    """Every unit of `arch` whose name contains one of `only` (all when empty), each on its problems
    named in `problems` (all when empty: fa_attn.check.problems)."""
    if arch not in ARCHES:
        raise UsageError(f"--arch {arch}: use one of {', '.join(ARCHES)}")
    harness = emulator()
    if versions.arch_specific(arch):
        _runs_arch_specific(arch, harness)
    if csrc is not None and not (csrc / "fwd.cu").is_file():
        raise UsageError(
            f"--source {csrc}: not a kernel source folder (no fwd.cu); use a copy of kernels/csrc"
        )
    jobs = emulated_jobs(arch, only)
    _check_problem_names(jobs, problems)
    if problems:  # only the units that have a selected problem
        jobs = [(job, u) for job, u in jobs if set(problems) & set(problem_names(job))]
    libs: dict[str, Any] = {}
    units: list[UnitReport] = []
    on_unit = on_unit or line_progress()
    with kernels_on_cpu(lambda module: libs[module]):
        for n, (job, unit) in enumerate(jobs):
            on_unit(n, len(jobs), job.unit)
            try:
                if job.module not in libs:
                    libs[job.module] = harness.Emulated(unit, arch, *(() if csrc is None else (csrc,)))
                units.append(summarize(job, run_job(job, torch.device("cpu"), False, problems)))
            except Exception as err:  # noqa: BLE001 (a build or launch failure is this unit's verdict)
                text = f"{type(err).__name__}: {err}".replace("\n", " ")[:300]
                units.append(
                    UnitReport(
                        job.unit, 0, job.direction, job.dtype, job.launch[0], "fail", text, float("inf")
                    )
                )
    on_unit(len(jobs), len(jobs), "")
    gpu = {"index": 0, "gpu": f"CPU emulator, sm {arch}", "sm": arch}
    return CheckReport(verdict_of(units), [gpu], units, [])


def _runs_arch_specific(arch: str, harness: Any) -> None:
    """FaError (exit 1: nothing was checked, never a pass) unless the units of the arch-specific target
    `arch` exist in this tree and the emulator runs their instructions."""
    import tiles

    missing = tiles.missing_sources(arch)
    if missing:
        raise FaError(
            f"--arch {arch}: not supported by this checkout yet: kernels/{missing[0]} is not in the tree, so "
            f"sm {arch} has no unit to check (kernels/tiles.py lists them for when it lands); nothing was checked"
        )
    if arch not in getattr(harness, "ARCH_SPECIFIC", ()):
        raise FaError(
            f"--arch {arch}: not supported by this emulator yet: its harness (tests/emu/emu_harness.py) does "
            f"not list {arch} in ARCH_SPECIFIC, so `fa check` cannot launch sm {arch} units (their tensor maps "
            "and entries) on it; nothing was checked"
        )


def problem_names(job: Job, paged: bool | None = None) -> list[str]:
    """The names of a unit's emulated problems (fa_attn.check.problems, without the medium shapes);
    `paged`: as if the unit did (True) or did not read paged KV, instead of job.paged."""
    launch = KernelLaunch(job.module, job.entries, job.launch)
    dtype = torch.bfloat16 if job.dtype == "bf16" else torch.float16
    chosen = check_problems(
        dtype, job.launch[0], job.direction, key_block(launch), False, query_block(launch),
        job.paged if paged is None else paged, lowest_head_dim=job.lowest_head_dim,
    )  # fmt: skip
    return [p.name for p in chosen]


def _check_problem_names(jobs: list[tuple[Job, Any]], names: tuple[str, ...]) -> None:
    """--problem: each name must be a problem of some selected unit (a typo checks nothing)."""
    if not names:
        return
    known = {name for job, _ in jobs for name in problem_names(job)}
    unknown = [n for n in names if n not in known]
    unpaged = [job.unit for job, _ in jobs if not job.paged]
    if unpaged and set(unknown) & {n for job, _ in jobs for n in problem_names(job, paged=True)}:
        raise UsageError(
            f"--problem {', '.join(unknown)}: not a problem of {', '.join(unpaged)}, which {NOT_PAGED} "
            f"(its problems: {', '.join(sorted(known))})"
        )
    if unknown:
        raise UsageError(
            f"--problem {', '.join(unknown)}: no selected unit has such a problem "
            f"(problems: {', '.join(sorted(known))})"
        )
