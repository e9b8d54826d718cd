// Attention backward, FlashAttention-2 style: dQ, dK, dV from Q, K, V, O, dO and the forward's lse.
//
// Three entry points, launched in this order by the binding (tiles.py lists them in launch order):
//   fa_bwd_preprocess   grid q_blocks: D = rowsum(dO * O) in fp32 into dsoftmax_sum, and zero the
//                       16-row groups of dq_accum this block owns.
//   fa_bwd              grid k_blocks: one block per BLOCK_N keys of one (batch, query head). K and V
//                       stay in shared memory; the block walks the query blocks that can see its keys,
//                       recomputes S = Q K^T and P = exp2(S * scale_log2 - lse * log2e), and
//                       accumulates dV += P^T dO, dK += dS^T Q in registers (dS = P * (dO V^T - D));
//                       dQ += dS K goes to dq_accum with fp32 atomic adds straight from the mma
//                       fragments, in dq_accum's permuted layout (below).
//   fa_bwd_convert_dq   grid q_blocks: dq = dq_accum * scale_softmax, converted to fp16/bf16 (and
//                       the permutation undone).
//
// Tile sizes come from kernels/tiles.py as -D defines (the same names as the forward):
//   FA_HEAD_DIM   compiled head dim (bucket); params.head_dim is any multiple of 8 <= it
//   FA_BLOCK_M    query rows per step (and rows per block of the two q_blocks entries)
//   FA_BLOCK_N    key rows per block of fa_bwd
//   FA_WARPS      warps per block
//   FA_STAGES     1 or 2 shared-memory buffers for Q and dO (2: the next query block is fetched with
//                 cp.async while this one is computed; 1 where shared memory is tight)
//   FA_V_IN_REGS  1: each warp keeps its V fragments of dP = dO V^T in registers, read once per key
//                 block, and P and dS take V's shared memory (FA2's Is_V_in_regs); 0: V stays in
//                 shared memory beside them
//   FA_DQ_PASSES  dQ = dS K of a step in this many passes over slices of the head dim (default 1), a
//                 rolled loop: a pass's accumulators are all that is live beside dK, dV (and V with
//                 FA_V_IN_REGS); each pass reads dS again
//   FA_DQ_HOLD_DS N: dS read once per step and held in registers through the passes, each pass in N
//                 warp rows (below, at GridQ)
//   FA_K_IN_REGS  1: each warp keeps its K fragments of S = Q K^T in registers too, read once per key
//                 block as V's are, so S reads only Q from shared memory (K's tile stays for dQ)
//   FA_S_ROWS     the warps' row split of S and dP (default: FewestBytesGrid's); with FA_V_IN_REGS a
//                 warp holds V's fragments of its 1 / (warps / FA_S_ROWS) of the keys
//   FA_BWD_SWIZZLE 1: shared-memory tiles unpadded and XOR-swizzled (the forward's layout, less shared
//                 memory: what fits FA2's tiles in 99 KB); 0: rows padded by 8 elements (tiles.cuh)
//   FA_DTYPE_BF16 1 for bf16, else fp16
//
// One step of fa_bwd (a query block against this block's keys), as named below:
//   load_step                Q, dO of the step (prefetched a step ahead with two stages)
//   S = Q K^T, dP = dO V^T   warp_gemm over this warp's rectangle of [query][key]
//   probabilities            P = exp2(logit2 - lse2), stored to shared memory (packed copy kept)
//   grad_scores              dS = P (dP - D), stored to shared memory
//   dV += P^T dO, dK += dS^T Q   accumulated in registers across the steps
//   accumulate_dq            dQ = dS K, added from registers into the fp32 workspace
// Three barriers per step (after lse and D, after P and dS, after the step), FA2's count.
// Each product uses attention.cuh's warp_gemm over shared tiles, split over the warps as reads the
// fewest ldmatrix bytes per mma. P and dS go through shared memory (BLOCK_M x BLOCK_N each) so each
// product can split its own result among the warps; this costs shared memory traffic, which FA2
// avoids for P in some configs, in exchange for one code path for every tile shape and arch.
//
// Shared memory (bytes; tiles.py BwdTile.smem_bytes computes the same number and passes it as
// FA_SMEM_BYTES, which is static_asserted below):
//   K, V: 2 x BLOCK_N x (D + 8) x 2;  per stage Q then dO: 2 x STAGES x BLOCK_M x (D + 8) x 2;
//   P, dS: 2 x BLOCK_M x (BLOCK_N + 8) x 2;  lse, D: 2 x BLOCK_M x 4 (swizzled: the same without the + 8).
// With FA_V_IN_REGS, P and dS start where V does: K, max(V, P + dS), the Q/dO stages, lse and D. Every
// warp has V in registers before the first step's barrier, and P and dS are written after it.
//
// Semantics match fwd.cu (see its header): flash-attn layouts and strides, GQA (query head h reads kv
// head h / (heads / heads_k)), varlen through cu_seqlens, bottom-right causal, sliding window, softcap.
// Workspace layouts (the binding allocates them; params.h describes them too):
//   lse          as the forward writes it: (batch, heads, seqlen_q), varlen (heads, total_q)
//   dsoftmax_sum (batch, heads, seqlen_q_rounded), fp32; varlen: element (h, cu_seqlens_q[b] + i) of
//                a contiguous (heads, total_q) view (the binding allocates (heads, total_q + 128 *
//                batch); the tail is unused)
//   dq_accum     allocated (batch, seqlen_q_rounded, heads, FA_HEAD_DIM), varlen (total_q + 128 *
//                batch, heads, FA_HEAD_DIM), contiguous fp32 (FA_HEAD_DIM is the compiled bucket); the
//                kernels lay it out their own way (dq_index): rows in groups of 16, a group holding
//                each head's FA_HEAD_DIM / 8 tiles of 16 x 8 in turn, a tile's 128 floats permuted so
//                that each red instruction of a warp adds 32 consecutive floats: whole 32-byte sectors
//                straight from the mma fragments, no staging. Sequence b of a
//                varlen batch starts at row round_up(cu_seqlens_q[b], 16) + 16 * b (each sequence's
//                groups whole, inside the allocation). Only fa_bwd_convert_dq reads it.
//   dk, dv       per *query* head, with their own strides; the binding sums GQA groups.
// Only rows and columns inside the sequence and head_dim are read or written, so the padding of the
// workspaces is never touched (no initialisation needed beyond what fa_bwd_preprocess does).
//
// Correctness of this file is not verified on a GPU here; the GPU tests under tests/gpu check it.

