"""The build plan: the matrix expanded into cells, the wheels that cover them, and the work to do.

One wheel per distinct binary. Kernels depend only on the CUDA major (toolkit) and arch, never on
torch, so every wheel of one CUDA major shares one set of compile jobs; the binding depends on the
torch minor and C++ ABI, never on CUDA or Python (no Python C API: wheels are py3-none), so one
binding serves every CUDA major. With `stable_abi` the minors from that floor on share one
stable-ABI binding (buildtool/core/binding_forms.py), so they share one wheel per (CPU, CUDA major). A Python version only decides coverage: a cell is covered when
PyPI has a torch build of that minor for that Python on Linux for the cell's CPU. Each CPU in
`platforms` (x86_64, aarch64) gets its own bindings and wheels; the kernel compile jobs are the same,
but for the SASS of archs whose GPUs only come with the other CPU (cuda_facts.ONE_CPU_ARCHS: Jetson
Thor's 11.0 is in aarch64 wheels only), which that CPU's wheels leave out (Plan.dropped_sass says so).

Pure: the catalog and the kernel table come in as arguments; nothing is downloaded or compiled.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from buildtool.builder.all_wheel import AllWheelSpec, all_wheel_specs
from buildtool.builder.matrix import (
    DEFAULT_VERSION,
    MIN_TORCH,
    KernelFilter,
    Matrix,
    MatrixError,
    arch_option,
    default_ptx,
    python_version,
)
from buildtool.builder.pypi import TorchCatalog
from buildtool.builder.wheel_specs import (
    BindingJob,
    Cell,
    CompileJob,
    MajorUnits,
    ReusedSass,
    WheelSpec,
    keep_reused,
    sass_compiler,
    units_per_major,
    variant_label,
)
from buildtool.core import binding_forms, cpus, cuda_facts, kernels_src
from buildtool.core.runtime import versions
from buildtool.core.textfile import shown
from buildtool.core.wheel_file import local_build_label

# `units(arch, cuda)` from kernels/tiles.py: the kernel programs CUDA major `cuda`'s NVRTC compiles for
# an arch (the same names in every major; a tile can differ).
Units = Callable[[str, int], Sequence[Any]]

# Rough weights for balancing shards, in "kernel programs": a binding is one g++ compile against
# torch's headers, which costs a few NVRTC programs. Not measured; only the order matters.
BINDING_WEIGHT = 4
WHEEL_WEIGHT = 1


@dataclass(frozen=True)
class SkippedCell:
    cell: Cell
    reason: str  # a sentence for people, naming the cell's torch and Python or the exclude entry
    code: str = ""  # SKIP_EXCLUDED | SKIP_NO_TORCH_BUILD, for grouping and scripts


@dataclass(frozen=True)
class DroppedSass:
    """An arch of the matrix whose SASS one CPU's wheels of a CUDA major leave out, and why."""

    platform: str  # the CPU whose wheels go without it
    cuda_major: int
    arch: str
    why: str = ""  # a reason other than the CPU's (WAITING_FOR_SOURCE)

    @property
    def reason(self) -> str:
        if self.why:
            return self.why
        cpu, gpus = cuda_facts.ONE_CPU_ARCHS[self.arch]
        return f"sm {self.arch} GPUs ({gpus}) only come with {cpu} CPUs"


# An arch-specific target whose kernel source is not in this tree yet (kernels/tiles.py's units leave
# units without a source out): the build goes on without it and says so. The sm_90a forward
# (csrc/hopper_fwd.cu) lands with its own branch; once it is in the tree the target builds.
WAITING_FOR_SOURCE = (
    "its kernel source is not in this tree yet (kernels/tiles.py missing_sources): built once it is"
)


SKIP_EXCLUDED = "excluded"
SKIP_NO_TORCH_BUILD = "no-torch-build"


