"""Execute a plan: toolkits -> kernel compiles (cached) -> bindings (cached) -> wheels -> index.

Every stage reads its inputs from the cache or the previous stage and writes through atomic renames,
so a build killed at any moment is resumed by running it again: finished compiles are cache hits,
and wheels/ only ever holds whole wheels. Progress goes to stderr (rich); the summary is returned
as data for the command to print as a table or JSON.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from buildtool.builder import all_wheel, build_stamp, cubin_fit, eta, index, out_files, package, torch_headers
from buildtool.builder import binding as binding_mod
from buildtool.builder.compile import (
    CompileStats,
    CompileTask,
    KernelTree,
    compile_all,
    shared_targets,
    usable_cpus,
    usable_workers,
)
from buildtool.builder.plan import Plan
from buildtool.builder.wheel_specs import BindingJob, CompileJob, WheelSpec
from buildtool.core import atomic, binding_forms, cache
from buildtool.core.console import counted, plain_console, progress_columns
from buildtool.core.cuda_facts import TOOLKITS, compute_name, sm_name
from buildtool.core.fetch import ProgressHook

T = TypeVar("T")


@dataclass
class WheelReport:
    file: str
    variant: str  # "" for the universal wheel
    platform: str | None  # the binding's CPU; None for the universal wheel
    size: int
    platform_tag: str
    platform_reason: str
    cells: int
    compile_seconds: float  # NVRTC time spent on this wheel's images in this build
    compiled: int  # images compiled for this wheel in this build
    cache_hits: int  # images and binding taken from the cache


@dataclass
class BuildSummary:
    out_dir: str
    wheels: list[WheelReport] = field(default_factory=list)
    nvrtc_compiles: int = 0
    nvrtc_cached: int = 0
    nvrtc_ptx_with_cubin: int = 0  # PTX images their cubin's compile gave (no NVRTC run of their own)
    nvrtc_seconds: float = 0.0
    ptxas_runs: int = 0  # cubins assembled from another target's NVRTC PTX (compile.py, ptxas.py)
    ptxas_seconds: float = 0.0
    cxx_compiles: int = 0
    cxx_cached: int = 0
    cxx_seconds: float = 0.0
    skipped_cells: int = 0
    seconds: float = 0.0
    up_to_date: bool = False  # the folder was as the last build of this plan left it (build_stamp)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _WeightedEta(TimeRemainingColumn):
    """rich's time left, but for a bar that knows better (its task's `ends_at`, a time.monotonic()
    deadline from eta.WorkEta): counting down between updates, never jumping with the recent rate."""

    def render(self, task: Task) -> Text:
        ends_at = task.fields.get("ends_at")
        if ends_at is None or task.finished:
            return super().render(task)
        minutes, seconds = divmod(int(max(0.0, ends_at - time.monotonic()) + 0.5), 60)
        hours, minutes = divmod(minutes, 60)
        text = f"{hours:d}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"
        return Text(text, style="progress.remaining")


class _Bars:
    """rich progress on stderr; silent when stderr is not a terminal and `quiet` is set."""

    def __init__(self, console: Console, enabled: bool) -> None:
        def bars(count: ProgressColumn) -> Progress:
            *columns, _ = progress_columns(count)
            columns.append(_WeightedEta(compact=True, elapsed_when_finished=False))
            return Progress(*columns, console=console, disable=not enabled, transient=False)

        self._progress = bars(MofNCompleteColumn())  # kernels, bindings, wheels: done of total
        self._bytes = bars(DownloadColumn())  # toolkit and header downloads: bytes

    @contextmanager
    def running(self) -> Iterator[_Bars]:
        with self._progress, self._bytes:
            yield self

    def counter(self, what: str, total: int) -> TaskID:
        return self._progress.add_task(what, total=total)

    def advance(self, task: TaskID, ends_at: float | None = None) -> None:
        self._progress.advance(task)
        if ends_at is not None:
            self._progress.update(task, ends_at=ends_at)

    def download(self, what: str) -> ProgressHook:
        task: list[TaskID] = []  # created on the first byte: a build waiting on another's lock shows none

        def hook(done: int, total: int | None) -> None:
            if not task:
                task.append(self._bytes.add_task(what, total=total))
            # A finished download's bar goes: the build's bars stay on screen for minutes.
            finished = total is not None and done >= total
            self._bytes.update(task[0], completed=done, total=total, visible=not finished)

        return hook


def execute(
    plan: Plan,
    out_dir: Path,
    workers: int = 1,
    tree: KernelTree | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> BuildSummary:
    """Build every wheel of `plan` into `out_dir` and re-index it. Raises OutDirError for an `out_dir`
    inside the sources, else CompileError, BindingError, ToolkitError, HeaderError, FetchError,
    PackageError or WriteError (each with a message for a person)."""
    t0 = time.perf_counter()
    tree = tree or KernelTree()
    console = console or plain_console(stderr=True)
    package.check_out_dir(out_dir, tree.root)
    atomic.ensure_dir(out_dir)
    # A killed build's half-written wheels; the index, simple/ and logs/ files sweep their own
    # leftovers when they are rewritten (atomic.writing).
    atomic.sweep_stale(out_dir)
    summary = BuildSummary(out_dir=str(out_dir), skipped_cells=len(plan.skipped))
    stamp, rows = _stamp_of(plan, out_dir, tree)
    if rows is not None:
        return _up_to_date(plan, summary, rows, t0)
    bars = _Bars(console, show_progress)
    with bars.running(), package.one_tree_state():
        kernels = bars.counter("kernels", len(plan.compile_jobs))
        bindings_bar = bars.counter("bindings", len(plan.binding_jobs))
        # One estimate for both bars: the bindings' g++ runs share the CPUs with the kernel compiles.
        left = eta.WorkEta(
            time.monotonic(),
            usable_cpus(),
            kernels=(
                {
                    _program(j): w
                    for j, w in eta.job_weights(
                        plan.compile_jobs, shared_targets(plan.compile_jobs, tree)
                    ).items()
                },
                usable_workers(workers),
            ),
            bindings=(eta.binding_weights(plan.binding_jobs), max(1, workers)),
            say_starts=("bindings",),  # a few long g++ runs, after each one's header download
        )
        estimating = threading.Lock()  # kernels finish on this thread, bindings on theirs

        def compiling() -> None:  # the toolkits are there: the rate counts from now
            with estimating:
                left.restart(time.monotonic())

        def finished(pool: str, bar: TaskID, item: Hashable, cached: bool) -> None:
            with estimating:
                now = time.monotonic()
                left.done(pool, item, now, cached)
                seconds = left.seconds_left(pool, now)
            bars.advance(bar, None if seconds is None else now + seconds)

        def binding_started(job: BindingJob) -> None:
            with estimating:
                left.started("bindings", job, time.monotonic())

        def kernel_done(task: CompileTask, cached: bool) -> None:
            finished("kernels", kernels, (task.cuda_major, task.unit, task.target), cached)

        def binding_done(job: BindingJob, cached: bool) -> None:
            finished("bindings", bindings_bar, job, cached)

        # The bindings (torch header downloads, then g++) are built beside the kernel compiles, not
        # after them: the downloads wait on the network while NVRTC keeps the CPUs busy.
        building = _beside(
            _build_bindings, plan.binding_jobs, tree, workers, bars, binding_started, binding_done
        )
        images, cstats = compile_all(
            plan.compile_jobs,
            workers,
            tree,
            on_done=kernel_done,
            toolkit_progress=lambda m: bars.download(f"NVRTC for CUDA {m}"),
            on_compiling=compiling,
            ptxas_progress=lambda m: bars.download(f"ptxas for CUDA {m}"),
            on_note=lambda line: console.print(line, markup=False, highlight=False),
        )
        cubin_fit.check_build(images, tree, plan.reused_sass)
        summary.nvrtc_compiles, summary.nvrtc_cached = cstats.compiled, len(cstats.cached)
        summary.nvrtc_ptx_with_cubin = len(cstats.with_cubin)
        summary.nvrtc_seconds = round(sum(cstats.seconds.values()), 3)
        summary.ptxas_runs, summary.ptxas_seconds = len(cstats.ptxas), round(sum(cstats.ptxas.values()), 3)

        bindings = building.result()
        summary.cxx_compiles = sum(not b.cached for b in bindings.values())
        summary.cxx_cached = sum(b.cached for b in bindings.values())
        summary.cxx_seconds = round(sum(b.seconds for b in bindings.values()), 3)

        wheels_bar = bars.counter("wheels", len(plan.wheels))
        logs: list[dict[str, Any]] = []
        with cache.inputs_held():  # the images and bindings stay as they are while the wheels are packed
            for spec in plan.wheels:
                b = bindings.get(spec.binding) if spec.binding else None
                built = package.build_wheel(
                    spec, out_dir, tree.root, tree.tiles, images, b.path if b else None
                )
                summary.wheels.append(_report(spec, built, cstats, b))
                logs.append(_log_entry(spec, built, b))
                bars.advance(wheels_bar)
            for whole in plan.all_wheels:
                paths = {job: bindings[job].path for job in (b.job for b in whole.bindings)}
                made = all_wheel.build_all_wheel(whole, out_dir, tree.root, tree.tiles, images, paths)
                summary.wheels.append(_all_report(whole, made))
                logs.append(_all_log_entry(whole, made))
        index.write_index(out_dir)
        _write_log(out_dir, plan, logs)
    inputs = [*images.values(), *(b.path for b in bindings.values())]
    build_stamp.record(stamp, out_dir, inputs, [asdict(w) for w in summary.wheels])
    summary.seconds = round(time.perf_counter() - t0, 3)
    return summary


def up_to_date(plan: Plan, out_dir: Path, tree: KernelTree | None = None) -> BuildSummary | None:
    """What execute() reports when `out_dir` and every input are as the last build of `plan` left
    them (build_stamp): nothing compiled, everything cached, nothing written; None: build."""
    t0 = time.perf_counter()
    if not out_dir.is_dir():
        return None
    _, rows = _stamp_of(plan, out_dir, tree or KernelTree())
    if rows is None:
        return None
    return _up_to_date(plan, BuildSummary(out_dir=str(out_dir), skipped_cells=len(plan.skipped)), rows, t0)


def _stamp_of(plan: Plan, out_dir: Path, tree: KernelTree) -> tuple[str, list[WheelReport] | None]:
    """The key of building `plan` into `out_dir`, and its stamp's rows when nothing changed since."""
    stamp = build_stamp.key(plan, out_dir, tree.root)
    return stamp, _stamped_rows(plan, build_stamp.unchanged(stamp, out_dir))


