// Attention backward, FlashAttention-2 style: dQ, dK, dV from Q, K, V, O, dO and the forward's lse.
//
// Three entry points, launched in this order by the binding (tiles.py lists them in launch order):
//   fa_bwd_preprocess   grid q_blocks: D = rowsum(dO * O) in fp32 into dsoftmax_sum, and zero the
//                       rows of dq_accum this block owns.
//   fa_bwd              grid k_blocks: one block per BLOCK_N keys of one (batch, query head). K and V
//                       stay in shared memory; the block walks the query blocks that can see its keys,
//                       recomputes S = Q K^T and P = exp2(S * scale_log2 - lse * log2e), and
//                       accumulates dV += P^T dO, dK += dS^T Q in registers (dS = P * (dO V^T - D));
//                       dQ += dS K goes to dq_accum with fp32 atomic adds.
//   fa_bwd_convert_dq   grid q_blocks: dq = dq_accum * scale_softmax, converted to fp16/bf16.
//
// Tile sizes come from kernels/tiles.py as -D defines (the same names as the forward):
//   FA_HEAD_DIM   compiled head dim (bucket); params.head_dim is any multiple of 8 <= it
//   FA_BLOCK_M    query rows per step (and rows per block of the two q_blocks entries)
//   FA_BLOCK_N    key rows per block of fa_bwd
//   FA_WARPS      warps per block
//   FA_STAGES     1 or 2 shared-memory buffers for Q and dO (2: the next query block is fetched with
//                 cp.async while this one is computed; 1 where shared memory is tight)
//   FA_DTYPE_BF16 1 for bf16, else fp16
//
// The five products of one step are written as one warp-tiled GEMM helper (`warp_gemm`) over shared
// tiles: every warp computes a rectangle of the result with its operands read by ldmatrix (.trans where
// the operand is stored transposed). P and dS go through shared memory (BLOCK_M x BLOCK_N each) so each
// product can split its own result among the warps; this costs shared memory traffic, which FA2 avoids
// for P in some configs, in exchange for one code path for every tile shape and arch.
//
// Shared memory (bytes; tiles.py BwdTile.smem_bytes computes the same number and passes it as
// FA_SMEM_BYTES, which is static_asserted below):
//   K, V: 2 x BLOCK_N x (D + 8) x 2;  Q, dO: 2 x STAGES x BLOCK_M x (D + 8) x 2;
//   P, dS: 2 x BLOCK_M x (BLOCK_N + 8) x 2;  lse, D: 2 x BLOCK_M x 4.
//
// Semantics match fwd.cu (see its header): flash-attn layouts and strides, GQA (query head h reads kv
// head h / (heads / heads_k)), varlen through cu_seqlens, bottom-right causal, sliding window, softcap.
// Workspace layouts (the binding allocates them; params.h describes them too):
//   lse          as the forward writes it: (batch, heads, seqlen_q), varlen (heads, total_q)
//   dsoftmax_sum (batch, heads, seqlen_q_rounded), fp32; varlen: element (h, cu_seqlens_q[b] + i) of
//                a contiguous (heads, total_q) view (the binding allocates (heads, total_q + 128 *
//                batch); the tail is unused)
//   dq_accum     (batch, seqlen_q_rounded, heads, FA_HEAD_DIM), varlen (total_q + 128 * batch, heads,
//                FA_HEAD_DIM), contiguous fp32: the last dim is the compiled bucket ("dim_rounded"),
//                of which the first head_dim columns are used; sequence b of a varlen batch starts at
//                row cu_seqlens_q[b]
//   dk, dv       per *query* head, with their own strides; the binding sums GQA groups.
// Only rows and columns inside the sequence and head_dim are read or written, so the padding of the
// workspaces is never touched (no initialisation needed beyond what fa_bwd_preprocess does).
//
// Correctness of this file is not verified on a GPU here; the GPU tests under tests/gpu check it.

#include "params.h"
#include "primitives.cuh"
#include "tiles.cuh"

#if !defined(FA_HEAD_DIM) || !defined(FA_BLOCK_M) || !defined(FA_BLOCK_N) || !defined(FA_WARPS)
#error "compile with -DFA_HEAD_DIM -DFA_BLOCK_M -DFA_BLOCK_N -DFA_WARPS (kernels/tiles.py)"
#endif
#ifndef FA_STAGES
#define FA_STAGES 1
#endif