#include "attention.cuh"
#include "unit.cuh"  // kHeadDim, kBlockM, kBlockN, kWarps, kThreads, kStages from tiles.py's defines

namespace fa {
namespace bwd {

static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0 && kBlockM % 16 == 0, "tile sizes: see tiles.cuh");

// Padded tiles by default, the forward's swizzled ones with FA_BWD_SWIZZLE (tiles.cuh says what each
// costs).
#ifndef FA_BWD_SWIZZLE
#define FA_BWD_SWIZZLE 0
#endif
constexpr bool kSwizzled = FA_BWD_SWIZZLE != 0;
using QTile = SmemTile<kBlockM, kHeadDim, kSwizzled>;   // Q and dO
using KVTile = SmemTile<kBlockN, kHeadDim, kSwizzled>;  // K and V
using PTile = SmemTile<kBlockM, kBlockN, kSwizzled>;    // P and dS, stored [query][key]
#ifndef FA_V_IN_REGS
#define FA_V_IN_REGS 0
#endif
constexpr bool kVInRegs = FA_V_IN_REGS != 0;
// Every tile starts on a 128-byte boundary, as the swizzle's groups of 8 chunks assume.
static_assert(!kSwizzled || (QTile::kBytes % 128 == 0 && KVTile::kBytes % 128 == 0 && PTile::kBytes % 128 == 0),
              "swizzled tiles must be whole 128-byte groups");
constexpr int kPdsBytes = 2 * PTile::kBytes;  // P, dS
constexpr int kVOrPds = KVTile::kBytes > kPdsBytes ? KVTile::kBytes : kPdsBytes;
constexpr int kSmemBytes = KVTile::kBytes + (kVInRegs ? kVOrPds : KVTile::kBytes + kPdsBytes) +
                           2 * kStages * QTile::kBytes + 2 * kBlockM * 4;

#ifdef FA_SMEM_BYTES
static_assert(FA_SMEM_BYTES == kSmemBytes, "tiles.py's shared memory size disagrees with bwd.cu's layout");
#endif

// dq_accum's layout (the header): float (r, c) of one head, r counted from its sequence's first row,
// at dq_index(r, c) from the head's group-0 base (dq_base), groups dq_group_stride floats apart. Inside
// a 16 x 8 tile the mma C fragment's lane l = 4g + t holds rows g and g + 8, columns 2t and 2t + 1:
// value e = 2 * (row >= 8) + column parity of lane l is at e * 32 + l, so a warp's scalar red of one e
// adds 32 consecutive floats (4 whole sectors), as FA2's permuted dq_accum does. Scalar on every arch:
// sm90's vector pairs (a row-major tile) made ptxas spill the 64 x 128 d128 tile (72 B, NVRTC 12.9).
FA_DEVICE fa_i64 dq_index(int r, int c, fa_i64 group_stride) {
  const int rr = r & 15, cc = c & 7;
  const int in_tile = (2 * (rr >> 3) + (cc & 1)) * 32 + 4 * (rr & 7) + (cc >> 1);
  return (r >> 4) * group_stride + (c >> 3) * 128 + in_tile;
}

FA_DEVICE fa_i64 dq_group_stride(const FaParams& p) { return static_cast<fa_i64>(p.heads) * kHeadDim * 16; }

// Whether fa_bwd holds dQ's group stride in a register across the query loop or recomputes it from the
// parameters at each step's dQ adds. The units run at ptxas's 255-register limit, where those two
// registers decide whether it spills: recomputed, FA2's 64 x 128 at d128 compiles without spills on
// sm100 (28 B when held, NVRTC 12.9) and sm90's two-stage one stays clean; the V-in-registers units,
// whose V fragments take 48-64 registers, spill when it is recomputed (sm100 d96 16 B) and keep it.
constexpr bool kHoldDqStride = kVInRegs;

// How accumulate_dq addresses its adds (FA_DQ_LANE_POINTER, tiles.py BwdTile.dq_lane_pointer): 1, one
// pointer per lane held through the adds and constant offsets from it; 0, each add's dq_index from
// scratch (more instructions, nothing held). Again ptxas's margin at 255 registers decides, and not
// the same way for every tile: the pointer takes sm86's d128 64 x 64 to one dQ pass without a spill
// (8, 4 and 4 B with NVRTC 11.8, 12.9 and 13.0 before) and sm100's 64 x 64 at d192 and d256 (12.9: 32
// and 8 B), but spills others that run clean without it (sm80's d128 64 x 128 24 B, sm90's d128 48 B).
#ifndef FA_DQ_LANE_POINTER
#define FA_DQ_LANE_POINTER 0
#endif
constexpr bool kDqLanePointer = FA_DQ_LANE_POINTER != 0;

// FA_BWD_REBASE (tiles.py BwdTile.rebase, label suffix "a"): each step derives its shared-memory tiles
// from a base ptxas cannot see is constant (opaque_zero), so it computes their addresses in the step
// instead of holding them across the query loop. With one Q/dO stage every ldmatrix address of the
// step is loop-invariant, and a swizzled tile's XOR patterns are a register each: hoisted beside dK,
// dV and V's fragments they spilled sm86's swizzled d96 64 x 128 in one dQ pass (116 B stored, NVRTC
// 12.9), V's fragments reloaded from local memory every step; recomputed, none (with FA_DQ_FIRST on
// sm_80 too). 0: the tiles as declared before the loop.
#ifndef FA_BWD_REBASE
#define FA_BWD_REBASE 0
#endif
constexpr bool kRebase = FA_BWD_REBASE != 0;

// FA_DQ_FIRST (tiles.py BwdTile.dq_first, label suffix "f"): the step's dQ = dS K before dV += P^T dO
// and dK += dS^T Q, not after. All three read what the barrier before them published, so only ptxas's
// schedule changes: with FA_BWD_REBASE, sm_80's ptxas fits sm86's d96 64 x 128 (its 99 KB
// alternative) without a spill this way (24 B of spill stores and loads with dQ last, NVRTC 12.9).
// 0: dQ last.
#ifndef FA_DQ_FIRST
#define FA_DQ_FIRST 0
#endif

// The (group 0, this head) base of dq_accum for sequence s.
FA_DEVICE float* dq_base(const FaParams& p, const Seq& s) {
  return p.dq_accum + s.acc_row0 * p.heads * kHeadDim + static_cast<fa_i64>(s.head) * kHeadDim * 16;
}

// Each product splits its result over the warps the way that reads the fewest ldmatrix bytes per
// mma (attention.cuh); S and dP (and so P, dS: [query][key]) in FA_S_ROWS warp rows where given.
#ifdef FA_S_ROWS
using GridS = WarpGrid<kBlockM, kBlockN, kWarps, FA_S_ROWS>;
#else
using GridS = FewestBytesGrid<kBlockM, kBlockN, kWarps>;
#endif
using GridKV = FewestBytesGrid<kBlockN, kHeadDim, kWarps>;  // dK, dV accumulators: [key][dim]
#ifndef FA_DQ_PASSES
#define FA_DQ_PASSES 1
#endif
constexpr int kDqPasses = FA_DQ_PASSES;  // dQ of a step in column slices (the header)
constexpr int kDqCols = kHeadDim / kDqPasses;
static_assert(kHeadDim % (8 * kDqPasses) == 0, "FA_DQ_PASSES must split the head dim into whole n-tiles");
// FA_DQ_HOLD_DS=N (tiles.py BwdTile.dq_hold_ds, label suffix "hN"): with dQ in passes, this warp's dS
// fragments are read from shared memory once per step and held in registers through the passes, and a
// pass splits over N warp rows. The passes then read no more ldmatrix bytes than one pass over the head
// dim in N warp rows (without it each pass reads dS again), and dQ keeps only the held dS and one
// pass's accumulators live beside dK and dV (and V): fewer registers where the passes are narrow.
#ifndef FA_DQ_HOLD_DS
#define FA_DQ_HOLD_DS 0
#endif
#if FA_DQ_HOLD_DS
static_assert(kDqPasses > 1, "FA_DQ_HOLD_DS holds dS through dQ's passes: it needs FA_DQ_PASSES > 1");
using GridQ = WarpGrid<kBlockM, kDqCols, kWarps, FA_DQ_HOLD_DS>;
#else
using GridQ = FewestBytesGrid<kBlockM, kDqCols, kWarps>;  // one dQ pass of one step: [query][dim slice]
#endif

using KVAcc = float[GridKV::kMT][GridKV::kNT][4];

// A [key][dim] B operand of GridS held in registers (V of dP = dO V^T: FA_V_IN_REGS; K of S = Q K^T:
// FA_K_IN_REGS, below): this warp's n-tile pairs of GridS over the whole head dim, read once per key
// block; warp_gemm asks for them as it would from shared memory (n0 - n_base folds to a constant once
// unrolled). One element when not held.
constexpr int kBPairs = (GridS::kNT + 1) / 2;
template <bool kHeld>
using HeldB = u32[kHeld ? kBPairs : 1][kHeld ? kHeadDim / 16 : 1][4];
using VFrags = HeldB<kVInRegs>;

// FA_K_IN_REGS (tiles.py BwdTile.k_in_regs, label suffix "k"): K as the B operand of S = Q K^T held in
// registers the same way (this warp's keys of GridS, the whole head dim, read once per key block), so
// S reads only Q's fragments from shared memory: with S in two warp rows on 64 x 64 at d192, 256
// ldmatrix bytes per mma of S instead of 384, what FA2's four warp rows of dP save (V's fragments for
// 32 keys, 96 registers) at 48 registers. K's shared tile stays: dQ = dS K reads it. 0: S reads K's
// fragments from shared memory each step.
#ifndef FA_K_IN_REGS
#define FA_K_IN_REGS 0
#endif
constexpr bool kKInRegs = FA_K_IN_REGS != 0;
using KFrags = HeldB<kKInRegs>;

template <class Frags>
struct RegB {
  const Frags& frag;
  int n_base;
  FA_DEVICE void load_pair(u32 (&b)[4], int n0, int k0, int /*lane*/) const {
#pragma unroll
    for (int r = 0; r < 4; ++r) b[r] = frag[(n0 - n_base) / 16][k0 / 16][r];
  }
  FA_DEVICE void load_single(u32 (&b)[2], int n0, int k0, int /*lane*/) const {
    b[0] = frag[(n0 - n_base) / 16][k0 / 16][0];
    b[1] = frag[(n0 - n_base) / 16][k0 / 16][1];
  }
};

// This warp's fragments of a held B operand (V or K) from its shared tile, every k step of the bucket
// (columns past head_dim are zero-filled there).
template <class Frags>
FA_DEVICE void load_held_b(Frags& frag, KVTile tile, int n_base, int lane) {
  const SmemB<KVTile, false> b{tile};
#pragma unroll
  for (int k = 0; k < kHeadDim / 16; ++k) {
#pragma unroll
    for (int j = 0; j < kBPairs; ++j) {
      if (2 * j + 1 < GridS::kNT) {
        b.load_pair(frag[j][k], n_base + j * 16, k * 16, lane);
      } else {
        u32 single[2];
        b.load_single(single, n_base + j * 16, k * 16, lane);
        frag[j][k][0] = single[0];
        frag[j][k][1] = single[1];
      }
    }
  }
}

// acc = A B^T over this warp's rectangle of GridS ([query][key]: S = Q K^T, dP = dO V^T), B's [key][dim]
// fragments from this warp's registers where held (`frags`: FA_K_IN_REGS, FA_V_IN_REGS), else from its
// shared tile.
template <bool kBInRegs, class Frags>
FA_DEVICE void score_gemm(float (&acc)[GridS::kMT][GridS::kNT][4], QTile a, const Frags& frags, KVTile b, int m_base,
                          int n_base, int head_dim, int lane) {
  zero<GridS>(acc);
  if (kBInRegs) {
    warp_gemm<GridS, kHeadDim>(acc, SmemA<QTile, false>{a}, RegB<Frags>{frags, n_base}, m_base, n_base, head_dim, lane);
  } else {
    warp_gemm<GridS, kHeadDim>(acc, SmemA<QTile, false>{a}, SmemB<KVTile, false>{b}, m_base, n_base, head_dim, lane);
  }
}

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
  float* dq_accum;  // dq_base: group 0 of this head
  fa_i64 dq_group_stride;  // read only where kHoldDqStride (above)
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
  kb.dq_group_stride = dq_group_stride(p);
  kb.dq_accum = dq_base(p, s);
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

// The probabilities of this warp's S rectangle: P = exp2(logit2 - lse2) on visible entries (0
// elsewhere), stored as elements for dV += P^T dO, and kept as P * softcap's derivative (1 without
// softcap) in fp16 pairs `pd` for dS. Packed, they hold half the registers the fp32 S did while
// dP is computed: the reason dS is split from P (64 x 128 at d128 spilled with both live).
using Packed = u32[GridS::kMT][GridS::kNT][2];

FA_DEVICE void probabilities(const KeyBlock& kb, int row0, const float (&s)[GridS::kMT][GridS::kNT][4],
                             const float* s_lse, PTile sP, Packed& pd, int m_base, int n_base, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < GridS::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < GridS::kNT; ++j) {
      float pr[4], prd[4];
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
        prd[e] = pr[e] * dtanh;
      }
      store_acc_frag(sP, pr, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
      pd[i][j][0] = pack_half2(prd[0], prd[1]);
      pd[i][j][1] = pack_half2(prd[2], prd[3]);
    }
  }
}

