// The launch geometry of one entry: its grid from the problem (FaParams) and the entry's launch numbers
// (tiles.py, through the wheel manifest). launch.cpp launches with it, and the CPU emulator
// (tests/emu/emu_runtime.cpp) compiles this same header and asks it for every grid it runs, so the
// emulated launches are the binding's. Header-only and dependency-free (params.h only): the caller
// turns a status into its own error.
#ifndef FA_BINDING_GEOMETRY_H_
#define FA_BINDING_GEOMETRY_H_

#include <cstdint>

#include "params.h"

namespace fa_geometry {

// Grid codes of an entry (fa_attn/runtime/decision.py GRID_CODES, docs/contracts.md section 2).
constexpr int kGridQBlocks = 0;        // "q_blocks": blocks over the query rows
constexpr int kGridKBlocks = 1;        // "k_blocks": blocks over the key rows
constexpr int kGridQBlocksSplits = 2;  // "q_blocks_splits": q blocks times params.num_splits

// A grid's y and z dimensions hold at most 65,535 blocks each (x: 2^31 - 1).
constexpr int64_t kGridYZLimit = 65535;

enum class Status {
  kOk,
  kEmpty,         // nothing to launch (an empty sequence, no batch or no head): a zero grid is an error
  kNoBlockSize,   // the entry's block or thread count is not positive
  kBadPairs,      // fold of batch or heads <= 0
  kTooManyPairs,  // more (batch, head) pairs than limit x limit blocks
};

struct PairGrid {
  unsigned y, z;
};

// The grid's y and z extents for batch x heads (batch, head) pairs: (batch, heads) when both fit,
// else the pairs folded over y and z (y * z >= batch * heads; the kernels' locate_block, in
// kernels/csrc/attention.cuh, unfolds them and returns from blocks past the last pair).
inline Status fold_batch_heads(int64_t batch, int64_t heads, int64_t limit, PairGrid* out) {
  if (!(batch > 0 && heads > 0 && limit > 0)) return Status::kBadPairs;
  if (batch <= limit && heads <= limit) {
    *out = PairGrid{static_cast<unsigned>(batch), static_cast<unsigned>(heads)};
    return Status::kOk;
  }
  // The fewest z rows that hold the pairs, then the fewest y columns for those rows: at most z - 1
  // blocks past the last pair, which return at once.
  const int64_t pairs = batch * heads;  // both < 2^31 (int32 in FaParams): no overflow
  const int64_t z = (pairs + limit - 1) / limit;
  const int64_t y = (pairs + z - 1) / z;
  if (z > limit) return Status::kTooManyPairs;
  *out = PairGrid{static_cast<unsigned>(y), static_cast<unsigned>(z)};
  return Status::kOk;
}

// One launch: grid, threads per block and dynamic shared memory.
struct Launch {
  unsigned grid_x, grid_y, grid_z;
  unsigned threads;
  int smem_bytes;
};

// The launch of an entry with launch numbers (threads, block_m, block_n, smem_bytes, grid code) on
// the problem `p`: blocks over the query or key rows [times num_splits], then the (batch, head)
// pairs over y and z (folded past `limit`).
inline Status entry_launch(int threads, int block_m, int block_n, int smem_bytes, int grid, const FaParams& p,
                           int64_t limit, Launch* out) {
  const bool by_keys = grid == kGridKBlocks;
  const int64_t rows = by_keys ? p.seqlen_k : p.seqlen_q;
  const int64_t block = by_keys ? block_n : block_m;
  if (!(block > 0 && threads > 0)) return Status::kNoBlockSize;
  const int64_t splits = grid == kGridQBlocksSplits ? p.num_splits : 1;
  const unsigned grid_x = static_cast<unsigned>((rows + block - 1) / block * splits);
  if (grid_x == 0 || p.batch == 0 || p.heads == 0) return Status::kEmpty;
  PairGrid pairs{0, 0};
  const Status folded = fold_batch_heads(p.batch, p.heads, limit, &pairs);
  if (folded != Status::kOk) return folded;
  *out = Launch{grid_x, pairs.y, pairs.z, static_cast<unsigned>(threads), smem_bytes};
  return Status::kOk;
}

}  // namespace fa_geometry

#endif  // FA_BINDING_GEOMETRY_H_
