// The pieces of the attention algorithm that fwd.cu (and its split-KV form) and bwd.cu share:
//   Seq, locate     where one (batch, query head) lives: its lengths and first rows
//   KvRows          where a block of keys starts in K or V (through the page table of a paged cache)
//   Band            which keys a query row sees (causal, sliding window, sequence ends), and so
//                   which key blocks a query block visits and which query blocks a key block meets
//   WarpGrid        how a block's warps split an M x N GEMM result into whole mma tiles
//   warp_gemm       acc += A B for one warp's rectangle, A from shared memory or from registers
#ifndef FA_ATTENTION_CUH_
#define FA_ATTENTION_CUH_

#include "params.h"
#include "primitives.cuh"
#include "tiles.cuh"

namespace fa {

// ---------------------------------------------------------------------------------------------
// Where one (batch, query head) lives
// ---------------------------------------------------------------------------------------------

// Offsets of one sequence of one head in every tensor of FaParams. A q-side tensor (q, o, dout,
// dq) holds its row r at base + q_batch * batch_stride + (q_row0 + r) * row_stride + head *
// head_stride; k and v the same with k_batch, k_row0 and kv_head (or through k_pages, KvRows); dk
// and dv (per query head) with k_batch, k_row0 and head. Per-row fp32 arrays (lse, and the split-KV
// partials) index row r at lse_row0 + r.
//
// The KV-cache layouts (params.h) all land here: seqused_k sets seqlen_k, leftpad_k moves k_row0 and
// shortens seqlen_k, kv_batch_idx sets k_batch, and block_table gives k_pages (k_batch = k_row0 = 0).
struct Seq {
  int head, kv_head;
  int q_batch, k_batch;  // 0 for packed (varlen) or paged tensors, whose batch strides are not rows
  int seqlen_q, seqlen_k;
  fa_i64 q_row0, k_row0;  // first row of the sequence (packed offset, plus leftpad_k on the k side)
  const fa_i32* k_pages;  // this sequence's row of block_table; null when k/v are not paged
  fa_i64 lse_row0;        // lse (batch, heads, seqlen_q) or varlen (heads, total_q)
  fa_i64 lse_rows;        // rows of lse in all: batch * heads * seqlen_q, or heads * total_q
  fa_i64 dsum_row0;       // dsoftmax_sum (batch, heads, seqlen_q_rounded), varlen as lse
  fa_i64 acc_row0;        // dq_accum row of query row 0, a multiple of 16: (batch, seqlen_q_rounded), or
                          // varlen round_up(q_row0, 16) + 16 * batch index (bwd.cu dq_index)
};

FA_DEVICE Seq locate(const FaParams& p, int b, int h) {
  Seq s;
  s.head = h;
  s.kv_head = h / (p.heads / p.heads_k);
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[b];
    const fa_i64 total_q = p.cu_seqlens_q[p.batch];
    s.q_batch = 0;
    s.seqlen_q = p.cu_seqlens_q[b + 1] - start;
    s.q_row0 = start;
    s.lse_row0 = h * total_q + start;
    s.lse_rows = p.heads * total_q;
    s.dsum_row0 = s.lse_row0;
    s.acc_row0 = (start + 15) / 16 * 16 + 16 * b;
  } else {
    const fa_i64 bh = static_cast<fa_i64>(b) * p.heads + h;
    s.q_batch = b;
    s.seqlen_q = p.seqlen_q;
    s.q_row0 = 0;
    s.lse_row0 = bh * p.seqlen_q;
    s.lse_rows = static_cast<fa_i64>(p.batch) * p.heads * p.seqlen_q;
    s.dsum_row0 = bh * p.seqlen_q_rounded;
    s.acc_row0 = static_cast<fa_i64>(b) * p.seqlen_q_rounded;
  }
  // Keys [first, end) of the sequence's rows (or pages); the sequence's key 0 is row `first`.
  const int first = p.leftpad_k != nullptr ? p.leftpad_k[b] : 0;
  int end;
  s.k_pages = nullptr;
  if (p.cu_seqlens_k != nullptr) {
    s.k_batch = 0;
    s.k_row0 = p.cu_seqlens_k[b];
    end = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.k_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
    s.k_row0 = 0;
    end = p.seqlen_k;
  }
  if (p.block_table != nullptr) {  // pages hold the keys from key 0 on (no leftpad_k)
    s.k_batch = 0;
    s.k_row0 = 0;
    s.k_pages = p.block_table + b * p.block_table_batch_stride;
  }
  if (p.seqused_k != nullptr) end = p.seqused_k[b];
  s.k_row0 += first;
  s.seqlen_k = end - first;
  return s;
}