namespace fa {
namespace bwd {

constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kBlockM = FA_BLOCK_M;
constexpr int kBlockN = FA_BLOCK_N;
constexpr int kWarps = FA_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = FA_STAGES;

static_assert(kStages == 1 || kStages == 2, "FA_STAGES is 1 or 2");
static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0 && kBlockM % 16 == 0, "tile sizes: see tiles.cuh");

using QTile = SmemTile<kBlockM, kHeadDim>;   // Q and dO
using KVTile = SmemTile<kBlockN, kHeadDim>;  // K and V
using PTile = SmemTile<kBlockM, kBlockN>;    // P and dS, stored [query][key]
constexpr int kSmemBytes = 2 * KVTile::kBytes + 2 * kStages * QTile::kBytes + 2 * PTile::kBytes + 2 * kBlockM * 4;

#ifdef FA_SMEM_BYTES
static_assert(FA_SMEM_BYTES == kSmemBytes, "tiles.py's shared memory size disagrees with bwd.cu's layout");
#endif

// How the warps split an M x N result: a kWM x kWN grid of warps, each owning kTM x kTN (whole
// 16 x 8 mma tiles). Rows are split first: that keeps each warp's B fragments few.
template <int M, int N>
struct WarpGrid {
  static constexpr int kWM = (M / 16 < kWarps) ? M / 16 : kWarps;
  static constexpr int kWN = kWarps / kWM;
  static constexpr int kTM = M / kWM;
  static constexpr int kTN = N / kWN;
  static constexpr int kMT = kTM / 16;  // 16-row mma tiles per warp
  static constexpr int kNT = kTN / 8;   // 8-column mma tiles per warp
  static_assert(kWarps % kWM == 0 && M % (16 * kWM) == 0 && N % (8 * kWN) == 0,
                "this tile shape cannot be split into whole mma tiles over the warps");

  FA_DEVICE static int row0(int warp) { return (warp / kWN) * kTM; }
  FA_DEVICE static int col0(int warp) { return (warp % kWN) * kTN; }
};

using GridS = WarpGrid<kBlockM, kBlockN>;    // S, dP (and so P, dS): [query][key]
using GridKV = WarpGrid<kBlockN, kHeadDim>;  // dK, dV accumulators: [key][dim]
using GridQ = WarpGrid<kBlockM, kHeadDim>;   // dQ of one step: [query][dim]

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

// B operand of one 8-column n-tile (when a warp's width is an odd number of n-tiles), from a tile
// stored [n][k] or, with TRANS, [k][n]. ldmatrix .x2 reads addresses from lanes 0-15 only; lanes
// 16-31 repeat them so every address stays inside the tile.
template <bool TRANS, int ROWS, int COLS>
FA_DEVICE void load_b_frag_single(u32 (&b)[2], SmemTile<ROWS, COLS> tile, int n0, int k0, int lane) {
  const int half = (lane >> 3) & 1;
  if (TRANS) {
    ldmatrix_x2_trans(b, tile.at(k0 + half * 8 + (lane & 7), n0));
  } else {
    ldmatrix_x2(b, tile.at(n0 + (lane & 7), k0 + half * 8));
  }
}

// acc += A B over k in [0, K), for this warp's rectangle of grid G at (m_base, n_base).
//   A_TRANS: A (M x K) is stored [k][m] (P^T, dS^T); else [m][k].
//   B_TRANS: B (K x N) is stored [k][n] (dO, Q, K as right operands); else [n][k] (K, V in S, dP).
// k steps at or beyond k_limit are skipped: there the operands are the zero-filled columns of a head
// dim smaller than the bucket.
template <class G, int K, bool A_TRANS, bool B_TRANS, int AR, int AC, int BR, int BC>
FA_DEVICE void warp_gemm(float (&acc)[G::kMT][G::kNT][4], SmemTile<AR, AC> a_tile, SmemTile<BR, BC> b_tile,
                         int m_base, int n_base, int k_limit, int lane) {
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    if (k0 >= k_limit) break;
    u32 a[G::kMT][4];
#pragma unroll
    for (int i = 0; i < G::kMT; ++i) {
      if (A_TRANS) {
        load_a_frag_trans(a[i], a_tile, m_base + i * 16, k0, lane);
      } else {
        load_a_frag(a[i], a_tile, m_base + i * 16, k0, lane);
      }
    }
#pragma unroll
    for (int j = 0; j + 1 < G::kNT; j += 2) {
      u32 b[4];
      if (B_TRANS) {
        load_b_frag_pair_trans(b, b_tile, n_base + j * 8, k0, lane);
      } else {
        load_b_frag_pair(b, b_tile, n_base + j * 8, k0, lane);
      }
#pragma unroll
      for (int i = 0; i < G::kMT; ++i) {
        mma_16816(acc[i][j], a[i], b[0], b[1]);
        mma_16816(acc[i][j + 1], a[i], b[2], b[3]);
      }
    }
    if (G::kNT % 2 == 1) {
      constexpr int j = G::kNT - 1;
      u32 b[2];
      load_b_frag_single<B_TRANS>(b, b_tile, n_base + j * 8, k0, lane);
#pragma unroll
      for (int i = 0; i < G::kMT; ++i) mma_16816(acc[i][j], a[i], b[0], b[1]);
    }
  }
}