@dataclass(frozen=True)
class Plan:
    matrix: Matrix
    wheels: tuple[WheelSpec, ...]
    skipped: tuple[SkippedCell, ...]
    compile_jobs: tuple[CompileJob, ...]  # deduplicated over all wheels
    binding_jobs: tuple[BindingJob, ...]  # deduplicated
    shard: tuple[int, int] | None = None  # (K, N) when this is one shard of a bigger plan
    platform: str | None = None  # the CPU when the plan keeps one CPU's wheels (fa build --platform)
    # matrix.yaml all_wheel: one per CPU, made of the wheels' own compiles and bindings (all_wheel.py)
    all_wheels: tuple[AllWheelSpec, ...] = ()
    # the matrix's archs whose SASS a CPU's wheels leave out (reported like skipped cells: by shard 1)
    dropped_sass: tuple[DroppedSass, ...] = ()

    @property
    def reused_sass(self) -> tuple[ReusedSass, ...]:
        """Every unit a lower minor's cubin serves, over the plan's wheels and all-wheels."""
        rows = [r for w in self.wheels for r in w.reused_sass]
        rows += [r for a in self.all_wheels for k in a.kernel_sets for r in k.reused_sass]
        return tuple(dict.fromkeys(rows))


def make_plan(
    matrix: Matrix,
    catalog: TorchCatalog,
    shard: tuple[int, int] | None = None,
    *,
    platform: str | None = None,
    units: Units | None = None,
) -> Plan:
    """Expand `matrix` against the torch releases in `catalog`; `platform` keeps one CPU's wheels (the
    universal wheel goes with the matrix's first platform), then `shard` keeps one shard of those.
    Raises MatrixError for a torch minor that PyPI never published, an arch without kernels, or a
    platform the matrix does not list."""
    # Each CUDA major asks for the same archs' units: tiles builds an arch's table once per plan.
    alternatives = functools.cache(_alternatives(units))
    options = _options(units)
    table = units_per_major(units or kernels_src.tiles().units)
    for i, minor in enumerate(matrix.torch):
        if minor not in catalog.minors:
            raise MatrixError(
                matrix.source,
                f"torch[{i}]",
                f"torch {minor} was never published on PyPI (newest minors: {', '.join(catalog.newest())})",
                "remove it, or use a published minor (fa build --refresh re-reads PyPI)",
            )
    per_cpu: dict[tuple[str, int], _MajorKernels] = {}

    def kernels_of(cpu: str, cuda: int) -> _MajorKernels:
        if (cpu, cuda) not in per_cpu:
            per_cpu[cpu, cuda] = _for_cpu(matrix, cuda, kernels[cuda], cpu)
        return per_cpu[cpu, cuda]

    skipped: list[SkippedCell] = []
    covered: dict[tuple[str, int, str], list[Cell]] = {}
    for cpu, torch, cuda, python in itertools.product(
        matrix.platforms, _by_version(matrix.torch), matrix.cuda, _pythons(matrix.python)
    ):
        cell = Cell(torch, cuda, python, cpu)
        skip = _skip(matrix, catalog, cell)
        if skip:
            skipped.append(skip)
        else:
            covered.setdefault((cpu, cuda, torch), []).append(cell)
    # A major's cubins go to a newer major's wheels only where the plan builds its wheels anyway (for
    # the CPU `platform` keeps): no toolkit is fetched only to share.
    built = {cuda for cpu, cuda, _ in covered if platform is None or cpu == platform}
    kernels = {m: _kernels_for_major(matrix, m, table, alternatives, options, built) for m in matrix.cuda}

    wheels = [universal_wheel(matrix)]
    stable_cells: dict[tuple[str, int], list[Cell]] = {}
    for (cpu, cuda, torch), cells in sorted(covered.items(), key=_wheel_order):
        if matrix.stable(torch):
            stable_cells.setdefault((cpu, cuda), []).extend(cells)
            continue
        release = catalog.minors[torch].builds[cpu]
        for abi in matrix.abis(torch):
            binding = BindingJob(torch, release.oldest, abi, release.header_source, cpu)
            wheels.append(
                _kernel_wheel(matrix, cuda, torch, abi, tuple(cells), kernels_of(cpu, cuda), binding)
            )
    for (cpu, cuda), cells in stable_cells.items():
        binding = _stable_binding(matrix, catalog, cpu)
        wheels.append(
            _kernel_wheel(
                matrix, cuda, binding.torch_minor, None, tuple(cells), kernels_of(cpu, cuda), binding
            )
        )
    wheels.sort(key=_wheel_sort_key)
    dropped = _dropped(kernels, per_cpu)

    if platform is not None:
        if platform not in matrix.platforms:
            raise MatrixError(
                "command line",
                "--platform",
                f"{platform!r} is not in platforms ({', '.join(matrix.platforms)})",
                f"use one of {', '.join(matrix.platforms)}, or add it to platforms in {matrix.source}",
            )
        keep_universal = platform == matrix.platforms[0]
        wheels = [w for w in wheels if w.platform == platform or (w.platform is None and keep_universal)]
        skipped = [s for s in skipped if s.cell.platform == platform]
        dropped = [d for d in dropped if d.platform == platform]
    alls = all_wheel_specs(wheels, matrix.version) if matrix.all_wheel else ()
    plan = _assemble(matrix, wheels, skipped, platform=platform, all_wheels=alls, dropped=dropped)
    if shard is None:
        return plan
    # Skipped cells are reported once, by shard 1 (with the universal wheel), so the shards' reports
    # add up to the whole matrix. The all-wheels go with shard 1 too: they need every major's kernels.
    first = shard[0] == 1
    return _assemble(
        matrix,
        shard_wheels(plan.wheels, shard),
        skipped if first else [],
        shard,
        platform=platform,
        all_wheels=alls if first else (),
        dropped=dropped if first else (),
    )


