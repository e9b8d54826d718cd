"""The kernel table: which NVRTC programs exist per arch, with which -D defines, and how to launch them.

The one place where per-arch and per-head-dim differences live (docs/contracts.md section 2). The
build reads it to know what to compile; the packager copies the launches into the manifest. Pure
Python, stdlib only: the build tool loads this file by path (buildtool/core/kernels_src.py).

Tile choices start from FlashAttention-2's published forward configs (csrc/flash_attn/src/
flash_fwd_launch_template.h) and are fitted to each arch family's shared memory per block. Our warps
own one 16-row mma tile each (BLOCK_M = 16 * WARPS), where FA2 often gives a 4-warp block 32 rows
per warp: the same block shape with twice the warps, fewer registers per thread and no spills. The
choices are not tuned on hardware yet (no GPU in the session that wrote them): bench/ measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEAD_DIM_BUCKETS: tuple[int, ...] = (32, 64, 96, 128, 160, 192, 224, 256)
MIN_ARCH = "7.5"

# What the forward kernel implements (fwd.cu's header states the exact semantics). Anything else the
# runtime must refuse with reason `feature-unsupported` (dropout, alibi, ...).
FEATURES: frozenset[str] = frozenset({"causal", "gqa", "varlen", "window", "softcap"})

_KERNELS_DIR = Path(__file__).resolve().parent
_ELEM_BYTES = 2  # fp16 / bf16
_ROW_PAD = 8  # elements of padding per shared-memory row (tiles.cuh: bank-conflict-free pitch)


@dataclass(frozen=True)
class Launch:
    """One __global__ entry point of a unit."""

    threads: int  # threads per block
    block_m: int  # query rows per block (0 if unused)
    block_n: int  # key rows per block (0 if unused)
    smem_bytes: int  # dynamic shared memory; > 48 KiB needs cuFuncSetAttribute
    grid: str  # "q_blocks": (ceil(seqlen_q / block_m), batch, heads); "k_blocks": (ceil(seqlen_k / block_n), ...)


@dataclass(frozen=True)
class KernelUnit:
    """One NVRTC program = one cubin per arch."""

    name: str  # unique per arch, e.g. "fwd_bf16_d128"
    direction: str  # "fwd" | "bwd"
    dtype: str  # "fp16" | "bf16"
    head_dim: int  # the bucket (compiled FA_HEAD_DIM)
    source: str  # relative to kernels/, e.g. "csrc/fwd.cu"
    defines: dict[str, int]
    entries: dict[str, Launch]  # extern "C" name -> launch; bwd runs them in dict order


@dataclass(frozen=True)
class FwdTile:
    block_m: int
    block_n: int
    warps: int

    def smem_bytes(self, head_dim: int) -> int:
        """fwd.cu's kSmemBytes: Q (block_m rows) plus one K and one V tile (block_n rows each)."""
        return (self.block_m + 2 * self.block_n) * (head_dim + _ROW_PAD) * _ELEM_BYTES


@dataclass(frozen=True)
class ArchFamily:
    """Archs that share shared-memory size and so tile choices."""

    name: str
    smem_limit: int  # max dynamic shared memory per block (opt-in), bytes
    dtypes: tuple[str, ...]
    fwd: dict[int, FwdTile]  # head-dim bucket -> forward tile


_T = FwdTile

# Shared memory per block, opt-in maximum (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"): sm75 64 KB; sm80/sm87 163 KB; sm86/sm89/sm12x 99 KB; sm90/sm10x/sm110 227 KB.
FAMILIES: dict[str, ArchFamily] = {
    "sm75": ArchFamily(
        name="sm75",
        smem_limit=64 * 1024,
        dtypes=("fp16",),  # Turing has no bf16 mma
        # 64 KB per SM in all, and no cp.async: a second resident block is what hides the load
        # latency, so d <= 96 use tiles under 32 KB (2 blocks/SM); larger head dims get 1.
        fwd={
            32: _T(64, 128, 4),
            64: _T(64, 64, 4),
            96: _T(64, 32, 4),
            128: _T(64, 64, 4),
            160: _T(64, 32, 4),
            192: _T(64, 32, 4),
            224: _T(64, 32, 4),
            256: _T(64, 16, 4),
        },
    ),
    "sm80": ArchFamily(
        name="sm80",
        smem_limit=163 * 1024,
        dtypes=("fp16", "bf16"),
        fwd={
            32: _T(128, 128, 8),
            64: _T(128, 128, 8),
            96: _T(128, 64, 8),
            128: _T(128, 64, 8),
            160: _T(128, 64, 8),
            192: _T(128, 64, 8),
            224: _T(128, 64, 8),
            256: _T(128, 64, 8),
        },
    ),
    "sm86": ArchFamily(
        name="sm86",
        smem_limit=99 * 1024,
        dtypes=("fp16", "bf16"),
        # FA2 drops to 64-row blocks for d >= 192 on these parts; d256 then fills 99 KB exactly.
        fwd={
            32: _T(128, 128, 8),
            64: _T(128, 128, 8),
            96: _T(128, 64, 8),
            128: _T(128, 64, 8),
            160: _T(128, 64, 8),
            192: _T(64, 64, 4),
            224: _T(64, 64, 4),
            256: _T(64, 64, 4),
        },
    ),
    "sm90": ArchFamily(
        name="sm90",
        smem_limit=227 * 1024,
        dtypes=("fp16", "bf16"),
        fwd={
            32: _T(128, 128, 8),
            64: _T(128, 128, 8),
            96: _T(128, 128, 8),
            128: _T(128, 128, 8),
            160: _T(128, 64, 8),
            192: _T(128, 64, 8),
            224: _T(128, 64, 8),
            256: _T(128, 64, 8),
        },
    ),
}