// Where one (batch, query head) lives: extents and first elements of every tensor.
struct Problem {
  int seqlen_q, seqlen_k;
  const u16* q;
  const u16* k;
  const u16* v;
  const u16* o;
  const u16* dout;
  u16* dq;
  u16* dk;
  u16* dv;
  const float* lse;
  float* dsum;      // dsoftmax_sum of row 0; rows contiguous
  float* dq_accum;  // dq_accum of (row 0, this head, column 0)
  fa_i64 dq_accum_row_stride;
};

FA_DEVICE Problem locate(const FaParams& p, int b, int h) {
  Problem pr;
  fa_i64 q_row0, k_row0;  // first row of the sequence in the packed (varlen) tensors, else 0
  fa_i64 q_bat = 0, k_bat = 0, o_bat = 0, do_bat = 0, dq_bat = 0, dk_bat = 0, dv_bat = 0;
  fa_i64 lse_off, dsum_off, acc_row0;
  if (p.cu_seqlens_q != nullptr) {
    q_row0 = p.cu_seqlens_q[b];
    pr.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    lse_off = static_cast<fa_i64>(h) * p.cu_seqlens_q[p.batch] + q_row0;
    dsum_off = lse_off;
    acc_row0 = q_row0;
  } else {
    q_row0 = 0;
    pr.seqlen_q = p.seqlen_q;
    q_bat = b * p.q_batch_stride;
    o_bat = b * p.o_batch_stride;
    do_bat = b * p.do_batch_stride;
    dq_bat = b * p.dq_batch_stride;
    lse_off = (static_cast<fa_i64>(b) * p.heads + h) * p.seqlen_q;
    dsum_off = (static_cast<fa_i64>(b) * p.heads + h) * p.seqlen_q_rounded;
    acc_row0 = static_cast<fa_i64>(b) * p.seqlen_q_rounded;
  }
  if (p.cu_seqlens_k != nullptr) {
    k_row0 = p.cu_seqlens_k[b];
    pr.seqlen_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    k_row0 = 0;
    pr.seqlen_k = p.seqlen_k;
    k_bat = b * p.k_batch_stride;
    dk_bat = b * p.dk_batch_stride;
    dv_bat = b * p.dv_batch_stride;
  }
  const int kv_head = h / (p.heads / p.heads_k);
  const fa_i64 kv_bat_v = p.cu_seqlens_k != nullptr ? 0 : b * p.v_batch_stride;
  pr.q = static_cast<const u16*>(p.q) + q_bat + q_row0 * p.q_row_stride + h * p.q_head_stride;
  pr.o = static_cast<const u16*>(p.o) + o_bat + q_row0 * p.o_row_stride + h * p.o_head_stride;
  pr.dout = static_cast<const u16*>(p.dout) + do_bat + q_row0 * p.do_row_stride + h * p.do_head_stride;
  pr.dq = static_cast<u16*>(p.dq) + dq_bat + q_row0 * p.dq_row_stride + h * p.dq_head_stride;
  pr.k = static_cast<const u16*>(p.k) + k_bat + k_row0 * p.k_row_stride + kv_head * p.k_head_stride;
  pr.v = static_cast<const u16*>(p.v) + kv_bat_v + k_row0 * p.v_row_stride + kv_head * p.v_head_stride;
  pr.dk = static_cast<u16*>(p.dk) + dk_bat + k_row0 * p.dk_row_stride + h * p.dk_head_stride;
  pr.dv = static_cast<u16*>(p.dv) + dv_bat + k_row0 * p.dv_row_stride + h * p.dv_head_stride;
  pr.lse = p.lse + lse_off;
  pr.dsum = p.dsoftmax_sum + dsum_off;
  pr.dq_accum_row_stride = static_cast<fa_i64>(p.heads) * kHeadDim;
  pr.dq_accum = p.dq_accum + acc_row0 * pr.dq_accum_row_stride + static_cast<fa_i64>(h) * kHeadDim;
  return pr;
}

