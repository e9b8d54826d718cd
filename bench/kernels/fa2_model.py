"""FlashAttention-2's tile choices and the static arithmetic that bench/kernels/kernel_model.py sets beside ours.

No FA2 code and no FA2 binary: the facts are its launch templates' choices (csrc/flash_attn/src/
flash_fwd_launch_template.h and flash_bwd_launch_template.h, 2.8: the non-causal, no-dropout branch,
picked at run time from the device's opt-in shared memory per block and per SM, and for the forward
from "sm 8.x but not 8.0"), its shared-memory sizes (kernel_traits.h: kSmemSize for the forward,
kSmemSize1colblock for the backward it launches) and its data flow, run through the arithmetic our
model applies to our SASS:

  ldsm/mma   ldmatrix bytes per m16n8k16 mma. A warp's rectangle of kMT x kNT mma tiles reads, per
             16-deep k step, kMT A fragments (512 B each) and kNT B fragments (256 B each) for kMT * kNT
             mmas. Forward: Q and K from shared memory every key block, P from registers, V from shared
             memory (4 warps or 8 split the query rows). Backward: the five GEMMs (S = Q K^T, dP = dO V^T,
             dV = P^T dO, dK = dS^T Q, dQ = dS K) have equal mma counts; every operand is read from shared
             memory except V in dP when FA2 keeps V in registers (Is_V_in_regs); the warps split each
             result by FA2's AtomLayoutMSdP, AtomLayoutNdKV and AtomLayoutMdQ.
  warps/SM   blocks per SM from shared memory (plus the 1 KB per block the driver keeps), threads and
             registers, times warps. FA2's registers are not known without its SASS: taken as 255 per
             thread (it declares no launch bounds, and its 32-row warp tiles hold more than the 168
             live values per thread that a third 4-warp block would need), so a 4-warp tile gets at
             most 2 blocks per SM and an 8-warp tile 1.
  dQ sectors per MFLOP (backward)  FA2 adds dQ straight from its mma fragments into a dq_accum laid
             out so that a warp's adds cover whole 32-byte sectors: block_m * d * 4 / 32 sectors per
             query block step, over the step's 10 * block_m * block_n * d FLOPs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO / "bench" / "kernels", REPO / "kernels"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import kernel_resources  # bench/kernels/ and kernels/ are not packages: found through sys.path
import tiles

FA2_REGISTERS = 255  # assumed per thread (see the module docstring)
LDSM_A = 512  # bytes per A fragment (ldmatrix .x4) per warp
LDSM_B = 256  # bytes per B fragment of one 8-column n-tile (half an .x4) per warp
SECTOR = 32  # bytes


@dataclass(frozen=True)
class Fa2Tile:
    """One FA2 kernel trait: block_m x block_n over `warps` warps; for the backward the rows-splits of
    its three warp grids and its two shared-memory switches."""

    block_m: int
    block_n: int
    warps: int
    rows_sdp: int = 0  # AtomLayoutMSdP: warps along the query rows of S and dP
    rows_dkv: int = 0  # AtomLayoutNdKV: warps along the key rows of dK and dV
    rows_dq: int = 0  # AtomLayoutMdQ: warps along the query rows of dQ
    v_in_regs: bool = False
    double_buffer: bool = True  # Q double-buffered (No_double_buffer false)

    @property
    def label(self) -> str:
        return f"m{self.block_m}n{self.block_n}w{self.warps}"


def device_limits(arch: str) -> tuple[int, int]:
    """(opt-in shared memory per block, shared memory per SM) as FA2 reads them from the device."""
    return tiles.SMEM_LIMIT[arch], kernel_resources.SM_LIMITS[arch].smem_per_sm


def fwd_tile(arch: str, head_dim: int) -> Fa2Tile | None:
    """run_mha_fwd_hdim*: FA2's forward tile on `arch` (None at head dims it no longer builds)."""
    per_block, per_sm = device_limits(arch)
    major, minor = (int(x) for x in arch.split("."))
    sm8x = major == 8 and minor > 0
    if head_dim in (32, 64):
        return Fa2Tile(128, 128, 4)
    if head_dim == 96:
        return Fa2Tile(128, 64, 4)
    if head_dim == 128:
        # "128 x 32 (48 KB smem) is the fastest for non-causal since we get 2 CTAs per SM" on sm86/89.
        return Fa2Tile(128, 32, 4) if sm8x else Fa2Tile(128, 64, 4)
    if head_dim == 192:
        return Fa2Tile(128, 64, 8)
    if head_dim == 256:
        a100_like = per_block >= 2 * 256 * (128 + 2 * 64) and per_sm < 4 * 256 * (64 + 2 * 64)
        return Fa2Tile(128, 64, 8) if a100_like else Fa2Tile(64, 64, 4)
    return None


