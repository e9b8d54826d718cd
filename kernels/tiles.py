"""The kernel table: which NVRTC programs exist per arch, with which -D defines, and how to launch them.

The one place where per-arch and per-head-dim differences live (docs/contracts.md section 2). The
build reads it to know what to compile; the packager copies the launches into the manifest; the GPU
autotuner (bench/kernels/autotune.py) reads its search space. Pure Python, stdlib only: the build tool loads
this file by path (buildtool/core/kernels_src.py).

Three layers:
  - a Tile per direction (FwdTile, BwdTile): the knobs a kernel's -D defines take, with a short
    `label` and the shared memory the kernel lays out for it (`smem_bytes`);
  - per arch family, every candidate tile per head-dim bucket (`candidates`), the default first: the
    autotuner measures them on a GPU and a patch to the defaults records the winner;
  - the compile units (`unit`, `units`): a tile turned into an NVRTC program's defines and launches.
Register limits (no spills) are not modelled here: they are ptxas's, checked at compile time
(bench/kernels/kernel_resources.py, the autotuner's pruning).

Tile choices start from FlashAttention-2's published configs (csrc/flash_attn/src/
flash_fwd_launch_template.h, flash_bwd_launch_template.h) fitted to each family's shared memory per
block. Not tuned on hardware yet (no GPU in the sessions that wrote them): bench/ measures.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# FlashAttention-2's buckets (flash_api.cpp rounds a head dim <= 192 up to a multiple of 32 and any
# larger one to 256): it has no d224 kernels, and neither do we; head dims 200 to 256 run the d256 unit.
HEAD_DIM_BUCKETS: tuple[int, ...] = (32, 64, 96, 128, 160, 192, 256)
MIN_ARCH = "7.5"
DIRECTIONS: tuple[str, ...] = ("fwd", "bwd", "splitkv")

# What the forward kernel implements (fwd.cu's header states the exact semantics). Anything else the
# runtime must refuse with reason `feature-unsupported` (dropout, alibi, ...). The KV-cache layouts
# (paged_kv, seqused_k, leftpad_k, cache_batch_idx) are the forward's and split-KV's only: the
# decision (fa_attn/runtime/decision.py KV_LAYOUT_FEATURES) sends a call that needs their gradients to the
# fallback, and pages must hold whole key blocks (a multiple of every unit's block_n).
FEATURES: frozenset[str] = frozenset(
    {"causal", "gqa", "varlen", "window", "softcap", "paged_kv", "seqused_k", "leftpad_k", "cache_batch_idx"}
)

_KERNELS_DIR = Path(__file__).resolve().parent
# The arch-specific sm_90a forward (issue 39): wgmma runs a warpgroup (4 warps, 128 threads) over 64 rows.
WARPGROUP_ROWS = 64
WARPGROUP_THREADS = 128
_MBARRIER_BYTES = 8
HOPPER_HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 192, 256)  # FlashAttention-3's head-dim buckets
HOPPER_SOURCE = "csrc/hopper_fwd.cu"
HOPPER_ENTRY = "fa_fwd_sm90a"
_ELEM_BYTES = 2  # fp16 / bf16
# The backward's tiles pad each shared-memory row by 8 elements; the forward's are unpadded and
# swizzled (kernels/csrc/tiles.cuh says why).
_BWD_ROW_PAD = 8


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
    # Built for an arch-specific target ("9.0a"): its cubin runs on that one compute capability only.
    arch_specific: bool = False
    tile: str = ""  # the tile's label ("m128n32w4s1"): doctor and last_dispatch() name it
    # An alternative (`alternative_units`): the GPUs, by arch, below this arch's shared memory that it
    # is built to serve; () for the default unit.
    serves: tuple[str, ...] = ()


# ---- tiles: the knobs of each direction ------------------------------------------------------------


@dataclass(frozen=True)
class FwdTile:
    """fwd.cu's knobs (the forward and its split-KV form): FA_BLOCK_M query rows per block, FA_BLOCK_N
    keys per iteration, FA_WARPS (each owns 16 or 32 whole rows), FA_STAGES K/V buffers (2: the next
    key block lands during this one's work) and FA_Q_IN_REGS (Q's fragments kept in registers across
    the key loop instead of re-read from shared memory)."""

    block_m: int
    block_n: int
    warps: int
    stages: int = 1
    q_in_regs: bool = False

    @property
    def label(self) -> str:
        regs = "q" if self.q_in_regs else ""
        return f"m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}{regs}"

    def smem_bytes(self, head_dim: int) -> int:
        """fwd.cu's kSmemBytes: Q (block_m rows) plus K and V tiles (block_n rows each) per stage, unpadded
        (tiles.cuh swizzles them)."""
        return (self.block_m + 2 * self.stages * self.block_n) * head_dim * _ELEM_BYTES

    def valid(self, head_dim: int) -> bool:  # noqa: ARG002 (BwdTile's needs it; one signature for both)
        """fwd.cu's static_asserts: 16 or 32 whole rows per warp; k steps of 16; 1 or 2 stages."""
        rows = self.block_m // self.warps
        return (
            self.block_m % self.warps == 0
            and rows in (16, 32)
            and self.block_n % 16 == 0
            and self.stages in (1, 2)
        )

    def defines(self) -> dict[str, int]:
        return {
            "FA_BLOCK_M": self.block_m,
            "FA_BLOCK_N": self.block_n,
            "FA_WARPS": self.warps,
            "FA_STAGES": self.stages,
            "FA_Q_IN_REGS": int(self.q_in_regs),
        }


