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
//   FA_DQ_SMEM    1 stages each step's dQ through shared memory so that every warp's atomic adds cover
//                 whole 32-byte sectors; 0 adds straight from the mma fragments (two adjacent floats
//                 per lane: one vector red on sm90+, whole sectors as well)
//   FA_DTYPE_BF16 1 for bf16, else fp16
//
// One step of fa_bwd (a query block against this block's keys), as named below:
//   load_step                Q, dO of the step (prefetched a step ahead with two stages)
//   S = Q K^T, dP = dO V^T   warp_gemm over this warp's rectangle of [query][key]
//   probabilities_and_ds     P = exp2(logit2 - lse2), dS = P (dP - D), stored to shared memory
//   dV += P^T dO, dK += dS^T Q   accumulated in registers across the steps
//   accumulate_dq            dQ = dS K, added into the fp32 workspace
// Each product uses attention.cuh's warp_gemm over shared tiles, split over the warps as reads the
// fewest ldmatrix bytes per mma. P and dS go through shared memory (BLOCK_M x BLOCK_N each) so each
// product can split its own result among the warps; this costs shared memory traffic, which FA2
// avoids for P in some configs, in exchange for one code path for every tile shape and arch.
//
// Shared memory (bytes; tiles.py BwdTile.smem_bytes computes the same number and passes it as
// FA_SMEM_BYTES, which is static_asserted below):
//   K, V: 2 x BLOCK_N x (D + 8) x 2;  per stage Q then dO: 2 x STAGES x BLOCK_M x (D + 8) x 2;
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

#include "attention.cuh"
#include "unit.cuh"  // kHeadDim, kBlockM, kBlockN, kWarps, kThreads, kStages from tiles.py's defines

#ifndef FA_DQ_SMEM
#define FA_DQ_SMEM 0
#endif

