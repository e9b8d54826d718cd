// Attention forward, FlashAttention-2 style: O = softmax(Q K^T * scale) V and the row log-sum-exp.
//
// One source for every arch and head dim; kernels/tiles.py picks the tile per arch family and passes
// it as -D defines:
//   FA_HEAD_DIM   compiled head dim (bucket); the actual params.head_dim is any multiple of 8 <= it
//   FA_BLOCK_M    query rows per block      FA_BLOCK_N  key rows per iteration
//   FA_WARPS      warps per block; warp w owns query rows [w * BLOCK_M / WARPS, (w + 1) * ...), so
//                 BLOCK_M / WARPS is 16 or 32 rows (one or two mma m-tiles) per warp
//   FA_STAGES     K/V buffers: 1 loads V(n) while S = Q K(n)^T runs and K(n-1) while softmax and
//                 P V(n) run (two barriers per key block); 2 double-buffers K and V, so block n-1
//                 lands during all of block n's work (one barrier per key block)
//   FA_Q_IN_REGS  1 keeps Q's A fragments in registers across the key loop; 0 reads them from shared
//                 memory at every k step (FA2's default: the registers go to the accumulators)
//   FA_SPLITKV    1 builds the split-KV program instead of fa_fwd: fa_fwd_splitkv (each block takes
//                 one share of the key blocks of its query block and writes a partial output and
//                 log-sum-exp) and fa_fwd_combine (the LSE-weighted sum of the partials)
//   FA_DTYPE_BF16 1 for bf16, else fp16 (sm75 builds fp16 only)
// Arch differences (mma shape, cp.async or register-staged loads) are inside primitives.cuh.
//
// Per block (blockIdx = (query block [x num_splits], (batch, head) pair folded over y and z:
// attention.cuh locate_block)), for every key block n the rows
// of the block can see, last to first (the block with the diagonal first, as in FA2):
//   S = Q K(n)^T               compute_scores      warp_gemm from shared Q (or registers) and K
//   S = softcap(S), masked     apply_softcap, apply_mask (only blocks that cross a mask edge)
//   m, l, O rescaled, P        online_softmax      fp32, log2 domain: exp2 with the scale folded in
//   O += P V(n)                accumulate_pv       P straight from the S accumulators, in registers
//                                                  (k steps past the sequence end skipped)
// then O / l and lse = m + log(l) (store_output), or, split-KV, the partials (store_partials). Every
// warp owns whole rows, so the softmax needs no inter-warp reduction. Causal grids run the query
// blocks with the most keys first.
//
// Semantics (flash-attn 2.x):
//   - q (batch, seqlen_q, heads, dim), k/v (batch, seqlen_k, heads_k, dim), strides in elements from
//     FaParams; the last dim must be contiguous and every row start 16-byte aligned (strides and
//     base pointers multiples of 8 elements), as for flash-attn.
//   - GQA/MQA: query head h reads kv head h / (heads / heads_k).
//   - Varlen: cu_seqlens_q (resp. cu_seqlens_k) non-null means q (resp. k/v) is packed
//     (total, heads, dim) and sequence b spans rows [cu[b], cu[b+1]); batch strides are then unused.
//     lse is (heads, total_q) with total_q = cu_seqlens_q[batch]; otherwise (batch, heads, seqlen_q).
//   - KV-cache layouts (params.h: seqused_k, leftpad_k, kv_batch_idx, block_table; null when
//     absent): every one is a different answer of attention.cuh's locate() (a sequence's key count,
//     first row, k/v batch row, page-table row) and KvRows (the page of a key block); the key loop
//     and the masks see only the sequence's own keys 0 .. seqlen_k - 1 (bottom-right alignment
//     against them, as flash-attn's kvcache). A page holds a multiple of BLOCK_N keys.
//   - Masks: attention.cuh's Band (bottom-right causal alignment, sliding window, sequence ends).
//   - Softcap (params.softcap > 0): the logit is softcap * tanh(scale_softmax * q.k / softcap), with
//     softcap the user's value (flash-attn's `softcap` argument) and scale_softmax the user's scale;
//     the binding passes them as given, not pre-divided as flash-attn's own C++ does.
//   - A row that sees no key gets O = 0 and lse = +inf (flash-attn's convention).
//   - lse is the natural log of the row's sum of exp(logit), fp32.
//   - A head dim below the bucket is zero-filled up to FA_HEAD_DIM in shared memory; Q K^T skips
//     the all-zero k steps, P V computes the zero columns.
//   - Split-KV: split s of num_splits takes key blocks [s * per, (s + 1) * per) of the sequence's
//     ceil(seqlen_k / BLOCK_N), per = ceil(that / num_splits), and writes row r's output normalised
//     by its own sum (fp32) to o_accum[s][lse_row0 + r][:] and its log-sum-exp (-inf: no key) to
//     lse_accum[s][lse_row0 + r]; fa_fwd_combine then writes O and lse as fa_fwd would.
//
// Correctness of this file is not verified on a GPU here; the GPU tests under tests/gpu check it.

