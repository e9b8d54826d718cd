"""Kernel compiles: one NVRTC program per (CUDA major, arch, image kind, unit), cached by content.

The cache key covers everything that can change the image: the unit's source text and the text of
every header it includes (followed recursively), the pinned NVRTC version, the target, the unit's
defines and the shared options from tiles.nvrtc_options. So a second build with nothing changed
compiles nothing, and a changed header recompiles exactly the units that include it.

Compiles run in worker processes (one NVRTC loaded per worker); each worker writes its image into
the cache itself, atomically, so work finished before a kill is kept. Where a build ships both the
cubin and the PTX of one (CUDA major, arch, unit), one NVRTC compile makes both: NVRTC produces the
PTX on its way to the cubin, byte for byte what a compute_XX compile gives (bench/build/ptx_with_cubin.py
compares every pair), so the second compile would only repeat the first one's work.

Where several cubins of a build are one program for different targets (ptxas.share_groups: sm_80 and
sm_90 of a CUDA 11 unit), NVRTC runs once, for the lowest target, keeping its PTX; the others are
that PTX with its `.target` line rewritten, assembled by the pinned standalone ptxas of NVRTC's own
release (about a third of an NVRTC run's CPU). Their images are byte for byte NVRTC's own
(bench/build/ptx_share.py compares every one), so they keep NVRTC's cache keys. Without a ptxas
(no pin for this CPU, a refused download) or when it fails, that target is compiled by NVRTC, with
a one-line note.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import functools
import hashlib
import importlib.util
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from buildtool.builder import ptxas, toolkits
from buildtool.builder.nvrtc import NvrtcError, open_nvrtc
from buildtool.core import atomic, cache, children, kernels_src
from buildtool.core.cuda_facts import compute_name, sm_name
from buildtool.core.fetch import ProgressHook
from buildtool.errors import FaError

if TYPE_CHECKING:
    from buildtool.builder.wheel_specs import CompileJob

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


class CompileError(FaError):
    """Kernel compiles that failed; str() names each unit and arch and carries NVRTC's log."""

    def __init__(self, failures: list[CompileFailure]) -> None:
        self.failures = failures
        parts = [f"{f.unit} for {f.target} (CUDA {f.cuda_major}) failed:\n{f.log.strip()}" for f in failures]
        super().__init__("\n\n".join(parts))


@dataclass(frozen=True)
class CompileFailure:
    unit: str
    cuda_major: int
    target: str
    log: str


class KernelTree:
    """A kernels/ source tree and its tiles.py (the repo's by default; tests pass a small one)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else kernels_src.kernels_dir()
        self._units: dict[tuple[str, int | None], dict[str, Any]] = {}
        self._headers: dict[str, tuple[tuple[str, str], ...]] = {}
        self._sources: dict[str, str] = {}

    @cached_property
    def tiles(self) -> ModuleType:
        if self.root == kernels_src.kernels_dir():
            return kernels_src.tiles()
        name = "_fa_tiles_" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, self.root / "tiles.py")
        if spec is None or spec.loader is None:
            raise FileNotFoundError(f"no tiles.py in {self.root}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses need the module registered while it executes
        spec.loader.exec_module(mod)
        return mod

    def unit(self, arch: str, name: str, cuda: int | None = None) -> Any:  # a tiles.KernelUnit
        """The unit `name` of `arch` as CUDA `cuda`'s NVRTC compiles it (tiles per CUDA major)."""
        if (arch, cuda) not in self._units:  # tiles.all_units() builds the arch's whole table: once
            self._units[arch, cuda] = {u.name: u for u in self.tiles.all_units(arch, cuda)}
        try:
            return self._units[arch, cuda][name]
        except KeyError:
            raise KeyError(f"tiles.units({arch!r}) has no unit {name!r}") from None

    def source(self, source: str) -> str:
        """The text of the unit source `source` (relative to the tree), read once per tree."""
        if source not in self._sources:
            self._sources[source] = (self.root / source).read_text()
        return self._sources[source]

    def headers(self, source: str) -> tuple[tuple[str, str], ...]:
        """_headers of the unit source `source` (relative to the tree), read once per tree."""
        if source not in self._headers:
            self._headers[source] = _headers(self.root / source, self.root)
        return self._headers[source]