# What each WheelReport field holds, as a stamp's JSON gives it back.
_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "float": (int, float),
}


def _stamped_rows(plan: Plan, rows: list[dict[str, Any]] | None) -> list[WheelReport] | None:
    """The stamp's rows as reports, one per wheel of `plan` in its order; None (build) for rows of
    another number or shape: a stamp edited by hand or written by another fa is never trusted."""
    if rows is None or len(rows) != len(plan.wheels) + len(plan.all_wheels):
        return None
    known = {f.name: _ROW_TYPES.get(str(f.type)) for f in fields(WheelReport)}
    kinds = {name: kind for name, kind in known.items() if kind is not None}
    if len(kinds) < len(known):  # a field of a type this check does not know
        return None
    for row in rows:
        if row.keys() != kinds.keys() or not all(isinstance(row[k], t) for k, t in kinds.items()):
            return None
    return [WheelReport(**row) for row in rows]


def _up_to_date(plan: Plan, summary: BuildSummary, wheels: list[WheelReport], t0: float) -> BuildSummary:
    """What a build with every compile, binding and wheel found as made reports: nothing compiled,
    everything cached; each wheel's file, size and platform tag from the stamp."""
    hits = [len(w.compile_jobs) + (w.binding is not None) for w in plan.wheels]
    hits += [len(a.compile_jobs) + len(a.bindings) for a in plan.all_wheels]
    for row, cached in zip(wheels, hits, strict=True):
        row.compile_seconds, row.compiled, row.cache_hits = 0.0, 0, cached
    summary.wheels = wheels
    summary.nvrtc_cached, summary.cxx_cached = len(plan.compile_jobs), len(plan.binding_jobs)
    summary.up_to_date = True
    summary.seconds = round(time.perf_counter() - t0, 3)
    return summary