def local_plan(
    torch_version: str,
    cxx11abi: bool,
    python: str,
    cuda: tuple[int, ...],
    matrix: Matrix | None = None,
    *,
    units: Units | None = None,
    stable_floor: str | None = None,
    sass: str | None = None,
) -> Plan:
    """`fa build --local` and `fa install --build`: wheels for the torch installed here only, its
    headers from its own install (BindingJob.header_source is None). `matrix` supplies version, archs,
    PTX and the kernel filter. With `stable_floor` (a torch at or above it) the binding is the stable-ABI
    form targeting that floor, so the wheel outlives a torch upgrade; `sass` ships that one arch's SASS
    and no PTX (the wheel for this machine's GPU)."""
    source = "fa build --local"
    try:
        release = Version(torch_version).release
    except InvalidVersion:
        raise MatrixError(
            source, "torch", f"{torch_version!r} is not a torch version", "check `python -c 'import torch'`"
        ) from None
    minor = f"{release[0]}.{release[1] if len(release) > 1 else 0}"
    if Version(minor) < Version(MIN_TORCH):
        raise MatrixError(
            source,
            "torch",
            f"torch {torch_version} is older than fa supports",
            f"install torch >= {MIN_TORCH}",
        )
    platform = cpus.host()
    if platform not in cpus.PLATFORMS:
        raise MatrixError(
            source,
            "platform",
            f"fa builds no wheels for {platform} machines",
            f"build on {' or '.join(cpus.PLATFORMS)}",
        )
    for m in cuda:
        if m not in cuda_facts.TOOLKITS:
            known = ", ".join(map(str, cuda_facts.TOOLKITS))
            raise MatrixError(
                source, "--cuda", f"CUDA {m} has no pinned toolkit in fa", f"use one of {known}"
            )
    if sass is not None:
        archs: dict[int, tuple[str, ...]] = {m: _sass_for(sass, m, source) for m in cuda}
        ptx: dict[int, str | None] = {m: None for m in cuda}
    else:
        archs = {
            m: (matrix.archs.get(m) if matrix else None) or cuda_facts.TOOLKITS[m].default_archs for m in cuda
        }
        ptx = {m: matrix.ptx[m] if matrix and m in matrix.ptx else default_ptx(archs[m]) for m in cuda}
    stable = stable_floor is not None and Version(minor) >= Version(stable_floor)
    local = Matrix(
        version=matrix.version if matrix else DEFAULT_VERSION,
        torch=(minor,),
        cuda=tuple(cuda),
        python=(python,),
        archs=archs,
        ptx=ptx,
        cxx11abi=str(cxx11abi).lower(),
        kernels=matrix.kernels if matrix else None,
        platforms=(platform,),
        stable_abi=stable_floor if stable else None,
        sass_per_major=tuple(m for m in (matrix.sass_per_major if matrix else ()) if m in cuda),
        source=source,
    )
    # Each CUDA major asks for the same archs' units: tiles builds an arch's table once per plan.
    alternatives = functools.cache(_alternatives(units))
    options = _options(units)
    table = units_per_major(units or kernels_src.tiles().units)
    if stable:
        binding = BindingJob(str(stable_floor), torch_version, True, None, platform, binding_forms.STABLE)
    else:
        binding = BindingJob(minor, torch_version, cxx11abi, None, platform)
    # The one GPU's arch (`sass`) is built as asked: it names this machine's own GPU.
    kernels = {m: _kernels_for_major(local, m, table, alternatives, options, cuda) for m in cuda}
    per_cpu = {(platform, m): kernels[m] if sass else _for_cpu(local, m, kernels[m], platform) for m in cuda}
    wheels = [
        _kernel_wheel(
            local,
            m,
            binding.torch_minor,
            None if stable else cxx11abi,
            (Cell(minor, m, python, platform),),
            per_cpu[platform, m],
            binding,
            one_arch=archs[m][0] if sass is not None else None,
        )
        for m in cuda
    ]
    # The wheel for one GPU (`sass`) is this machine's only: no all-wheel, which would be named like
    # the release's (no local label) while holding one arch.
    with_all = matrix is not None and matrix.all_wheel and sass is None
    alls = all_wheel_specs(wheels, local.version) if with_all else ()
    return _assemble(local, wheels, [], all_wheels=alls, dropped=_dropped(kernels, per_cpu))