@dataclass(frozen=True)
class CompileTask:
    """A CompileJob resolved to plain data: all a worker process needs, and the cache key."""

    cuda_major: int
    unit: str
    target: str  # "sm_80" (cubin) | "compute_90" (PTX)
    source_name: str
    source: str
    headers: tuple[tuple[str, str], ...]
    options: tuple[str, ...]
    nvrtc_version: str

    @property
    def suffix(self) -> str:
        return ".cubin" if self.target.startswith("sm_") else ".ptx"

    @cached_property
    def key(self) -> str:
        """cache.content_key("fa-kernel-v1", source_name, source, *headers, nvrtc_version, target,
        *options); the part up to the headers, the same for every unit of one source, is hashed once."""
        h = _source_digest(self.source_name, self.source, self.headers).copy()
        for part in (self.nvrtc_version, self.target, *self.options):
            data = part.encode()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()

    @cached_property
    def path(self) -> Path:
        return image_path(self.key, self.suffix)


@functools.lru_cache(maxsize=64)
def _source_digest(source_name: str, source: str, headers: tuple[tuple[str, str], ...]) -> hashlib._Hash:
    """The sha256 state after cache.content_key's first parts (length-prefixed, in its order)."""
    h = hashlib.sha256()
    for part in ("fa-kernel-v1", source_name, source, *(x for pair in headers for x in pair)):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h


def image_path(key: str, suffix: str) -> Path:
    # One Path from the joined text, not three `/` steps (pathlib led a profiled no-op rebuild).
    return Path(os.path.join(cache.cache_dir(), "kernels", key[:2], f"{key}{suffix}"))


def _headers(src_path: Path, root: Path) -> tuple[tuple[str, str], ...]:
    """Every quoted include reachable from `src_path`, as (name as written, text). A header is looked
    up beside the including file, then in csrc/; one we cannot find is left for NVRTC to reject."""
    found: dict[str, str] = {}
    todo = [src_path]
    while todo:
        path = todo.pop()
        for name in _INCLUDE.findall(path.read_text()):
            if name in found:
                continue
            for cand in (path.parent / name, root / "csrc" / name):
                if cand.is_file():
                    found[name] = cand.read_text()
                    todo.append(cand)
                    break
    return tuple(sorted(found.items()))


def resolve(job: CompileJob, tree: KernelTree) -> CompileTask:
    unit = tree.unit(job.arch, job.unit, job.cuda_major)
    defines = tuple(f"-D{k}={v}" for k, v in sorted(unit.defines.items()))
    target = sm_name(job.arch) if job.image == "sass" else compute_name(job.arch)
    return CompileTask(
        cuda_major=job.cuda_major,
        unit=unit.name,
        target=target,
        source_name=unit.source,
        source=tree.source(unit.source),
        headers=tree.headers(unit.source),
        options=(*tree.tiles.nvrtc_options(job.arch), *defines),
        nvrtc_version=toolkits.toolkit(job.cuda_major).version,
    )


def is_cached(job: CompileJob, tree: KernelTree | None = None) -> bool:
    """True when the job's image is already in the cache (for the plan view)."""
    return resolve(job, tree or KernelTree()).path.is_file()


@dataclass
class CompileStats:
    seconds: dict[CompileJob, float] = field(default_factory=dict)  # compiled by this build: NVRTC time
    cached: set[CompileJob] = field(default_factory=set)  # already in the cache: nothing to do
    # PTX that a cubin compile of this build gave (no NVRTC run of its own): job -> the cubin's job
    with_cubin: dict[CompileJob, CompileJob] = field(default_factory=dict)
    # cubins (and their PTX) assembled by ptxas from another target's NVRTC PTX: job -> ptxas time
    ptxas: dict[CompileJob, float] = field(default_factory=dict)

    @property
    def compiled(self) -> int:
        return len(self.seconds)


