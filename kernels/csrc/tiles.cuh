// Named shared-memory tiles and the fragment loads that read them, shared by fwd.cu and bwd.cu.
//
// A tile is ROWS x COLS elements, row-major, in one of two layouts; both keep ldmatrix free of bank
// conflicts at every head dim (bench/kernels/smem_banks.py counts them on the CPU emulator).
//
// Swizzled (the forward's): unpadded (ROWS * COLS * 2 bytes), its 16-byte chunks XOR-permuted. Take
// the tile as one run of chunks, chunk L = row * C + col / 8 with C = COLS / 8 chunks per row; chunk L
// is stored at L ^ key(row), which moves it only inside its aligned group of 8 chunks (128 bytes: the
// 32 banks):
//   - a row-wise copy's quarter-warp writes 8 consecutive chunks, an aligned group: a permutation of
//     the 32 banks whatever the key, so the copies are conflict-free at every width too;
//   - an ldmatrix phase (and an accumulator fragment's 4-byte stores) reads one chunk column of 8
//     consecutive rows r0..r0+7 (r0 a multiple of 8). With C a multiple of 8 every row starts at bank
//     0 and key = row & 7 spreads the 8 rows over the 8 bank quads. With C = 4 mod 8 (widths 32, 96,
//     160, 224) odd rows start half a group later (bank quad + 4) and key = (row >> 1) & 3 spreads
//     each row pair's 4 remaining choices: again 8 distinct quads.
// This is also the 128-byte swizzle TMA and wgmma read, for the sm90 paths to come.
//
// Padded (the backward's default): each row padded by 8 elements (16 B). With COLS a multiple of 32
// the row pitch is an odd number of 16-byte chunks, so the 8 rows of an ldmatrix phase fall in 8
// different bank quads; the row-wise copies of widths 32, 96, 160 and 224 take 2, 1.33, 1.2 and 1.14
// times the conflict-free wavefronts (a quarter-warp spans two rows). The backward picks per tile
// (tiles.py BwdTile.swizzled, bwd.cu FA_BWD_SWIZZLE): the swizzle's XOR costs ptxas registers its
// five accumulators may not have (swizzled, sm80's 32 x 64 d192 and 64 x 32 d256 spilled 28 and 4
// bytes with NVRTC 12.9, padded none), and it saves the padding's shared memory, which is what fits
// FA2's V-in-registers tiles on the 99 KB parts at d192 and d256 (98,816 B swizzled; padded 102,912
// and 101,888, over the 101,376 B limit).
//
// Fragment loads return registers in the mma layouts documented in primitives.cuh.
#ifndef FA_TILES_CUH_
#define FA_TILES_CUH_

#include "params.h"
#include "primitives.cuh"

namespace fa {

template <int ROWS, int COLS, bool SWIZZLED = true>
struct SmemTile {
  static_assert(COLS % 32 == 0, "tile width must be a multiple of 32 elements (bank-conflict-free layouts)");
  static_assert(ROWS % 16 == 0, "tile height must be a multiple of 16 rows (one mma step)");
  static constexpr int kRows = ROWS;
  static constexpr int kCols = COLS;
  static constexpr int kChunks = COLS / 8;                   // 16-byte chunks of a row's elements
  static constexpr int kPitch = SWIZZLED ? COLS : COLS + 8;  // elements per row in shared memory
  static constexpr int kBytes = ROWS * kPitch * 2;

  u32 base;  // shared-state-space address of element (0, 0)

  // The XOR key of a swizzled row's chunks (the header says why these spread every access over the
  // banks).
  FA_DEVICE static int swizzle_key(int row) { return kChunks % 8 == 0 ? (row & 7) : ((row >> 1) & 3); }

  // Swizzled: chunk L = row * kChunks + c moves to L ^ key; the key (< 8, and < 4 where a row starts
  // mid-group) touches only bits of L that row * kChunks leaves clear, so that is row * kChunks +
  // (c ^ key), which lets ptxas keep the row part and the k step's chunk apart.
  FA_DEVICE u32 at(int row, int col) const {
    if (!SWIZZLED) return base + static_cast<u32>((row * kPitch + col) * 2);
    const int chunk = row * kChunks + ((col >> 3) ^ swizzle_key(row));
    return base + static_cast<u32>(chunk * 16 + (col & 7) * 2);
  }
};

// Global -> shared copy of a whole tile by THREADS cooperating threads, 16 B per copy (cp.async on
// sm80+, register-staged on sm75; see copy16_async). Element (r, c) comes from
// gmem[r * row_stride + c]; rows >= valid_rows and columns >= valid_cols (a multiple of 8) are
// zero-filled. The caller commits (copy_commit) and waits (copy_wait + __syncthreads).
template <int THREADS, int ROWS, int COLS, bool SW>
FA_DEVICE void load_tile_async(SmemTile<ROWS, COLS, SW> tile, const u16* gmem, fa_i64 row_stride,
                               int valid_rows, int valid_cols, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
  // A rolled loop on sm80+: cp.async returns at once, and an unrolled one made ptxas precompute
  // every copy's addresses up front (spills in the d256 kernels). On sm75 the copy is a real load:
  // unroll a little so several are in flight.
#if FA_HAS_CP_ASYNC
#pragma unroll 1
#else
#pragma unroll 4
#endif
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * THREADS;
    if (kChunks % THREADS != 0 && i >= kChunks) break;
    const int row = i / kChunksPerRow;
    const int col = (i % kChunksPerRow) * 8;
    const bool ok = row < valid_rows && col < valid_cols;
    // A skipped copy still needs a mapped address: point it at the tile's first element.
    const u16* src = ok ? gmem + row * row_stride + col : gmem;
    copy16_async(tile.at(row, col), src, ok);
  }
}