// dS = P * (dP - D) (* softcap's derivative, inside pd) from this warp's dP rectangle, stored as
// elements for dK += dS^T Q and dQ += dS K.
FA_DEVICE void grad_scores(const float (&dp)[GridS::kMT][GridS::kNT][4], const Packed& pd, const float* s_dsum,
                           PTile sdS, int m_base, int n_base, int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int i = 0; i < GridS::kMT; ++i) {
#pragma unroll
    for (int j = 0; j < GridS::kNT; ++j) {
      const float d_lo = s_dsum[m_base + i * 16 + g], d_hi = s_dsum[m_base + i * 16 + g + 8];
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const u32 pair = pd[i][j][e >> 1];
        const float prd = half_to_float(static_cast<u16>((e & 1) ? pair >> 16 : pair & 0xffffu));
        ds[e] = prd * (dp[i][j][e] - ((e >> 1) ? d_hi : d_lo));
      }
      store_acc_frag(sdS, ds, m_base + i * 16, n_base + j * 8, 1.f, 1.f, lane);
    }
  }
}

// dQ's adds of one warp's accumulators (grid G's kMT x kNT tiles at m_base, n_base) into the fp32
// workspace, straight from the mma fragments: dq_index makes each warp instruction's adds whole sectors.
template <class G>
FA_DEVICE void add_dq(const FaParams& p, const float (&acc)[G::kMT][G::kNT][4], float* dq, fa_i64 group_stride,
                      int rows, int m_base, int n_base, int lane) {
  if (kDqLanePointer) {
    // dq_index is affine over one lane's fragments: from its first pair (row m_base + g, column
    // n_base + 2t), pair (i, j, e) lies i groups, j 16 x 8 tiles and e value rows of 32 floats on.
    float* lane_dq = dq + dq_index(m_base + (lane >> 2), n_base + 2 * (lane & 3), group_stride);
    for_each_acc_pair<G>(m_base, n_base, lane, [&](int r, int c, int i, int j, int e) {
      if (r < rows && c < p.head_dim) {
        float* at = lane_dq + i * group_stride + j * 128 + e * 32;
        red_add_f32(at, acc[i][j][e]);
        red_add_f32(at + 32, acc[i][j][e + 1]);
      }
    });
  } else {
    for_each_acc_pair<G>(m_base, n_base, lane, [&](int r, int c, int i, int j, int e) {
      if (r < rows && c < p.head_dim) {
        red_add_f32(dq + dq_index(r, c, group_stride), acc[i][j][e]);
        red_add_f32(dq + dq_index(r, c + 1, group_stride), acc[i][j][e + 1]);
      }
    });
  }
}