@dataclass(frozen=True)
class _Outcome:
    seconds: float
    failure: CompileFailure | None
    reused: bool = False  # another build compiled it while this one waited for the key's lock
    with_cubin: bool = False  # PTX written by its cubin's compile
    ptxas: bool = False  # assembled by ptxas from the group leader's PTX
    note: str = ""  # a fallback to say (ptxas failed, NVRTC compiled it)


def _lock(task: CompileTask) -> Path:
    return cache.cache_dir() / "locks" / "kernels" / task.key


@contextlib.contextmanager
def _held(task: CompileTask, ptx: CompileTask | None) -> Iterator[list[CompileTask]]:
    """The cache locks of a task and of the PTX it also writes (the cubin's first, as every build takes
    them); yields the images still missing once they are held: a second build sharing the cache waits
    for the first one's compile and reuses its images instead of compiling them again."""
    with cache.locked(_lock(task)), cache.locked(_lock(ptx)) if ptx else contextlib.nullcontext():
        yield [t for t in (task, ptx) if t is not None and not t.path.is_file()]


def _compile_task(
    task: CompileTask, lib_dir: str, ptx: CompileTask | None = None, keep_ptx: bool = False
) -> tuple[list[_Outcome], bytes | None]:
    """Worker body: compile one task and write its image into the cache (atomically); with `ptx` (the
    same program for compute_XX), write that image too, from the same compile, under _held's locks.
    One outcome per task, and with `keep_ptx` the compile's PTX (for ptxas to serve the program's other
    targets; None when nothing was compiled)."""
    with _held(task, ptx) as wanted:
        if not wanted:
            return [_Outcome(0.0, None, reused=True)] * (2 if ptx else 1), None
        if wanted == [ptx]:  # another build made the cubin (and so the PTX) meanwhile
            return [_Outcome(0.0, None, reused=True), *_compile_task(ptx, lib_dir)[0]], None  # type: ignore[arg-type]
        t0 = time.perf_counter()
        try:
            out = open_nvrtc(lib_dir).compile(
                task.source,
                task.source_name,
                task.target,
                list(task.options),
                dict(task.headers),
                with_ptx=ptx is not None or keep_ptx,
            )
        except NvrtcError as e:
            fails = [CompileFailure(task.unit, task.cuda_major, t.target, e.log or str(e)) for t in wanted]
            return [_Outcome(time.perf_counter() - t0, f) for f in fails] + (
                [_Outcome(0.0, None, reused=True)] if len(wanted) < (2 if ptx else 1) else []
            ), None
        atomic.write_bytes(task.path, out.image)
        if ptx is not None and out.ptx is not None:
            atomic.write_bytes(ptx.path, out.ptx)
        seconds = time.perf_counter() - t0
        outcomes = [_Outcome(seconds, None)] + ([_Outcome(0.0, None, with_cubin=True)] if ptx else [])
        return outcomes, out.ptx if keep_ptx else None


def _assemble_task(
    task: CompileTask, lib_dir: str, ptx: CompileTask | None, exe: str, leader_ptx: bytes
) -> tuple[list[_Outcome], bytes | None]:
    """Worker body for a group's other target: the leader's PTX retargeted, assembled by ptxas `exe`,
    written as the task's cubin (and as its compute_XX PTX image when `ptx` is shipped too), under
    the same locks as _compile_task. If ptxas fails, NVRTC compiles the task instead (with a note)."""
    with _held(task, ptx) as wanted:
        if not wanted:
            return [_Outcome(0.0, None, reused=True)] * (2 if ptx else 1), None
        t0 = time.perf_counter()
        try:
            retargeted = ptxas.retarget(leader_ptx, task.target)
            cubin = ptxas.assemble(Path(exe), retargeted, task.target) if task in wanted else None
        except ptxas.PtxasError as e:
            failed = str(e).splitlines()[0] if str(e) else type(e).__name__
        else:
            if cubin is not None:
                atomic.write_bytes(task.path, cubin)
            if ptx is not None and ptx in wanted:
                atomic.write_bytes(ptx.path, retargeted)
            seconds = time.perf_counter() - t0
            first = (
                _Outcome(seconds, None, ptxas=True) if cubin is not None else _Outcome(0.0, None, reused=True)
            )
            return [first] + ([_Outcome(0.0, None, with_cubin=True)] if ptx else []), None
    # NVRTC instead, outside the locks (_compile_task takes them itself)
    note = (
        f"ptxas: {task.unit} for {task.target} (CUDA {task.cuda_major}): {failed}; compiled by NVRTC instead"
    )
    outcomes, _ = _compile_task(task, lib_dir, ptx)
    return [replace(outcomes[0], note=note), *outcomes[1:]], None