// The (batch, query head) pair of this block. A grid holds at most 65,535 blocks in y and in z, so
// the binding folds the batch x heads pairs over both (launch.cpp fold_batch_heads): pair i =
// blockIdx.y + gridDim.y * blockIdx.z is batch i % batch, head i / batch. Unfolded (gridDim.y ==
// batch, gridDim.z == heads) that is blockIdx.y and blockIdx.z. A folded grid's last z row can run
// past the last pair: those blocks have no pair (has_pair) and every kernel returns at once.
FA_DEVICE unsigned pair_index() { return blockIdx.y + gridDim.y * blockIdx.z; }  // < 65535^2 < 2^32

FA_DEVICE bool has_pair(const FaParams& p) {
  return pair_index() < static_cast<unsigned>(p.batch) * static_cast<unsigned>(p.heads);
}

FA_DEVICE Seq locate_block(const FaParams& p) {
  // Unfolded (gridDim.y == batch only then): the same pair without the division, which costs ptxas
  // 11.8 the registers that made sm90's d256 fp16 backward spill.
  if (gridDim.y == static_cast<unsigned>(p.batch)) return locate(p, blockIdx.y, blockIdx.z);
  const unsigned i = pair_index(), batch = static_cast<unsigned>(p.batch);
  return locate(p, static_cast<int>(i % batch), static_cast<int>(i / batch));
}

// Row 0 of this sequence and head in a q-side tensor (q, o, dout, dq).
template <class T>
FA_DEVICE T* q_rows(T* base, fa_i64 batch_stride, fa_i64 row_stride, fa_i64 head_stride, const Seq& s) {
  return base + s.q_batch * batch_stride + s.q_row0 * row_stride + s.head * head_stride;
}

// Row 0 in a key-side tensor read per kv head (k, v) or written per query head (dk, dv).
template <class T>
FA_DEVICE T* k_rows(T* base, fa_i64 batch_stride, fa_i64 row_stride, fa_i64 head_stride, const Seq& s,
                    int head) {
  return base + s.k_batch * batch_stride + s.k_row0 * row_stride + head * head_stride;
}

// The keys (or values) of one sequence and kv head, by key block: the one place key blocks are
// addressed. A paged cache's pages hold a multiple of the key block (the binding checks), so a whole
// key block lies in one page.
struct KvRows {
  const u16* base;       // key 0; paged: row 0 of page 0, at this kv head
  fa_i64 row_stride;
  const fa_i32* pages;   // the sequence's row of block_table; null: rows follow each other
  fa_i64 page_stride;    // elements from one page to the next (k/v's batch stride)
  int page_size;         // keys per page

  FA_DEVICE const u16* rows(int key0) const {
    if (pages == nullptr) return base + key0 * row_stride;
    return base + pages[key0 / page_size] * page_stride + (key0 % page_size) * row_stride;
  }
};

// KvRows of k or v (base and strides from FaParams) for sequence s.
FA_DEVICE KvRows kv_rows(const FaParams& p, const Seq& s, const void* base, fa_i64 batch_stride, fa_i64 row_stride,
                         fa_i64 head_stride) {
  return KvRows{k_rows(static_cast<const u16*>(base), batch_stride, row_stride, head_stride, s, s.kv_head),
                row_stride, s.k_pages, batch_stride, p.page_block_size};
}

// ---------------------------------------------------------------------------------------------
// Which keys a query row sees
// ---------------------------------------------------------------------------------------------

struct Range {
  int begin, end;  // [begin, end); empty when end <= begin
};

// Query row i sees key j iff j < seqlen_k and i + diag - left <= j <= i + diag + right, with diag =
// seqlen_k - seqlen_q (bottom-right alignment); a side < 0 is unbounded. Causal is right = 0.
struct Band {
  int diag, left, right;

  // The band of one sequence. A window side wider than both sequences is the same as unbounded;
  // folding it to -1 keeps the index arithmetic far from int overflow.
  FA_DEVICE static Band of(const FaParams& p, int seqlen_q, int seqlen_k) {
    const int no_limit = seqlen_q + seqlen_k;
    const int right = p.is_causal ? 0 : p.window_right;
    return Band{seqlen_k - seqlen_q, p.window_left >= no_limit ? -1 : p.window_left, right >= no_limit ? -1 : right};
  }