@dataclass(frozen=True)
class BwdTile:
    """bwd.cu's knobs: FA_BLOCK_M query rows per step, FA_BLOCK_N keys per block, FA_WARPS and FA_STAGES
    shared-memory buffers for Q and dO (2 prefetches the next query block). dQ is added straight from
    the mma fragments in whole sectors (bwd.cu dq_index) on every arch."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    # FA_V_IN_REGS: V's fragments of dP = dO V^T in registers, and P and dS in V's shared memory
    v_in_regs: bool = False
    # FA_BWD_SWIZZLE: the shared-memory layout, unpadded and XOR-swizzled (label suffix "x") or rows
    # padded by _BWD_ROW_PAD elements (tiles.cuh says what each costs)
    swizzled: bool = False
    # FA_DQ_PASSES: dQ = dS K in this many passes over column slices of the head dim (label suffix
    # "p2"...), a rolled loop: fewer accumulators live beside V's registers, at more ldmatrix bytes
    dq_passes: int = 1
    # FA_S_ROWS: the warps' row split of S and dP (label suffix "r2"...); 0: the one reading the fewest
    # ldmatrix bytes (attention.cuh FewestBytesGrid). With V in registers, fewer warp rows hold fewer
    # of V's fragments per warp
    s_rows: int = 0
    # FA_DQ_LANE_POINTER: dQ's adds at constant offsets from one pointer per lane (label suffix "l"), not
    # an index each; which of the two ptxas fits in 255 registers differs by tile (bwd.cu kDqLanePointer)
    dq_lane_pointer: bool = False
    # FA_DQ_HOLD_DS: 0, or with dq_passes > 1 dS's fragments read once per step and held in registers
    # through the passes, each pass split over this many warp rows (label suffix "h2"...): the ldmatrix
    # bytes of one pass over the head dim at one narrow pass's accumulators
    dq_hold_ds: int = 0
    # FA_BWD_REBASE: each step's shared-memory addresses computed in the step from an opaque base, not
    # held across the query loop (label suffix "a"; bwd.cu kRebase): what keeps a swizzled one-stage
    # tile's XOR patterns out of the registers V's fragments need
    rebase: bool = False
    # FA_DQ_FIRST: each step's dQ before its dK and dV products (label suffix "f"; ptxas's schedule only)
    dq_first: bool = False
    # FA_K_IN_REGS: K's fragments of S = Q K^T in registers as V's are (label suffix "k"): S reads only Q
    # from shared memory, at 48 to 96 registers held across the query loop
    k_in_regs: bool = False

    @property
    def label(self) -> str:
        suffix = ("v" if self.v_in_regs else "") + ("x" if self.swizzled else "")
        suffix += f"p{self.dq_passes}" if self.dq_passes > 1 else ""
        suffix += f"r{self.s_rows}" if self.s_rows else ""
        suffix += "l" if self.dq_lane_pointer else ""
        suffix += f"h{self.dq_hold_ds}" if self.dq_hold_ds else ""
        suffix += "a" if self.rebase else ""
        suffix += "f" if self.dq_first else ""
        suffix += "k" if self.k_in_regs else ""
        return f"m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}{suffix}"

    def smem_bytes(self, head_dim: int) -> int:
        """bwd.cu's kSmemBytes: K, V; Q, dO per stage; P, dS (rows padded unless swizzled); lse and D
        (fp32) per query row. With V in registers, P and dS reuse V's shared memory."""
        pad = 0 if self.swizzled else _BWD_ROW_PAD
        k_or_v = self.block_n * (head_dim + pad) * _ELEM_BYTES
        q_do = 2 * self.stages * self.block_m * (head_dim + pad) * _ELEM_BYTES
        p_ds = 2 * self.block_m * (self.block_n + pad) * _ELEM_BYTES
        v_p_ds = max(k_or_v, p_ds) if self.v_in_regs else k_or_v + p_ds
        return k_or_v + v_p_ds + q_do + 2 * self.block_m * 4

    def valid(self, head_dim: int) -> bool:
        """bwd.cu's static_asserts: WarpGrid splits S (block_m x block_n), dK/dV (block_n x d) and each
        dQ pass (block_m x d / dq_passes; in dq_hold_ds warp rows where given, which needs passes) into
        whole 16 x 8 mma tiles over the warps; tile widths multiples of 32."""
        if (
            self.block_n % 32
            or self.block_m % 16
            or self.stages not in (1, 2)
            or head_dim % (8 * self.dq_passes)
            or (self.dq_hold_ds and self.dq_passes == 1)
        ):
            return False
        dq_cols = head_dim // self.dq_passes
        if self.dq_hold_ds and not _warp_grid_fits(self.block_m, dq_cols, self.warps, self.dq_hold_ds):
            return False
        if self.s_rows and not _warp_grid_fits(self.block_m, self.block_n, self.warps, self.s_rows):
            return False
        return all(
            _warp_grid_fits(m, n, self.warps)
            for m, n in ((self.block_m, self.block_n), (self.block_n, head_dim), (self.block_m, dq_cols))
        )

    def defines(self) -> dict[str, int]:
        return {
            "FA_BLOCK_M": self.block_m,
            "FA_BLOCK_N": self.block_n,
            "FA_WARPS": self.warps,
            "FA_STAGES": self.stages,
            **({"FA_V_IN_REGS": 1} if self.v_in_regs else {}),
            **({"FA_BWD_SWIZZLE": 1} if self.swizzled else {}),
            **({"FA_DQ_PASSES": self.dq_passes} if self.dq_passes > 1 else {}),
            **({"FA_S_ROWS": self.s_rows} if self.s_rows else {}),
            **({"FA_DQ_LANE_POINTER": 1} if self.dq_lane_pointer else {}),
            **({"FA_DQ_HOLD_DS": self.dq_hold_ds} if self.dq_hold_ds else {}),
            **({"FA_BWD_REBASE": 1} if self.rebase else {}),
            **({"FA_DQ_FIRST": 1} if self.dq_first else {}),
            **({"FA_K_IN_REGS": 1} if self.k_in_regs else {}),
        }


@dataclass(frozen=True)
class HopperTile:
    """hopper_fwd.cu's knobs (the sm_90a forward, FlashAttention-3's design; docs/kernels.md, the
    contract in issue 39): FA_BLOCK_M query rows per block, 64 per consumer warpgroup (a wgmma's M), so
    FA_CONSUMER_WGS = block_m / 64; FA_BLOCK_N keys per K/V stage; FA_STAGES K/V stages of the TMA
    pipeline. One producer warpgroup beside the consumers: 128 * (1 + consumers) threads."""

    block_m: int
    block_n: int
    stages: int = 2

    @property
    def consumer_wgs(self) -> int:
        return self.block_m // WARPGROUP_ROWS

    @property
    def threads(self) -> int:
        return WARPGROUP_THREADS * (1 + self.consumer_wgs)

    @property
    def label(self) -> str:
        return f"m{self.block_m}n{self.block_n}g{self.consumer_wgs}s{self.stages}"

    def smem_bytes(self, head_dim: int) -> int:
        """Q (block_m rows) and K and V (block_n rows each) per stage, swizzled and unpadded, then the
        pipeline's mbarriers (Q's, a full and an empty one per K and V stage, and the last V block's; 8 bytes
        each)."""
        barriers = _MBARRIER_BYTES * (2 + 4 * self.stages)  # q_full, 4 per stage, v_tail
        return (self.block_m + 2 * self.stages * self.block_n) * head_dim * _ELEM_BYTES + barriers

    def valid(self, head_dim: int) -> bool:
        """Whole warpgroups of 64 rows (1 to 3 consumers); wgmma's N in steps of 16 up to 256 (the key
        block is QK^T's N and PV's K, whose steps are 16); the head dim one of the sm_90a buckets."""
        return (
            self.block_m % WARPGROUP_ROWS == 0
            and 1 <= self.consumer_wgs <= 3
            and self.block_n % 16 == 0
            and 16 <= self.block_n <= 256
            and 1 <= self.stages <= 4
            and head_dim in HOPPER_HEAD_DIMS
        )

    def defines(self) -> dict[str, int]:
        return {
            "FA_BLOCK_M": self.block_m,
            "FA_BLOCK_N": self.block_n,
            "FA_STAGES": self.stages,
            "FA_CONSUMER_WGS": self.consumer_wgs,
        }


Tile = FwdTile | BwdTile | HopperTile