# Every arch some pinned NVRTC can target (buildtool/core/cuda_facts.py) maps to a family. sm88 (new in
# CUDA 13.0, no published smem figure we could check) gets the smallest Ampere-class budget.
_ARCH_FAMILY: dict[str, str] = {
    "7.5": "sm75",
    "8.0": "sm80",
    "8.7": "sm80",
    "8.6": "sm86",
    "8.8": "sm86",
    "8.9": "sm86",
    "12.0": "sm86",
    "12.1": "sm86",
    "9.0": "sm90",
    "10.0": "sm90",
    "10.1": "sm90",
    "10.3": "sm90",
    "11.0": "sm90",
}

SMEM_LIMIT: dict[str, int] = {arch: FAMILIES[fam].smem_limit for arch, fam in _ARCH_FAMILY.items()}


def arch_family(arch: str) -> ArchFamily | None:
    """The family of an arch like "8.6"; None for an arch we have no kernels for."""
    fam = _ARCH_FAMILY.get(arch)
    return FAMILIES[fam] if fam else None


def _fwd_units(family: ArchFamily) -> list[KernelUnit]:
    out = []
    for dtype in family.dtypes:
        for d in HEAD_DIM_BUCKETS:
            tile = family.fwd[d]
            out.append(
                KernelUnit(
                    name=f"fwd_{dtype}_d{d}",
                    direction="fwd",
                    dtype=dtype,
                    head_dim=d,
                    source="csrc/fwd.cu",
                    defines={
                        "FA_HEAD_DIM": d,
                        "FA_BLOCK_M": tile.block_m,
                        "FA_BLOCK_N": tile.block_n,
                        "FA_WARPS": tile.warps,
                        "FA_SMEM_BYTES": tile.smem_bytes(d),  # static_asserted by fwd.cu
                        "FA_DTYPE_BF16": int(dtype == "bf16"),
                    },
                    entries={
                        "fa_fwd": Launch(
                            threads=32 * tile.warps,
                            block_m=tile.block_m,
                            block_n=tile.block_n,
                            smem_bytes=tile.smem_bytes(d),
                            grid="q_blocks",
                        )
                    },
                )
            )
    return out


# --- backward ---
# Units with direction "bwd", source "csrc/bwd.cu", entries fa_bwd_preprocess / fa_bwd /
# fa_bwd_convert_dq (run in that order). bwd.cu's header describes the algorithm and its smem layout.
#
# Tiles are chosen per family so that (a) shared memory fits the family's per-block limit, checked
# here and against bwd.cu itself (FA_SMEM_BYTES is static_asserted in the kernel), and (b) NVRTC 12.9
# reports no register spills at -Xptxas=-v (bench/kernel_resources.py measures it). Head dim 256
# fits the 99 KB parts (sm86/89/120) with 32x32 blocks (71 KB), where FA2 < 2.5.5 and torch SDPA
# refuse training. Turing (64 KB) gets backward up to head dim 192; 224 and 256 do not fit 64 KB
# without blocks so small that they spill, so they are left out and dispatch falls back for them
# (backward-unsupported). Not tuned on hardware yet (no GPU in the session that chose them).


