// Attention forward, FlashAttention-2 style: O = softmax(Q K^T * scale) V and the row log-sum-exp.
//
// One source for every arch and head dim; kernels/tiles.py picks the tile sizes per arch family and
// passes them as -D defines:
//   FA_HEAD_DIM   compiled head dim (bucket); the actual params.head_dim is any multiple of 8 <= it
//   FA_BLOCK_M    query rows per block      FA_BLOCK_N  key rows per iteration
//   FA_WARPS      warps per block; warp w owns query rows [w * BLOCK_M / WARPS, (w + 1) * ...)
//   FA_DTYPE_BF16 1 for bf16, else fp16 (sm75 builds fp16 only)
// Arch differences (mma shape, cp.async or register-staged loads) are inside primitives.cuh.
//
// Algorithm per block (blockIdx = (query block, batch, head)):
//   shared memory holds Q (BLOCK_M x D), one K tile and one V tile (BLOCK_N x D each), rows padded
//   (tiles.cuh). Key blocks are visited from the last visible one down (FA2 order: the masked
//   diagonal block comes first). Loads overlap compute as in FA2: V(n) is fetched while S = Q K(n)^T
//   runs, K(n-1) while softmax and O += P V(n) run. Softmax is online in fp32, in the log2 domain
//   (exp2 with scale_softmax_log2 folded into one FFMA); P stays in registers as the A operand of
//   P V; every warp owns whole rows, so no inter-warp reduction is needed.
//
// Semantics (flash-attn 2.x):
//   - q (batch, seqlen_q, heads, dim), k/v (batch, seqlen_k, heads_k, dim), strides in elements from
//     FaParams; the last dim must be contiguous and every row start 16-byte aligned (strides and
//     base pointers multiples of 8 elements), as for flash-attn.
//   - GQA/MQA: query head h reads kv head h / (heads / heads_k).
//   - Varlen: cu_seqlens_q (resp. cu_seqlens_k) non-null means q (resp. k/v) is packed
//     (total, heads, dim) and sequence b spans rows [cu[b], cu[b+1]); batch strides are then unused.
//     lse is (heads, total_q) with total_q = cu_seqlens_q[batch]; otherwise (batch, heads, seqlen_q).
//   - Masks: query row i sees key j iff j < seqlen_k and, with diag = seqlen_k - seqlen_q (per
//     sequence; bottom-right alignment), j <= i + diag + right and j >= i + diag - window_left,
//     where right = 0 when is_causal, else window_right; a negative window side is unbounded.
//   - Softcap (params.softcap > 0): the logit is softcap * tanh(scale_softmax * q.k / softcap), with
//     softcap the user's value (flash-attn's `softcap` argument) and scale_softmax the user's scale;
//     the binding passes them as given, not pre-divided as flash-attn's own C++ does.
//   - A row that sees no key gets O = 0 and lse = +inf (flash-attn's convention).
//   - lse is the natural log of the row's sum of exp(logit), fp32.
//   - A head dim below the bucket is zero-filled up to FA_HEAD_DIM in shared memory and computed
//     over in full (exact, not free: d = 72 in the 96 bucket costs what d = 96 costs).
//
// Correctness of this file is not verified on a GPU here; the GPU tests under tests/gpu check it.

#include "params.h"
#include "primitives.cuh"
#include "tiles.cuh"

#if !defined(FA_HEAD_DIM) || !defined(FA_BLOCK_M) || !defined(FA_BLOCK_N) || !defined(FA_WARPS)
#error "compile with -DFA_HEAD_DIM -DFA_BLOCK_M -DFA_BLOCK_N -DFA_WARPS (kernels/tiles.py)"
#endif

