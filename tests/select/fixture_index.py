"""A fixture index.json shaped like the one `fa build` writes for the repo's matrix.yaml
(docs/contracts.md section 5), built without compiling anything.

Mirrors the build's rules: one wheel per (CPU, CUDA major, torch minor, C++ ABI); both ABIs below torch 2.7,
the C++11 ABI only from 2.7; from matrix.yaml's `stable_abi` floor on, one stable-ABI wheel per (CPU, CUDA
major) instead, tested with the listed minors from the floor on; matrix.yaml's excludes; SASS/PTX archs per major from
buildtool/core/cuda_facts.py; plus the universal py3-none-any wheel. Each wheel's manifest is the one
the build's packager writes (package.manifest) for the kernel table's units (kernels/tiles.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet

from buildtool.builder import all_wheel, package
from buildtool.builder.plan import BindingJob, Cell, CompileJob, WheelSpec, alternative_jobs, variant_label
from buildtool.core import binding_forms, kernels_src
from buildtool.core.cuda_facts import TOOLKITS
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import REQUIRES_PYTHON

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"
PLATFORM = "manylinux_2_28_x86_64"  # what the release workflow's manylinux_2_28 containers give


@functools.cache
def kernel_manifest(*spec: Any, **images: Any) -> schema.Manifest:
    """The manifest `fa build` writes for the wheel kernel_spec(*spec, **images) describes."""
    return package.manifest(kernel_spec(*spec, **images), kernels_src.tiles())


def table_tiles() -> SimpleNamespace:
    """kernels/tiles.py whose units() are its table's (tiles.table_units): the sm_90a units included before
    csrc/hopper_fwd.cu is in the tree, for the packager and the decision to be tested on (no compile)."""
    tiles = kernels_src.tiles()
    table = SimpleNamespace(
        **{name: getattr(tiles, name) for name in dir(tiles) if not name.startswith("__")}
    )
    table.units = tiles.table_units
    table.all_units = lambda arch, cuda=None: (
        tiles.table_units(arch, cuda) + tiles.alternative_units(arch, cuda)
    )
    return table


@functools.cache
def kernel_spec(
    cuda: int,
    torch: str,
    abi: bool | None,
    cpu: str = "x86_64",
    sass: tuple[str, ...] | None = None,
    ptx: str | None = "newest",
    tested: tuple[str, ...] | None = None,
) -> WheelSpec:
    """A per-variant wheel's spec as the plan makes it: SASS for `sass` (default: the toolkit's default
    archs) and PTX of `ptx` ("newest": the last SASS arch; None: no PTX). `abi` None: the stable-ABI
    wheel of floor `torch`, built for the minors `tested` (default: the floor alone)."""
    tiles = kernels_src.tiles()
    sass = TOOLKITS[cuda].default_archs if sass is None else sass
    ptx = sass[-1] if ptx == "newest" else ptx
    images = [(arch, "sass") for arch in sass] + ([(ptx, "ptx")] if ptx else [])
    jobs = tuple(
        CompileJob(cuda, arch, image, unit.name) for arch, image in images for unit in tiles.units(arch)
    ) + tuple(alternative_jobs(cuda, sass, ptx, tiles.alternative_units))
    variant = variant_label(cuda, torch, abi)
    spec = WheelSpec(
        cuda_major=cuda,
        torch_minor=torch,
        cxx11abi=abi,
        sass=tuple(sass),
        ptx=ptx,
        cells=tuple(Cell(minor, cuda, "3.12", cpu) for minor in (tested or (torch,))),
        compile_jobs=jobs,
        binding=BindingJob(torch, f"{torch}.0", True, None, cpu, binding_forms.STABLE)
        if abi is None
        else BindingJob(torch, f"{torch}.0", abi, None, cpu),
        variant=variant,
        version=f"{VERSION}+{variant}",
    )
    return spec


def kernel_entry(
    cuda: int, torch: str, abi: bool | None, cpu: str = "x86_64", **images: Any
) -> dict[str, Any]:
    """The index.json entry of kernel_manifest(cuda, torch, abi, cpu, **images)."""
    return _entry(kernel_manifest(cuda, torch, abi, cpu, **images).info, cpu)


def all_wheel_entry(specs: list[WheelSpec], cpu: str = "x86_64") -> dict[str, Any]:
    """The index.json entry of the all-wheel `fa build` makes of these per-variant wheels of `cpu`."""
    (spec,) = all_wheel.all_wheel_specs([s for s in specs if s.platform == cpu], VERSION)
    return _entry(all_wheel.manifest(spec, kernels_src.tiles()).info, cpu)


def _entry(info: schema.WheelInfo, cpu: str) -> dict[str, Any]:
    platform = PLATFORM.replace("x86_64", cpu)
    entry = schema.IndexEntry(
        file=f"fa_attn-{info.version}-py3-none-{platform}.whl",
        sha256="0" * 64,
        size=1,
        info=info,
        python_tag="py3",
        abi_tag="none",
        platform_tag=platform,
        requires_python=REQUIRES_PYTHON,
    )
    return entry.to_json()


def universal_entry() -> dict[str, Any]:
    entry = schema.IndexEntry(
        file=f"fa_attn-{VERSION}-py3-none-any.whl",
        sha256="0" * 64,
        size=1,
        info=schema.universal_info(VERSION),
        python_tag="py3",
        abi_tag="none",
        platform_tag="any",
        requires_python=REQUIRES_PYTHON,
    )
    return entry.to_json()


def fixture_index(matrix_path: Path = REPO / "matrix.yaml") -> dict[str, Any]:
    """The per-variant wheels of the matrix, the Windows wheels the release makes of its x86_64
    stable-ABI ones (buildtool/builder/windows_wheel.py), and the universal wheel."""
    entries = [_entry(kernel_manifest(*key).info, key[3]) for key in matrix_wheels(matrix_path)]
    windows = [
        windows_entry(e) for e in entries if e["binding_form"] == "stable" and e["platform"] == "x86_64"
    ]
    return _index([*entries, *windows, universal_entry()])


def windows_entry(linux: dict[str, Any]) -> dict[str, Any]:
    """The win_amd64 entry of an x86_64 stable-ABI wheel's: the same info, the MSVC binding's file."""
    tag = "win_amd64"
    return {
        **linux,
        "file": linux["file"].replace(linux["platform_tag"], tag),
        "platform_tag": tag,
        "binding": "fa_attn_ops.dll",
    }


def all_wheel_index(matrix_path: Path = REPO / "matrix.yaml") -> dict[str, Any]:
    """The matrix's all-wheels (one per CPU) and the universal wheel: what PyPI would hold."""
    specs = [kernel_spec(*key) for key in matrix_wheels(matrix_path)]
    cpus = dict.fromkeys(s.platform for s in specs)
    return _index([universal_entry()], [all_wheel_entry(specs, str(cpu)) for cpu in cpus])