namespace fa {
namespace bwd {

constexpr bool kDqViaSmem = FA_DQ_SMEM != 0;

static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0 && kBlockM % 16 == 0, "tile sizes: see tiles.cuh");

// Padded tiles, not the forward's swizzled ones: tiles.cuh says why.
using QTile = PaddedTile<kBlockM, kHeadDim>;   // Q and dO
using KVTile = PaddedTile<kBlockN, kHeadDim>;  // K and V
using PTile = PaddedTile<kBlockM, kBlockN>;    // P and dS, stored [query][key]
constexpr int kSmemBytes = 2 * KVTile::kBytes + 2 * kStages * QTile::kBytes + 2 * PTile::kBytes + 2 * kBlockM * 4;

#ifdef FA_SMEM_BYTES
static_assert(FA_SMEM_BYTES == kSmemBytes, "tiles.py's shared memory size disagrees with bwd.cu's layout");
#endif

// dQ of one step staged as fp32 in the step's own Q and dO buffers (free once dK and dV have read
// them): rows padded by 4 floats so that the fragments' 8-byte stores are conflict-free.
constexpr int kDqPitch = kHeadDim + 4;
static_assert(kBlockM * kDqPitch * 4 <= 2 * QTile::kBytes, "the dQ staging tile must fit in Q and dO");

// Each product splits its result over the warps the way that reads the fewest ldmatrix bytes per
// mma (attention.cuh).
using GridS = FewestBytesGrid<kBlockM, kBlockN, kWarps>;    // S, dP (and so P, dS): [query][key]
using GridKV = FewestBytesGrid<kBlockN, kHeadDim, kWarps>;  // dK, dV accumulators: [key][dim]
using GridQ = FewestBytesGrid<kBlockM, kHeadDim, kWarps>;   // dQ of one step: [query][dim]

using KVAcc = float[GridKV::kMT][GridKV::kNT][4];

// sum_i a_i * b_i over the 8 elements of two 16-byte chunks, in fp32.
FA_DEVICE float dot8(const Chunk16& a, const Chunk16& b) {
  return unpack_lo(a.x) * unpack_lo(b.x) + unpack_hi(a.x) * unpack_hi(b.x) + unpack_lo(a.y) * unpack_lo(b.y) +
         unpack_hi(a.y) * unpack_hi(b.y) + unpack_lo(a.z) * unpack_lo(b.z) + unpack_hi(a.z) * unpack_hi(b.z) +
         unpack_lo(a.w) * unpack_lo(b.w) + unpack_hi(a.w) * unpack_hi(b.w);
}

FA_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

// One pipeline stage's Q and dO tiles, adjacent (the dQ staging tile spans both).
struct QStage {
  QTile q, dout;
};

FA_DEVICE QStage q_stage(u32 base, int stage) {
  const u32 q = base + static_cast<u32>(stage * 2 * QTile::kBytes);
  return QStage{QTile{q}, QTile{q + QTile::kBytes}};
}

// This block's keys, its sequence's tensors and the arithmetic every step shares.
struct KeyBlock {
  int key0;  // first key of this block, in its sequence
  int seqlen_q, seqlen_k;
  Band band;
  Range queries;  // query blocks whose rows see some key of this block
  const u16* q;
  const u16* dout;
  const float* lse;
  const float* dsum;
  float* dq_accum;  // (query row 0, this head, column 0) of dq_accum
  fa_i64 dq_accum_row_stride;
  float logit_scale;  // logit2 = raw * logit_scale, raw = q.k or tanh(q.k * tanh_scale)
  float tanh_scale;
  bool softcap;
};

FA_DEVICE KeyBlock key_block_of(const FaParams& p, const Seq& s) {
  KeyBlock kb;
  kb.key0 = blockIdx.x * kBlockN;
  kb.seqlen_q = s.seqlen_q;
  kb.seqlen_k = s.seqlen_k;
  kb.band = Band::of(p, s.seqlen_q, s.seqlen_k);
  kb.queries = kb.band.query_blocks(kb.key0, kBlockN, kBlockM, s.seqlen_q, s.seqlen_k);
  kb.q = q_rows(static_cast<const u16*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride, s);
  kb.dout = q_rows(static_cast<const u16*>(p.dout), p.do_batch_stride, p.do_row_stride, p.do_head_stride, s);
  kb.lse = p.lse + s.lse_row0;
  kb.dsum = p.dsoftmax_sum + s.dsum_row0;
  kb.dq_accum_row_stride = static_cast<fa_i64>(p.heads) * kHeadDim;
  kb.dq_accum = p.dq_accum + s.acc_row0 * kb.dq_accum_row_stride + static_cast<fa_i64>(s.head) * kHeadDim;
  // Softcap: logit = softcap * tanh(raw * scale / softcap); its derivative scale * (1 - tanh^2)
  // multiplies dS, and the common `scale` is applied once at the end as without softcap.
  kb.softcap = p.softcap > 0.f;
  kb.logit_scale = kb.softcap ? p.softcap * kLog2e : p.scale_softmax_log2;
  kb.tanh_scale = kb.softcap ? p.scale_softmax / p.softcap : 0.f;
  return kb;
}

// Q and dO of the query block at row0 into one stage (rows past the sequence zero-filled).
FA_DEVICE void load_step(const FaParams& p, const KeyBlock& kb, QStage st, int row0, int tid) {
  load_tile_async<kThreads>(st.q, kb.q + row0 * p.q_row_stride, p.q_row_stride, kb.seqlen_q - row0, p.head_dim, tid);
  load_tile_async<kThreads>(st.dout, kb.dout + row0 * p.do_row_stride, p.do_row_stride, kb.seqlen_q - row0,
                            p.head_dim, tid);
}

// P = exp2(logit2 - lse2) on visible entries (0 elsewhere) and dS = P * (dP - D) (* softcap's
// derivative), from this warp's S and dP rectangles, stored as elements for the products after.
FA_DEVICE void probabilities_and_ds(const KeyBlock& kb, int row0, const float (&s)[GridS::kMT][GridS::kNT][4],
                                    const float (&dp)[GridS::kMT][GridS::kNT][4], const float* s_lse,
                                    const float* s_dsum, PTile sP, PTile sdS, int m_base, int n_base, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < GridS::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < GridS::kNT; ++j) {
      float pr[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m_base + i * 16 + g + (e >> 1) * 8;
        const int c = n_base + j * 8 + 2 * t + (e & 1);
        float raw = s[i][j][e];
        float dtanh = 1.f;
        if (kb.softcap) {
          raw = tanh_approx(raw * kb.tanh_scale);
          dtanh = 1.f - raw * raw;
        }
        const bool vis = kb.band.visible(row0 + r, kb.key0 + c, kb.seqlen_q, kb.seqlen_k);
        pr[e] = vis ? exp2_approx(raw * kb.logit_scale - s_lse[r]) : 0.f;
        ds[e] = pr[e] * (dp[i][j][e] - s_dsum[r]) * dtanh;
      }
      store_acc_frag(sP, pr, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
      store_acc_frag(sdS, ds, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
    }
  }
}

// dQ += dS K for this step's queries, added into the fp32 workspace (other key blocks add theirs).
// Either staged through shared memory, so that every warp's atomic adds cover 32 consecutive floats
// (four whole 32-byte sectors), or straight from the fragments, two adjacent floats per lane (a
// vector red on sm90+, whole sectors too; two scalar adds before).
FA_DEVICE void accumulate_dq(const FaParams& p, const KeyBlock& kb, int row0, PTile sdS, KVTile sK, QStage st,
                             int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int m_base = GridQ::row0(warp), n_base = GridQ::col0(warp);
  float acc[GridQ::kMT][GridQ::kNT][4];
  zero<GridQ>(acc);
  warp_gemm<GridQ, kBlockN>(acc, SmemA<PTile, false>{sdS}, SmemB<KVTile, true>{sK}, m_base, n_base, kBlockN, lane);
  float* dq = kb.dq_accum + row0 * kb.dq_accum_row_stride;
  const int rows = kb.seqlen_q - row0;
  if (kDqViaSmem) {
    const u32 staged = st.q.base;
    __syncthreads();  // every warp is done reading this step's Q and dO (dK, dV above)
    for_each_acc_pair<GridQ>(m_base, n_base, lane, [&](int r, int c, int i, int j, int e) {
      st_shared64(staged + (r * kDqPitch + c) * 4, float_to_bits(acc[i][j][e]), float_to_bits(acc[i][j][e + 1]));
    });
    __syncthreads();
    for (int k = tid; k < kBlockM * kHeadDim; k += kThreads) {
      const int r = k / kHeadDim, c = k % kHeadDim;
      if (r < rows && c < p.head_dim) {
        red_add_f32(dq + r * kb.dq_accum_row_stride + c, bits_to_float(ld_shared32(staged + (r * kDqPitch + c) * 4)));
      }
    }
  } else {
    for_each_acc_pair<GridQ>(m_base, n_base, lane, [&](int r, int c, int i, int j, int e) {
      if (r < rows && c < p.head_dim) {
        red_add_f32x2(dq + r * kb.dq_accum_row_stride + c, acc[i][j][e], acc[i][j][e + 1]);
      }
    });
  }
}

}  // namespace bwd
}  // namespace fa

