"""Small sm_90a kernels over kernels/csrc/hopper.cuh for the emulator's Hopper tests, and the PTX ISA's
documented layouts computed independently in Python: where a 16-bit operand element lies in shared
memory under a matrix descriptor, and which accumulator element each thread of a warpgroup holds."""

from __future__ import annotations

import ctypes

import torch

# ---- the layouts, from the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate") ----------
SWIZZLE_WIDTH = {0: 16, 1: 128, 2: 64, 3: 32}  # descriptor mode -> bytes per swizzle row (none: core matrix)
SWIZZLE_BITS = {0: 0, 1: 3, 2: 2, 3: 1}


def swizzle(offset: int, mode: int) -> int:
    """Swizzle<b,4,3>: the 16-byte chunk bits [4, 4+b) XOR bits [7, 7+b) of the byte offset."""
    b = SWIZZLE_BITS[mode]
    return offset ^ (((offset >> 7) & ((1 << b) - 1)) << 4)


def element_offset(row: int, k: int, mode: int, mn_major: bool, lbo: int, sbo: int) -> int:
    """Byte offset (from a 1024-aligned start) of element (row, k); row is M of A or N of B."""
    if mode == 0:  # 8 x 16-byte core matrices of 128 contiguous bytes
        inner_row, inner_col = (k % 8, row % 8) if mn_major else (row % 8, k % 8)
        return (row // 8) * sbo + (k // 8) * lbo + inner_row * 16 + 2 * inner_col
    width = SWIZZLE_WIDTH[mode]
    if mn_major:  # rows of `width` bytes along MN, one per k; k groups of 8 rows SBO apart
        per_row = width // 2
        plain = (row // per_row) * lbo + (k // 8) * sbo + (k % 8) * width + 2 * (row % per_row)
    else:  # rows of `width` bytes along K, one per M/N index; groups of 8 rows SBO apart
        plain = (row // 8) * sbo + (row % 8) * width + 2 * k
    return swizzle(plain, mode)


def place(
    image: bytearray, base: int, matrix: torch.Tensor, mode: int, mn_major: bool, lbo: int, sbo: int
) -> None:
    """Write `matrix` (rows x k, 16-bit) into `image` at `base` in the given canonical layout."""
    raw = matrix.contiguous().view(torch.int16).tolist()
    for r, line in enumerate(raw):
        for k, v in enumerate(line):
            at = base + element_offset(r, k, mode, mn_major, lbo, sbo)
            image[at : at + 2] = (v & 0xFFFF).to_bytes(2, "little")


def accumulator_position(thread: int, i: int) -> tuple[int, int]:
    """(row, column) of accumulator register i of warpgroup thread `thread` in D (m64nN, fp32)."""
    warp, lane = divmod(thread, 32)
    g, q = divmod(lane, 4)
    return 16 * warp + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * q + (i % 2)


def a_fragment(a: torch.Tensor) -> torch.Tensor:
    """The 4 u32 registers of A (64 x 16, 16-bit) per warpgroup thread, (128, 4) int32, low half = lower k."""
    bits = a.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    out = torch.zeros(128, 4, dtype=torch.int32)
    for t in range(128):
        warp, lane = divmod(t, 32)
        g, q = divmod(lane, 4)
        for i in range(4):
            row, k = 16 * warp + g + 8 * (i % 2), 2 * q + 8 * (i // 2)
            out[t, i] = bits[row, k] | (bits[row, k + 1] << 16)
    return out


def gather_d(out: torch.Tensor, n: int) -> torch.Tensor:
    """D (64 x n) from the per-thread accumulators `out` (128, n / 2)."""
    d = torch.full((64, n), float("nan"))
    for t in range(128):
        for i in range(n // 2):
            d[accumulator_position(t, i)] = out[t, i]
    return d


# ---- the kernel ----------------------------------------------------------------------------------------
# Faults a test switches on (Args.faults) to show the rule that catches each.
NO_FENCE = 1  # no wgmma.fence before the first wgmma
READ_EARLY = 2  # a plain read of an accumulator between the commit and the wait
NO_WAIT = 4  # no wgmma.wait_group at all
WRITE_PENDING = 8  # a store to shared memory the pending wgmma reads
WRITE_AFTER_FENCE = 16  # an ordinary write of an accumulator between the fence and the wgmma
HALF_WARPGROUP = 32  # only warps 0 and 1 run the wgmma

WGMMA_SOURCE = r"""
#include "hopper.cuh"
using namespace fa::sm90;
using fa::u32;
using fa::u64;

struct Args {
  const unsigned char* image;  // the shared-memory image of A and B, copied in with plain stores
  float* out;                  // 128 threads x WN / 2 accumulators
  const u32* a_frag;           // A in registers: ksteps x 128 threads x 4
  u64 desc_a, desc_b;          // descriptors with start address 0 (the kernel adds the tile's)
  u32 image_bytes, off_a, off_b, step_a, step_b, ksteps, trans_a, trans_b, a_in_regs, faults;
};

template <int TA, int TB>
__device__ void mma_step(float (&d)[WN / 2], const Args& a, u32 base, u32 s) {
  const u64 da = a.desc_a + ((base + a.off_a + s * a.step_a) >> 4);
  const u64 db = a.desc_b + ((base + a.off_b + s * a.step_b) >> 4);
  if (a.a_in_regs) {
    u32 frag[4];
    for (int i = 0; i < 4; ++i) frag[i] = a.a_frag[(s * 128 + threadIdx.x) * 4 + i];
    Wgmma<WN>::template rs<TB>(d, frag, db, s > 0 ? 1 : 0);
  } else {
    Wgmma<WN>::template ss<TA, TB>(d, da, db, s > 0 ? 1 : 0);
  }
}

extern "C" __global__ void wgmma_kernel(const void* p) {
  const Args& a = *static_cast<const Args*>(p);
  extern __shared__ __align__(1024) unsigned char smem[];
  for (u32 i = threadIdx.x * 4; i < a.image_bytes; i += blockDim.x * 4) {
    *reinterpret_cast<u32*>(smem + i) = *reinterpret_cast<const u32*>(a.image + i);
  }
  __syncthreads();
  if ((a.faults & 32) && threadIdx.x >= 64) return;
  const u32 base = smem_addr(smem);
  float d[WN / 2];
  for (int i = 0; i < WN / 2; ++i) d[i] = 0.f;
  fence_acc(d);
  if (!(a.faults & 1)) wgmma_fence();
  if (a.faults & 16) d[0] = 1.f;
  for (u32 s = 0; s < a.ksteps; ++s) {
    if (a.trans_a) {
      a.trans_b ? mma_step<1, 1>(d, a, base, s) : mma_step<1, 0>(d, a, base, s);
    } else {
      a.trans_b ? mma_step<0, 1>(d, a, base, s) : mma_step<0, 0>(d, a, base, s);
    }
  }
  wgmma_commit();
  if (a.faults & 2) a.out[threadIdx.x] = d[1];
  if (a.faults & 8) *reinterpret_cast<u32*>(smem + a.off_b) = 0;
  if (a.faults & 4) return;
  wgmma_wait<0>();
  fence_acc(d);
  for (int i = 0; i < WN / 2; ++i) a.out[threadIdx.x * (WN / 2) + i] = d[i];
}
"""


class WgmmaArgs(ctypes.Structure):
    _fields_ = [
        ("image", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("a_frag", ctypes.c_void_p),
        ("desc_a", ctypes.c_uint64),
        ("desc_b", ctypes.c_uint64),
        *[
            (name, ctypes.c_uint32)
            for name in (
                "image_bytes",
                "off_a",
                "off_b",
                "step_a",
                "step_b",
                "ksteps",
                "trans_a",
                "trans_b",
                "a_in_regs",
                "faults",
            )
        ],
    ]


def descriptor(lbo: int, sbo: int, mode: int) -> int:
    """A matrix descriptor with start address 0 (hopper.cuh make_desc's fields)."""
    return ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | mode << 62


# ---- a TMA + mbarrier pipeline: one producer warpgroup, two consumer warpgroups ---------------------------
WRONG_PARITY = 1  # consumers wait on the other parity of the full barrier
NO_EXPECT_TX = 2  # the producer arrives without expect_tx before its TMA
EXTRA_ARRIVE = 4  # the producer arrives twice on the full barrier (its count is 1)
NO_CONSUMER_WAIT = 8  # consumers read the stage without waiting on its full barrier
NO_REG_DEC = 16  # the producer keeps its registers; the consumers' setmaxnreg.inc cannot be met
SPLIT_REG_COUNT = 32  # one consumer warp asks a different register count

PIPELINE_SOURCE = r"""
#include "hopper.cuh"
using namespace fa::sm90;
using fa::u32;

struct Args {
  const CUtensorMap* map;  // rows x cols of 16-bit elements, box BOX_ROWS x BOX_COLS
  unsigned char* out;      // 2 consumers x tiles x stage bytes: what each consumer read of each stage
  u32 tiles, faults;
};

constexpr u32 kStages = 2;
constexpr u32 kStageBytes = BOX_ROWS * BOX_COLS * 2;

extern "C" __global__ void pipeline_kernel(const void* p) {
  const Args& a = *static_cast<const Args*>(p);
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = smem_addr(smem);
  const u32 full = base + kStages * kStageBytes, empty = full + 8 * kStages;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (u32 s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 256);
    }
    fence_mbar_init();
  }
  __syncthreads();
  if (wg == 0) {  // the producer: one elected thread of warp 0 issues the loads
    if (!(a.faults & 16)) setmaxnreg_dec<24>();
    if (threadIdx.x < 32 && elect_one()) {
      prefetch_tensormap(a.map);
      for (u32 t = 0; t < a.tiles; ++t) {
        const u32 s = t % kStages, n = t / kStages;
        mbar_wait(empty + 8 * s, (n & 1) ^ 1);
        if (a.faults & 2) {
          mbar_arrive(full + 8 * s);
        } else {
          mbar_arrive_expect_tx(full + 8 * s, kStageBytes);
        }
        if (a.faults & 4) mbar_arrive(full + 8 * s);
        tma_load_2d(base + s * kStageBytes, a.map, full + 8 * s, 0, static_cast<int>(t * BOX_ROWS));
      }
    }
    return;
  }
  if ((a.faults & 32) && threadIdx.x >= 352) {
    setmaxnreg_inc<232>();
  } else {
    setmaxnreg_inc<240>();
  }
  const u32 me = threadIdx.x - 128 * wg;
  for (u32 t = 0; t < a.tiles; ++t) {
    const u32 s = t % kStages, n = t / kStages;
    if (!(a.faults & 8)) mbar_wait(full + 8 * s, (a.faults & 1) ? (n & 1) ^ 1 : n & 1);
    unsigned char* dst = a.out + ((wg - 1) * a.tiles + t) * kStageBytes;
    for (u32 i = me * 4; i < kStageBytes; i += 128 * 4) {
      *reinterpret_cast<u32*>(dst + i) = *reinterpret_cast<const u32*>(smem + s * kStageBytes + i);
    }
    mbar_arrive(empty + 8 * s);
  }
}
"""


class PipelineArgs(ctypes.Structure):
    _fields_ = [
        ("map", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("tiles", ctypes.c_uint32),
        ("faults", ctypes.c_uint32),
    ]


CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6  # the driver's CUtensorMapDataType
CU_TENSOR_MAP_SWIZZLE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}  # CUtensorMapSwizzle


def tma_box_image(x: torch.Tensor, row0: int, rows: int, cols: int, pattern: str) -> torch.Tensor:
    """The shared-memory bytes a TMA writes for the box of `x` (rows x cols at (row0, 0)) at a 1024-aligned
    address: rows of cols elements, out-of-bounds elements zero, 16-byte chunks swizzled per row."""
    box = torch.zeros(rows, cols, dtype=x.dtype)
    avail = x[row0 : row0 + rows, :cols]
    box[: avail.shape[0], : avail.shape[1]] = avail
    raw = box.contiguous().view(torch.uint8).reshape(-1)
    out = torch.empty_like(raw)
    row_bytes = cols * x.element_size()
    mode = {"none": 0, "32B": 3, "64B": 2, "128B": 1}[pattern]  # as a descriptor mode, for swizzle()
    for offset in range(0, raw.numel(), 16):
        dst = swizzle(offset, mode) if mode else offset
        out[dst : dst + 16] = raw[offset : offset + 16]
    assert row_bytes % 16 == 0
    return out
