"""What `fa build --dry-run` shows: the plan as rich tables, or as a dict for `--json`.

Both views are built from the same `plan_json` dict, so the table and the JSON never disagree.
`cache_status(job)` comes from the compile step (True: the image is already in the cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from buildtool.builder.all_wheel import AllWheelSpec
from buildtool.builder.plan import SKIP_NO_TORCH_BUILD, BindingJob, Cell, CompileJob, Plan, WheelSpec
from buildtool.core.binding_forms import STABLE
from buildtool.core.console import plain_console

CacheStatus = Callable[[CompileJob], bool]
SCHEMA = 1


def plan_json(plan: Plan, cache_status: CacheStatus) -> dict[str, Any]:
    cached = {job: cache_status(job) for job in plan.compile_jobs}
    covered = {cell for w in plan.wheels for cell in w.cells}
    n_cached = sum(cached.values())
    return {
        "schema": SCHEMA,
        "version": plan.matrix.version,
        "source": plan.matrix.source,
        "shard": list(plan.shard) if plan.shard else None,
        "wheels": [_wheel_json(w, cached) for w in plan.wheels]
        + [_all_json(a, cached) for a in plan.all_wheels],
        "skipped": [{**_cell_json(s.cell), "code": s.code, "reason": s.reason} for s in plan.skipped],
        "compile_jobs": [
            {
                "cuda_major": j.cuda_major,
                "arch": j.arch,
                "image": j.image,
                "unit": j.unit,
                "cached": cached[j],
            }
            for j in plan.compile_jobs
        ],
        "binding_jobs": [_binding_json(b) for b in plan.binding_jobs],
        "totals": {
            "cells": len(covered) + len(plan.skipped),
            "covered": len(covered),
            "skipped": len(plan.skipped),
            "wheels": len(plan.wheels) + len(plan.all_wheels),
            "compile_jobs": len(plan.compile_jobs),
            "cached": n_cached,
            "to_compile": len(plan.compile_jobs) - n_cached,
            "binding_jobs": len(plan.binding_jobs),
        },
    }


def _wheel_json(wheel: WheelSpec, cached: dict[CompileJob, bool]) -> dict[str, Any]:
    return {
        "variant": wheel.variant,
        "platform": wheel.platform,
        "version": wheel.version,
        "cuda_major": wheel.cuda_major,
        "torch": wheel.torch_minor,
        "cxx11abi": wheel.cxx11abi,
        "form": wheel.form,
        "torch_tested": list(wheel.torch_tested),
        "sass": list(wheel.sass),
        "ptx": wheel.ptx,
        "cells": [_cell_json(c) for c in wheel.cells],
        "pythons": list(dict.fromkeys(c.python for c in wheel.cells)),
        "kernels": _kernels_json(wheel.compile_jobs, cached),
        "binding": _binding_json(wheel.binding) if wheel.binding else None,
    }


def _all_json(spec: AllWheelSpec, cached: dict[CompileJob, bool]) -> dict[str, Any]:
    """The all-wheel (variant "all"): no CUDA major or binding of its own; `kernel_sets` and
    `bindings` list its parts (all of them the per-variant wheels' work)."""
    return {
        "variant": spec.variant,
        "platform": spec.platform,
        "version": spec.version,
        "cuda_major": None,
        "torch": None,
        "cxx11abi": None,
        "form": None,
        "torch_tested": sorted({c.torch for c in spec.cells}, key=lambda t: tuple(map(int, t.split(".")))),
        "sass": [],
        "ptx": None,
        "cells": [_cell_json(c) for c in spec.cells],
        "pythons": list(dict.fromkeys(c.python for c in spec.cells)),
        "kernels": _kernels_json(spec.compile_jobs, cached),
        "binding": None,
        "kernel_sets": [
            {"cuda_major": k.cuda_major, "sass": list(k.sass), "ptx": k.ptx} for k in spec.kernel_sets
        ],
        "bindings": [_binding_json(b.job) for b in spec.bindings],
    }


def _kernels_json(jobs: tuple[CompileJob, ...], cached: dict[CompileJob, bool]) -> dict[str, int]:
    n_cached = sum(cached[j] for j in jobs)
    return {"total": len(jobs), "cached": n_cached, "to_compile": len(jobs) - n_cached}


def _cell_json(cell: Cell) -> dict[str, Any]:
    return {"torch": cell.torch, "cuda": cell.cuda, "python": cell.python, "platform": cell.platform}


def _binding_json(job: BindingJob) -> dict[str, Any]:
    return {
        "torch_minor": job.torch_minor,
        "torch_version": job.torch_version,
        "cxx11abi": job.cxx11abi,
        "form": job.form,
        "platform": job.platform,
        "header_source": job.header_source.filename if job.header_source else None,
    }


def plan_table(plan: Plan, cache_status: CacheStatus) -> Table:
    """The wheels: what each covers and what building it takes."""
    return _wheels_table(plan_json(plan, cache_status))


def _wheels_table(data: dict[str, Any]) -> Table:
    shard = f" (shard {data['shard'][0]}/{data['shard'][1]})" if data["shard"] else ""
    table = Table(title=f"fa-attn {data['version']}: wheels{shard}", title_justify="left")
    table.add_column("variant", no_wrap=True)
    table.add_column("CPU", no_wrap=True)
    table.add_column("torch covered")
    table.add_column("Pythons covered")
    table.add_column("SASS")
    table.add_column("PTX")
    table.add_column("kernels to compile/cached", justify="right")
    table.add_column("binding (torch, ABI)")
    for w in data["wheels"]:
        if w["variant"] == "all":
            k = w["kernels"]
            sets = "; ".join(f"cu{s['cuda_major']}: {' '.join(s['sass'])}" for s in w["kernel_sets"])
            ptx = " ".join(f"cu{s['cuda_major']}: {s['ptx']}" for s in w["kernel_sets"] if s["ptx"])
            row = ["all", w["platform"], " ".join(w["torch_tested"]), " ".join(w["pythons"]), sets]
            table.add_row(*row, ptx or "-", f"{k['to_compile']}/{k['cached']}", f"all {len(w['bindings'])}")
            continue
        if w["cuda_major"] is None:
            table.add_row("(universal)", "any", "any", "any", "-", "-", "-", "-")
            continue
        k = w["kernels"]
        b = w["binding"]
        stable = b["form"] == STABLE
        table.add_row(
            w["variant"],
            w["platform"],
            " ".join(w["torch_tested"]),
            " ".join(w["pythons"]),
            " ".join(w["sass"]),
            w["ptx"] or "-",
            f"{k['to_compile']}/{k['cached']}",
            f"stable ABI >= {b['torch_minor']} ({b['torch_version']} headers)"
            if stable
            else f"{b['torch_version']}, {'cxx11' if b['cxx11abi'] else 'old'}",
        )
    return table


def _skipped_table(data: dict[str, Any]) -> Table:
    """One row per exclude entry, and one per torch minor for the Pythons PyPI has no torch build
    for, so the table stays short; the JSON has every cell with its own reason."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for s in data["skipped"]:
        key = (
            (s["code"], s["torch"], s["platform"])
            if s["code"] == SKIP_NO_TORCH_BUILD
            else (s["code"], s["reason"], s["platform"])
        )
        groups.setdefault(key, []).append(s)
    table = Table(title="skipped cells", title_justify="left")
    for name in ("cells", "CPU", "torch", "cuda", "python", "reason"):
        table.add_column(name)
    for (code, key, platform), cells in groups.items():
        reason = (
            f"no torch build on PyPI for these Pythons (Linux {platform})"
            if code == SKIP_NO_TORCH_BUILD
            else key
        )
        table.add_row(
            str(len(cells)),
            platform,
            " ".join(dict.fromkeys(c["torch"] for c in cells)),
            " ".join(dict.fromkeys(str(c["cuda"]) for c in cells)),
            " ".join(dict.fromkeys(c["python"] for c in cells)),
            reason,
        )
    return table


def _totals_line(data: dict[str, Any]) -> str:
    t = data["totals"]
    return (
        f"{t['cells']} cells: {t['covered']} covered by {t['wheels']} wheels, {t['skipped']} skipped. "
        f"{t['compile_jobs']} kernel programs: {t['cached']} cached, {t['to_compile']} to compile. "
        f"{t['binding_jobs']} bindings to build."
    )


def plan_renderable(plan: Plan, cache_status: CacheStatus) -> Group:
    """Wheels, then skipped cells with their reasons, then totals."""
    data = plan_json(plan, cache_status)
    parts: list[Any] = [_wheels_table(data)]
    if data["skipped"]:
        parts.append(_skipped_table(data))
    parts.append(_totals_line(data))
    return Group(*parts)


def print_plan(plan: Plan, cache_status: CacheStatus, console: Console | None = None) -> None:
    (console or plain_console()).print(plan_renderable(plan, cache_status))