#include "attention.cuh"
#include "softmax.cuh"  // apply_softcap, apply_mask, online_softmax, reduce_sums: the stages hopper_fwd.cu shares
#include "unit.cuh"  // kHeadDim, kBlockM, kBlockN, kWarps, kThreads, kStages from tiles.py's defines

#ifndef FA_Q_IN_REGS
#define FA_Q_IN_REGS 0
#endif
#ifndef FA_SPLITKV
#define FA_SPLITKV 0
#endif

namespace fa {
namespace fwd {

constexpr bool kQInRegs = FA_Q_IN_REGS != 0;

static_assert(kBlockN % 16 == 0 && kHeadDim % 32 == 0, "tile sizes must be multiples of 16 / 32");

// Every warp owns whole rows (the softmax reduces within a warp): the rows are split over all warps.
using GridS = WarpGrid<kBlockM, kBlockN, kWarps, kWarps>;   // S and P: [query][key]
using GridO = WarpGrid<kBlockM, kHeadDim, kWarps, kWarps>;  // O: [query][dim]
constexpr int kMT = GridS::kMT;     // 16-row m-tiles per warp
constexpr int kSTiles = GridS::kNT;  // 8-key n-tiles of S
constexpr int kOTiles = GridO::kNT;  // 8-column n-tiles of O
constexpr int kDSteps = kHeadDim / 16;
constexpr int kNSteps = kBlockN / 16;

using QTile = SmemTile<kBlockM, kHeadDim>;
using KVTile = SmemTile<kBlockN, kHeadDim>;
// tiles.py computes the same number for the launch: (BLOCK_M + 2 * STAGES * BLOCK_N) * D * 2.
constexpr int kSmemBytes = QTile::kBytes + 2 * kStages * KVTile::kBytes;
#ifdef FA_SMEM_BYTES
static_assert(kSmemBytes == FA_SMEM_BYTES, "tiles.py's smem_bytes disagrees with this kernel's layout");
#endif

using ScoreAcc = float[kMT][kSTiles][4];
using OutAcc = float[kMT][kOTiles][4];

// The running softmax of this warp's rows (softmax.cuh).
using RowStats = SoftmaxRows<kMT>;

// K and V tiles of one pipeline stage.
struct KvStage {
  KVTile k, v;
};

FA_DEVICE KvStage kv_stage(u32 base, int stage) {
  const u32 k = base + static_cast<u32>(stage * 2 * KVTile::kBytes);
  return KvStage{KVTile{k}, KVTile{k + KVTile::kBytes}};
}

// Global -> shared copy of one key block (rows past the sequence end are zero-filled).
FA_DEVICE void load_keys(KVTile tile, const KvRows& src, int key0, int seqlen_k, int head_dim, int tid) {
  load_tile_async<kThreads>(tile, src.rows(key0), src.row_stride, seqlen_k - key0, head_dim, tid);
}

// S = Q K^T for this warp's rows of one key block.
template <class QOperand>
FA_DEVICE void compute_scores(ScoreAcc& s, const QOperand& q, KVTile k, int warp_row, int head_dim, int lane) {
  zero<GridS>(s);
  warp_gemm<GridS, kHeadDim>(s, q, SmemB<KVTile, false>{k}, warp_row, 0, head_dim, lane);
}

// O += P V: P packed from the S accumulators (the C layout of n-tiles 2k, 2k + 1 is the A layout). The
// k steps at or past `keys` (the keys left before the sequence end) are skipped: P is 0 there. Besides
// the work, the skip's branches keep ptxas from hoisting every k step's V fragments at once: without
// them the 128 x 64 x 4 tiles at d96 and d128 spill 16 to 84 bytes (NVRTC 11.8 to 13.0), with them none.
FA_DEVICE void accumulate_pv(OutAcc& o, const ScoreAcc& p, KVTile v, int warp_row, int keys, int lane) {
  u32 frag[kMT][kNSteps][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kNSteps; ++kk) acc_to_a_frag(frag[mt][kk], p[mt][2 * kk], p[mt][2 * kk + 1]);
  }
  warp_gemm<GridO, kBlockN>(o, RegA<kMT, kNSteps>{frag}, SmemB<KVTile, true>{v}, warp_row, 0, keys, lane);
}

// This block's query rows, the key blocks they see, and the arithmetic every step shares. (The
// epilogues locate() the sequence again rather than keep its offsets live across the key loop: the
// registers go to the accumulators.)
struct Block {
  int seqlen_q, seqlen_k;
  Band band;
  int m_block, row0;   // query block and its first row in the sequence
  Range keys;          // key blocks to visit (a split's share of them, split-KV)
  KvRows k, v;
  float logit_scale;  // logit2 = raw * logit_scale, raw = q.k or tanh(q.k * tanh_scale)
  float tanh_scale;
  bool softcap;
};

// The query block of blockIdx.x (causal and right-bounded grids run the blocks with most keys first)
// and, split-KV, its split.
FA_DEVICE Block block_of(const FaParams& p, int m_block_index, int m_blocks, int split, int num_splits) {
  Block blk;
  const Seq s = locate_block(p);
  blk.seqlen_q = s.seqlen_q;
  blk.seqlen_k = s.seqlen_k;
  blk.band = Band::of(p, s.seqlen_q, s.seqlen_k);
  blk.m_block = blk.band.right >= 0 ? m_blocks - 1 - m_block_index : m_block_index;
  blk.row0 = blk.m_block * kBlockM;
  blk.keys = blk.band.key_blocks(blk.row0, kBlockM, kBlockN, s.seqlen_q, s.seqlen_k);
  if (num_splits > 1) {
    const int all = (s.seqlen_k + kBlockN - 1) / kBlockN;
    const int per = (all + num_splits - 1) / num_splits;
    blk.keys.begin = max(blk.keys.begin, split * per);
    blk.keys.end = min(blk.keys.end, (split + 1) * per);
  }
  blk.k = kv_rows(p, s, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  blk.v = kv_rows(p, s, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  blk.softcap = p.softcap > 0.f;
  blk.logit_scale = blk.softcap ? p.softcap * kLog2e : p.scale_softmax_log2;
  blk.tanh_scale = blk.softcap ? p.scale_softmax / p.softcap : 0.f;
  return blk;
}

// The whole key loop of one block: O (unnormalised) and the row statistics, in registers. Leaves Q
// in shared memory and every copy retired.
FA_DEVICE void attend(const FaParams& p, const Block& blk, QTile sQ, u32 kv_base, OutAcc& o, RowStats& st) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int warp_row = GridS::row0(warp);
  const int head_dim = p.head_dim;
  const int seqlen_k = blk.seqlen_k;

  zero<GridO>(o);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      st.max[mt][hh] = -pos_inf();
      st.sum[mt][hh] = 0.f;
    }
  }