def _program(job: CompileJob) -> tuple[int, str, str]:
    """A job as compile.CompileTask names it: (CUDA major, unit, NVRTC target)."""
    target = sm_name(job.arch) if job.image == "sass" else compute_name(job.arch)
    return job.cuda_major, job.unit, target


def _beside(work: Callable[..., T], *args: Any) -> cf.Future[T]:
    """`work(*args)` in a daemon thread: a build that fails or is interrupted meanwhile does not wait
    for all of it (the compiler a binding thread runs at that moment finishes or dies with fa)."""
    future: cf.Future[T] = cf.Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(work(*args))
            except BaseException as error:  # noqa: BLE001 (handed to whoever asks for the result)
                future.set_exception(error)

    threading.Thread(target=run, name="fa-bindings", daemon=True).start()
    return future


def _build_bindings(
    jobs: tuple[BindingJob, ...],
    tree: KernelTree,
    workers: int,
    bars: _Bars,
    on_start: Callable[[BindingJob], None],
    on_done: Callable[[BindingJob, bool], None],
) -> dict[BindingJob, binding_mod.BindingBuild]:
    """One binding per job; header downloads and g++ runs in threads (each is I/O or a subprocess).
    `on_start(job)` when its headers are there (its compiler's turn), `on_done(job, cached)` as it is."""

    def one(job: BindingJob) -> binding_mod.BindingBuild:
        if job.header_source is None:
            _, headers = torch_headers.local_torch()
        else:
            headers = torch_headers.headers_for(
                job.torch_version,
                job.header_source,
                bars.download(f"torch {job.torch_version} headers ({job.platform})"),
            )
        floor = job.torch_minor if job.form == binding_forms.STABLE else None
        on_start(job)
        built = binding_mod.build_binding(headers, job.cxx11abi, tree.root, job.platform, floor)
        on_done(job, built.cached)
        return built

    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=True))