def _index(wheels: list[dict[str, Any]], all_wheels: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "schema": schema.SCHEMA_MAJOR,
        "schema_minor": schema.SCHEMA_MINOR,
        "package": schema.PACKAGE,
        "wheels": wheels,
        "all_wheels": all_wheels or [],
    }


def matrix_wheels(matrix_path: Path) -> list[tuple[Any, ...]]:
    """kernel_spec's arguments for each per-variant wheel of the matrix."""
    matrix = yaml.safe_load(matrix_path.read_text())
    excludes = matrix.get("exclude") or []

    def excluded(cpu: str, torch: str, cuda: int) -> bool:
        return any(
            e.get("cuda", cuda) == cuda
            and e.get("platform", cpu) == cpu
            and ("torch" not in e or SpecifierSet(e["torch"]).contains(torch))
            for e in excludes
        )

    def minor(torch: str) -> tuple[int, ...]:
        return tuple(int(p) for p in torch.split("."))

    floor = matrix.get("stable_abi")
    wheels = []
    for cpu in matrix.get("platforms", ["x86_64"]):
        for cuda in matrix["cuda"]:
            stable = []
            for torch in matrix["torch"]:
                if excluded(cpu, torch, cuda):
                    continue
                if floor and minor(torch) >= minor(floor):
                    stable.append(torch)
                    continue
                abis = [False, True] if minor(torch) < (2, 7) else [True]
                wheels += [(cuda, torch, abi, cpu) for abi in abis]
            if stable:
                wheels.append((cuda, floor, None, cpu, None, "newest", tuple(sorted(stable, key=minor))))
    return wheels
