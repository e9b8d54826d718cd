"""Test fixture: a kernel table with the shape of kernels/tiles.py (docs/contracts.md section 2) and
one trivial unit per arch, so the build machinery is tested without compiling real attention kernels."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

HEAD_DIM_BUCKETS: tuple[int, ...] = (64,)
MIN_ARCH = "7.5"
FEATURES: tuple[str, ...] = ("causal",)
# Per arch (every arch a toolkit targets): 99 KiB, the smallest Ampere-class figure, is enough here.
SMEM_LIMIT: dict[str, int] = defaultdict(lambda: 99 * 1024)


@dataclass(frozen=True)
class Launch:
    threads: int
    block_m: int
    block_n: int
    smem_bytes: int
    grid: str


@dataclass(frozen=True)
class KernelUnit:
    name: str
    direction: str
    dtype: str
    head_dim: int
    source: str
    defines: dict[str, int] = field(hash=False)
    entries: dict[str, Launch] = field(hash=False)
    tile: str = ""


def _arch(arch: str) -> tuple[int, int]:
    major, minor = arch.split(".")
    return int(major), int(minor)


def units(arch: str, cuda: int | None = None) -> list[KernelUnit]:  # one table for every major
    if _arch(arch) < _arch(MIN_ARCH):
        return []
    launch = Launch(threads=32, block_m=64, block_n=64, smem_bytes=0, grid="q_blocks")
    return [
        KernelUnit(
            f"fwd_{dtype}_d64",
            "fwd",
            dtype,
            64,
            "csrc/tiny.cu",
            {"FA_HEAD_DIM": 64, "FA_BF16": int(dtype == "bf16")},
            {"fa_fwd": launch},
        )
        for dtype in ("fp16", "bf16")
    ]


def all_units(arch: str, cuda: int | None = None) -> list[KernelUnit]:
    return units(arch, cuda)  # no alternative tiles here


def static_smem(arch: str, image: str) -> int:
    return 1024 if _arch(arch) >= (9, 0) or image == "ptx" else 0  # ptxas's 1 KiB, as kernels/tiles.py


def nvrtc_options(arch: str) -> list[str]:
    return ["-std=c++17"]


def head_dims(unit: KernelUnit) -> list[int]:
    return list(range(8, unit.head_dim + 1, 8))
