"""A fixture index.json shaped like the one `fa build` writes for the repo's matrix.yaml
(docs/contracts.md section 5), built without compiling anything.

Mirrors the build's rules: one wheel per (CPU, CUDA major, torch minor, C++ ABI); both ABIs below torch 2.7,
the C++11 ABI only from 2.7; from matrix.yaml's `stable_abi` floor on, one stable-ABI wheel per (CPU, CUDA
major) instead, tested with the listed minors from the floor on; matrix.yaml's excludes; SASS/PTX archs and driver floors per major from
buildtool/core/cuda_facts.py; plus the universal py3-none-any wheel. Coverage comes from the kernel table
(kernels/tiles.py) as the build derives it: sm 7.5 fp16 only (backward to head dim 192), fp16 and bf16
from sm 8.0 with head dims to 256 forward and backward.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet

from buildtool.build.package import coverage_of, kernel_of
from buildtool.core import kernels_src
from buildtool.core.cuda_facts import TOOLKITS
from buildtool.core.schema import (
    PROJECT,
    REQUIRES_PYTHON,
    SCHEMA_MAJOR,
    SCHEMA_MINOR,
    IndexEntry,
    universal_info,
)

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"
PLATFORM = "manylinux_2_28_x86_64"  # what the release workflow's manylinux_2_28 containers give


def _coverage(arch: str, image: str) -> list[dict[str, Any]]:
    """What `fa build` writes for the kernel table's units on `arch` (package.coverage_of)."""
    tiles = kernels_src.tiles()
    rows = [
        coverage_of(kernel_of(unit, arch, image, file=""), tiles.head_dims(unit))
        for unit in tiles.units(arch)
    ]
    return [dataclasses.asdict(row) for row in rows]


def _variant(cuda: int, torch: str, abi: bool) -> str:
    label = f"cu{cuda}torch{torch}"
    old_minor = tuple(int(p) for p in torch.split(".")) < (2, 7)
    return label + (f"cxx11abi{str(abi).lower()}" if old_minor or not abi else "")


def kernel_entry(
    cuda: int, torch: str, abi: bool | None, cpu: str = "x86_64", tested: list[str] | None = None
) -> dict[str, Any]:
    """A per-minor wheel; with `abi` None the stable-ABI wheel of floor `torch`, tested with `tested`."""
    toolkit = TOOLKITS[cuda]
    sass = list(toolkit.default_archs)
    ptx = sass[-1]
    variant = f"cu{cuda}torch{torch}plus" if abi is None else _variant(cuda, torch, abi)
    version = f"{VERSION}+{variant}"
    coverage = [c for arch in sass for c in _coverage(arch, "sass")] + _coverage(ptx, "ptx")
    platform = PLATFORM.replace("x86_64", cpu)
    return {
        "file": f"fa_attn-{version}-py3-none-{platform}.whl",
        "sha256": "0" * 64,
        "size": 1,
        "version": version,
        "variant": variant,
        "platform": cpu,
        "cuda_major": cuda,
        "toolkit": toolkit.version,
        "torch": torch,
        "cxx11abi": abi,
        "binding_form": "aten" if abi is not None else "stable",
        "torch_tested": [torch] if abi is not None else list(tested or [torch]),
        "min_driver": toolkit.min_driver,
        "ptx_min_driver": toolkit.ptx_min_driver,
        "sass": sass,
        "ptx": ptx,
        "python_tag": "py3",
        "abi_tag": "none",
        "platform_tag": platform,
        "requires_python": REQUIRES_PYTHON,
        "coverage": coverage,
    }


def universal_entry() -> dict[str, Any]:
    entry = IndexEntry(
        file=f"fa_attn-{VERSION}-py3-none-any.whl",
        sha256="0" * 64,
        size=1,
        info=universal_info(VERSION),
        python_tag="py3",
        abi_tag="none",
        platform_tag="any",
        requires_python=REQUIRES_PYTHON,
    )
    return entry.to_json()


def fixture_index(matrix_path: Path = REPO / "matrix.yaml") -> dict[str, Any]:
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
                wheels += [kernel_entry(cuda, torch, abi, cpu) for abi in abis]
            if stable:
                wheels.append(kernel_entry(cuda, floor, None, cpu, sorted(stable, key=minor)))
    wheels.append(universal_entry())
    return {"schema": SCHEMA_MAJOR, "schema_minor": SCHEMA_MINOR, "package": PROJECT, "wheels": wheels}
