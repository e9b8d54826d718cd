"""What `fa build --dry-run` shows: the plan as rich tables, or as a dict for `--json`.

Both views are built from the same `plan_json` dict, so the table and the JSON never disagree.
`cache_status(job)` comes from the compile step (True: the image is already in the cache).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from buildtool.builder.all_wheel import AllWheelSpec
from buildtool.builder.plan import SKIP_NO_TORCH_BUILD, BindingJob, Cell, CompileJob, Plan, WheelSpec
from buildtool.core.binding_forms import STABLE
from buildtool.core.console import counted, plain_console
from buildtool.core.runtime import versions

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
        "dropped_sass": [
            {"platform": d.platform, "cuda_major": d.cuda_major, "arch": d.arch, "reason": d.reason}
            for d in plan.dropped_sass
        ],
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


def _span(values: list[str]) -> str:
    """A list of versions as its first and last ("3.10-3.13"), or the one value."""
    return values[0] if len(values) == 1 else f"{values[0]}-{values[-1]}" if values else "-"


def _wheels_table(data: dict[str, Any]) -> Table:
    """One line per wheel, readable at 80 columns: the variant (not the file name), versions as spans.
    The JSON (`--json`) has every torch, Python and arch, and the binding's headers."""
    shard = f" (shard {data['shard'][0]}/{data['shard'][1]})" if data["shard"] else ""
    table = Table(
        title=f"fa-attn {data['version']}: wheels{shard}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
    )
    for name, justify in (
        ("variant", "left"),
        ("CPU", "left"),
        ("torch", "left"),
        ("Python", "left"),
        ("SASS", "left"),
        ("PTX", "left"),
        ("compile", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for w in data["wheels"]:
        if w["variant"] == "all":  # every CUDA major's archs as one span; --json has each set's
            k = w["kernels"]
            archs = sorted({a for s in w["kernel_sets"] for a in s["sass"]}, key=versions.parse_target)
            ptx = " ".join(s["ptx"] for s in w["kernel_sets"] if s["ptx"]) or "-"
            spans = [_span(w["torch_tested"]), _span(w["pythons"]), _span(archs), ptx]
            table.add_row("all", w["platform"], *spans, f"{k['to_compile']}/{k['total']}")
            continue
        if w["cuda_major"] is None:
            table.add_row("(universal)", "any", "any", "any", "-", "-", "-")
            continue
        k = w["kernels"]
        stable = w["binding"] and w["binding"]["form"] == STABLE
        torch = f"{w['torch_tested'][0]}+" if stable else w["torch"]
        table.add_row(
            w["variant"],
            w["platform"],
            torch,
            _span(w["pythons"]),
            _span(w["sass"]),
            w["ptx"] or "-",
            f"{k['to_compile']}/{k['total']}",
        )
    table.caption = "compile: kernel programs to compile, of the wheel's; torch N+: stable ABI; --json: all"
    table.caption_justify = "left"
    return table


def _runs(values: list[str], order: Sequence[str]) -> str:
    """Values as spans of runs that are unbroken in the matrix's own order ("3.13t-3.15t 3.10"), so a
    skipped-cells line stays one line at 80 columns; a value outside `order` stands alone."""
    index = {v: i for i, v in enumerate(order)}
    runs: list[list[str]] = []
    for v in sorted(values, key=lambda v: index.get(v, len(order))):
        last = runs[-1][-1] if runs else None
        if last is not None and v in index and last in index and index[v] == index[last] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return " ".join(_span(run) if len(run) > 2 else " ".join(run) for run in runs)


def _skipped_lines(data: dict[str, Any], pythons: Sequence[str]) -> list[Text]:
    """One entry per exclude entry, and one per torch minor for the Pythons PyPI has no torch build
    for, so the list stays short; the JSON has every cell with its own reason. Each entry is its
    cells on one line (Pythons as runs of the matrix's `pythons` order) and the reason below it,
    indented (prose wraps; nothing is cut)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for s in data["skipped"]:
        key = (
            (s["code"], s["torch"], s["platform"])
            if s["code"] == SKIP_NO_TORCH_BUILD
            else (s["code"], s["reason"], s["platform"])
        )
        groups.setdefault(key, []).append(s)
    lines = [Text("skipped cells", style="italic")]
    for (code, key, platform), cells in groups.items():
        reason = (
            f"no torch build on PyPI for these Pythons (Linux {platform})"
            if code == SKIP_NO_TORCH_BUILD
            else key
        )
        torch = _span(list(dict.fromkeys(c["torch"] for c in cells)))
        cuda = " ".join(dict.fromkeys(str(c["cuda"]) for c in cells))
        skipped_pythons = _runs(list(dict.fromkeys(c["python"] for c in cells)), pythons)
        n = len(cells)
        lines.append(
            Text(f"  {counted(n, 'cell')}: {platform}, torch {torch}, CUDA {cuda}, Python {skipped_pythons}")
        )
        lines.append(Text(f"      {reason}"))
    return lines


def _dropped_lines(data: dict[str, Any]) -> list[Text]:
    """One entry per (CPU, arch): the CUDA majors whose wheels of that CPU leave its SASS out, and why
    (its GPUs never sit beside that CPU), so an arch the matrix lists does not vanish unexplained."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in data["dropped_sass"]:
        groups.setdefault((d["platform"], d["arch"]), []).append(d)
    lines = [Text("SASS left out", style="italic")]
    for (platform, arch), entries in groups.items():
        majors = " ".join(str(d["cuda_major"]) for d in entries)
        lines.append(Text(f"  sm {arch} in {platform} wheels (CUDA {majors})"))
        lines.append(Text(f"      {entries[0]['reason']}"))
    return lines


def _totals_line(data: dict[str, Any]) -> str:
    t = data["totals"]
    wheels = counted(t["wheels"], "wheel")
    return (
        f"{t['cells']} cells: {t['covered']} covered by {wheels}, {t['skipped']} skipped. "
        f"{t['compile_jobs']} kernel programs: {t['cached']} cached, {t['to_compile']} to compile. "
        f"{t['binding_jobs']} bindings (each compiled unless the cache has it)."
    )


def plan_renderable(plan: Plan, cache_status: CacheStatus) -> Group:
    """Wheels, then skipped cells with their reasons, then totals."""
    data = plan_json(plan, cache_status)
    parts: list[Any] = [_wheels_table(data)]
    if data["skipped"]:
        parts += _skipped_lines(data, plan.matrix.python)
    if data["dropped_sass"]:
        parts += _dropped_lines(data)
    parts.append(_totals_line(data))
    return Group(*parts)


def print_plan(plan: Plan, cache_status: CacheStatus, console: Console | None = None) -> None:
    (console or plain_console()).print(plan_renderable(plan, cache_status))