def _warp_grid_fits(m: int, n: int, warps: int, rows: int = 0) -> bool:
    """attention.cuh FewestBytesGrid<M, N, WARPS>: some rows x columns split of the warps (or the one of
    `rows` warp rows) gives every warp whole 16 x 8 mma tiles."""
    return any(
        warps % wm == 0 and m % (16 * wm) == 0 and n % (8 * (warps // wm)) == 0
        for wm in ((rows,) if rows else range(1, warps + 1))
    )


# ---- arch families and their tables -------------------------------------------------------------------


@dataclass(frozen=True)
class ArchFamily:
    """Archs that share shared-memory size and so tile choices."""

    name: str
    smem_limit: int  # max shared memory per block (opt-in), static and dynamic together, bytes
    dtypes: tuple[str, ...]
    fwd: Mapping[int, FwdTile | HopperTile]  # head-dim bucket -> the default forward tile
    bwd: dict[int, BwdTile]  # head-dim bucket -> the default backward tile; absent: no backward
    splitkv: dict[int, FwdTile]  # head-dim bucket -> the split-KV forward's tile
    # Earlier defaults, kept as candidates so that measurements decide between old and new.
    previous: Mapping[str, Mapping[int, Tile]]
    # Static shared memory ptxas puts in every kernel of these archs (our sources declare none): the
    # sm90+ cubins of CUDA 11.8 to 13.0 carry 1 KiB (.nv.shared.<kernel>). The build reads the real
    # figure from each cubin and refuses one that does not fit (buildtool/builder/cubin_fit.py).
    static_smem: int = 0
    # An arch-specific family ("9.0a"): its own source and entry, its own head-dim buckets, the features
    # its kernel implements (None: FEATURES, every unit's), and its cubins run on one compute capability.
    arch_specific: bool = False
    features: frozenset[str] | None = None
    # Tiles of one CUDA major's own, where its NVRTC's ptxas spills on the default (fwd, bwd, splitkv)
    # tiles: CUDA major -> direction -> head-dim bucket -> tile. The defaults are what every other major
    # compiles (CUDA 12 and 13: the wheels most users get), and the unit keeps its name in each.
    per_cuda: Mapping[int, Mapping[str, Mapping[int, Tile]]] = dataclasses.field(default_factory=dict)

    def table(self, direction: str, cuda: int | None = None) -> Mapping[int, Tile]:
        """Head-dim bucket -> tile of `direction` that CUDA `cuda`'s NVRTC compiles (None: the defaults)."""
        own = self.per_cuda.get(cuda, {}).get(direction, {}) if cuda is not None else {}
        return {**getattr(self, direction), **own}

    @property
    def dynamic_limit(self) -> int:
        """The most dynamic shared memory a tile may ask for here."""
        return self.smem_limit - self.static_smem


_T = FwdTile
_B = BwdTile

# The forward tiles of the first kernels (8 warps x 16 rows, K and V single-buffered).
_FWD_V1_SM80 = {d: _T(128, 128 if d <= 64 else 64, 8) for d in HEAD_DIM_BUCKETS}
_FWD_V1 = {
    "sm75": {
        32: _T(64, 128, 4),
        64: _T(64, 64, 4),
        96: _T(64, 32, 4),
        128: _T(64, 64, 4),
        160: _T(64, 32, 4),
        192: _T(64, 32, 4),
        256: _T(64, 16, 4),
    },
    "sm80": _FWD_V1_SM80,
    "sm86": {**_FWD_V1_SM80, 192: _T(64, 64, 4), 256: _T(64, 64, 4)},
    "sm90": {d: _T(128, 128 if d <= 128 else 64, 8) for d in HEAD_DIM_BUCKETS},
}

# The backward tiles of the first kernels (mostly 64 x 32 key-query blocks, dQ atomics per element).
_BWD_V1_SM80 = {
    32: _B(64, 128, 8, 2),
    64: _B(64, 128, 8, 2),
    96: _B(64, 64, 8, 2),
    128: _B(64, 32, 8, 2),
    160: _B(64, 32, 8, 2),
    192: _B(64, 32, 8, 2),
    256: _B(32, 32, 8, 2),
}
_BWD_V1 = {
    "sm75": {
        32: _B(64, 64, 8, 1),
        64: _B(64, 64, 8, 1),
        96: _B(64, 32, 8, 1),
        128: _B(64, 32, 8, 1),
        160: _B(32, 32, 8, 1),
        192: _B(32, 32, 8, 1),
    },
    "sm80": _BWD_V1_SM80,
    "sm86": {
        32: _B(64, 128, 8, 2),
        64: _B(64, 128, 8, 1),
        96: _B(64, 64, 8, 2),
        128: _B(64, 32, 8, 2),
        160: _B(64, 32, 8, 1),
        192: _B(64, 32, 8, 1),
        256: _B(32, 32, 8, 1),
    },
    "sm90": _BWD_V1_SM80,
}

# Forward defaults: 4 warps x 32 rows (two m-tiles per warp halve the K and V fragment reads per mma)
# up to head dim 128 at FA2's own blocks (128 x 128 at d64, 128 x 64 at d96 and d128: the K and V
# fragments of a k step serve twice the mmas of a 32-key block; Q kept in registers at d32), 4 warps x
# 16 rows with Q in registers at 160, FA2's 8-warp 128 x 64 blocks at 192 and above (64 x 64 x 4 where
# shared memory is short, and FA2's H100 choice at 256 on sm90), and two K/V stages wherever shared
# memory keeps FA2's blocks per SM (sm80's d128 takes one: two would leave one block per SM). Each is
# spill-free with NVRTC 11.8, 12.9 and 13.0 on every arch of its family (bench/kernels/kernel_resources.py)
# since P V skips the k steps past the sequence end (fwd.cu accumulate_pv).
_FWD_SM80 = {
    32: _T(128, 64, 4, 2, True),  # 128 x 128 spills on sm100/sm120 with NVRTC 13.0
    64: _T(128, 128, 4, 2),
    96: _T(128, 64, 4, 2),
    128: _T(128, 64, 4, 1),
    160: _T(64, 64, 4, 1, True),
    192: _T(128, 64, 8, 2),
    256: _T(128, 64, 8, 1),
}
_FWD_SM90 = {
    **_FWD_SM80,
    128: _T(128, 64, 4, 2),
    256: _T(64, 64, 4, 1),  # FA2's H100 choice
}
# The 99 KB parts (sm86, sm89, sm120): two blocks per SM hold at most 50,176 B each (100 KB per SM, 1 KB
# per block for the driver; sm120's 1 KiB of static shared memory too). With unpadded tiles d64 and d96
# keep FA2's blocks single-staged in 49,152 B; d128 takes 128 x 32 x 4 (49,152 B), FA2's own choice
# there "since we get 2 CTAs per SM". d192 fits sm80's 8-warp block single-staged (98,304 B).
_FWD_SM86 = {
    **_FWD_SM80,
    64: _T(128, 128, 4, 1),
    96: _T(128, 64, 4, 1),
    128: _T(128, 32, 4, 1),
    192: _T(128, 64, 8, 1),
    256: _T(64, 64, 4, 1),
}
# Blackwell (sm100 to sm121) takes its shared-memory class's tables, but for sm120's d128: FA2 runs
# 128 x 64 x 4 there (its "two CTAs per SM" 128 x 32 is for sm 8.x only), one block per SM.
_FWD_SM100 = _FWD_SM90
_FWD_SM120 = {**_FWD_SM86, 128: _T(128, 64, 4, 1)}
# Turing: the first kernels' tiles, with 32 rows per warp at d32 (16-key blocks at d256: the m16n8k8
# path needs more registers per row than sm80's).
_FWD_SM75 = {**_FWD_V1["sm75"], 32: _T(128, 64, 4)}

# Backward defaults: 8 warps and key blocks of 64 to 128 (FA2's are 128 at d <= 128 and 64 above),
# the largest that leave ptxas room for the five accumulators without spilling (bench/
# kernel_resources.py --candidates), two Q/dO stages where shared memory allows; dQ added from the
# fragments in whole sectors (bwd.cu dq_index). FA2's own blocks at d64 (128 x 128), d96 and d128
# (64 x 128) on sm80 and sm90 on, since P and dS are computed apart (bwd.cu probabilities,
# grad_scores); sm80 keeps one Q/dO stage at d64 and d128 (two need 181,248 and 174,592 B) and at d96. At d192
# and d256 FA2's 64 x 64 spills in one dQ pass (NVRTC 12.9: 4 to 444 B); sm80 runs d256 in four passes with
# dS held (_BWD_SM80_FAMILY) and d192 in one pass with S in two warp rows (CUDA 12 and 13; 11 its own)
# (tiles per CUDA major, below); sm90's d256 takes it with one stage for CUDA 12 and 13; sm100 in one pass
# with dQ's per-lane pointer (_BWD_SM100). Head dim 256 fits the 99 KB parts
# (sm86/89/120) with 64 x 32 blocks (swizzled: _BWD_SM86), where FA2 < 2.5.5 and torch SDPA refuse
# training. Turing (64 KB) gets backward up to head dim 192; 256 does not fit 64 KB without blocks so
# small that they spill, so dispatch falls back for it (backward-unsupported).
_BWD_SM80 = {
    32: _B(64, 128, 8, 2),
    64: _B(128, 128, 8, 1),
    96: _B(64, 128, 8, 1),  # two stages spill 24 B on sm87 with NVRTC 11.8
    128: _B(64, 128, 8, 1),
    160: _B(32, 64, 8, 2),
    192: _B(32, 64, 8, 2),
    256: _B(64, 32, 8, 1),
}
# sm90 on: sm80's blocks, two stages at every head dim (227 KB holds them), and V in registers at d96
# (FA2's choice; sm80 spills 48 B so, NVRTC 12.9; sm100 32 B with two stages, none with one). sm90 also
# takes FA2's 64 x 64 at d192 (sm80 spills 8 B; sm100 below). Blackwell runs FA2's 64 x 128 at d128 with
# one stage (252-254 registers, no spill, NVRTC 12.9 and 13.0, since fa_bwd recomputes dQ's group
# stride at each step: bwd.cu kHoldDqStride; 28 B spilled before); two stages spill 384 B there.
_BWD_SM90_BASE = {d: dataclasses.replace(t, stages=2) for d, t in _BWD_SM80.items()}
_BWD_SM90 = {**_BWD_SM90_BASE, 96: _B(64, 128, 8, 2, True), 192: _B(64, 64, 8, 2)}
# Blackwell also runs FA2's 64 x 64 at d192 and d256, one stage, with dQ's adds at offsets from one
# pointer per lane (dq_lane_pointer, bwd.cu kDqLanePointer): NVRTC 12.9 spilled 32 and 8 B there
# without it, 13.0 0 and 24 B; none with it (two stages at d256 still spill 8 B with 12.9).
_BWD_SM100 = {
    **_BWD_SM90_BASE,
    96: _B(64, 128, 8, 1, True),
    128: _B(64, 128, 8, 1),
    192: _B(64, 64, 8, 1, dq_lane_pointer=True),
    256: _B(64, 64, 8, 1, dq_lane_pointer=True),
}
# sm80's own d256: FA2's 64 x 64 with dQ in column passes (64 x 32 before, with dQ sectors twice FA2's).
# One pass spills 152 B (NVRTC 12.9); two run at 250-252 registers without a spill with NVRTC 11.8, 12.9
# and 13.0 on sm80 and sm87, but re-read dS (281.6 B/mma). It takes four passes with dS held in registers through them, each in two warp
# rows (dq_hold_ds, FA_DQ_HOLD_DS): 245-246 registers, no spill with 11.8, 12.9 and 13.0 on sm80 and
# sm87, bf16 and fp16, and FA2's 268.8 B/mma (eight passes 242 registers, also clean; two passes spill
# 56 B with 12.9, 20 with 11.8 with dq_lane_pointer). (sm90's table derives from _BWD_SM80 and keeps
# its own rows.)
_BWD_SM80_FAMILY = {**_BWD_SM80, 256: _B(64, 64, 8, 1, dq_passes=4, dq_hold_ds=2)}
# Tiles per CUDA major (issue 38): where NVRTC 12.9's and 13.0's ptxas fit FA2's blocks without a spill
# and 11.8's does not, CUDA 12 and 13 compile FA2's and CUDA 11 keeps the tile above (ArchFamily.
# per_cuda). Spilled bytes, stores + loads, the same for bf16 and fp16 (bench/kernels/kernel_resources.py
# --cuda N --direction bwd; kernel_model.py --vs-fa2 for ldsm/mma), 2026-11-29:
#   - sm80 d96: FA2's 64 x 128 with V in registers, two Q/dO stages (ldsm/mma 221.9, FA2's 230.4):
#     none with 12.9 and 13.0, 16 with 11.8; one stage spills 48 with every NVRTC.
#   - sm80 d192: FA2's 64 x 64, two stages, swizzled (padded it needs 172,544 B) with S and dP in two
#     warp rows (s_rows; ldsm/mma 281.6, FA2's): none with 12.9 and 13.0, 40 with 11.8 (one stage,
#     padded, 8); FA2's four warp rows spill 128 with 12.9.
#   - sm90 d256: FA2's 64 x 64, one stage: none with 12.9 and 13.0, 528 with 11.8; two stages spill 84
#     with 12.9.
# CUDA 11 runs FA2's blocks too, two stages, with dQ in passes and dS held through them (dq_hold_ds, two
# warp rows): sm80 d96 64 x 128 V in registers in three passes (254 registers, 221.9 B/mma), d192 64 x 64
# swizzled in three (238, 281.6), sm90 d256 64 x 64 in four (248, 268.8): no spill with 11.8, bf16 and
# fp16. Before: 64 x 128 one stage (247.5), 64 x 64 in two passes re-reading dS (298.7), 64 x 32 (345.6,
# dQ sectors twice FA2's).
_FA2_BWD_SM80 = {96: _B(64, 128, 8, 2, True), 192: _B(64, 64, 8, 2, swizzled=True, s_rows=2)}
_FA2_BWD_SM90 = {256: _B(64, 64, 8, 1)}
_CU11_BWD_SM80 = {
    96: _B(64, 128, 8, 2, True, dq_passes=3, dq_hold_ds=2),
    192: _B(64, 64, 8, 2, swizzled=True, dq_passes=3, dq_hold_ds=2),
}
_CU11_BWD_SM90 = {256: _B(64, 64, 8, 2, dq_passes=4, dq_hold_ds=2)}
# sm87 (Jetson Orin, DRIVE Orin) has sm80's shared memory but a row of its own: its ptxas fits both of
# sm80's FA2 tiles with every NVRTC, 11.8 too (none spilled, bf16 and fp16), so it needs no CUDA 11 row.
_BWD_SM87 = {**_BWD_SM80_FAMILY, **_FA2_BWD_SM80}
# The 99 KB parts: FA2's blocks with V in registers from d64 up (FA2's choice there). Beside V's
# fragments sm86's ptxas spilled dQ's accumulators at d96 and d128 (40 and 136 B, NVRTC 12.9), so dQ ran
# in column passes there (dq_passes, FA_DQ_PASSES). d96 now takes one pass, swizzled: what spilled
# there (vx 304 B, vxl 232 B stores + loads, NVRTC 12.9 sm_86) was the step's swizzled ldmatrix
# addresses, loop-invariant with one Q/dO stage and held across the query loop; computed in each step
# (rebase, FA_BWD_REBASE) and with dQ before dK and dV (dq_first: sm_80's ptxas, which compiles it as
# 8.6's alternative, spilled 24 B with dQ last), 247-255 registers and no spill with NVRTC 11.8, 12.9
# and 13.0, bf16 and fp16, on sm_86, sm_80 and sm_87 (two passes before: 247.5 B/mma). d128 takes one
# pass with dQ's adds at offsets from
# one pointer per lane (dq_lane_pointer: 8, 4 and 4 B spilled without it with NVRTC 11.8, 12.9 and 13.0,
# none with it); d192 and d256 fit 99 KB only swizzled (98,816 B;
# padded 102,912 and 101,888), d192 with S in two warp rows (s_rows: 48 registers of V, not 96). Both
# run dQ in passes of a few n-tiles per warp over dS fragments read once per step into registers
# (dq_hold_ds, bwd.cu FA_DQ_HOLD_DS, as sm 12.0 and sm 8.0 d256: dS of 32 or 64 keys in 16 or 32
# registers, 8 of accumulators live, not 48 or 64). NVRTC 12.9, sm_86 bf16: one pass spills 256 B at
# d192 (S in two warp rows; in FA2's four, 840 B: 230.4 B/mma) and 296 B at d256; passes over dS from
# shared memory spill none but re-read it (d192 273.1 in two, d256 307.2 in two and 332.8 in four).
# Held (d192 six passes of 32 columns, two warp rows, each step's addresses rebased, which sm_80's
# ptxas with NVRTC 11.8 needs as the alternative: 8 B spilled without; d256 four passes of 64): 247 to
# 255 registers and no spill with NVRTC 11.8, 12.9 and 13.0, bf16 and fp16, on sm_86 and as sm_80's and
# sm_87's alternative. Spill-free with NVRTC 11.8, 12.9 and 13.0; ldsm/mma (kernel_model.py --vs-fa2,
# NVRTC 12) d96 221.9, d128 256.0 (281.6 in two passes), d192 230.4, d256 294.4, against the padded half
# blocks' 332.8, 307.2, 349.9, 460.8 and FA2's 230.4, 256.0, 230.4, 294.4.
# d192 also holds K's fragments of S = Q K^T in registers (k_in_regs, FA_K_IN_REGS): in two warp rows
# each warp's dP reads 32 rows of dO (256 B/mma where FA2's four rows read 128), and S then reads Q alone
# (384 -> 256), so the step's five products read FA2's 230.4 (256.0 without). 48 registers more beside
# V's 48. Spill stores + loads, sm_86 bf16 (2026-11-29, /tmp probe over tiles.unit): FA2's own form (V
# for 32 keys in four warp rows, r4) 256 to 1,028 B with NVRTC 11.8 in every p/h/l/a/f variant at 230.4
# (16 at best, p3r4h4a, at 247.5), 240 to 840 with 12.9 and 13.0; vxp6r2h2ak none with 12.9 and 13.0, bf16
# and fp16, on sm_86, sm_89 and as sm_80's and sm_87's alternative (255 registers). NVRTC 11.8 spills
# it (112 B; 72 to 1,072 for every K-in-registers variant at 230.4), so CUDA 11 takes its own
# (per_cuda): dQ's passes in four warp rows (h4), 247.5 B/mma, no spill with 11.8 on all four.
_BWD_SM86 = {
    32: _B(64, 128, 8, 2),
    64: _B(64, 128, 8, 1, True),
    96: _B(64, 128, 8, 1, True, True, dq_lane_pointer=True, rebase=True, dq_first=True),
    128: _B(64, 64, 8, 1, True, True, dq_lane_pointer=True),
    160: _B(32, 64, 8, 2),
    192: _B(64, 64, 8, 1, True, True, 6, s_rows=2, dq_hold_ds=2, rebase=True, k_in_regs=True),
    256: _B(64, 32, 8, 1, True, True, 4, dq_hold_ds=2),
}
_CU11_BWD_SM86 = {192: _B(64, 64, 8, 1, True, True, 6, s_rows=2, dq_hold_ds=4, rebase=True, k_in_regs=True)}
# sm120 keeps V in registers (FA_V_IN_REGS, FA2's choice on the 99 KB parts): P and dS take V's shared
# memory, so d96 fits FA2's 64 x 128 (88,576 B) and dP reads no V from shared memory. Its ptxas also
# keeps d192's S in FA2's four warp rows, with dQ in six passes of 32 columns in two warp rows and dS
# held in registers through them (dq_hold_ds), and d256 in 32 x 64 blocks (98,560 B swizzled: dQ sectors
# half FA2's 64 x 32) with dQ in four passes in one warp row, dS held: no spill with NVRTC 12.9 and 13.0,
# bf16 and fp16 (252 and 249-252 registers), ldsm/mma 230.4 and 281.6 against FA2's 230.4 and 294.4
# (FA2's 64 x 32 at d256 spills 20 B in one pass with 12.9; 64 x 64 in one dQ pass at d192 316). The
# two-pass rows before, which re-read dS, read 247.5 and 307.2. sm 8.0's, 9.0's and 10.0's ptxas
# spill some of these as alternatives (kernel_resources.py --alternatives; the 12.0 GPUs they serve JIT
# the PTX), as sm 8.0's does sm120's d96 and d128.
_BWD_SM120 = {
    **_BWD_SM86,
    96: _B(64, 128, 8, 1, True),
    128: _B(64, 64, 8, 1, True),
    192: _B(64, 64, 8, 1, True, True, 6, dq_hold_ds=2),
    256: _B(32, 64, 8, 1, True, True, 4, dq_hold_ds=1),
}
_BWD_SM75 = _BWD_V1["sm75"]

# Split-KV (decode: few query rows, long keys): FA2's 64-row blocks of 4 warps with long key blocks,
# double-buffered where shared memory allows.
_SPLITKV_SM80 = {d: _T(64, 128 if d <= 128 else 64, 4, 2 if d < 256 else 1) for d in HEAD_DIM_BUCKETS}
_SPLITKV_SM86 = {d: _T(64, 128 if d <= 64 else 64, 4, 2 if d <= 128 else 1) for d in HEAD_DIM_BUCKETS}
# sm90's ptxas (NVRTC 12.9) spills 4 bytes of d96's double-buffered 64 x 128 since P V skips the k steps
# past the sequence end; one stage does not (and fits three blocks per SM).
_SPLITKV_SM90 = {**_SPLITKV_SM80, 96: _T(64, 128, 4, 1)}


# Shared memory per block, opt-in maximum (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"): sm75 64 KB; sm80/sm87 163 KB; sm86/sm89/sm12x 99 KB; sm90/sm10x/sm110 227 KB.
FAMILIES: dict[str, ArchFamily] = {
    "sm75": ArchFamily(
        name="sm75",
        smem_limit=64 * 1024,
        dtypes=("fp16",),  # Turing has no bf16 mma
        # 64 KB per SM in all, and no cp.async: a second resident block is what hides the load
        # latency, so d <= 96 use tiles under 32 KB (2 blocks/SM); larger head dims get 1.
        fwd=_FWD_SM75,
        bwd=_BWD_SM75,
        # No split-KV at d256: its 16-key blocks spill there; such calls run the plain forward.
        splitkv={d: _T(64, 64 if d <= 96 else 32, 4) for d in HEAD_DIM_BUCKETS if d < 256},
        previous={"fwd": _FWD_V1["sm75"], "bwd": _BWD_V1["sm75"]},
    ),
    "sm80": ArchFamily(
        name="sm80",
        smem_limit=163 * 1024,
        dtypes=("fp16", "bf16"),
        fwd=_FWD_SM80,
        bwd={**_BWD_SM80_FAMILY, **_FA2_BWD_SM80},
        splitkv=_SPLITKV_SM80,
        previous={"fwd": _FWD_V1["sm80"], "bwd": _BWD_V1["sm80"]},
        per_cuda={11: {"bwd": _CU11_BWD_SM80}},
    ),
    "sm86": ArchFamily(
        name="sm86",
        smem_limit=99 * 1024,
        dtypes=("fp16", "bf16"),
        fwd=_FWD_SM86,
        bwd=_BWD_SM86,
        splitkv=_SPLITKV_SM86,
        previous={"fwd": _FWD_V1["sm86"], "bwd": _BWD_V1["sm86"]},
        per_cuda={11: {"bwd": _CU11_BWD_SM86}},
    ),
    "sm90": ArchFamily(
        name="sm90",
        smem_limit=227 * 1024,
        dtypes=("fp16", "bf16"),
        fwd=_FWD_SM90,
        bwd={**_BWD_SM90, **_FA2_BWD_SM90},
        splitkv=_SPLITKV_SM90,
        previous={"fwd": _FWD_V1["sm90"], "bwd": _BWD_V1["sm90"]},
        static_smem=1024,
        per_cuda={11: {"bwd": _CU11_BWD_SM90}},
    ),
    # sm90's shared memory and tables but the d128 tiles (_FWD_SM100) and sm90's backward before the
    # d96 and d192 tiles its ptxas spills (_BWD_SM100).
    "sm100": ArchFamily(
        name="sm100",
        smem_limit=227 * 1024,
        dtypes=("fp16", "bf16"),
        fwd=_FWD_SM100,
        bwd=_BWD_SM100,
        splitkv=_SPLITKV_SM80,
        previous={"fwd": _FWD_V1["sm90"], "bwd": _BWD_V1["sm90"]},
        static_smem=1024,
    ),
    # sm86's shared memory and tables but the forward's d128 tile (_FWD_SM120) and the backward's d96
    # and d128, V in registers (_BWD_SM120).
    "sm120": ArchFamily(
        name="sm120",
        smem_limit=99 * 1024,
        dtypes=("fp16", "bf16"),
        fwd=_FWD_SM120,
        bwd=_BWD_SM120,
        splitkv=_SPLITKV_SM86,
        previous={"fwd": _FWD_V1["sm86"], "bwd": _BWD_V1["sm86"]},
        static_smem=1024,
    ),
}

# sm87 (Jetson Orin): sm80's family but its backward row (_BWD_SM87), the same in every CUDA major.
FAMILIES["sm87"] = dataclasses.replace(
    FAMILIES["sm80"], name="sm87", fwd=_FWD_SM80, bwd=_BWD_SM87, splitkv=_SPLITKV_SM80, per_cuda={}
)

# sm_90a (issue 39): FlashAttention-3's forward tiles per head dim (hopper/tile_size.h, non-causal fwd:
# d64 192 x 128, d96 192 x 128, d128 128 x 128, d192 128 x 96, d256 128 x 80), two K/V stages, a consumer
# warpgroup per 64 rows. Until hopper_fwd.cu records the numbers that compile without spills. Forward
# only: split-KV and the backward run sm_90's units (the decision passes the call on, with its reason).
_FWD_SM90A = {
    64: HopperTile(192, 128),
    96: HopperTile(192, 128),
    128: HopperTile(128, 128),
    192: HopperTile(128, 96),
    256: HopperTile(128, 80),
}
# What hopper_fwd.cu implements (the issue 39 contract): every forward feature, paged KV too, whose key
# blocks it TMA-loads from their pages: pages must hold whole key blocks of its tile (80 to 128 keys), and
# a call whose pages do not passes on to sm_90's forward (decision.py _holds_key_blocks).
SM90A_FEATURES: frozenset[str] = FEATURES
FAMILIES["sm90a"] = ArchFamily(
    name="sm90a",
    smem_limit=227 * 1024,
    dtypes=("fp16", "bf16"),
    fwd=_FWD_SM90A,
    bwd={},
    splitkv={},
    previous={},
    static_smem=1024,
    arch_specific=True,
    features=SM90A_FEATURES,
)

# Every arch some pinned NVRTC can target (buildtool/core/cuda_facts.py) maps to a family. sm88 (new in
# CUDA 13.0, no published smem figure we could check) gets the smallest Ampere-class budget.
_ARCH_FAMILY: dict[str, str] = {
    "7.5": "sm75",
    "8.0": "sm80",
    "8.7": "sm87",
    "8.6": "sm86",
    "8.8": "sm86",
    "8.9": "sm86",
    "12.0": "sm120",
    "12.1": "sm120",
    "9.0": "sm90",
    "9.0a": "sm90a",
    "10.0": "sm100",
    "10.1": "sm100",
    "10.3": "sm100",
    "11.0": "sm100",
}

SMEM_LIMIT: dict[str, int] = {arch: FAMILIES[fam].smem_limit for arch, fam in _ARCH_FAMILY.items()}

# The PTX path's static shared memory: a documented margin, not a measurement. The driver JIT-compiles
# PTX with its own ptxas for the GPU it runs on, which no build sees; ptxas gives every kernel of
# every sm 9.0+ cubin NVRTC 11.8 to 13.0 writes 1 KiB of it (.nv.shared.<kernel>; tests/kernels/
# test_kernel_compile.py reads it from the cubins), so a PTX image counts 1 KiB on whatever GPU it
# lands. A 99 KiB tile of PTX would not launch on a 99 KiB sm 12.0 part.
PTX_STATIC_SMEM = 1024


def arch_family(arch: str) -> ArchFamily | None:
    """The family of an arch like "8.6"; None for an arch we have no kernels for."""
    fam = _ARCH_FAMILY.get(arch)
    return FAMILIES[fam] if fam else None


# ---- the search space ------------------------------------------------------------------------------
# The knob values the autotuner may try, per direction. Every valid combination that fits the
# family's shared memory is a candidate, after the default and the earlier defaults.
_SPACE: dict[str, tuple[type, dict[str, tuple[int, ...]]]] = {
    "fwd": (
        FwdTile,
        {
            "block_m": (64, 128),
            "block_n": (32, 64, 128),
            "warps": (4, 8),
            "stages": (1, 2),
            "q_in_regs": (False, True),
        },
    ),
    "bwd": (
        BwdTile,
        {
            "block_m": (32, 64, 128),
            "block_n": (32, 64, 128),
            "warps": (4, 8),
            "stages": (1, 2),
        },
    ),
    # Decode has a handful of query rows: smaller query blocks are worth a try.
    "splitkv": (
        FwdTile,
        {
            "block_m": (16, 32, 64),
            "block_n": (32, 64, 128),
            "warps": (1, 2, 4),
            "stages": (1, 2),
            "q_in_regs": (False, True),
        },
    ),
}
_SOURCES = {"fwd": "csrc/fwd.cu", "bwd": "csrc/bwd.cu", "splitkv": "csrc/fwd.cu"}
COMBINE_ROWS = 4  # fwd.cu kCombineWarps: fa_fwd_combine runs one warp per query row


def bucket_of(head_dim: int, buckets: tuple[int, ...] = HEAD_DIM_BUCKETS) -> int:
    """The compiled head-dim bucket serving `head_dim` (the smallest bucket >= it)."""
    for b in buckets:
        if head_dim <= b:
            return b
    raise ValueError(f"head_dim: {head_dim} is above the largest bucket {buckets[-1]}")


def _buckets(family: ArchFamily) -> tuple[int, ...]:
    return HOPPER_HEAD_DIMS if family.arch_specific else HEAD_DIM_BUCKETS


def static_smem(arch: str, image: str) -> int:
    """The static shared memory a kernel of this arch's image carries on the GPU: the family's figure
    for SASS (cubin_fit.py checks each cubin against it), at least PTX_STATIC_SMEM for PTX."""
    family = _family_or_raise(arch)
    return family.static_smem if image == "sass" else max(family.static_smem, PTX_STATIC_SMEM)


def _family_or_raise(arch: str) -> ArchFamily:
    family = arch_family(arch)
    if family is None:
        raise ValueError(f"arch: {arch!r} has no kernels (known: {', '.join(_ARCH_FAMILY)})")
    return family


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: {direction!r} is not one of {', '.join(DIRECTIONS)}")


def default_tile(arch: str, direction: str, head_dim: int, cuda: int | None = None) -> Tile | None:
    """The tile `units(arch, cuda)` compiles for this direction and head dim (its bucket); None where
    the family builds no kernel (Turing's backward above 192). `cuda`: the major whose NVRTC compiles
    it (ArchFamily.per_cuda); None, or a major the table names no tiles for: the defaults."""
    family = _family_or_raise(arch)
    _check_direction(direction)
    return family.table(direction, cuda).get(bucket_of(head_dim, _buckets(family)))


def candidates(arch: str, direction: str, head_dim: int, cuda: int | None = None) -> list[Tile]:
    """Every tile the autotuner may try for this direction and head dim's bucket: the default (of
    CUDA `cuda`'s NVRTC) first, then the earlier defaults, then every valid combination of the search
    space; all fit the family's shared memory. [] where the family builds no such kernel."""
    default = default_tile(arch, direction, head_dim, cuda)
    if default is None:
        return []
    family = _family_or_raise(arch)
    d = bucket_of(head_dim, _buckets(family))
    if family.arch_specific:  # no search space yet: the autotuner measures the default only
        return [default] if default.smem_bytes(d) <= family.dynamic_limit else []
    cls, space = _SPACE[direction]
    previous = family.previous.get(direction, {}).get(d)
    grid = (cls(**dict(zip(space, values, strict=True))) for values in itertools.product(*space.values()))
    rows: list[Tile] = []
    for tile in itertools.chain([default], [previous] if previous else [], grid):
        if tile not in rows and tile.valid(d) and tile.smem_bytes(d) <= family.dynamic_limit:
            rows.append(tile)
    return rows


def _entries(direction: str, tile: FwdTile | BwdTile, smem: int) -> dict[str, Launch]:
    threads = 32 * tile.warps
    if direction == "fwd":
        return {"fa_fwd": Launch(threads, tile.block_m, tile.block_n, smem, "q_blocks")}
    if direction == "splitkv":
        # fa_fwd_splitkv's grid is (ceil(seqlen_q / block_m) * num_splits, batch, heads).
        return {
            "fa_fwd_splitkv": Launch(threads, tile.block_m, tile.block_n, smem, "q_blocks_splits"),
            "fa_fwd_combine": Launch(32 * COMBINE_ROWS, COMBINE_ROWS, 0, 0, "q_blocks"),
        }
    rows = Launch(threads, tile.block_m, 0, 0, "q_blocks")
    return {
        "fa_bwd_preprocess": rows,
        "fa_bwd": Launch(threads, tile.block_m, tile.block_n, smem, "k_blocks"),
        "fa_bwd_convert_dq": rows,
    }


def unit(arch: str, direction: str, dtype: str, head_dim: int, tile: Tile) -> KernelUnit:
    """The compile unit of one direction, dtype and head-dim bucket built with `tile` (the default's
    name and entries, so a tuned unit drops in for the default)."""
    family = _family_or_raise(arch)
    _check_direction(direction)
    if dtype not in family.dtypes:
        raise ValueError(f"dtype: {dtype!r} has no kernels on {arch} (it builds {', '.join(family.dtypes)})")
    kind = HopperTile if family.arch_specific else _SPACE[direction][0]
    if not isinstance(tile, kind):
        raise TypeError(f"tile: a {type(tile).__name__} cannot build a {direction} unit on {arch}")
    d = bucket_of(head_dim, _buckets(family))
    if not tile.valid(d):
        raise ValueError(f"tile: {tile.label} does not split into whole mma tiles at head dim {d}")
    smem = tile.smem_bytes(d)
    if smem > family.dynamic_limit:
        raise ValueError(
            f"tile: {tile.label} needs {smem} B of shared memory at head dim {d}; {arch} has {family.smem_limit}"
            f" per block, {family.static_smem} of it static"
        )
    defines = {
        "FA_HEAD_DIM": d,
        **tile.defines(),
        "FA_SMEM_BYTES": smem,
        "FA_DTYPE_BF16": int(dtype == "bf16"),
    }
    name = f"{direction}_{dtype}_d{d}"
    if isinstance(tile, HopperTile):
        launch = Launch(tile.threads, tile.block_m, tile.block_n, smem, "q_blocks")
        entries = {HOPPER_ENTRY: launch}
        return KernelUnit(
            name, direction, dtype, d, HOPPER_SOURCE, defines, entries, arch_specific=True, tile=tile.label
        )
    if direction == "splitkv":
        defines["FA_SPLITKV"] = 1
    entries = _entries(direction, tile, smem)
    return KernelUnit(name, direction, dtype, d, _SOURCES[direction], defines, entries, tile=tile.label)


def units(arch: str, cuda: int | None = None) -> list[KernelUnit]:
    """Every unit to compile for `arch` ("8.0") with CUDA `cuda`'s NVRTC, each with its default tile
    (default_tile: `cuda` None is CUDA 12's and 13's); [] for an arch we have no kernels for. Units
    whose source file is not in this tree are left out, so a build never compiles a missing file."""
    return [u for u in table_units(arch, cuda) if (_KERNELS_DIR / u.source).is_file()]


def table_units(arch: str, cuda: int | None = None) -> list[KernelUnit]:
    """Every unit the table lists for `arch` and CUDA `cuda`, whether or not its source is in this
    tree (`units` keeps those that are): hopper_fwd.cu's units are planned before the kernel lands."""
    family = arch_family(arch)
    if family is None:
        return []
    out = []
    for direction in DIRECTIONS:
        for dtype in family.dtypes:
            for d in _buckets(family):
                tile = default_tile(arch, direction, d, cuda)
                if tile is not None:
                    out.append(unit(arch, direction, dtype, d, tile))
    return out


def own_majors(arch: str) -> tuple[int, ...]:
    """The CUDA majors whose NVRTC compiles some unit of `arch` with a tile of its own (ArchFamily.
    per_cuda); () for none, or for an arch we have no kernels for."""
    family = arch_family(arch)
    return tuple(sorted(family.per_cuda)) if family else ()


def missing_sources(arch: str) -> list[str]:
    """The sources of `arch`'s table units that are not in this tree (relative to kernels/)."""
    return sorted({u.source for u in table_units(arch) if not (_KERNELS_DIR / u.source).is_file()})


def features(arch: str) -> frozenset[str]:
    """What the units of `arch` implement: FEATURES, or an arch-specific family's own subset."""
    family = _family_or_raise(arch)
    return FEATURES if family.features is None else family.features


# ---- alternatives: the same program with a smaller tile, for GPUs with less shared memory -----------
# An image runs on newer GPUs than its arch (SASS within its major, PTX on any), and some have less
# shared memory per block than the image's family assumes. The real cases, with the CUDA C++
# Programming Guide's opt-in limits ("Technical Specifications per Compute Capability"):
#   - sm 8.6/8.8/8.9 (99 KB: RTX 30xx/40xx, A10, L4, L40S) on sm 8.0's SASS (163 KB) in a build
#     without 8.6 SASS, which is how FlashAttention-2 ships (one sm80 binary, tiles switched at run
#     time by the device's limit: compat-facts);
#   - sm 12.0/12.1 (99 KB: RTX 50xx, RTX PRO Blackwell, DGX Spark's GB10) on 9.0/10.x/11.0 PTX
#     (227 KB) in a CUDA 12/13 build whose PTX ends there;
#   - sm 8.8 (CUDA 13's, taken as 99 KB) on sm 8.7's SASS, which `fa install --build` picks for it
#     with a toolkit that does not target 8.8.
# The alternative for a GPU is the tile its own family's SASS uses, so it is a tile the table already
# holds (spill-free on that family; sm 8.0's 24 compile spill-free for sm_80 too with NVRTC 12.9:
# `python bench/kernels/kernel_resources.py --cuda 12 --arch 8.0 --alternatives`, 2026-11-28); it is built only where the default needs more than that GPU's
# limit, and the plan (buildtool/builder/plan.py alternative_jobs) compiles it only into wheels where
# that GPU would run this image: none of the release matrix's wheels, whose every GPU has SASS of its
# own family. The runtime and doctor pick among them by the GPU's reported limit (decision.py).


def alternative_units(arch: str, cuda: int | None = None) -> list[KernelUnit]:
    """The units of `arch` with a smaller tile than the default, for newer GPUs whose opt-in shared
    memory per block is below the default's need (its static shared memory counted as PTX's, the
    larger); each names the GPUs it serves (`serves`). Both tiles are those CUDA `cuda`'s NVRTC
    compiles (default_tile). [] for an arch we have no kernels for."""
    family = arch_family(arch)
    if family is None or family.arch_specific:  # its cubin runs on its own capability only
        return []
    static = max(family.static_smem, PTX_STATIC_SMEM)
    serves: dict[tuple[str, str, int, Tile], list[str]] = {}
    for device, name in _ARCH_FAMILY.items():
        if FAMILIES[name].arch_specific:  # a GPU reports a plain capability ("9.0"), never "9.0a"
            continue
        budget = SMEM_LIMIT[device] - static
        if _arch_key(device) <= _arch_key(arch) or SMEM_LIMIT[device] >= family.smem_limit:
            continue
        theirs = FAMILIES[name]
        for direction in DIRECTIONS:
            for d in HEAD_DIM_BUCKETS:
                default = default_tile(arch, direction, d, cuda)
                smaller: Tile | None = theirs.table(direction, cuda).get(d)
                if default is None or smaller is None or default.smem_bytes(d) <= budget:
                    continue
                if smaller.smem_bytes(d) > budget or not smaller.valid(d):
                    continue  # no tile of theirs fits: such calls fall back there, with both numbers
                for dtype in family.dtypes:
                    serves.setdefault((direction, dtype, d, smaller), []).append(device)
    out = []
    for (direction, dtype, d, tile), devices in serves.items():
        base = unit(arch, direction, dtype, d, tile)
        out.append(dataclasses.replace(base, name=f"{base.name}_{tile.label}", serves=tuple(devices)))
    return [u for u in out if (_KERNELS_DIR / u.source).is_file()]


def all_units(arch: str, cuda: int | None = None) -> list[KernelUnit]:
    """Every unit a build may compile for `arch` with CUDA `cuda`'s NVRTC: the defaults, then the
    alternatives."""
    return units(arch, cuda) + alternative_units(arch, cuda)


def _arch_key(arch: str) -> tuple[int, int]:
    major, minor = arch.split(".")
    return int(major), int(minor)


def nvrtc_options(arch: str) -> list[str]:  # noqa: ARG001 (the API takes the arch; no flag depends on it yet)
    """Flags shared by every unit. Fast math matches flash-attn's own build (--use_fast_math); the
    kernels' exp2/log2/tanh are explicit approximate PTX anyway."""
    return ["-std=c++17", "--use_fast_math"]


def head_dims(unit: KernelUnit) -> list[int]:
    """Every head dim (a multiple of 8) this unit serves: those above the next smaller bucket (of its
    family's buckets: the sm_90a d192 unit serves 136 to 192)."""
    buckets = HOPPER_HEAD_DIMS if unit.arch_specific else HEAD_DIM_BUCKETS
    lower = max((b for b in buckets if b < unit.head_dim), default=0)
    return list(range(lower + 8, unit.head_dim + 1, 8))
