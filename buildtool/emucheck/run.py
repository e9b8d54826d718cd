"""`fa check --emulate`: fa_attn.check's unit checks (the same problems, the same fp32 reference and
FA2 rule) with each unit built from kernels/ (or another kernel source folder, `csrc`) and run on the
CPU emulator. A launch the emulator refuses (out of bounds, race, hang) fails that unit with the
emulator's message; the others go on. Small shapes only: the emulator runs a thread at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fa_attn.check import (
    CheckReport,
    Job,
    Progress,
    UnitReport,
    line_progress,
    run_job,
    summarize,
    verdict_of,
)
from fa_attn.decision import GRID_CODES

from buildtool.emucheck.harness import emulator
from buildtool.emucheck.ops import kernels_on_cpu
from buildtool.errors import UsageError

ARCHES = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0")


def emulated_jobs(arch: str, only: tuple[str, ...]) -> list[tuple[Job, Any]]:
    """(job, tiles unit) of every unit of `arch` whose name contains one of `only` (all when empty)."""
    emulator()
    import tiles

    units = [u for u in tiles.units(arch) if not only or any(o in u.name for o in only)]
    if not units:
        names = ", ".join(u.name for u in tiles.units(arch)[:6])
        raise UsageError(f"--unit {','.join(only)}: no unit of sm {arch} matches (units: {names}, ...)")
    jobs = []
    tag = "sm_" + arch.replace(".", "")
    for u in units:
        module = f"/emulated/{tag}/{u.name}.cubin"
        launch = [u.head_dim]  # as decision.KernelLaunch.of lays it out
        for e in u.entries.values():
            launch += [e.threads, e.block_m, e.block_n, e.smem_bytes, GRID_CODES[e.grid]]
        job = Job(f"{tag}/{u.name}", u.direction, u.dtype, module, ",".join(u.entries), tuple(launch), 0)
        jobs.append((job, u))
    return jobs


def check_emulated(
    arch: str, only: tuple[str, ...] = (), csrc: Path | None = None, on_unit: Progress | None = None
) -> CheckReport:
    if arch not in ARCHES:
        raise UsageError(f"--arch {arch}: use one of {', '.join(ARCHES)}")
    harness = emulator()
    if csrc is not None and not (csrc / "fwd.cu").is_file():
        raise UsageError(
            f"--source {csrc}: not a kernel source folder (no fwd.cu); use a copy of kernels/csrc"
        )
    jobs = emulated_jobs(arch, only)
    libs: dict[str, Any] = {}
    units: list[UnitReport] = []
    on_unit = on_unit or line_progress()
    with kernels_on_cpu(lambda module: libs[module]):
        for n, (job, unit) in enumerate(jobs):
            on_unit(n, len(jobs), job.unit)
            try:
                if job.module not in libs:
                    libs[job.module] = harness.Emulated(unit, arch, *(() if csrc is None else (csrc,)))
                units.append(summarize(job, run_job(job, torch.device("cpu"), medium=False)))
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