@dataclass(frozen=True)
class BwdTile:
    block_m: int  # query rows per step (and per block of the two q_blocks entries)
    block_n: int  # key rows per fa_bwd block
    warps: int
    stages: int  # shared-memory buffers for Q and dO: 2 prefetches the next query block

    def smem_bytes(self, head_dim: int) -> int:
        """bwd.cu's kSmemBytes: K, V; Q, dO per stage; P, dS; lse and D (fp32) per query row."""
        pitch = head_dim + _ROW_PAD
        kv = 2 * self.block_n * pitch * _ELEM_BYTES
        q_do = 2 * self.stages * self.block_m * pitch * _ELEM_BYTES
        p_ds = 2 * self.block_m * (self.block_n + _ROW_PAD) * _ELEM_BYTES
        return kv + q_do + p_ds + 2 * self.block_m * 4


_B = BwdTile

_BWD: dict[str, dict[int, BwdTile]] = {
    "sm75": {
        32: _B(64, 64, 8, 1),
        64: _B(64, 64, 8, 1),
        96: _B(64, 32, 8, 1),
        128: _B(64, 32, 8, 1),
        160: _B(32, 32, 8, 1),
        192: _B(32, 32, 8, 1),
    },
    "sm80": {
        32: _B(64, 128, 8, 2),
        64: _B(64, 128, 8, 2),
        96: _B(64, 64, 8, 2),
        128: _B(64, 32, 8, 2),
        160: _B(64, 32, 8, 2),
        192: _B(64, 32, 8, 2),
        224: _B(64, 32, 8, 2),
        256: _B(32, 32, 8, 2),
    },
    "sm86": {
        32: _B(64, 128, 8, 2),
        64: _B(64, 128, 8, 1),
        96: _B(64, 64, 8, 2),
        128: _B(64, 32, 8, 2),
        160: _B(64, 32, 8, 1),
        192: _B(64, 32, 8, 1),
        224: _B(64, 32, 8, 1),
        256: _B(32, 32, 8, 1),
    },
}
_BWD["sm90"] = _BWD["sm80"]  # more shared memory than sm80, but these tiles are register-bound


def bwd_tile(family: ArchFamily, head_dim: int) -> BwdTile | None:
    """The backward tile of a head-dim bucket on a family; None where no backward is built."""
    return _BWD[family.name].get(head_dim)


def _bwd_units(family: ArchFamily) -> list[KernelUnit]:
    out = []
    for dtype in family.dtypes:
        for d in HEAD_DIM_BUCKETS:
            tile = bwd_tile(family, d)
            if tile is None:
                continue
            smem = tile.smem_bytes(d)
            rows = Launch(
                threads=32 * tile.warps, block_m=tile.block_m, block_n=0, smem_bytes=0, grid="q_blocks"
            )
            out.append(
                KernelUnit(
                    name=f"bwd_{dtype}_d{d}",
                    direction="bwd",
                    dtype=dtype,
                    head_dim=d,
                    source="csrc/bwd.cu",
                    defines={
                        "FA_HEAD_DIM": d,
                        "FA_BLOCK_M": tile.block_m,
                        "FA_BLOCK_N": tile.block_n,
                        "FA_WARPS": tile.warps,
                        "FA_STAGES": tile.stages,
                        "FA_SMEM_BYTES": smem,
                        "FA_DTYPE_BF16": int(dtype == "bf16"),
                    },
                    entries={
                        "fa_bwd_preprocess": rows,
                        "fa_bwd": Launch(
                            threads=32 * tile.warps,
                            block_m=tile.block_m,
                            block_n=tile.block_n,
                            smem_bytes=smem,
                            grid="k_blocks",
                        ),
                        "fa_bwd_convert_dq": rows,
                    },
                )
            )
    return out


# --- end backward ---


def units(arch: str) -> list[KernelUnit]:
    """Every unit to compile for `arch` ("8.0"); [] for an arch we have no kernels for. Units whose
    source file is not in this tree are left out, so a build never compiles a missing file."""
    family = arch_family(arch)
    if family is None:
        return []
    return [u for u in _fwd_units(family) + _bwd_units(family) if (_KERNELS_DIR / u.source).is_file()]


def nvrtc_options(arch: str) -> list[str]:
    """Flags shared by every unit. Fast math matches flash-attn's own build (--use_fast_math); the
    kernels' exp2/log2/tanh are explicit approximate PTX anyway."""
    return ["-std=c++17", "--use_fast_math"]


def head_dims(unit: KernelUnit) -> list[int]:
    """Every head dim (a multiple of 8) this unit serves: those above the next smaller bucket."""
    lower = max((b for b in HEAD_DIM_BUCKETS if b < unit.head_dim), default=0)
    return list(range(lower + 8, unit.head_dim + 1, 8))