  // Prologue: Q, and the first key block (K and V with two stages, K alone with one).
  const Seq s = locate_block(p);
  const u16* q = q_rows(static_cast<const u16*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride, s);
  load_tile_async<kThreads>(sQ, q + blk.row0 * p.q_row_stride, p.q_row_stride, blk.seqlen_q - blk.row0, head_dim,
                            tid);
  copy_commit();
  if (blk.keys.end > blk.keys.begin) {
    const int key0 = (blk.keys.end - 1) * kBlockN;
    const KvStage first = kv_stage(kv_base, 0);
    load_keys(first.k, blk.k, key0, seqlen_k, head_dim, tid);
    if (kStages == 2) load_keys(first.v, blk.v, key0, seqlen_k, head_dim, tid);
  }
  copy_commit();

  u32 q_frag[kMT][kDSteps][4];  // used with FA_Q_IN_REGS only (and then optimised away otherwise)
  int stage = 0;
  for (int n_block = blk.keys.end - 1; n_block >= blk.keys.begin; --n_block, stage ^= (kStages - 1)) {
    const int key0 = n_block * kBlockN;
    const KvStage kv = kv_stage(kv_base, stage);
    const bool more = n_block > blk.keys.begin;

    // This block's K (and V with two stages) has landed, Q too on the first pass; every warp is done
    // with the previous block, whose buffers the next loads reuse.
    copy_wait<0>();
    __syncthreads();
    if (kStages == 2) {
      if (more) {
        const KvStage next = kv_stage(kv_base, stage ^ 1);
        load_keys(next.k, blk.k, key0 - kBlockN, seqlen_k, head_dim, tid);
        load_keys(next.v, blk.v, key0 - kBlockN, seqlen_k, head_dim, tid);
      }
    } else {
      load_keys(kv.v, blk.v, key0, seqlen_k, head_dim, tid);
    }
    copy_commit();

    float sc[kMT][kSTiles][4];
    if constexpr (kQInRegs) {
      if (n_block == blk.keys.end - 1) load_a_frags<GridS, kHeadDim>(q_frag, sQ, warp_row, lane);
      compute_scores(sc, RegA<kMT, kDSteps>{q_frag}, kv.k, warp_row, head_dim, lane);
    } else {
      compute_scores(sc, SmemA<QTile, false>{sQ}, kv.k, warp_row, head_dim, lane);
    }

    if (kStages == 1) {
      // V has landed; every warp is done with K, so the next K may overwrite it.
      copy_wait<0>();
      __syncthreads();
      if (more) load_keys(kv.k, blk.k, key0 - kBlockN, seqlen_k, head_dim, tid);
      copy_commit();
    }

    if (blk.softcap) apply_softcap(sc, blk.tanh_scale);
    if (blk.band.crosses(blk.row0, kBlockM, key0, kBlockN, seqlen_k)) {
      apply_mask(sc, blk.band, blk.row0 + warp_row, key0, seqlen_k, lane);
    }
    online_softmax(sc, o, st, blk.logit_scale);
    accumulate_pv(o, sc, kv.v, warp_row, seqlen_k - key0, lane);
  }
  // With no key block at all the Q copy (issued by all threads) may still be in flight.
  copy_wait<0>();
}