# run_mha_bwd_hdim*: per head dim, FA2's backward tiles from the one it prefers down, each with the
# opt-in shared memory per block (KiB) a device must offer for it.
_BWD_TILES: dict[int, tuple[tuple[int, Fa2Tile], ...]] = {
    32: ((0, Fa2Tile(128, 128, 8, 4, 4, 4, v_in_regs=True)),),
    64: ((144, Fa2Tile(128, 128, 8, 4, 4, 4)), (0, Fa2Tile(64, 128, 8, 2, 4, 4, v_in_regs=True))),
    96: ((0, Fa2Tile(64, 128, 8, 2, 4, 4, v_in_regs=True)),),
    128: ((144, Fa2Tile(64, 128, 8, 2, 4, 2)), (0, Fa2Tile(64, 64, 8, 4, 2, 2, v_in_regs=True))),
    160: ((116, Fa2Tile(64, 64, 8, 4, 4, 4)), (0, Fa2Tile(64, 64, 8, 4, 4, 4, double_buffer=False))),
    192: (
        (136, Fa2Tile(64, 64, 8, 4, 2, 2)),
        (0, Fa2Tile(64, 64, 8, 4, 2, 2, v_in_regs=True, double_buffer=False)),
    ),
    256: (
        (176, Fa2Tile(64, 64, 8, 4, 2, 2)),  # H100
        (144, Fa2Tile(64, 64, 8, 4, 2, 2, double_buffer=False)),  # A100
        (0, Fa2Tile(64, 32, 8, 4, 1, 2, v_in_regs=True, double_buffer=False)),  # the 99 KB parts
    ),
}


def bwd_tile(arch: str, head_dim: int) -> Fa2Tile | None:
    """FA2's backward tile on `arch` (None at head dims it no longer builds)."""
    per_block, _ = device_limits(arch)
    return next((t for kib, t in _BWD_TILES.get(head_dim, ()) if per_block >= kib * 1024), None)


def tile_for(direction: str, arch: str, head_dim: int) -> Fa2Tile | None:
    return {"fwd": fwd_tile, "bwd": bwd_tile}[direction](arch, head_dim)


def smem_bytes(direction: str, tile: Fa2Tile, head_dim: int) -> int:
    """kernel_traits.h: the forward's Q + K + V; the backward's kSmemSize1colblock (Q in 2 buffers and
    dO in 1, or 1 each; K and V, or V's half reused when V lives in registers; P and dS)."""
    if direction == "fwd":
        return (tile.block_m + 2 * tile.block_n) * head_dim * 2
    q_do = tile.block_m * head_dim * 2 * (3 if tile.double_buffer else 2)
    kv = 2 * tile.block_n * head_dim * 2
    p_ds = 2 * tile.block_m * tile.block_n * 2
    return q_do + (max(kv, kv // 2 + p_ds) if tile.v_in_regs else kv + p_ds)


def _bytes_per_mma(m: int, n: int, warps: int, rows: int, a: bool = True, b: bool = True) -> float:
    """ldmatrix bytes per mma of an m x n result split rows x (warps / rows), per 16-deep k step;
    `a`/`b` False: that operand comes from registers."""
    mt = m // rows // 16
    nt = n // (warps // rows) // 8
    return (LDSM_A * mt * a + LDSM_B * nt * b) / (mt * nt)


def ldsm_per_mma(direction: str, tile: Fa2Tile, head_dim: int) -> float:
    d, bm, bn, w = head_dim, tile.block_m, tile.block_n, tile.warps
    if direction == "fwd":
        # Every warp owns bm / w whole query rows and all bn keys: S from Q, K; O from P (registers), V.
        s = _bytes_per_mma(bm, bn, w, w)
        o = _bytes_per_mma(bm, d, w, w, a=False)
        return (s + o) / 2
    products = (
        _bytes_per_mma(bm, bn, w, tile.rows_sdp),  # S = Q K^T
        _bytes_per_mma(bm, bn, w, tile.rows_sdp, b=not tile.v_in_regs),  # dP = dO V^T
        _bytes_per_mma(bn, d, w, tile.rows_dkv),  # dV = P^T dO
        _bytes_per_mma(bn, d, w, tile.rows_dkv),  # dK = dS^T Q
        _bytes_per_mma(bm, d, w, tile.rows_dq),  # dQ = dS K
    )
    return sum(products) / len(products)


def dq_sectors_per_mflop(block_m: int, block_n: int, head_dim: int, whole_sectors: bool) -> float:
    """dq_accum sectors a query block step adds, per million of its FLOPs: whole 32-byte sectors, or
    half of each (single floats from the mma fragments: 8 rows x 2 adjacent floats per warp add)."""
    sectors = block_m * head_dim * 4 / (SECTOR if whole_sectors else SECTOR // 2)
    return sectors / (10 * block_m * block_n * head_dim) * 1e6


def warps_per_sm(arch: str, direction: str, tile: Fa2Tile, head_dim: int) -> int:
    blocks = kernel_resources.blocks_per_sm(
        arch, 32 * tile.warps, FA2_REGISTERS, smem_bytes(direction, tile, head_dim)
    )
    return blocks * tile.warps


@dataclass(frozen=True)
class Fa2Row:
    """FA2's figures for one direction, arch and head dim."""

    direction: str
    arch: str
    head_dim: int
    tile: str
    smem_bytes: int
    warps_per_sm: int
    ldsm_per_mma: float
    dq_sectors_per_mflop: float  # backward only, else 0


def row(direction: str, arch: str, head_dim: int) -> Fa2Row | None:
    tile = tile_for(direction, arch, head_dim)
    if tile is None:
        return None
    return Fa2Row(
        direction=direction,
        arch=arch,
        head_dim=head_dim,
        tile=tile.label,
        smem_bytes=smem_bytes(direction, tile, head_dim),
        warps_per_sm=warps_per_sm(arch, direction, tile, head_dim),
        ldsm_per_mma=round(ldsm_per_mma(direction, tile, head_dim), 1),
        dq_sectors_per_mflop=round(dq_sectors_per_mflop(tile.block_m, tile.block_n, head_dim, True), 1)
        if direction == "bwd"
        else 0.0,
    )