def _sass_for(gpu_sm: str, major: int, source: str) -> tuple[str, ...]:
    """The targets to compile SASS for a GPU of compute capability `gpu_sm` with CUDA `major`: the GPU's
    own arch, or the highest one of its major the toolkit targets below it (SASS runs on a higher
    minor), then the arch-specific targets of exactly its arch ("9.0a" on a 9.0 GPU) the toolkit has."""
    toolkit = cuda_facts.TOOLKITS[major]
    gpu = arch_option(gpu_sm, source)
    fitting = [
        a
        for a in cuda_facts.plain(toolkit.archs)
        if versions.parse_arch(a)[0] == gpu[0] and versions.parse_arch(a) <= gpu
    ]
    if not fitting:
        raise MatrixError(
            source,
            "--arch",
            f"CUDA {major} (NVRTC {toolkit.version}) cannot target sm {gpu_sm} (it targets {', '.join(toolkit.archs)})",
            "build with a newer CUDA major (--cuda), or on a machine with a supported GPU",
        )
    specific = [a for a in toolkit.archs if versions.arch_specific(a) and versions.sass_runs_on(a, gpu_sm)]
    return (max(fitting, key=versions.parse_arch), *specific)


def _stable_binding(matrix: Matrix, catalog: TorchCatalog, cpu: str) -> BindingJob:
    """The stable-ABI binding of `cpu`: built against the floor's oldest patch, with its headers."""
    floor = str(matrix.stable_abi)
    builds = catalog.minors[floor].builds
    if cpu not in builds:
        raise MatrixError(
            matrix.source,
            "stable_abi",
            f"torch {floor} has no Linux {cpu} wheel on PyPI to take the stable-ABI headers from",
            f"raise stable_abi to a minor with {cpu} wheels, or drop {cpu} from platforms",
        )
    release = builds[cpu]
    # The C++ ABI flag only concerns the binding's own use of the C++ library: nothing of it crosses
    # into torch, so one build serves both ABIs. The C++11 ABI is every pip torch's since 2.7.
    return BindingJob(floor, release.oldest, True, release.header_source, cpu, binding_forms.STABLE)


def universal_wheel(matrix: Matrix) -> WheelSpec:
    """py3-none-any: the runtime with no kernels, for any platform fa has no binary for (it falls back
    to PyTorch's attention and says why)."""
    return WheelSpec(
        cuda_major=None,
        torch_minor=None,
        cxx11abi=None,
        sass=(),
        ptx=None,
        cells=(),
        compile_jobs=(),
        binding=None,
        variant="",
        version=matrix.version,
    )


