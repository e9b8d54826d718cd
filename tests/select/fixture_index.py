"""A fixture index.json shaped like the one `fa build` writes for the repo's matrix.yaml
(docs/contracts.md section 5), built without compiling anything.

Mirrors the build's rules: one wheel per (CPU, CUDA major, torch minor, C++ ABI); both ABIs below torch 2.7,
the C++11 ABI only from 2.7; matrix.yaml's excludes; SASS/PTX archs and driver floors per major from
buildtool/core/cuda_facts.py; plus the universal py3-none-any wheel. Coverage comes from the kernel table
(kernels/tiles.py) as the build derives it: sm 7.5 fp16 only (backward to head dim 192), fp16 and bf16
from sm 8.0 with head dims to 256 forward and backward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet

from buildtool.core import kernels_src
from buildtool.core.cuda_facts import TOOLKITS
from buildtool.core.schema import REQUIRES_PYTHON

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"
PLATFORM = "manylinux_2_28_x86_64"  # what the release workflow's manylinux_2_28 containers give


def _coverage(arch: str, image: str) -> list[dict[str, Any]]:
    """What `fa build` derives from the kernel table: per (dtype, direction), every head dim served."""
    tiles = kernels_src.tiles()
    served: dict[tuple[str, str], set[int]] = {}
    for unit in tiles.units(arch):
        served.setdefault((unit.dtype, unit.direction), set()).update(tiles.head_dims(unit))
    return [
        {"arch": arch, "image": image, "dtype": d, "direction": r, "head_dims": sorted(dims)}
        for (d, r), dims in sorted(served.items())
    ]


def _variant(cuda: int, torch: str, abi: bool) -> str:
    label = f"cu{cuda}torch{torch}"
    old_minor = tuple(int(p) for p in torch.split(".")) < (2, 7)
    return label + (f"cxx11abi{str(abi).lower()}" if old_minor or not abi else "")


def kernel_entry(cuda: int, torch: str, abi: bool, cpu: str = "x86_64") -> dict[str, Any]:
    toolkit = TOOLKITS[cuda]
    sass = list(toolkit.default_archs)
    ptx = sass[-1]
    variant = _variant(cuda, torch, abi)
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
    return {
        "file": f"fa_attn-{VERSION}-py3-none-any.whl",
        "sha256": "0" * 64,
        "size": 1,
        "version": VERSION,
        "variant": "",
        "platform": None,
        "cuda_major": None,
        "toolkit": None,
        "torch": None,
        "cxx11abi": None,
        "min_driver": None,
        "ptx_min_driver": None,
        "sass": [],
        "ptx": None,
        "python_tag": "py3",
        "abi_tag": "none",
        "platform_tag": "any",
        "requires_python": REQUIRES_PYTHON,
        "coverage": [],
    }


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

    wheels = []
    for cpu in matrix.get("platforms", ["x86_64"]):
        for cuda in matrix["cuda"]:
            for torch in matrix["torch"]:
                if excluded(cpu, torch, cuda):
                    continue
                abis = [False, True] if tuple(int(p) for p in torch.split(".")) < (2, 7) else [True]
                wheels += [kernel_entry(cuda, torch, abi, cpu) for abi in abis]
    wheels.append(universal_entry())
    return {"schema": 1, "package": "fa-attn", "wheels": wheels}