// dQ += dS K for this step's queries, added into the fp32 workspace (other key blocks add theirs)
// straight from the mma fragments (add_dq). In kDqPasses column slices, a rolled loop (ptxas
// interleaves an unrolled one back into one live set), reading dS from shared memory in each pass or
// once into registers (FA_DQ_HOLD_DS).
FA_DEVICE void accumulate_dq(const FaParams& p, const KeyBlock& kb, int row0, PTile sdS, KVTile sK, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int rows = kb.seqlen_q - row0;
  const fa_i64 group_stride = kHoldDqStride ? kb.dq_group_stride : dq_group_stride(p);
  float* dq = kb.dq_accum + (row0 >> 4) * group_stride;  // row0: a multiple of 16
#if FA_DQ_HOLD_DS
  u32 ds_frags[GridQ::kMT][kBlockN / 16][4];
  load_a_frags<GridQ, kBlockN>(ds_frags, sdS, GridQ::row0(warp), lane);
  const RegA<GridQ::kMT, kBlockN / 16> ds{ds_frags};
#else
  const SmemA<PTile, false> ds{sdS};
#endif
#pragma unroll 1
  for (int pass = 0; pass < kDqPasses; ++pass) {
    const int m_base = GridQ::row0(warp), n_base = pass * kDqCols + GridQ::col0(warp);
    float acc[GridQ::kMT][GridQ::kNT][4];
    zero<GridQ>(acc);
    warp_gemm<GridQ, kBlockN>(acc, ds, SmemB<KVTile, true>{sK}, m_base, n_base, kBlockN, lane);
    add_dq<GridQ>(p, acc, dq, group_stride, rows, m_base, n_base, lane);
  }
}

}  // namespace bwd
}  // namespace fa