  FA_DEVICE int first(int row) const { return left < 0 ? 0 : row + diag - left; }
  FA_DEVICE int last(int row, int seqlen_k) const {
    return right < 0 ? seqlen_k - 1 : min(seqlen_k - 1, row + diag + right);
  }
  FA_DEVICE bool visible(int row, int key, int seqlen_q, int seqlen_k) const {
    return row < seqlen_q && key < seqlen_k && (right < 0 || key <= row + diag + right) &&
           (left < 0 || key >= row + diag - left);
  }

  // Key blocks holding every key that some row of [row0, row0 + rows) sees.
  FA_DEVICE Range key_blocks(int row0, int rows, int block_n, int seqlen_q, int seqlen_k) const {
    Range r{0, (seqlen_k + block_n - 1) / block_n};
    if (right >= 0) {
      const int last_key = min(row0 + rows, seqlen_q) - 1 + diag + right;
      r.end = min(r.end, last_key < 0 ? 0 : last_key / block_n + 1);
    }
    if (left >= 0) {
      const int first_key = row0 + diag - left;
      r.begin = first_key <= 0 ? 0 : first_key / block_n;
    }
    return r;
  }

  // Query blocks holding every row that sees some key of [key0, key0 + keys).
  FA_DEVICE Range query_blocks(int key0, int keys, int block_m, int seqlen_q, int seqlen_k) const {
    Range r{0, (seqlen_q + block_m - 1) / block_m};
    if (left >= 0) {
      const int last_row = min(key0 + keys, seqlen_k) - 1 - diag + left;
      r.end = min(r.end, last_row < 0 ? 0 : last_row / block_m + 1);
    }
    if (right >= 0) {
      const int first_row = key0 - diag - right;
      r.begin = first_row <= 0 ? 0 : first_row / block_m;
    }
    return r;
  }

  // Whether the block [row0, row0 + rows) x [key0, key0 + keys) has an element some mask hides.
  FA_DEVICE bool crosses(int row0, int rows, int key0, int keys, int seqlen_k) const {
    return key0 + keys > seqlen_k || (right >= 0 && key0 + keys - 1 > row0 + diag + right) ||
           (left >= 0 && key0 < row0 + rows - 1 + diag - left);
  }
};

// ---------------------------------------------------------------------------------------------
// Warp tiling of a block GEMM
// ---------------------------------------------------------------------------------------------

// An M x N result split over WARPS warps as a WM x (WARPS / WM) grid; each warp owns kTM x kTN, whole
// 16 x 8 mma tiles (kMT x kNT of them).
template <int M, int N, int WARPS, int WM>
struct WarpGrid {
  static constexpr int kWM = WM;
  static constexpr int kWN = WARPS / WM;
  static constexpr int kTM = M / kWM;
  static constexpr int kTN = N / kWN;
  static constexpr int kMT = kTM / 16;
  static constexpr int kNT = kTN / 8;
  static_assert(WM > 0 && WARPS % WM == 0 && M % (16 * kWM) == 0 && N % (8 * kWN) == 0,
                "this tile shape cannot be split into whole mma tiles over the warps");

  FA_DEVICE static int row0(int warp) { return (warp / kWN) * kTM; }
  FA_DEVICE static int col0(int warp) { return (warp % kWN) * kTN; }
};

// The rows-split of an M x N result over WARPS warps that reads the fewest ldmatrix bytes per mma:
// per 16-deep k step a warp loads kMT A fragments (512 B each) and kNT / 2 B fragment pairs (512 B),
// for kMT * kNT mmas, i.e. 512 / kNT + 256 / kMT bytes per mma. Ties go to more row splits (fewer A
// registers). 0 when no split gives whole mma tiles (WarpGrid's static_assert then says so).
template <int M, int N, int WARPS>
__device__ constexpr int fewest_bytes_rows_split() {
  int best = 0;
  long best_num = 0, best_den = 1;
  for (int wm = WARPS; wm >= 1; --wm) {
    if (WARPS % wm != 0 || M % (16 * wm) != 0 || N % (8 * (WARPS / wm)) != 0) continue;
    const long mt = M / wm / 16, nt = N / (WARPS / wm) / 8;
    const long num = 512 * mt + 256 * nt, den = mt * nt;  // bytes per mma = num / den
    if (best == 0 || num * best_den < best_num * den) best = wm, best_num = num, best_den = den;
  }
  return best;
}

template <int M, int N, int WARPS>
using FewestBytesGrid = WarpGrid<M, N, WARPS, fewest_bytes_rows_split<M, N, WARPS>()>;