def _report(
    spec: WheelSpec, built: package.BuiltWheel, stats: CompileStats, b: binding_mod.BindingBuild | None
) -> WheelReport:
    seconds, cached = stats.seconds, stats.cached
    compiled = [j for j in spec.compile_jobs if j in seconds or j in stats.with_cubin or j in stats.ptxas]
    hits = sum(j in cached for j in spec.compile_jobs) + int(bool(b and b.cached))
    row = _row(built, spec.variant, spec.platform, len(spec.cells), hits)
    row.compile_seconds = round(sum(seconds.get(j, stats.ptxas.get(j, 0.0)) for j in compiled), 3)
    row.compiled = len(compiled)
    return row


def _all_report(spec: all_wheel.AllWheelSpec, built: package.BuiltWheel) -> WheelReport:
    """The all-wheel's row: its compiles are the per-variant wheels' (counted there, cache hits here)."""
    return _row(
        built, spec.variant, spec.platform, len(spec.cells), len(spec.compile_jobs) + len(spec.bindings)
    )


def _row(built: package.BuiltWheel, variant: str, platform: str | None, cells: int, hits: int) -> WheelReport:
    return WheelReport(
        file=built.path.name,
        variant=variant,
        platform=platform,
        size=built.path.stat().st_size,
        platform_tag=built.platform,
        platform_reason=built.platform_reason,
        cells=cells,
        compile_seconds=0.0,
        compiled=0,
        cache_hits=hits,
    )