// O / l staged through this warp's own rows of sQ, then 16-byte stores; lse = m + log(l), +inf for a
// row that sees nothing.
FA_DEVICE void store_output(const FaParams& p, const Block& blk, QTile sQ, const OutAcc& o, RowStats& st) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp_row = GridS::row0(warp);
  const Seq s = locate_block(p);
  reduce_sums(st);
  __syncthreads();  // every warp is done reading sQ
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float sum = st.sum[mt][hh];
      inv[hh] = sum > 0.f ? rcp_approx(sum) : 0.f;
      const float lse = sum > 0.f ? (st.max[mt][hh] * blk.logit_scale + log2_approx(sum)) * kLn2 : pos_inf();
      const int row = blk.row0 + warp_row + mt * 16 + g + hh * 8;
      if (t == 0 && row < s.seqlen_q) p.lse[s.lse_row0 + row] = lse;
    }
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) store_acc_frag(sQ, o[mt][n], warp_row + mt * 16, n * 8, inv[0], inv[1], lane);
  }
  __syncthreads();
  u16* out = q_rows(static_cast<u16*>(p.o), p.o_batch_stride, p.o_row_stride, p.o_head_stride, s);
  store_tile<kThreads>(out + blk.row0 * p.o_row_stride, p.o_row_stride, sQ, s.seqlen_q - blk.row0, p.head_dim, tid);
}

}  // namespace fwd
}  // namespace fa

using namespace fa;
using namespace fa::fwd;

#if !FA_SPLITKV

