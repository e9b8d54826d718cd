"""What a plan is made of, and the facts the plan and the all-wheel both need: the cells, the jobs,
the wheel specs, the variant labels, and which CUDA major's NVRTC compiles an arch's SASS.

plan.py makes these from the matrix; all_wheel.py takes the plan's wheels and makes the all-wheels of
them. Both import this module, neither imports the other backwards: data flows matrix -> plan ->
all-wheel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from buildtool.builder.matrix import CXX11ABI_ONLY_FROM
from buildtool.builder.pypi import TorchFile
from buildtool.core import binding_forms, cpus, cuda_facts

# `units(arch, cuda_major)`: kernels/tiles.py's units of an arch for one CUDA major (`units_per_major`):
# a unit's tile may differ per major where one NVRTC spills on it.
MajorUnits = Callable[[str, int], Sequence[Any]]


@dataclass(frozen=True)
class Cell:
    torch: str  # minor
    cuda: int  # major
    python: str  # "3.12", "3.13t"
    platform: str = cpus.X86_64  # the CPU: "x86_64" | "aarch64"


@dataclass(frozen=True)
class CompileJob:
    """One NVRTC program; its image lands in the cache by content."""

    cuda_major: int
    arch: str
    image: str  # "sass" | "ptx"
    unit: str  # tiles.KernelUnit.name


@dataclass(frozen=True)
class ReusedSass:
    """A SASS unit of `arch` ("8.6") whose program (source, -D defines, NVRTC options) is a lower
    minor's of the same major ("8.0"), compiled by the same NVRTC: the wheel carries that one cubin
    (`job`) and the manifest's `arch` entry names its file. A cubin runs on every GPU of its major
    whose minor is at least its own (CUDA C++ Programming Guide, "Binary Compatibility"); FA2's wheels
    ship sm_80 SASS alone for all of 8.x. The unit keeps its own tile: only equal programs are reused."""

    arch: str
    job: CompileJob

    @property
    def own_job(self) -> CompileJob:
        """The program `arch` compiles without the reuse."""
        return CompileJob(self.job.cuda_major, self.arch, "sass", self.job.unit)


def keep_reused(
    jobs: Sequence[CompileJob], reused: Sequence[ReusedSass], sass: Collection[str]
) -> tuple[tuple[CompileJob, ...], tuple[ReusedSass, ...]]:
    """`reused` narrowed to a subset of a major's images (SASS archs `sass`, compile jobs `jobs`): an
    arch left out drops its entries; an entry whose cubin `jobs` left out (its lower minor dropped)
    compiles its own program again."""
    kept = tuple(r for r in reused if r.arch in sass and r.job in jobs)
    own = tuple(r.own_job for r in reused if r.arch in sass and r.job not in jobs)
    return (*jobs, *own), kept


@dataclass(frozen=True)
class BindingJob:
    torch_minor: str  # the stable form's floor
    torch_version: str  # the patch whose headers are used: the oldest of the minor
    cxx11abi: bool  # the flag it is compiled with (the stable form's binary does not depend on it)
    header_source: TorchFile | None  # None: the torch installed here (fa build --local)
    platform: str = cpus.X86_64  # the CPU the binding runs on (a cross compile if not this host's)
    form: str = binding_forms.ATEN  # binding_forms.ATEN | STABLE


@dataclass(frozen=True)
class WheelSpec:
    cuda_major: int | None  # None: the universal py3-none-any wheel (no kernels, no binding)
    torch_minor: str | None  # the minor its binding is built for; the floor of a stable-ABI wheel
    cxx11abi: bool | None  # None: any (the universal and the stable-ABI wheels)
    sass: tuple[str, ...]
    ptx: str | None
    cells: tuple[Cell, ...]  # matrix cells this wheel covers
    compile_jobs: tuple[CompileJob, ...]
    binding: BindingJob | None
    variant: str  # "cu12torch2.5cxx11abifalse", "cu12torch2.7", "cu12torch2.10plus", "" for universal
    version: str  # "0.1.0+cu12torch2.5cxx11abifalse"
    reused_sass: tuple[ReusedSass, ...] = ()  # units of an arch served by a lower minor's cubin

    @property
    def form(self) -> str | None:
        """Its binding's form (binding_forms.ATEN | STABLE); None for the universal wheel."""
        return self.binding.form if self.binding else None

    @property
    def torch_tested(self) -> tuple[str, ...]:
        """The torch minors of its cells, oldest first: what the release workflow tests it with."""
        return tuple(sorted({c.torch for c in self.cells}, key=Version))

    @property
    def platform(self) -> str | None:
        """The CPU: its binding's; None for the universal wheel, which has no binary."""
        return self.binding.platform if self.binding else None

    @property
    def name(self) -> str:
        """Unique within a plan: the variant and the CPU ("cu12torch2.7-aarch64"; "universal")."""
        return f"{self.variant}-{self.platform}" if self.platform else "universal"


def cxx11abi_in_label(torch_minor: str, cxx11abi: bool) -> bool:
    """The ABI is named in the variant where it is ambiguous: below torch 2.7 (PyPI old, NGC new) or
    an old-ABI build from 2.7 on, where every pip wheel uses the C++11 ABI."""
    return Version(torch_minor) < Version(CXX11ABI_ONLY_FROM) or not cxx11abi


def variant_label(cuda_major: int, torch_minor: str, cxx11abi: bool | None) -> str:
    """The per-minor label; `cxx11abi` None is the stable-ABI wheel of the floor `torch_minor`."""
    if cxx11abi is None:
        return binding_forms.stable_label(cuda_major, torch_minor)
    label = f"cu{cuda_major}torch{torch_minor}"
    if cxx11abi_in_label(torch_minor, cxx11abi):
        label += f"cxx11abi{str(cxx11abi).lower()}"
    return label


def sass_compiler(
    major: int,
    arch: str,
    built: Collection[int],
    per_major: Collection[int] = (),
    same: Callable[[int], bool] | None = None,
) -> int:
    """The CUDA major whose NVRTC compiles the SASS (and the PTX) of `arch` for a unit of the wheels of
    CUDA `major`: along the chain cuda_facts.SASS_FROM names (13 -> 12 -> 11), the oldest major whose
    NVRTC targets `arch`, which the plan builds anyway (`built`: no toolkit is fetched for it alone)
    and whose program of the unit is the same as `major`'s (`same(older)`: source, -D defines and
    options; None: the same), else `major` itself. A major in `per_major` (matrix.yaml
    sass_per_major) compiles all its own, and the chain stops there. The rule the all-wheel follows
    too: a newer major only where no older NVRTC can serve. An older NVRTC's PTX JITs under a newer
    major's driver floor (11.8's needs 520.61.05, CUDA 12's floor is 525.60.13; 12.9's needs
    575.51.03, CUDA 13's floor is 580), so the PTX follows the same rule and, with SASS of the same
    arch, comes out of its run."""
    by = major
    while by not in per_major:
        older = cuda_facts.SASS_FROM.get(by)
        if older is None or older not in built or arch not in cuda_facts.TOOLKITS[older].archs:
            break
        if same is not None and not same(older):
            break
        by = older
    return by


def units_per_major(units: Callable[..., Sequence[Any]]) -> MajorUnits:
    """`units` (tiles.units, or a caller's table of its signature `(arch, cuda=None)`) as
    `(arch, cuda_major) -> units`, each arch and major asked once per plan."""
    return functools.cache(lambda arch, major: tuple(units(arch, cuda=major)))