@dataclass(frozen=True)
class _MajorKernels:
    sass: tuple[str, ...]
    ptx: str | None
    jobs: tuple[CompileJob, ...]
    waiting: tuple[str, ...] = ()  # arch-specific targets of the matrix left out: no source yet
    reused: tuple[ReusedSass, ...] = ()  # SASS units a lower minor's cubin serves (not in `jobs`)


def _no_alternatives(arch: str, cuda: int) -> Sequence[Any]:  # noqa: ARG001 (a Units)
    return ()


def _alternatives(units: Units | None) -> Units:
    """tiles.alternative_units with the repo's table; none with a table a caller passes (`units`)."""
    if units is not None:
        return _no_alternatives
    return getattr(kernels_src.tiles(), "alternative_units", _no_alternatives)


Options = Callable[[str], Sequence[str]] | None  # tiles.nvrtc_options; None: no reuse of SASS


def _options(units: Units | None) -> Options:
    """tiles.nvrtc_options with the repo's table; None with a table a caller passes (`units`): its
    units need not say how they compile, so no SASS is reused."""
    return None if units is not None else kernels_src.tiles().nvrtc_options


def _program(unit: Any, arch: str, options: Callable[[str], Sequence[str]]) -> tuple[Any, ...]:
    """What NVRTC is given for `unit` on `arch`, but the target."""
    return (unit.source, tuple(sorted(unit.defines.items())), tuple(options(arch)))


def _same_program(a: Any, b: Any, arch: str, options: Options) -> bool:
    """Whether two units (one unit of two CUDA majors' tables) are the same NVRTC program on `arch`:
    by source, -D defines and options where the table says how it compiles, else by the unit itself."""
    if a is None or b is None:
        return False
    if not (hasattr(a, "source") and hasattr(a, "defines")):
        return bool(a == b)
    opts = options or (lambda _arch: ())
    return _program(a, arch, opts) == _program(b, arch, opts)


def reuse_lower_minor(
    jobs: Sequence[CompileJob], chosen: dict[str, Sequence[Any]], options: Options
) -> tuple[list[CompileJob], list[ReusedSass]]:
    """Split a major's SASS `jobs` into those to compile and the units a lower minor's cubin serves
    (ReusedSass): a unit of X.y (not arch-specific) whose program is the same as that of the
    lowest X.z < y the major builds, by the same NVRTC. `chosen`: each SASS arch's units."""
    if options is None:
        return list(jobs), []
    parsed = {a: versions.parse_arch(a) for a in chosen if not versions.arch_specific(a)}
    plain = sorted(parsed, key=parsed.__getitem__)
    programs = {arch: {u.name: _program(u, arch, options) for u in chosen[arch]} for arch in plain}
    served: dict[CompileJob, CompileJob] = {}  # a job of a higher minor -> the kept job serving it
    kept: dict[tuple[str, str], CompileJob] = {}  # (arch, unit) -> its job, for SASS compiled
    for job in sorted((j for j in jobs if j.image == "sass"), key=lambda j: versions.parse_target(j.arch)):
        if job.arch not in programs:  # arch-specific: its cubin runs on its own capability only
            continue
        major, minor = parsed[job.arch]
        base = next(
            (
                kept[arch, job.unit]
                for arch in plain
                if parsed[arch][0] == major
                and parsed[arch][1] < minor
                and (arch, job.unit) in kept
                and kept[arch, job.unit].cuda_major == job.cuda_major
                and programs[arch].get(job.unit) == programs[job.arch][job.unit]
            ),
            None,
        )
        if base is None:
            kept[job.arch, job.unit] = job
        else:
            served[job] = base
    keep = [j for j in jobs if j not in served]
    return keep, [ReusedSass(j.arch, base) for j, base in served.items()]


def runs_image(image_arch: str, image: str, sass: Sequence[str], gpu: str) -> bool:
    """Whether a GPU of arch `gpu` runs this image of a wheel with SASS for `sass`: the image must run
    there (SASS: same major, minor <= the GPU's; PTX: any arch <= the GPU's) and no better one may
    (SASS of the GPU's major closer to it; any SASS beats PTX). decision.py picks the same way."""
    own, there = versions.parse_arch(image_arch), versions.parse_arch(gpu)
    if own > there or (image == "sass" and own[0] != there[0]):
        return False
    plain = [arch for arch in sass if not versions.arch_specific(arch)]  # sm_90a serves its own units only
    better = [
        s
        for s in map(versions.parse_arch, plain)
        if s[0] == there[0] and s <= there and (image == "ptx" or s > own)
    ]
    return not better