def pair_ptx_with_cubins(tasks: dict[CompileJob, CompileTask]) -> dict[CompileJob, CompileJob]:
    """PTX jobs whose program a cubin job of the same set compiles too: PTX job -> that cubin job. The
    same program means the same CUDA major, NVRTC, source, headers and options, and the same arch
    number (compute_90 beside sm_90)."""

    def program(task: CompileTask, arch: str) -> tuple[object, ...]:
        return (
            task.cuda_major,
            task.nvrtc_version,
            task.source_name,
            task.source,
            task.headers,
            task.options,
            arch,
        )

    cubins = {
        program(t, t.target.removeprefix("sm_")): job
        for job, t in tasks.items()
        if t.target.startswith("sm_")
    }
    pairs = {}
    for job, t in tasks.items():
        if t.target.startswith("compute_"):
            cubin = cubins.get(program(t, t.target.removeprefix("compute_")))
            if cubin is not None:
                pairs[job] = cubin
    return pairs


def shared_targets(jobs: Iterable[CompileJob], tree: KernelTree) -> set[CompileJob]:
    """The cubin jobs of `jobs` that ptxas assembles from another target's PTX when all are compiled
    (ptxas.share_groups' followers; for the ETA's weights)."""
    groups = ptxas.share_groups({job: resolve(job, tree) for job in jobs})
    return {f for fs in groups.values() for f in fs}


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_workers(requested: int) -> int:
    """At most one worker per CPU this process may run on: each worker is a process with its own NVRTC
    (about 110 MB), and more of them than CPUs only compete for the same cores."""
    return max(1, min(requested, usable_cpus()))