extern "C" __global__ void __launch_bounds__(kThreads) fa_fwd(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  extern __shared__ __align__(16) unsigned char smem[];
  const Block blk = block_of(params, blockIdx.x, gridDim.x, 0, 1);
  if (blk.row0 >= blk.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const QTile sQ{smem_addr(smem)};
  float o[kMT][kOTiles][4];
  RowStats st;
  attend(params, blk, sQ, sQ.base + QTile::kBytes, o, st);
  store_output(params, blk, sQ, o, st);
}

#else  // FA_SPLITKV

namespace fa {
namespace fwd {

// Split-KV partials straight from the accumulators: O / l (fp32, 8 bytes per store) and the split's
// log-sum-exp, -inf where the split holds no key the row sees (its weight in the combine is 0).
FA_DEVICE void store_partials(const FaParams& p, const Block& blk, int split, const OutAcc& o, RowStats& st) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const Seq s = locate_block(p);
  reduce_sums(st);
  const fa_i64 split_row0 = split * s.lse_rows + s.lse_row0;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float sum = st.sum[mt][hh];
      const float inv = sum > 0.f ? rcp_approx(sum) : 0.f;
      const int row = blk.row0 + GridS::row0(warp) + mt * 16 + g + hh * 8;
      if (row >= s.seqlen_q) continue;
      if (t == 0) {
        p.lse_accum[split_row0 + row] =
            sum > 0.f ? (st.max[mt][hh] * blk.logit_scale + log2_approx(sum)) * kLn2 : -pos_inf();
      }
      float* out = p.o_accum + (split_row0 + row) * kHeadDim;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < p.head_dim) {
          out[col] = o[mt][n][2 * hh] * inv;
          out[col + 1] = o[mt][n][2 * hh + 1] * inv;
        }
      }
    }
  }
}

constexpr int kCombineWarps = 4;  // tiles.py: the combine launches 128 threads, one warp per row

// exp2 of (a - b) * log2(e): the natural exp of a difference of log-sum-exps.
FA_DEVICE float exp_diff(float a, float b) { return exp2_approx((a - b) * kLog2e); }

}  // namespace fwd
}  // namespace fa

extern "C" __global__ void __launch_bounds__(kThreads) fa_fwd_splitkv(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  extern __shared__ __align__(16) unsigned char smem[];
  const int splits = params.num_splits;
  const int split = blockIdx.x % splits;
  const Block blk = block_of(params, blockIdx.x / splits, gridDim.x / splits, split, splits);
  if (blk.row0 >= blk.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const QTile sQ{smem_addr(smem)};
  float o[kMT][kOTiles][4];
  RowStats st;
  attend(params, blk, sQ, sQ.base + QTile::kBytes, o, st);
  store_partials(params, blk, split, o, st);
}

// One warp per query row: lse = log(sum_s exp(lse_s)) and O = sum_s exp(lse_s - lse) O_s, each lane
// over 8 columns per pass. A row no split saw gets O = 0 and lse = +inf.
extern "C" __global__ void __launch_bounds__(kCombineWarps * 32)
    fa_fwd_combine(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  const Seq s = locate_block(params);
  const int row0 = blockIdx.x * kCombineWarps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = row0 + warp;
  if (row >= s.seqlen_q) return;
  const int splits = params.num_splits;
  const fa_i64 r = s.lse_row0 + row;
  const float* lse_s = params.lse_accum + r;  // split i at lse_s[i * lse_rows]

  float mx = -pos_inf();
  for (int i = lane; i < splits; i += 32) mx = fmax2(mx, lse_s[i * s.lse_rows]);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mx = fmax2(mx, shfl_xor(mx, m));
  float sum = 0.f;
  if (mx != -pos_inf()) {
    for (int i = lane; i < splits; i += 32) sum += exp_diff(lse_s[i * s.lse_rows], mx);
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += shfl_xor(sum, m);
  const bool seen = sum > 0.f;
  const float lse = seen ? mx + log2_approx(sum) * kLn2 : pos_inf();
  if (lane == 0) params.lse[r] = lse;

  u16* out = q_rows(static_cast<u16*>(params.o), params.o_batch_stride, params.o_row_stride, params.o_head_stride, s) +
             row * params.o_row_stride;
  for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int i = 0; seen && i < splits; ++i) {
      const float w = exp_diff(lse_s[i * s.lse_rows], lse);
      const float* part = params.o_accum + (i * s.lse_rows + r) * kHeadDim + c;
      const Chunk16 lo = ld_global16(part);
      const Chunk16 hi = ld_global16(part + 4);
      const u32 v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += w * bits_to_float(v[e]);
    }
    st_global16(out + c, Chunk16{pack_float2(acc[0], acc[1]), pack_float2(acc[2], acc[3]), pack_float2(acc[4], acc[5]),
                                 pack_float2(acc[6], acc[7])});
  }
}

#endif  // FA_SPLITKV