def _log_head(built: package.BuiltWheel, variant: str, platform: str | None) -> dict[str, Any]:
    return {
        "wheel": built.path.name,
        "variant": variant,
        "platform": platform,
        "platform_tag": built.platform,
        "platform_reason": built.platform_reason,
    }


def _all_log_entry(spec: all_wheel.AllWheelSpec, built: package.BuiltWheel) -> dict[str, Any]:
    sets = [{"cuda_major": k.cuda_major, "sass": list(k.sass), "ptx": k.ptx} for k in spec.kernel_sets]
    bindings = [b.label for b in spec.bindings]
    return {**_log_head(built, spec.variant, spec.platform), "bindings": bindings, "kernel_sets": sets}


def _log_entry(
    spec: WheelSpec, built: package.BuiltWheel, b: binding_mod.BindingBuild | None
) -> dict[str, Any]:
    return {
        **_log_head(built, spec.variant, spec.platform),
        "binding_key": b.key if b else None,
        "compiler": binding_mod.compiler_identity(spec.platform) if b else None,
        "toolkit": TOOLKITS[spec.cuda_major].version if spec.cuda_major is not None else None,
    }


def _write_log(out_dir: Path, plan: Plan, wheels: list[dict[str, Any]]) -> None:
    """logs/build[-<cpu>][-<K>of<N>].json: why each wheel got its platform tag, what compiled it. Per
    CPU and shard, so the jobs' logs copied into one directory do not overwrite each other."""
    cpu = f"-{plan.platform}" if plan.platform else ""
    name = f"build{cpu}-{plan.shard[0]}of{plan.shard[1]}.json" if plan.shard else f"build{cpu}.json"
    skipped = [{"cell": asdict(s.cell), "reason": s.reason} for s in plan.skipped]
    out_files.write_json(
        out_dir, f"logs/{name}", {"wheels": wheels, "skipped": skipped, "python": sys.version.split()[0]}
    )


def summary_table(summary: BuildSummary) -> Table:
    """One row per wheel, named by its variant and CPU (the file names are in --json and index.json)."""
    title = Text(f"fa build: {counted(len(summary.wheels), 'wheel')} in {summary.out_dir}")
    # No rules: the longest variant (cu12torch2.5cxx11abifalse) and every figure fit 80 columns.
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, caption_justify="left")
    table.add_column("variant", no_wrap=True)
    table.add_column("CPU", no_wrap=True)
    for col in ("size", "cells", "NVRTC s", "compiled", "cached"):
        table.add_column(col, justify="right", no_wrap=True)
    for w in summary.wheels:
        table.add_row(
            Text(w.variant or "universal"),
            w.platform or "any",
            _size(w.size),
            str(w.cells),
            f"{w.compile_seconds:.1f}",
            str(w.compiled),
            str(w.cache_hits),
        )
    nothing = (
        "nothing to do: the folder is as the last build of this plan left it; " if summary.up_to_date else ""
    )
    table.caption = (
        f"{nothing}NVRTC: {summary.nvrtc_compiles} compiled ({summary.nvrtc_seconds:.1f} s; "
        f"{summary.nvrtc_ptx_with_cubin} PTX with their cubin), {summary.nvrtc_cached} cached; "
        f"ptxas: {summary.ptxas_runs} cubins from another target's PTX ({summary.ptxas_seconds:.1f} s); C++: {summary.cxx_compiles} compiled ({summary.cxx_seconds:.1f} s), "
        f"{summary.cxx_cached} cached; {summary.skipped_cells} cells skipped; {summary.seconds:.1f} s total"
    )
    return table


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"