def compile_all(
    jobs: Iterable[CompileJob],
    workers: int,
    tree: KernelTree | None = None,
    on_done: Callable[[CompileTask, bool], None] | None = None,
    toolkit_progress: Callable[[int], ProgressHook] | None = None,
    on_compiling: Callable[[], None] | None = None,
    ptxas_progress: Callable[[int], ProgressHook] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> tuple[dict[CompileJob, Path], CompileStats]:
    """Compile what is not cached, up to `workers` at a time. Returns each job's image path.
    `on_done(task, was_cached)` is called once per job, in completion order; `toolkit_progress(major)`
    (`ptxas_progress(major)`) returns a download progress hook for a toolkit (a ptxas) that must be
    fetched first; `on_compiling()` is called once the toolkits are there, before the first compile;
    `on_note(line)` is told of each fallback from ptxas to NVRTC (default: stderr). Raises
    CompileError naming every failed unit after the others have finished (their images are kept)."""
    tree = tree or KernelTree()
    stats = CompileStats()
    tasks = {job: resolve(job, tree) for job in jobs}
    todo = {job: t for job, t in tasks.items() if not t.path.is_file()}
    for job, t in tasks.items():
        if job not in todo:
            stats.cached.add(job)
            if on_done:
                on_done(t, True)
    lib_dirs: dict[int, str] = {}
    for major in sorted({t.cuda_major for t in todo.values()}):
        hook = toolkit_progress(major) if toolkit_progress and not toolkits.is_unpacked(major) else None
        lib_dirs[major] = str(toolkits.nvrtc_lib_dir(major, hook))

    say = on_note or (lambda line: print(line, file=sys.stderr))
    groups = ptxas.share_groups(todo)  # leader -> the program's other targets, assembled by ptxas
    exes: dict[int, str] = {}
    for major in sorted({todo[leader].cuda_major for leader in groups}):
        hook = ptxas_progress(major) if ptxas_progress and not ptxas.is_unpacked(major) else None
        try:
            exes[major] = str(ptxas.ptxas_path(major, hook))
        except toolkits.ToolkitError as e:
            n = sum(len(fs) for leader, fs in groups.items() if todo[leader].cuda_major == major)
            say(
                f"no ptxas for CUDA {major} ({str(e).splitlines()[0]}): NVRTC compiles its {n} shared targets"
            )
    groups = {leader: fs for leader, fs in groups.items() if todo[leader].cuda_major in exes}
    followers = {f for fs in groups.values() for f in fs}

    if on_compiling:
        on_compiling()
    failures: list[CompileFailure] = []
    ptx_of = {cubin: ptx for ptx, cubin in pair_ptx_with_cubins(todo).items()}
    # one NVRTC compile each, the groups' leaders first (their followers can start sooner)
    runs = [job for job in todo if job not in ptx_of.values() and job not in followers]
    runs.sort(key=lambda job: job not in groups)

    def record(jobs: list[CompileJob], outcomes: list[_Outcome]) -> None:
        for job, outcome in zip(jobs, outcomes, strict=True):
            if outcome.note:
                say(outcome.note)
            if outcome.failure:
                failures.append(outcome.failure)
            elif outcome.reused:
                stats.cached.add(job)
            elif outcome.with_cubin:
                stats.with_cubin[job] = jobs[0]
            elif outcome.ptxas:
                stats.ptxas[job] = outcome.seconds
            else:
                stats.seconds[job] = outcome.seconds
            if on_done:
                on_done(tasks[job], outcome.reused)

    def run_jobs(job: CompileJob) -> list[CompileJob]:
        return [job, ptx_of[job]] if job in ptx_of else [job]

    Work = tuple[Callable[..., tuple[list[_Outcome], bytes | None]], tuple[Any, ...]]

    def work(job: CompileJob, leader_ptx: bytes | None) -> Work:
        """What a worker runs for `job`: ptxas on its leader's PTX, or NVRTC (a leader, a lone
        program, or a follower whose leader gave no PTX: it failed, or another build made it)."""
        task, lib_dir = todo[job], lib_dirs[todo[job].cuda_major]
        ptx = todo[ptx_of[job]] if job in ptx_of else None
        if leader_ptx is not None:
            return _assemble_task, (task, lib_dir, ptx, exes[task.cuda_major], leader_ptx)
        return _compile_task, (task, lib_dir, ptx, job in groups)

    def finished(
        job: CompileJob, result: tuple[list[_Outcome], bytes | None]
    ) -> list[tuple[CompileJob, bytes | None]]:
        """Record `job`'s outcomes; the followers it lets run next."""
        record(run_jobs(job), result[0])
        return [(f, result[1]) for f in groups.get(job, ())]

    queue: collections.deque[tuple[CompileJob, bytes | None]] = collections.deque((job, None) for job in runs)
    workers = min(usable_workers(workers), len(runs) + len(followers))
    if workers <= 1:
        while queue:
            job, leader_ptx = queue.popleft()
            fn, args = work(job, leader_ptx)
            queue.extendleft(reversed(finished(job, fn(*args))))
    else:
        # spawn, not fork: the parent runs progress threads, and each worker loads its own NVRTC.
        # Workers die with this process (a killed build leaves none blocked on the task pipe).
        # A few tasks queued per worker, not all: a leader's followers go next, its PTX held briefly.
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=children.die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            pending: dict[cf.Future[tuple[list[_Outcome], bytes | None]], CompileJob] = {}
            while queue or pending:
                while queue and len(pending) < 2 * workers:
                    job, leader_ptx = queue.popleft()
                    fn, args = work(job, leader_ptx)
                    pending[pool.submit(fn, *args)] = job
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    job = pending.pop(fut)
                    queue.extendleft(reversed(finished(job, fut.result())))
    if failures:
        raise CompileError(failures)
    return {job: t.path for job, t in tasks.items()}, stats