def alternative_jobs(
    major: int, sass: Sequence[str], ptx: str | None, alternatives: Units, flt: KernelFilter | None = None
) -> list[CompileJob]:
    """The alternative tiles (tiles.alternative_units) a wheel of CUDA `major` with SASS for `sass` and
    PTX of `ptx` compiles: those that some GPU they serve runs from that image; other GPUs never load
    them. Only GPUs the major's NVRTC targets count: a torch of that major runs on no other (PyTorch
    builds SASS for the archs its CUDA knows, and its CUDA 11.8 builds no PTX: pytorch/builder's
    build_cuda.sh, "5.0;6.0;7.0;7.5;8.0;8.6;3.7;9.0"), so cu11's compute 9.0 PTX never meets sm 12.x."""
    known = cuda_facts.TOOLKITS[major].archs
    images = [(arch, "sass") for arch in sass] + ([(ptx, "ptx")] if ptx else [])
    return [
        CompileJob(major, arch, image, u.name)
        for arch, image in images
        for u in alternatives(arch, major)
        if (flt is None or flt.accepts(u))
        and any(gpu in known and runs_image(arch, image, sass, gpu) for gpu in u.serves)
    ]


def _kernels_for_major(
    matrix: Matrix,
    major: int,
    units: MajorUnits,
    alternatives: Units = _no_alternatives,
    options: Options = None,
    built: Collection[int] | None = None,
) -> _MajorKernels:
    """`built`: the majors whose wheels the plan builds (their NVRTC is fetched anyway); None: the
    matrix's."""

    def selected(arch: str, field: str) -> list[Any]:
        all_units = list(units(arch, major))
        if not all_units and versions.arch_specific(arch):
            waiting.append(arch)
            return []
        if not all_units:
            raise MatrixError(
                matrix.source,
                field,
                f"fa has no kernels for arch {arch} (kernels/tiles.py)",
                "remove it; archs with kernels get them from the nearest lower SASS or the PTX",
            )
        flt = matrix.kernels
        return [u for u in all_units if flt is None or flt.accepts(u)]

    # An older major's units of an arch by name: once per (arch, major), not once per unit asked.
    named = functools.cache(lambda arch, older: {u.name: u for u in units(arch, older)})

    def compiler(arch: str, unit: Any) -> int:
        """The major whose NVRTC compiles `unit` of `arch` for this major's wheels (sass_compiler):
        an older one only where its program of the unit is this major's."""

        def same(older: int) -> bool:
            return _same_program(named(arch, older).get(unit.name), unit, arch, options)

        return sass_compiler(
            major, arch, matrix.cuda if built is None else built, matrix.sass_per_major, same
        )

    explicit = matrix.archs.get(major) != cuda_facts.TOOLKITS[major].default_archs
    sass: list[str] = []
    jobs: list[CompileJob] = []
    waiting: list[str] = []
    sass_units: dict[str, Sequence[Any]] = {}
    for i, arch in enumerate(matrix.archs[major]):
        field = f'archs."{major}"[{i}]' if explicit else f'archs."{major}" (default {arch})'
        chosen = selected(arch, field)
        if chosen:  # a kernel filter can leave an arch with nothing to ship
            sass.append(arch)
            sass_units[arch] = chosen
            jobs += [CompileJob(compiler(arch, u), arch, "sass", u.name) for u in chosen]
    jobs, reused = reuse_lower_minor(jobs, sass_units, options)
    ptx = matrix.ptx.get(major)
    if ptx is not None:
        chosen = selected(ptx, f'ptx."{major}"')
        jobs += [CompileJob(compiler(ptx, u), ptx, "ptx", u.name) for u in chosen]
        ptx = ptx if chosen else None
    jobs += alternative_jobs(major, sass, ptx, alternatives, matrix.kernels)
    if not jobs:
        raise MatrixError(
            matrix.source,
            "kernels",
            f"the filter selects no kernel for any arch of CUDA {major}",
            "widen kernels: (dtypes, head_dims, directions) or remove it",
        )
    return _MajorKernels(tuple(sass), ptx, tuple(jobs), tuple(waiting), tuple(reused))