template <class G>
FA_DEVICE void zero(float (&acc)[G::kMT][G::kNT][4]) {
#pragma unroll
  for (int i = 0; i < G::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < G::kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Warp GEMM: acc += A B over one warp's rectangle
// ---------------------------------------------------------------------------------------------

// A operand (M x K) in shared memory, stored [m][k], or [k][m] with TRANS (P^T, dS^T).
template <class Tile, bool TRANS>
struct SmemA {
  Tile tile;
  FA_DEVICE void load(u32 (&a)[4], int /*i*/, int m0, int k0, int lane) const {
    if (TRANS) {
      load_a_frag_trans(a, tile, m0, k0, lane);
    } else {
      load_a_frag(a, tile, m0, k0, lane);
    }
  }
};

// A operand already in registers: fragment [i][k0 / 16] of this warp's m-tile i (Q kept across the
// key loop, or P straight from the S accumulators).
template <int MT, int KT>
struct RegA {
  const u32 (&frag)[MT][KT][4];
  FA_DEVICE void load(u32 (&a)[4], int i, int /*m0*/, int k0, int /*lane*/) const {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = frag[i][k0 / 16][r];
  }
};

// B operand (K x N) in shared memory, stored [n][k] (K in S = Q K^T), or [k][n] with TRANS (V in
// O = P V, and the right operands dO, Q, K of the backward).
template <class Tile, bool TRANS>
struct SmemB {
  Tile tile;
  // The fragments of n-tiles n0 and n0 + 8: b[0], b[1] serve n0; b[2], b[3] serve n0 + 8.
  FA_DEVICE void load_pair(u32 (&b)[4], int n0, int k0, int lane) const {
    if (TRANS) {
      load_b_frag_pair_trans(b, tile, n0, k0, lane);
    } else {
      load_b_frag_pair(b, tile, n0, k0, lane);
    }
  }
  // One n-tile (a warp rectangle an odd number of n-tiles wide). ldmatrix .x2 takes the addresses of
  // lanes 0-15; lanes 16-31 repeat them so that every address stays inside the tile.
  FA_DEVICE void load_single(u32 (&b)[2], int n0, int k0, int lane) const {
    const int half = (lane >> 3) & 1;
    if (TRANS) {
      ldmatrix_x2_trans(b, tile.at(k0 + half * 8 + (lane & 7), n0));
    } else {
      ldmatrix_x2(b, tile.at(n0 + (lane & 7), k0 + half * 8));
    }
  }
};

// acc += A B for k in [0, K), over grid G's rectangle of this warp at (m_base, n_base). k steps at or
// beyond k_limit are skipped: there both operands are zero (a head dim below its bucket).
template <class G, int K, class A, class B>
FA_DEVICE void warp_gemm(float (&acc)[G::kMT][G::kNT][4], const A& a_op, const B& b_op, int m_base, int n_base,
                         int k_limit, int lane) {
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    if (k0 >= k_limit) break;
    u32 a[G::kMT][4];
#pragma unroll
    for (int i = 0; i < G::kMT; ++i) a_op.load(a[i], i, m_base + i * 16, k0, lane);
#pragma unroll
    for (int j = 0; j + 1 < G::kNT; j += 2) {
      u32 b[4];
      b_op.load_pair(b, n_base + j * 8, k0, lane);
#pragma unroll
      for (int i = 0; i < G::kMT; ++i) {
        mma_16816(acc[i][j], a[i], b[0], b[1]);
        mma_16816(acc[i][j + 1], a[i], b[2], b[3]);
      }
    }
    if (G::kNT % 2 == 1) {
      constexpr int j = G::kNT - 1;
      u32 b[2];
      b_op.load_single(b, n_base + j * 8, k0, lane);
#pragma unroll
      for (int i = 0; i < G::kMT; ++i) mma_16816(acc[i][j], a[i], b[0], b[1]);
    }
  }
}

// The A fragments of this warp's m-tiles over all of K, read once (e.g. Q before the key loop).
template <class G, int K, class Tile>
FA_DEVICE void load_a_frags(u32 (&frag)[G::kMT][K / 16][4], Tile tile, int m_base, int lane) {
#pragma unroll
  for (int i = 0; i < G::kMT; ++i) {
#pragma unroll
    for (int k = 0; k < K / 16; ++k) load_a_frag(frag[i][k], tile, m_base + i * 16, k * 16, lane);
  }
}

}  // namespace fa

#endif  // FA_ATTENTION_CUH_
