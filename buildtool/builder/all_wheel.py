"""The all-wheel: one wheel per CPU (variant "all", version without a local label, so a plain
`pip install fa-attn` takes it) holding every binding and every CUDA major's kernels of that CPU's
per-variant wheels. matrix.yaml `all_wheel: true` adds it to the plan; docs/matrix.md has the rules.

It is made of the per-variant wheels' own work: its bindings are theirs and its compile jobs a subset
of theirs (cached by content), so it costs no NVRTC or C++ compile of its own. What it leaves out was
decided by measurement (docs/build.md, "The all-wheel"; bench/build/all_wheel_size.py):
- the main CUDA major (the one the most torch minors of the matrix are built with: 12) ships every
  arch the matrix lists for it, and its PTX;
- an older major (11) ships its archs too, without PTX: it is the one drivers below the main major's
  floor (450-524) run, and a GPU newer than its archs needs a newer driver anyway;
- a newer major (13) ships only the archs no kept major ships (Jetson Thor's 11.0 when the matrix
  lists it, in the aarch64 all-wheel: CUDA 12 cannot target it, and the x86_64 wheels leave it out), and PTX only for an arch newer than every other: on a driver that runs the main major's
  cubin, its own cubin for the same arch adds bytes and no measured benefit (no GPU here to measure
  a speed-up).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from packaging.version import Version

from buildtool.builder import package
from buildtool.builder.platform_tag import platform_tag
from buildtool.builder.wheel_specs import (
    BindingJob,
    Cell,
    CompileJob,
    ReusedSass,
    WheelSpec,
    keep_reused,
    variant_label,
)
from buildtool.core import cuda_facts, kernels_src
from buildtool.core.cuda_facts import TOOLKITS, compute_name, sm_name
from buildtool.core.runtime import all_wheel, schema, versions

VARIANT = all_wheel.VARIANT
BINDINGS_DIR = "bindings"


@dataclass(frozen=True)
class KernelSetSpec:
    cuda_major: int
    sass: tuple[str, ...]
    ptx: str | None
    compile_jobs: tuple[CompileJob, ...]
    reused_sass: tuple[ReusedSass, ...] = ()  # units a lower minor's cubin serves (wheel_specs)


@dataclass(frozen=True)
class BindingSpec:
    job: BindingJob
    label: str  # "torch2.5cxx11abifalse", "torch2.10plus": the per-variant labels without the CUDA major
    torch_tested: tuple[str, ...]


@dataclass(frozen=True)
class AllWheelSpec:
    platform: str  # the CPU
    version: str  # no local label
    bindings: tuple[BindingSpec, ...]
    kernel_sets: tuple[KernelSetSpec, ...]
    cells: tuple[Cell, ...]  # every cell its CPU's per-variant wheels cover
    variant: str = VARIANT

    @property
    def compile_jobs(self) -> tuple[CompileJob, ...]:
        return tuple(job for kernel_set in self.kernel_sets for job in kernel_set.compile_jobs)

    @property
    def name(self) -> str:
        return f"{VARIANT}-{self.platform}"


def main_major(wheels: Sequence[WheelSpec]) -> int:
    """The CUDA major the most torch minors are built with (ties: the newer, whose NVRTC targets more)."""
    minors: dict[int, set[str]] = {}
    for w in wheels:
        if w.cuda_major is not None:
            minors.setdefault(w.cuda_major, set()).update(c.torch for c in w.cells)
    return max(minors, key=lambda m: (len(minors[m]), m))


def all_wheel_specs(wheels: Sequence[WheelSpec], version: str) -> tuple[AllWheelSpec, ...]:
    """One all-wheel per CPU of `wheels` (the per-variant kernel wheels of a plan)."""
    kernel_wheels = [w for w in wheels if w.cuda_major is not None and w.binding is not None]
    cpus = list(dict.fromkeys(w.platform for w in kernel_wheels))
    return tuple(_spec([w for w in kernel_wheels if w.platform == cpu], version) for cpu in cpus)


def _spec(wheels: Sequence[WheelSpec], version: str) -> AllWheelSpec:
    main = main_major(wheels)
    per_major: dict[int, WheelSpec] = {}
    for w in wheels:  # every wheel of a major has the same kernels (plan.py)
        per_major.setdefault(int(w.cuda_major or 0), w)
    newest = max((w.ptx or w.sass[-1] for w in per_major.values()), key=versions.parse_target)
    kept: set[str] = set()
    sets = []
    for major in sorted(per_major, key=lambda m: (m > main, m)):  # older and main first, newer after
        w = per_major[major]
        if major <= main:
            sass = w.sass
        else:
            sass = tuple(a for a in w.sass if a not in kept)
        ptx = w.ptx if w.ptx == newest and (major == main or newest not in kept) else None
        if major < main:
            ptx = None
        kept.update(sass)
        jobs, reused = keep_reused(
            tuple(
                j
                for j in w.compile_jobs
                if (j.image == "sass" and j.arch in sass) or (j.image == "ptx" and j.arch == ptx)
            ),
            w.reused_sass,
            sass,
        )
        if jobs:
            sets.append(KernelSetSpec(major, sass, ptx, jobs, reused))
    sets.sort(key=lambda k: k.cuda_major)
    bindings: dict[BindingJob, set[str]] = {}
    for w in wheels:
        assert w.binding is not None
        bindings.setdefault(w.binding, set()).update(w.torch_tested)
    specs = tuple(
        BindingSpec(job, _label(job), tuple(sorted(tested, key=Version)))
        for job, tested in sorted(bindings.items(), key=lambda b: (Version(b[0].torch_minor), b[0].cxx11abi))
    )
    cells = tuple(dict.fromkeys(c for w in wheels for c in w.cells))
    return AllWheelSpec(str(wheels[0].platform), version, specs, tuple(sets), cells)


def _label(job: BindingJob) -> str:
    """The per-variant label without its CUDA major: "torch2.5cxx11abifalse", "torch2.10plus"."""
    abi = None if job.form == "stable" else job.cxx11abi
    return variant_label(0, job.torch_minor, abi).removeprefix("cu0")


def binding_file(spec: BindingSpec) -> str:
    """Inside fa_attn/: bindings/libfa_attn_ops-torch2.5cxx11abifalse.so."""
    stem = schema.BINDING_FILE.removesuffix(".so")
    return f"{BINDINGS_DIR}/{stem}-{spec.label}.so"


def kernel_file(job: CompileJob) -> str:
    """Inside fa_attn/: kernels/cu12/sm_80/<unit>.cubin, kernels/cu12/compute_120/<unit>.ptx."""
    where = sm_name(job.arch) if job.image == "sass" else compute_name(job.arch)
    suffix = "cubin" if job.image == "sass" else "ptx"
    return f"kernels/cu{job.cuda_major}/{where}/{job.unit}.{suffix}"


def manifest(spec: AllWheelSpec, tiles: ModuleType, source_sha256: str | None = None) -> schema.Manifest:
    units: dict[tuple[str, int], dict[str, Any]] = {}
    kernels: list[schema.KernelFile] = []
    sets: list[schema.KernelSet] = []
    for kernel_set in spec.kernel_sets:
        coverage = []
        tk = TOOLKITS[kernel_set.cuda_major]
        for arch, job in package.images_by_arch(kernel_set.compile_jobs, kernel_set.reused_sass):
            if (arch, job.cuda_major) not in units:  # the tiles of the major that compiled it
                units[arch, job.cuda_major] = {u.name: u for u in tiles.all_units(arch, job.cuda_major)}
            unit = units[arch, job.cuda_major].get(job.unit)
            if unit is None:
                raise package.PackageError(f"tiles.units({arch!r}) has no unit {job.unit!r}")
            static = tiles.static_smem(arch, job.image)
            kernel = package.kernel_of(unit, arch, job.image, kernel_file(job), static)
            kernel = dataclasses.replace(kernel, cuda_major=kernel_set.cuda_major)
            kernels.append(kernel)
            coverage.append(package.coverage_of(kernel, tiles.head_dims(unit)))
        specific, features = package.arch_specific_info(kernel_set.compile_jobs, tiles)
        sets.append(
            schema.KernelSet(
                cuda_major=kernel_set.cuda_major,
                toolkit=tk.version,
                min_driver=tk.min_driver,
                ptx_min_driver=tk.ptx_min_driver if kernel_set.ptx else None,
                sass=cuda_facts.plain(kernel_set.sass),
                ptx=kernel_set.ptx,
                coverage=tuple(coverage),
                arch_specific=specific,
                arch_specific_features=features,
            )
        )
    bindings = tuple(
        schema.BindingFile(
            file=binding_file(b),
            torch=b.job.torch_minor,
            cxx11abi=None if b.job.form == "stable" else b.job.cxx11abi,
            binding_form=b.job.form,
            torch_tested=b.torch_tested,
        )
        for b in spec.bindings
    )
    info = schema.WheelInfo(
        version=spec.version,
        variant=VARIANT,
        platform=spec.platform,
        cuda_major=None,
        toolkit=None,
        min_driver=None,
        ptx_min_driver=None,
        sass=(),
        ptx=None,
        torch=None,
        cxx11abi=None,
        binding=None,
        binding_form=None,
        torch_tested=tuple(sorted({c.torch for c in spec.cells}, key=Version)),
        features=tuple(sorted(getattr(tiles, "FEATURES", ()))),
        coverage=(),
        bindings=bindings,
        kernel_sets=tuple(sets),
    )
    return schema.Manifest(info=info, kernels=tuple(kernels), source_sha256=source_sha256)


def build_all_wheel(
    spec: AllWheelSpec,
    out_dir: Path,
    kernels_root: Path,
    tiles: ModuleType,
    images: Mapping[CompileJob, Path],
    bindings: Mapping[BindingJob, Path],
) -> package.BuiltWheel:
    """fa_attn-<version>-py3-none-<tag>.whl: the tag is the one every binding in it allows."""
    inputs = [images[j] for j in spec.compile_jobs if j in images] + [
        bindings[b.job] for b in spec.bindings if b.job in bindings
    ]
    key = package.wheel_key(out_dir, spec, kernels_root, inputs)
    if (same := package.reused(out_dir, key)) is not None:
        return same
    man = manifest(spec, tiles, kernels_src.source_hash(kernels_root))
    files = package.runtime_files(kernels_root)
    paths = []
    for b in spec.bindings:
        if b.job not in bindings:
            raise package.PackageError(f"the all-wheel for {spec.platform}: binding {b.label} was not built")
        paths.append(bindings[b.job])
        files[f"{schema.DIST}/{binding_file(b)}"] = bindings[b.job].read_bytes()
    tag = platform_tag(paths)
    if not tag.tag.endswith("_" + spec.platform):
        raise package.PackageError(f"the all-wheel for {spec.platform}: its bindings are {tag.tag}")
    for job in spec.compile_jobs:
        if job not in images:
            raise package.PackageError(
                f"the all-wheel: no image for {job.unit} on {job.arch} (CUDA {job.cuda_major})"
            )
        files[f"{schema.DIST}/{kernel_file(job)}"] = images[job].read_bytes()
    path = package.write_wheel(files, man, spec.version, tag.tag, out_dir)
    return package.remember(out_dir, key, package.BuiltWheel(path, tag.tag, tag.reason, man))