def _for_cpu(matrix: Matrix, major: int, kernels: _MajorKernels, cpu: str) -> _MajorKernels:
    """`kernels` without the SASS no GPU beside a `cpu` CPU runs (cuda_facts.ONE_CPU_ARCHS). The jobs
    left are a subset of the major's, so the CPUs still share every compile. PTX is kept: it JITs to
    any newer arch, whatever the CPU."""
    sass = tuple(a for a in kernels.sass if cuda_facts.sass_of_use_on(a, cpu))
    if sass == kernels.sass:
        return kernels
    jobs, reused = keep_reused(
        tuple(j for j in kernels.jobs if j.image == "ptx" or j.arch in sass), kernels.reused, sass
    )
    if not jobs:
        gone = "; ".join(DroppedSass(cpu, major, a).reason for a in kernels.sass)
        raise MatrixError(
            matrix.source,
            f'archs."{major}"',
            f"no arch of CUDA {major} is of use in {cpu} wheels: {gone}",
            f"add an arch of GPUs that {cpu} machines have, or exclude {{platform: {cpu}, cuda: {major}}}",
        )
    return _MajorKernels(sass, kernels.ptx, jobs, kernels.waiting, reused)


def _dropped(
    kernels: dict[int, _MajorKernels], per_cpu: dict[tuple[str, int], _MajorKernels]
) -> list[DroppedSass]:
    """What each CPU's wheels left out of their major's SASS, in CPU and major order: the archs whose
    GPUs never sit beside that CPU, and the arch-specific targets whose source is not here yet."""
    out = []
    for cpu, major in sorted(per_cpu, key=lambda k: (cpus.PLATFORMS.index(k[0]), k[1])):
        out += [DroppedSass(cpu, major, a) for a in kernels[major].sass if a not in per_cpu[cpu, major].sass]
        out += [DroppedSass(cpu, major, a, WAITING_FOR_SOURCE) for a in kernels[major].waiting]
    return out


def _kernel_wheel(
    matrix: Matrix,
    cuda: int,
    torch: str,
    abi: bool | None,
    cells: tuple[Cell, ...],
    kernels: _MajorKernels,
    binding: BindingJob,
    one_arch: str | None = None,
) -> WheelSpec:
    """`one_arch`: the wheel `fa install --build` makes for one GPU, labelled as a local build."""
    variant = variant_label(cuda, torch, abi)
    if one_arch is not None:
        variant = local_build_label(variant, one_arch)
    return WheelSpec(
        cuda_major=cuda,
        torch_minor=torch,
        cxx11abi=abi,
        sass=kernels.sass,
        ptx=kernels.ptx,
        cells=cells,
        compile_jobs=kernels.jobs,
        binding=binding,
        variant=variant,
        version=f"{matrix.version}+{variant}",
        reused_sass=kernels.reused,
    )


def _skip(matrix: Matrix, catalog: TorchCatalog, cell: Cell) -> SkippedCell | None:
    i = matrix.excluded_by(cell.torch, cell.cuda, cell.python, cell.platform)
    if i is not None:
        reason = f"excluded by exclude[{i}] ({_entry_text(matrix.exclude[i])}) in {matrix.source}"
        return SkippedCell(cell, reason, SKIP_EXCLUDED)
    published = catalog.minors[cell.torch].pythons(cell.platform)
    if cell.python not in published:
        kind = "free-threaded " if cell.python.endswith("t") else ""
        reason = (
            f"torch {cell.torch} has no {kind}Python {cell.python} build on PyPI "
            f"(Linux {cell.platform}: {', '.join(published) or 'none'})"
        )
        return SkippedCell(cell, reason, SKIP_NO_TORCH_BUILD)
    return None


def _entry_text(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in entry.items())