namespace fa {
namespace fwd {

constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kBlockM = FA_BLOCK_M;
constexpr int kBlockN = FA_BLOCK_N;
constexpr int kWarps = FA_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kBlockM / kWarps;
constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row mma tiles per warp
constexpr int kSTiles = kBlockN / 8;        // 8-key n-tiles of S per row tile
constexpr int kOTiles = kHeadDim / 8;       // 8-column n-tiles of O per row tile

static_assert(kBlockM % (16 * kWarps) == 0, "each warp needs whole 16-row mma tiles");
static_assert(kBlockN % 16 == 0 && kHeadDim % 32 == 0, "tile sizes must be multiples of 16 / 32");

using QTile = SmemTile<kBlockM, kHeadDim>;
using KVTile = SmemTile<kBlockN, kHeadDim>;
// tiles.py computes the same number for the launch: (BLOCK_M + 2 * BLOCK_N) * (D + 8) * 2.
constexpr int kSmemBytes = QTile::kBytes + 2 * KVTile::kBytes;
#ifdef FA_SMEM_BYTES
static_assert(kSmemBytes == FA_SMEM_BYTES, "tiles.py's smem_bytes disagrees with this kernel's layout");
#endif

// Where one (batch, head) lives: its extents and first elements.
struct Problem {
  int seqlen_q, seqlen_k;
  const u16* q;
  const u16* k;
  const u16* v;
  u16* o;
  float* lse;  // this head's lse for row 0 of the sequence; rows are contiguous
};

FA_DEVICE Problem locate(const FaParams& p, int b, int h) {
  Problem pr;
  fa_i64 q_off, k_off, v_off, o_off, lse_off;
  const int kv_head = h / (p.heads / p.heads_k);
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[b];
    pr.seqlen_q = p.cu_seqlens_q[b + 1] - start;
    q_off = start * p.q_row_stride;
    o_off = start * p.o_row_stride;
    lse_off = static_cast<fa_i64>(h) * p.cu_seqlens_q[p.batch] + start;
  } else {
    pr.seqlen_q = p.seqlen_q;
    q_off = b * p.q_batch_stride;
    o_off = b * p.o_batch_stride;
    lse_off = (static_cast<fa_i64>(b) * p.heads + h) * p.seqlen_q;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int start = p.cu_seqlens_k[b];
    pr.seqlen_k = p.cu_seqlens_k[b + 1] - start;
    k_off = start * p.k_row_stride;
    v_off = start * p.v_row_stride;
  } else {
    pr.seqlen_k = p.seqlen_k;
    k_off = b * p.k_batch_stride;
    v_off = b * p.v_batch_stride;
  }
  pr.q = static_cast<const u16*>(p.q) + q_off + h * p.q_head_stride;
  pr.o = static_cast<u16*>(p.o) + o_off + h * p.o_head_stride;
  pr.k = static_cast<const u16*>(p.k) + k_off + kv_head * p.k_head_stride;
  pr.v = static_cast<const u16*>(p.v) + v_off + kv_head * p.v_head_stride;
  pr.lse = p.lse + lse_off;
  return pr;
}

// The visible-key band of query row i is [i + diag - left, i + diag + right] (a side < 0: unbounded).
struct Band {
  int diag, left, right;

  // Visible keys of `row`: [first, last], as two compares per element.
  FA_DEVICE int first(int row) const { return left < 0 ? 0 : row + diag - left; }
  FA_DEVICE int last(int row, int seqlen_k) const {
    return right < 0 ? seqlen_k - 1 : min(seqlen_k - 1, row + diag + right);
  }
};

}  // namespace fwd
}  // namespace fa

using namespace fa;
using namespace fa::fwd;