// The visible-key band of query row i is [i + diag - left, i + diag + right] (a side < 0: unbounded);
// the same rule as fwd.cu.
struct Band {
  int diag, left, right;

  FA_DEVICE bool visible(int row, int key, int seqlen_q, int seqlen_k) const {
    return row < seqlen_q && key < seqlen_k && (right < 0 || key <= row + diag + right) &&
           (left < 0 || key >= row + diag - left);
  }
};

FA_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

}  // namespace bwd
}  // namespace fa

using namespace fa;
using namespace fa::bwd;

// D[row] = sum_c dO[row, c] * O[row, c] (fp32), and dq_accum[row, h, :] = 0, for this block's rows.
// One warp per row at a time; each lane covers 8 columns per pass.
extern "C" __global__ void __launch_bounds__(kThreads)
    fa_bwd_preprocess(const __grid_constant__ FaParams params) {
  const Problem pr = locate(params, blockIdx.y, blockIdx.z);
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= pr.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = min(kBlockM, pr.seqlen_q - row0);
  for (int r = warp; r < rows; r += kWarps) {
    const int row = row0 + r;
    float dot = 0.f;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      const Chunk16 o = ld_global16(pr.o + row * params.o_row_stride + c);
      const Chunk16 d = ld_global16(pr.dout + row * params.do_row_stride + c);
      const u32 ov[4] = {o.x, o.y, o.z, o.w};
      const u32 dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        dot += unpack_lo(ov[i]) * unpack_lo(dv[i]) + unpack_hi(ov[i]) * unpack_hi(dv[i]);
      }
      float* acc = pr.dq_accum + row * pr.dq_accum_row_stride + c;
      st_global16(acc, Chunk16{0u, 0u, 0u, 0u});
      st_global16(acc + 4, Chunk16{0u, 0u, 0u, 0u});
    }
    dot = warp_sum(dot);
    if (lane == 0) pr.dsum[row] = dot;
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) fa_bwd(const __grid_constant__ FaParams params) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  const Problem pr = locate(params, blockIdx.y, blockIdx.z);
  const int key0 = blockIdx.x * kBlockN;  // first key of this block, in its sequence
  if (key0 >= pr.seqlen_k) return;        // varlen: this sequence is shorter than the grid
  const int head_dim = params.head_dim;
  const int seqlen_q = pr.seqlen_q;
  const int seqlen_k = pr.seqlen_k;

  const Band band{seqlen_k - seqlen_q, params.window_left, params.is_causal ? 0 : params.window_right};

  // Query blocks [m_begin, m_end) hold every row that sees some key of this block.
  int m_end = (seqlen_q + kBlockM - 1) / kBlockM;
  if (band.left >= 0) {
    const int last_row = min(key0 + kBlockN, seqlen_k) - 1 - band.diag + band.left;
    m_end = min(m_end, last_row < 0 ? 0 : last_row / kBlockM + 1);
  }
  int m_begin = 0;
  if (band.right >= 0) {
    const int first_row = key0 - band.diag - band.right;
    m_begin = first_row <= 0 ? 0 : first_row / kBlockM;
  }

  const KVTile sK{smem_addr(smem)};
  const KVTile sV{sK.base + KVTile::kBytes};
  const QTile sQ0{sV.base + KVTile::kBytes};
  const QTile sdO0{sQ0.base + kStages * QTile::kBytes};
  const PTile sP{sdO0.base + kStages * QTile::kBytes};
  const PTile sdS{sP.base + PTile::kBytes};
  float* s_lse = reinterpret_cast<float*>(smem + 2 * KVTile::kBytes + 2 * kStages * QTile::kBytes +
                                          2 * PTile::kBytes);  // lse * log2(e) per query row
  float* s_dsum = s_lse + kBlockM;                               // D per query row

  // Softcap: logit = softcap * tanh(raw * scale / softcap); its derivative scale * (1 - tanh^2)
  // multiplies dS, and the common `scale` is applied once at the end as without softcap.
  const bool softcap = params.softcap > 0.f;
  const float logit_scale = softcap ? params.softcap * kLog2e : params.scale_softmax_log2;
  const float tanh_scale = softcap ? params.scale_softmax / params.softcap : 0.f;

  load_tile_async<kThreads>(sK, pr.k + key0 * params.k_row_stride, params.k_row_stride, seqlen_k - key0,
                            head_dim, tid);
  load_tile_async<kThreads>(sV, pr.v + key0 * params.v_row_stride, params.v_row_stride, seqlen_k - key0,
                            head_dim, tid);
  if (m_begin < m_end) {
    const int row0 = m_begin * kBlockM;
    load_tile_async<kThreads>(sQ0, pr.q + row0 * params.q_row_stride, params.q_row_stride, seqlen_q - row0,
                              head_dim, tid);
    load_tile_async<kThreads>(sdO0, pr.dout + row0 * params.do_row_stride, params.do_row_stride,
                              seqlen_q - row0, head_dim, tid);
  }
  copy_commit();

  float acc_dk[GridKV::kMT][GridKV::kNT][4];
  float acc_dv[GridKV::kMT][GridKV::kNT][4];
  zero<GridKV>(acc_dk);
  zero<GridKV>(acc_dv);

  for (int m_block = m_begin; m_block < m_end; ++m_block) {
    const int row0 = m_block * kBlockM;
    const int stage = kStages == 1 ? 0 : (m_block - m_begin) & 1;
    const QTile sQ{sQ0.base + stage * QTile::kBytes};
    const QTile sdO{sdO0.base + stage * QTile::kBytes};

    if (kStages == 1) {
      if (m_block > m_begin) {  // the previous step's readers are past the closing barrier
        load_tile_async<kThreads>(sQ, pr.q + row0 * params.q_row_stride, params.q_row_stride,
                                  seqlen_q - row0, head_dim, tid);
        load_tile_async<kThreads>(sdO, pr.dout + row0 * params.do_row_stride, params.do_row_stride,
                                  seqlen_q - row0, head_dim, tid);
        copy_commit();
      }
      copy_wait<0>();
    } else if (m_block + 1 < m_end) {
      // Prefetch the next step into the other buffer (last read one step ago, before the barrier).
      const int next0 = row0 + kBlockM;
      const QTile nQ{sQ0.base + (stage ^ 1) * QTile::kBytes};
      const QTile ndO{sdO0.base + (stage ^ 1) * QTile::kBytes};
      load_tile_async<kThreads>(nQ, pr.q + next0 * params.q_row_stride, params.q_row_stride, seqlen_q - next0,
                                head_dim, tid);
      load_tile_async<kThreads>(ndO, pr.dout + next0 * params.do_row_stride, params.do_row_stride,
                                seqlen_q - next0, head_dim, tid);
      copy_commit();
      copy_wait<1>();
    } else {
      copy_wait<0>();
    }

    // Rows beyond the sequence get lse = +inf (P = 0) and D = 0, so garbage never meets a product.
    // An lse of -inf (a row that sees nothing, in a convention other than ours) also gives P = 0.
    for (int r = tid; r < kBlockM; r += kThreads) {
      const bool in = row0 + r < seqlen_q;
      const float l = in ? pr.lse[row0 + r] : pos_inf();
      s_lse[r] = l == -pos_inf() ? pos_inf() : l * kLog2e;
      s_dsum[r] = in ? pr.dsum[row0 + r] : 0.f;
    }
    __syncthreads();

    // S = Q K^T and dP = dO V^T over this warp's rectangle of the [query][key] tile.
    {
      const int m_base = GridS::row0(warp);
      const int n_base = GridS::col0(warp);
      float acc_s[GridS::kMT][GridS::kNT][4];
      float acc_dp[GridS::kMT][GridS::kNT][4];
      zero<GridS>(acc_s);
      zero<GridS>(acc_dp);
      warp_gemm<GridS, kHeadDim, false, false>(acc_s, sQ, sK, m_base, n_base, head_dim, lane);
      warp_gemm<GridS, kHeadDim, false, false>(acc_dp, sdO, sV, m_base, n_base, head_dim, lane);

      // P = exp2(logit2 - lse2) on visible entries (0 elsewhere); dS = P * (dP - D) (* softcap's
      // derivative). Both are stored as elements for the products below.
#pragma unroll
      for (int i = 0; i < GridS::kMT; ++i) {
#pragma unroll
        for (int j = 0; j < GridS::kNT; ++j) {
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = m_base + i * 16 + g + (e >> 1) * 8;
            const int c = n_base + j * 8 + 2 * t + (e & 1);
            float raw = acc_s[i][j][e];
            float dtanh = 1.f;
            if (softcap) {
              raw = tanh_approx(raw * tanh_scale);
              dtanh = 1.f - raw * raw;
            }
            const bool vis = band.visible(row0 + r, key0 + c, seqlen_q, seqlen_k);
            p[e] = vis ? exp2_approx(raw * logit_scale - s_lse[r]) : 0.f;
            ds[e] = p[e] * (acc_dp[i][j][e] - s_dsum[r]) * dtanh;
          }
          store_acc_frag(sP, p, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
          store_acc_frag(sdS, ds, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
        }
      }
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q: [key][dim] rectangles, k running over this step's queries.
    {
      const int m_base = GridKV::row0(warp);
      const int n_base = GridKV::col0(warp);
      warp_gemm<GridKV, kBlockM, true, true>(acc_dv, sP, sdO, m_base, n_base, kBlockM, lane);
      warp_gemm<GridKV, kBlockM, true, true>(acc_dk, sdS, sQ, m_base, n_base, kBlockM, lane);
    }

    // dQ += dS K for this step's queries, added into the fp32 workspace (other key blocks add theirs).
    {
      const int m_base = GridQ::row0(warp);
      const int n_base = GridQ::col0(warp);
      float acc_dq[GridQ::kMT][GridQ::kNT][4];
      zero<GridQ>(acc_dq);
      warp_gemm<GridQ, kBlockN, false, true>(acc_dq, sdS, sK, m_base, n_base, kBlockN, lane);
#pragma unroll
      for (int i = 0; i < GridQ::kMT; ++i) {
#pragma unroll
        for (int j = 0; j < GridQ::kNT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = row0 + m_base + i * 16 + g + (e >> 1) * 8;
            const int c = n_base + j * 8 + 2 * t + (e & 1);
            if (r < seqlen_q && c < head_dim) {
              red_add_f32(pr.dq_accum + r * pr.dq_accum_row_stride + c, acc_dq[i][j][e]);
            }
          }
        }
      }
    }
    __syncthreads();  // sP, sdS, lse/D and this stage's Q/dO are free for the next step
  }
  copy_wait<0>();  // with no query block at all, K/V copies may still be in flight

  // dK (times the softmax scale: S = scale * Q K^T) and dV, two elements per 4-byte store.
  const int m_base = GridKV::row0(warp);
  const int n_base = GridKV::col0(warp);
#pragma unroll
  for (int i = 0; i < GridKV::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < GridKV::kNT; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = key0 + m_base + i * 16 + g + hh * 8;
        const int c = n_base + j * 8 + 2 * t;
        if (r < seqlen_k && c < head_dim) {
          const float s = params.scale_softmax;
          *reinterpret_cast<u32*>(pr.dk + r * params.dk_row_stride + c) =
              pack_float2(acc_dk[i][j][2 * hh] * s, acc_dk[i][j][2 * hh + 1] * s);
          *reinterpret_cast<u32*>(pr.dv + r * params.dv_row_stride + c) =
              pack_float2(acc_dv[i][j][2 * hh], acc_dv[i][j][2 * hh + 1]);
        }
      }
    }
  }
}

// dq = dq_accum * scale_softmax in the output dtype, 8 columns (one 16-byte store) per lane per pass.
extern "C" __global__ void __launch_bounds__(kThreads)
    fa_bwd_convert_dq(const __grid_constant__ FaParams params) {
  const Problem pr = locate(params, blockIdx.y, blockIdx.z);
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= pr.seqlen_q) return;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = min(kBlockM, pr.seqlen_q - row0);
  const float s = params.scale_softmax;
  for (int r = warp; r < rows; r += kWarps) {
    const int row = row0 + r;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      const float* acc = pr.dq_accum + row * pr.dq_accum_row_stride + c;
      const Chunk16 lo = ld_global16(acc);
      const Chunk16 hi = ld_global16(acc + 4);
      const Chunk16 out{
          pack_float2(bits_to_float(lo.x) * s, bits_to_float(lo.y) * s),
          pack_float2(bits_to_float(lo.z) * s, bits_to_float(lo.w) * s),
          pack_float2(bits_to_float(hi.x) * s, bits_to_float(hi.y) * s),
          pack_float2(bits_to_float(hi.z) * s, bits_to_float(hi.w) * s),
      };
      st_global16(pr.dq + row * params.dq_row_stride + c, out);
    }
  }
}