def _assemble(
    matrix: Matrix,
    wheels: Sequence[WheelSpec],
    skipped: Sequence[SkippedCell],
    shard: tuple[int, int] | None = None,
    *,
    platform: str | None = None,
    all_wheels: Sequence[AllWheelSpec] = (),
    dropped: Sequence[DroppedSass] = (),
) -> Plan:
    jobs = [job for w in wheels for job in w.compile_jobs] + [j for a in all_wheels for j in a.compile_jobs]
    bindings = [w.binding for w in wheels if w.binding is not None]
    bindings += [b.job for a in all_wheels for b in a.bindings]
    return Plan(
        matrix=matrix,
        wheels=tuple(wheels),
        skipped=tuple(skipped),
        compile_jobs=tuple(dict.fromkeys(jobs)),
        binding_jobs=tuple(dict.fromkeys(bindings)),
        shard=shard,
        platform=platform,
        all_wheels=tuple(all_wheels),
        dropped_sass=tuple(dropped),
    )


# -- sharding ----------------------------------------------------------------------------------------


def parse_shard(text: str) -> tuple[int, int]:
    """ "2/3" -> (2, 3); 1-based."""
    m = re.fullmatch(r"\s*([0-9]{1,4})\s*/\s*([0-9]{1,4})\s*", text, re.ASCII)
    if not m:
        raise MatrixError("command line", "--shard", f"{shown(text)} is not K/N", "write it like --shard 1/3")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise MatrixError(
            "command line",
            "--shard",
            f"{shown(text)}: K must be between 1 and N",
            f"use --shard 1/{max(n, 1)} .. {max(n, 1)}/{max(n, 1)}",
        )
    return k, n


def shard_wheels(wheels: Sequence[WheelSpec], shard: tuple[int, int]) -> tuple[WheelSpec, ...]:
    """The wheels of shard K of N. Wheels are grouped by (CPU, CUDA major), since the wheels of one major
    share all their kernel programs and a CI job runs on one CPU; a group is split (by torch minor)
    only when there are more shards than groups, and groups go to the least loaded shard, heaviest
    first. The universal wheel is in shard 1. Every wheel is in exactly one shard; a shard may be
    empty when N exceeds the wheels."""
    k, n = shard
    keys = dict.fromkeys((w.platform, w.cuda_major) for w in wheels if w.cuda_major is not None)
    groups = [[w for w in wheels if (w.platform, w.cuda_major) == key] for key in keys]
    while len(groups) < n:
        biggest = max(groups, key=len, default=[])
        if len(biggest) < 2:
            break
        i = groups.index(biggest)
        half = (len(biggest) + 1) // 2
        groups[i : i + 1] = [biggest[:half], biggest[half:]]

    def cost(group: list[WheelSpec]) -> int:
        programs = len({job for w in group for job in w.compile_jobs})
        bindings = len({w.binding for w in group})
        return programs + BINDING_WEIGHT * bindings + WHEEL_WEIGHT * len(group)

    loads = [0] * n
    members: list[list[WheelSpec]] = [[] for _ in range(n)]
    for group in sorted(groups, key=cost, reverse=True):  # stable: ties keep the CUDA-major order
        target = min(range(n), key=lambda s: (loads[s], s))
        loads[target] += cost(group)
        members[target] += group
    universal = [w for w in wheels if w.cuda_major is None]
    members[0] = universal + members[0]
    order = {w: i for i, w in enumerate(wheels)}
    return tuple(sorted(members[k - 1], key=order.__getitem__))


def _wheel_order(item: tuple[tuple[str, int, str], list[Cell]]) -> tuple[Any, ...]:
    (platform, cuda, torch), _ = item
    return cpus.PLATFORMS.index(platform), cuda, Version(torch)


def _wheel_sort_key(wheel: WheelSpec) -> tuple[Any, ...]:
    """The universal wheel first, then by CPU, CUDA major and torch (a stable-ABI wheel after the
    per-minor ones of its CPU and major: it serves the newest minors)."""
    if wheel.binding is None:
        return (-1,)
    return (
        cpus.PLATFORMS.index(wheel.binding.platform),
        wheel.cuda_major,
        wheel.form == binding_forms.STABLE,
        Version(wheel.binding.torch_minor),
    )


def _by_version(minors: Sequence[str]) -> list[str]:
    return sorted(minors, key=Version)


def _pythons(pythons: Sequence[str]) -> list[str]:
    return sorted(pythons, key=lambda p: (python_version(p)[0], python_version(p)[1]))