extern "C" __global__ void __launch_bounds__(kThreads) fa_fwd(const __grid_constant__ FaParams params) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int m_block = blockIdx.x;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const Problem pr = locate(params, blockIdx.y, blockIdx.z);
  const int row0 = m_block * kBlockM;  // first query row of this block, in its sequence
  if (row0 >= pr.seqlen_q) return;     // varlen: this sequence is shorter than the grid
  const int head_dim = params.head_dim;

  // A window side wider than both sequences is the same as unbounded; folding it to -1 keeps the
  // index arithmetic below far from int overflow.
  const int no_limit = pr.seqlen_q + pr.seqlen_k;
  const int right = params.is_causal ? 0 : params.window_right;
  const Band band{pr.seqlen_k - pr.seqlen_q, params.window_left >= no_limit ? -1 : params.window_left,
                  right >= no_limit ? -1 : right};

  // Key blocks [n_begin, n_end) hold every key some row of this block can see.
  int n_end = (pr.seqlen_k + kBlockN - 1) / kBlockN;
  if (band.right >= 0) {
    const int last_key = min(row0 + kBlockM, pr.seqlen_q) - 1 + band.diag + band.right;
    n_end = min(n_end, last_key < 0 ? 0 : last_key / kBlockN + 1);
  }
  int n_begin = 0;
  if (band.left >= 0) {
    const int first_key = row0 + band.diag - band.left;
    n_begin = first_key <= 0 ? 0 : first_key / kBlockN;
  }

  const QTile sQ{smem_addr(smem)};
  const KVTile sK{sQ.base + QTile::kBytes};
  const KVTile sV{sK.base + KVTile::kBytes};

  // Softcap folds its outer multiply into the exponent's scale: logit2 = raw * logit_scale, where raw
  // is q.k (no softcap) or tanh(q.k * scale / softcap) (softcap).
  const bool softcap = params.softcap > 0.f;
  const float logit_scale = softcap ? params.softcap * kLog2e : params.scale_softmax_log2;
  const float tanh_scale = softcap ? params.scale_softmax / params.softcap : 0.f;

  load_tile_async<kThreads>(sQ, pr.q + row0 * params.q_row_stride, params.q_row_stride, pr.seqlen_q - row0,
                            head_dim, tid);
  copy_commit();
  if (n_end > n_begin) {
    const int key0 = (n_end - 1) * kBlockN;
    load_tile_async<kThreads>(sK, pr.k + key0 * params.k_row_stride, params.k_row_stride, pr.seqlen_k - key0,
                              head_dim, tid);
  }
  copy_commit();

  float acc_o[kMTiles][kOTiles][4];
  float row_max[kMTiles][2];  // raw-logit max of rows g and g + 8 of each row tile
  float row_sum[kMTiles][2];  // this thread's partial sum of exp; reduced over the quad at the end
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][n][e] = 0.f;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      row_max[mt][hh] = -pos_inf();
      row_sum[mt][hh] = 0.f;
    }
  }

  const int warp_row = warp * kRowsPerWarp;  // first row of this warp, in the block
  const int g = lane >> 2;
  const int t = lane & 3;

  for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
    const int key0 = n_block * kBlockN;

    // K(n) (and Q on the first pass) has landed; every warp is done with V(n+1).
    copy_wait<0>();
    __syncthreads();
    load_tile_async<kThreads>(sV, pr.v + key0 * params.v_row_stride, params.v_row_stride, pr.seqlen_k - key0,
                              head_dim, tid);
    copy_commit();

    // S = Q K^T for this warp's rows.
    float acc_s[kMTiles][kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = 0.f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      u32 a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) load_a_frag(a[mt], sQ, warp_row + mt * 16, kk * 16, lane);