using namespace fa;
using namespace fa::bwd;

// D[row] = sum_c dO[row, c] * O[row, c] (fp32), and dq_accum[row, h, :] = 0, for this block's rows.
// (The second launch bound keeps ptxas 12.9/13.0 from spilling a loop bound here on sm90 fp16.)
// One warp per row at a time; each lane covers 8 columns per pass.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fa_bwd_preprocess(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  const Seq seq = locate_block(params);
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= seq.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row_end = min(row0 + kBlockM, seq.seqlen_q);
  const u16* o = q_rows(static_cast<const u16*>(params.o), params.o_batch_stride, params.o_row_stride,
                        params.o_head_stride, seq);
  const u16* dout = q_rows(static_cast<const u16*>(params.dout), params.do_batch_stride, params.do_row_stride,
                           params.do_head_stride, seq);
  const fa_i64 acc_stride = static_cast<fa_i64>(params.heads) * kHeadDim;
  float* dq_accum = params.dq_accum + seq.acc_row0 * acc_stride + static_cast<fa_i64>(seq.head) * kHeadDim;
  for (int row = row0 + warp; row < row_end; row += kWarps) {
    float dot = 0.f;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      dot += dot8(ld_global16(o + row * params.o_row_stride + c), ld_global16(dout + row * params.do_row_stride + c));
      float* acc = dq_accum + row * acc_stride + c;
      st_global16(acc, Chunk16{0u, 0u, 0u, 0u});
      st_global16(acc + 4, Chunk16{0u, 0u, 0u, 0u});
    }
    dot = warp_sum(dot);
    if (lane == 0) params.dsoftmax_sum[seq.dsum_row0 + row] = dot;
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) fa_bwd(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const Seq seq = locate_block(params);
  const KeyBlock kb = key_block_of(params, seq);
  if (kb.key0 >= kb.seqlen_k) return;  // varlen: this sequence is shorter than the grid
  const int head_dim = params.head_dim;

  const KVTile sK{smem_addr(smem)};
  const KVTile sV{sK.base + KVTile::kBytes};
  const u32 q_base = sV.base + KVTile::kBytes;  // kStages x (Q, dO)
  const PTile sP{q_base + 2 * kStages * QTile::kBytes};
  const PTile sdS{sP.base + PTile::kBytes};
  float* s_lse = reinterpret_cast<float*>(smem + 2 * KVTile::kBytes + 2 * kStages * QTile::kBytes +
                                          2 * PTile::kBytes);  // lse * log2(e) per query row
  float* s_dsum = s_lse + kBlockM;                               // D per query row

  const KvRows k = kv_rows(params, seq, params.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  const KvRows v = kv_rows(params, seq, params.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  load_tile_async<kThreads>(sK, k.rows(kb.key0), k.row_stride, kb.seqlen_k - kb.key0, head_dim, tid);
  load_tile_async<kThreads>(sV, v.rows(kb.key0), v.row_stride, kb.seqlen_k - kb.key0, head_dim, tid);
  if (kb.queries.begin < kb.queries.end) load_step(params, kb, q_stage(q_base, 0), kb.queries.begin * kBlockM, tid);
  copy_commit();

  float acc_dk[GridKV::kMT][GridKV::kNT][4];
  float acc_dv[GridKV::kMT][GridKV::kNT][4];
  zero<GridKV>(acc_dk);
  zero<GridKV>(acc_dv);

  for (int m_block = kb.queries.begin; m_block < kb.queries.end; ++m_block) {
    const int row0 = m_block * kBlockM;
    const int stage = kStages == 1 ? 0 : (m_block - kb.queries.begin) & 1;
    const QStage st = q_stage(q_base, stage);

    if (kStages == 1) {
      if (m_block > kb.queries.begin) {  // the previous step's readers are past the closing barrier
        load_step(params, kb, st, row0, tid);
        copy_commit();
      }
      copy_wait<0>();
    } else if (m_block + 1 < kb.queries.end) {
      // Prefetch the next step into the other buffer (last read one step ago, before the barrier).
      load_step(params, kb, q_stage(q_base, stage ^ 1), row0 + kBlockM, tid);
      copy_commit();
      copy_wait<1>();
    } else {
      copy_wait<0>();
    }

    // Rows beyond the sequence get lse = +inf (P = 0) and D = 0, so garbage never meets a product.
    // An lse of -inf (a row that sees nothing, in a convention other than ours) also gives P = 0.
    for (int r = tid; r < kBlockM; r += kThreads) {
      const bool in = row0 + r < kb.seqlen_q;
      const float l = in ? kb.lse[row0 + r] : pos_inf();
      s_lse[r] = l == -pos_inf() ? pos_inf() : l * kLog2e;
      s_dsum[r] = in ? kb.dsum[row0 + r] : 0.f;
    }
    __syncthreads();

    // S = Q K^T and dP = dO V^T over this warp's rectangle of the [query][key] tile, then P and dS.
    {
      const int m_base = GridS::row0(warp), n_base = GridS::col0(warp);
      float acc_s[GridS::kMT][GridS::kNT][4];
      float acc_dp[GridS::kMT][GridS::kNT][4];
      zero<GridS>(acc_s);
      zero<GridS>(acc_dp);
      warp_gemm<GridS, kHeadDim>(acc_s, SmemA<QTile, false>{st.q}, SmemB<KVTile, false>{sK}, m_base, n_base, head_dim,
                                 lane);
      warp_gemm<GridS, kHeadDim>(acc_dp, SmemA<QTile, false>{st.dout}, SmemB<KVTile, false>{sV}, m_base, n_base,
                                 head_dim, lane);
      probabilities_and_ds(kb, row0, acc_s, acc_dp, s_lse, s_dsum, sP, sdS, m_base, n_base, lane);
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q: [key][dim] rectangles, k running over this step's queries.
    {
      const int m_base = GridKV::row0(warp), n_base = GridKV::col0(warp);
      warp_gemm<GridKV, kBlockM>(acc_dv, SmemA<PTile, true>{sP}, SmemB<QTile, true>{st.dout}, m_base, n_base, kBlockM,
                                 lane);
      warp_gemm<GridKV, kBlockM>(acc_dk, SmemA<PTile, true>{sdS}, SmemB<QTile, true>{st.q}, m_base, n_base, kBlockM,
                                 lane);
    }

    accumulate_dq(params, kb, row0, sdS, sK, st, tid);
    __syncthreads();  // sP, sdS, lse/D and this stage's Q/dO are free for the next step
  }
  copy_wait<0>();  // with no query block at all, K/V copies may still be in flight

  // dK (times the softmax scale: S = scale * Q K^T) and dV, two elements per 4-byte store.
  u16* dk = k_rows(static_cast<u16*>(params.dk), params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride,
                   seq, seq.head);
  u16* dv = k_rows(static_cast<u16*>(params.dv), params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride,
                   seq, seq.head);
  const int m_base = GridKV::row0(warp), n_base = GridKV::col0(warp);
  for_each_acc_pair<GridKV>(kb.key0 + m_base, n_base, lane, [&](int r, int c, int i, int j, int e) {
    if (r < kb.seqlen_k && c < head_dim) {
      const float sc = params.scale_softmax;
      *reinterpret_cast<u32*>(dk + r * params.dk_row_stride + c) =
          pack_float2(acc_dk[i][j][e] * sc, acc_dk[i][j][e + 1] * sc);
      *reinterpret_cast<u32*>(dv + r * params.dv_row_stride + c) = pack_float2(acc_dv[i][j][e], acc_dv[i][j][e + 1]);
    }
  });
}

// dq = dq_accum * scale_softmax in the output dtype, 8 columns (one 16-byte store) per lane per pass.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fa_bwd_convert_dq(const __grid_constant__ FaParams params) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  const Seq seq = locate_block(params);
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= seq.seqlen_q) return;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = min(kBlockM, seq.seqlen_q - row0);
  const float s = params.scale_softmax;
  u16* dq = q_rows(static_cast<u16*>(params.dq), params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride,
                   seq);
  const fa_i64 acc_stride = static_cast<fa_i64>(params.heads) * kHeadDim;
  const float* dq_accum = params.dq_accum + seq.acc_row0 * acc_stride + static_cast<fa_i64>(seq.head) * kHeadDim;
  for (int r = warp; r < rows; r += kWarps) {
    const int row = row0 + r;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      const float* acc = dq_accum + row * acc_stride + c;
      const Chunk16 lo = ld_global16(acc);
      const Chunk16 hi = ld_global16(acc + 4);
      const Chunk16 out{
          pack_float2(bits_to_float(lo.x) * s, bits_to_float(lo.y) * s),
          pack_float2(bits_to_float(lo.z) * s, bits_to_float(lo.w) * s),
          pack_float2(bits_to_float(hi.x) * s, bits_to_float(hi.y) * s),
          pack_float2(bits_to_float(hi.z) * s, bits_to_float(hi.w) * s),
      };
      st_global16(dq + row * params.dq_row_stride + c, out);
    }
  }
}