// Shared -> global copy of a whole tile (16 B per store), skipping rows >= valid_rows and columns
// >= valid_cols. The caller synchronizes the writers of the tile first.
template <int THREADS, int ROWS, int COLS, bool SW>
FA_DEVICE void store_tile(u16* gmem, fa_i64 row_stride, SmemTile<ROWS, COLS, SW> tile, int valid_rows,
                          int valid_cols, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * THREADS;
    if (kChunks % THREADS != 0 && i >= kChunks) break;
    const int row = i / kChunksPerRow;
    const int col = (i % kChunksPerRow) * 8;
    if (row < valid_rows && col < valid_cols) {
      st_global16(gmem + row * row_stride + col, ld_shared16(tile.at(row, col)));
    }
  }
}

// A operand (16 x 16, row-major) from a tile stored [m][k]: rows m0.., columns k0...
template <int ROWS, int COLS, bool SW>
FA_DEVICE void load_a_frag(u32 (&a)[4], SmemTile<ROWS, COLS, SW> tile, int m0, int k0, int lane) {
  ldmatrix_x4(a, tile.at(m0 + (lane & 15), k0 + (lane >> 4) * 8));
}

// A operand (16 x 16) from a tile stored transposed, [k][m] (e.g. P^T or dS^T in the backward).
template <int ROWS, int COLS, bool SW>
FA_DEVICE void load_a_frag_trans(u32 (&a)[4], SmemTile<ROWS, COLS, SW> tile, int m0, int k0, int lane) {
  const int mat = lane >> 3;
  ldmatrix_x4_trans(a, tile.at(k0 + (mat >> 1) * 8 + (lane & 7), m0 + (mat & 1) * 8));
}

// B operands of two adjacent 8-column n-tiles (n0 and n0 + 8) for one k16 step, from a tile stored
// [n][k] (K in S = Q K^T): b[0], b[1] serve n-tile n0; b[2], b[3] serve n-tile n0 + 8.
template <int ROWS, int COLS, bool SW>
FA_DEVICE void load_b_frag_pair(u32 (&b)[4], SmemTile<ROWS, COLS, SW> tile, int n0, int k0, int lane) {
  const int mat = lane >> 3;
  ldmatrix_x4(b, tile.at(n0 + (mat >> 1) * 8 + (lane & 7), k0 + (mat & 1) * 8));
}

// The same from a tile stored [k][n] (V in O = P V), through ldmatrix.trans.
template <int ROWS, int COLS, bool SW>
FA_DEVICE void load_b_frag_pair_trans(u32 (&b)[4], SmemTile<ROWS, COLS, SW> tile, int n0, int k0, int lane) {
  const int mat = lane >> 3;
  ldmatrix_x4_trans(b, tile.at(k0 + (mat & 1) * 8 + (lane & 7), n0 + (mat >> 1) * 8));
}

// The A operand of the next mma from two fp32 accumulator n-tiles (keys k0..k0+7 and k0+8..k0+15):
// the FA2 trick that keeps P in registers for O += P V (C layout of n-tiles 2k, 2k+1 == A layout).
FA_DEVICE void acc_to_a_frag(u32 (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = pack_float2(c_lo[0], c_lo[1]);
  a[1] = pack_float2(c_lo[2], c_lo[3]);
  a[2] = pack_float2(c_hi[0], c_hi[1]);
  a[3] = pack_float2(c_hi[2], c_hi[3]);
}

// Write one fp32 accumulator n-tile (rows m0 + g, m0 + g + 8; columns n0 + 2t, +1) into a tile as
// elements, scaled per row; used to stage outputs for coalesced 16-byte global stores.
template <int ROWS, int COLS, bool SW>
FA_DEVICE void store_acc_frag(SmemTile<ROWS, COLS, SW> tile, const float (&c)[4], int m0, int n0,
                              float scale_row_lo, float scale_row_hi, int lane) {
  const int g = lane >> 2, t = lane & 3;
  st_shared32(tile.at(m0 + g, n0 + 2 * t), pack_float2(c[0] * scale_row_lo, c[1] * scale_row_lo));
  st_shared32(tile.at(m0 + g + 8, n0 + 2 * t), pack_float2(c[2] * scale_row_hi, c[3] * scale_row_hi));
}

// Visits the fp32 accumulators one lane holds of a warp's GRID::kMT x GRID::kNT n-tiles at (m0, n0),
// two adjacent columns at a time: f(row, col, i, j, e) for the pair acc[i][j][e], acc[i][j][e + 1] at
// (row, col) and (row, col + 1). This is the C layout of mma.m16n8k16: rows m0 + 16i + g and + 8,
// columns n0 + 8j + 2t.
template <class GRID, class F>
FA_DEVICE void for_each_acc_pair(int m0, int n0, int lane, F&& f) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < GRID::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < GRID::kNT; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) f(m0 + i * 16 + g + hh * 8, n0 + j * 8 + 2 * t, i, j, 2 * hh);
    }
  }
}

}  // namespace fa

#endif  // FA_TILES_CUH_