#pragma unroll
      for (int jp = 0; jp < kSTiles / 2; ++jp) {
        u32 b[4];
        load_b_frag_pair(b, sK, jp * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816(acc_s[mt][2 * jp], a[mt], b[0], b[1]);
          mma_16816(acc_s[mt][2 * jp + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // V(n) has landed; every warp is done with K(n), so K(n-1) may overwrite it.
    copy_wait<0>();
    __syncthreads();
    if (n_block > n_begin) {
      const int next0 = key0 - kBlockN;
      load_tile_async<kThreads>(sK, pr.k + next0 * params.k_row_stride, params.k_row_stride,
                                pr.seqlen_k - next0, head_dim, tid);
    }
    copy_commit();

    // Masks are needed only where the block crosses the sequence end or a band edge.
    const bool need_mask = key0 + kBlockN > pr.seqlen_k ||
                           (band.right >= 0 && key0 + kBlockN - 1 > row0 + band.diag + band.right) ||
                           (band.left >= 0 && key0 < row0 + kBlockM - 1 + band.diag - band.left);

    // Online softmax: new row max, rescale of the running output and sum, P = exp2(logit2 - max2).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      // Uniform branches around whole loops, selects inside: per-element branches would split the
      // unrolled body into hundreds of basic blocks and defeat ptxas's scheduling.
      if (softcap) {
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = tanh_approx(acc_s[mt][j][e] * tanh_scale);
        }
      }
      if (need_mask) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = row0 + warp_row + mt * 16 + g + hh * 8;
          const int first = band.first(row) - key0 - 2 * t;  // relative to this thread's column 0
          const int last = band.last(row, pr.seqlen_k) - key0 - 2 * t;
#pragma unroll
          for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = j * 8 + e;
              float& s = acc_s[mt][j][2 * hh + e];
              s = (col >= first) & (col <= last) ? s : -pos_inf();
            }
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = row_max[mt][hh];
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) mx = fmax2(mx, fmax2(acc_s[mt][j][2 * hh], acc_s[mt][j][2 * hh + 1]));
        mx = quad_max(mx);
        // A row with nothing visible so far keeps max -inf; subtracting 0 instead keeps exp2 at 0
        // rather than NaN (-inf - -inf).
        const float max2 = mx == -pos_inf() ? 0.f : mx * logit_scale;
        const float correction = exp2_approx(row_max[mt][hh] * logit_scale - max2);
        row_max[mt][hh] = mx;
        float sum = row_sum[mt][hh] * correction;
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
          acc_o[mt][n][2 * hh] *= correction;
          acc_o[mt][n][2 * hh + 1] *= correction;
        }
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
            const float p = exp2_approx(acc_s[mt][j][e] * logit_scale - max2);
            acc_s[mt][j][e] = p;
            sum += p;
          }
        }
        row_sum[mt][hh] = sum;
      }
    }

    // O += P V, P straight from the S accumulators (packed once: half the registers of fp32).
    u32 p_frag[kMTiles][kBlockN / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) acc_to_a_frag(p_frag[mt][kk], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kOTiles / 2; ++np) {
        u32 b[4];
        load_b_frag_pair_trans(b, sV, np * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816(acc_o[mt][2 * np], p_frag[mt][kk], b[0], b[1]);
          mma_16816(acc_o[mt][2 * np + 1], p_frag[mt][kk], b[2], b[3]);
        }
      }
    }
  }

  // Epilogue: O / rowsum staged through this warp's own rows of sQ, then 16-byte stores. With no key
  // block at all the Q copy (issued by all threads) may still be in flight: drain it block-wide.
  copy_wait<0>();
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float sum = quad_sum(row_sum[mt][hh]);
      inv[hh] = sum > 0.f ? rcp_approx(sum) : 0.f;
      const float lse = sum > 0.f ? (row_max[mt][hh] * logit_scale + log2_approx(sum)) * kLn2 : pos_inf();
      const int row = row0 + warp_row + mt * 16 + g + hh * 8;
      if (t == 0 && row < pr.seqlen_q) pr.lse[row] = lse;
    }
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) store_acc_frag(sQ, acc_o[mt][n], warp_row + mt * 16, n * 8, inv[0], inv[1], lane);
  }
  __syncthreads();
  store_tile<kThreads>(pr.o + row0 * params.o_row_stride, params.o_row_stride, sQ, pr.seqlen_q - row0, head_dim,
                       tid);
}