using namespace fa;
using namespace fa::bwd;

// D[row] = sum_c dO[row, c] * O[row, c] (fp32) for this block's rows, and this head's dq_accum groups
// of them zeroed (the group holding the sequence's last row whole: its rows past the end stay 0).
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
  for (int row = row0 + warp; row < row_end; row += kWarps) {
    float dot = 0.f;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      dot += dot8(ld_global16(o + row * params.o_row_stride + c), ld_global16(dout + row * params.do_row_stride + c));
    }
    dot = warp_sum(dot);
    if (lane == 0) params.dsoftmax_sum[seq.dsum_row0 + row] = dot;
  }
  // Each group of this head is 16 x kHeadDim contiguous floats (dq_index), 4 per 16-byte store.
  const fa_i64 group_stride = dq_group_stride(params);
  float* groups = dq_base(params, seq) + (row0 >> 4) * group_stride;
  const int n_groups = (row_end - row0 + 15) >> 4;
  for (int i = threadIdx.x; i < n_groups * 4 * kHeadDim; i += kThreads) {
    st_global16(groups + (i / (4 * kHeadDim)) * group_stride + (i % (4 * kHeadDim)) * 4, Chunk16{0u, 0u, 0u, 0u});
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

  // K, V, Q/dO stages, P, dS, lse, D; with V in registers P and dS start at V (the header).
  constexpr int kQAt = KVTile::kBytes + (kVInRegs ? kVOrPds : KVTile::kBytes);
  constexpr int kPdsAt = kVInRegs ? KVTile::kBytes : kQAt + 2 * kStages * QTile::kBytes;
  constexpr int kLseAt = kSmemBytes - 2 * kBlockM * 4;
  const KVTile sK{smem_addr(smem)};
  const KVTile sV{sK.base + KVTile::kBytes};
  const u32 q_base = sK.base + kQAt;  // kStages x (Q, dO)
  const PTile sP{sK.base + kPdsAt};
  const PTile sdS{sP.base + PTile::kBytes};
  float* s_lse = reinterpret_cast<float*>(smem + kLseAt);  // lse * log2(e) per query row
  float* s_dsum = s_lse + kBlockM;                         // D per query row

  const KvRows k = kv_rows(params, seq, params.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  const KvRows v = kv_rows(params, seq, params.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  load_tile_async<kThreads>(sK, k.rows(kb.key0), k.row_stride, kb.seqlen_k - kb.key0, head_dim, tid);
  load_tile_async<kThreads>(sV, v.rows(kb.key0), v.row_stride, kb.seqlen_k - kb.key0, head_dim, tid);
  if (kVInRegs || kKInRegs) copy_commit();  // K and V their own group: read before the first step's Q and dO land
  if (kb.queries.begin < kb.queries.end) load_step(params, kb, q_stage(q_base, 0), kb.queries.begin * kBlockM, tid);
  copy_commit();

  // V and K into registers (where held) once they have landed (the first step's Q and dO may still be in flight); P
  // and dS overwrite V only after the first step's first barrier, which every warp reaches after this.
  VFrags v_frags;
  if (kVInRegs || kKInRegs) {
    copy_wait<1>();
    __syncthreads();  // every thread's K and V copies have landed
  }
  if (kVInRegs) load_held_b(v_frags, sV, GridS::col0(warp), lane);
  KFrags k_frags;
  if (kKInRegs) load_held_b(k_frags, sK, GridS::col0(warp), lane);

  float acc_dk[GridKV::kMT][GridKV::kNT][4];
  float acc_dv[GridKV::kMT][GridKV::kNT][4];
  zero<GridKV>(acc_dk);
  zero<GridKV>(acc_dv);

  for (int m_block = kb.queries.begin; m_block < kb.queries.end; ++m_block) {
    // This step's tiles: the ones above, or with FA_BWD_REBASE the same from an opaque base (kRebase).
    const u32 rebase = kRebase ? opaque_zero() : 0u;
    const KVTile step_K{sK.base + rebase}, step_V{sV.base + rebase};
    const PTile step_P{sP.base + rebase}, step_dS{sdS.base + rebase};
    const u32 step_q_base = q_base + rebase;
    const int row0 = m_block * kBlockM;
    const int stage = kStages == 1 ? 0 : (m_block - kb.queries.begin) & 1;
    const QStage st = q_stage(step_q_base, stage);

    if (kStages == 1) {
      if (m_block > kb.queries.begin) {  // the previous step's readers are past the closing barrier
        load_step(params, kb, st, row0, tid);
        copy_commit();
      }
      copy_wait<0>();
    } else if (m_block + 1 < kb.queries.end) {
      // Prefetch the next step into the other buffer (last read one step ago, before the barrier).
      load_step(params, kb, q_stage(step_q_base, stage ^ 1), row0 + kBlockM, tid);
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
      Packed pd;
      {
        float acc_s[GridS::kMT][GridS::kNT][4];
        score_gemm<kKInRegs>(acc_s, st.q, k_frags, step_K, m_base, n_base, head_dim, lane);
        probabilities(kb, row0, acc_s, s_lse, step_P, pd, m_base, n_base, lane);
      }
      float acc_dp[GridS::kMT][GridS::kNT][4];
      score_gemm<kVInRegs>(acc_dp, st.dout, v_frags, step_V, m_base, n_base, head_dim, lane);
      grad_scores(acc_dp, pd, s_dsum, step_dS, m_base, n_base, lane);
    }
    __syncthreads();

#if FA_DQ_FIRST
    accumulate_dq(params, kb, row0, step_dS, step_K, tid);
#endif
    // dV += P^T dO and dK += dS^T Q: [key][dim] rectangles, k running over this step's queries.
    {
      const int m_base = GridKV::row0(warp), n_base = GridKV::col0(warp);
      warp_gemm<GridKV, kBlockM>(acc_dv, SmemA<PTile, true>{step_P}, SmemB<QTile, true>{st.dout}, m_base, n_base, kBlockM,
                                 lane);
      warp_gemm<GridKV, kBlockM>(acc_dk, SmemA<PTile, true>{step_dS}, SmemB<QTile, true>{st.q}, m_base, n_base,
                                 kBlockM, lane);
    }

#if !FA_DQ_FIRST
    accumulate_dq(params, kb, row0, step_dS, step_K, tid);
#endif
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

// dq = dq_accum * scale_softmax in the output dtype, 8 columns (one 16-byte store) per lane per pass:
// the 8 floats of one row's 16 x 8 tile are two 16-byte chunks in dq_index's layout, its even and its
// odd columns.
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
  const fa_i64 group_stride = dq_group_stride(params);
  const float* dq_accum = dq_base(params, seq);
  for (int r = warp; r < rows; r += kWarps) {
    const int row = row0 + r;
    for (int c = lane * 8; c < params.head_dim; c += 32 * 8) {
      const float* acc = dq_accum + dq_index(row, c, group_stride);
      const Chunk16 even = ld_global16(acc);     // columns 0, 2, 4, 6
      const Chunk16 odd = ld_global16(acc + 32);  // columns 1, 3, 5, 7
      const Chunk16 lo{even.x, odd.x, even.y, odd.y};
      const Chunk16 hi{even.z, odd.z, even.w, odd.w};
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
