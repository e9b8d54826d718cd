// Attention forward for sm_90a (H100, compute capability 9.0 exactly), FlashAttention-3's design in
// fa's own code: O = softmax(Q K^T * scale) V and the row log-sum-exp, with the numerics contract of
// fwd.cu (lse, softmax_scale, window, softcap, causal, GQA/MQA, varlen, seqused_k / leftpad_k /
// kv_batch_idx, and the paged KV cache: block_table with pages of a multiple of FA_BLOCK_N keys, each key
// block one TMA box in one page, as FA3 does where a page holds whole key blocks; other page sizes the
// binding and the routing send to the sm_90 unit, fwd.cu).
//
// Defines (kernels/tiles.py's sm_90a family, HopperTile; the contract of issue 39):
//   FA_HEAD_DIM     64, 96, 128, 192, 256 (a call's head_dim is any multiple of 8 <= it)
//   FA_BLOCK_M      query rows per block: 64 per consumer warpgroup
//   FA_CONSUMER_WGS consumer warpgroups, FA_BLOCK_M / 64 (2 or 3); threads = 128 x (1 + it)
//   FA_BLOCK_N      key rows per pipeline stage (a multiple of 16)
//   FA_STAGES       depth of the K/V pipeline (2)
//   FA_DTYPE_BF16   1 for bf16, else fp16
//
// Warp specialisation (one block = one query block of one (batch, head) pair):
//   warpgroup 0, the producer: gives registers back (setmaxnreg.dec); one thread loads Q once, then
//     streams K(n) and V(n) with TMA (cp.async.bulk.tensor) into an FA_STAGES-deep ring of swizzled
//     shared-memory tiles (a paged cache's key block from its page: kv_coords). Each stage has four mbarriers: k_full / v_full (armed with the bytes the
//     TMA brings: the copy completes the phase) and k_empty / v_empty (every consumer thread arrives
//     when it has finished reading the tile).
//   warpgroups 1 .. FA_CONSUMER_WGS, the consumers: take registers (setmaxnreg.inc); each owns 64 query
//     rows and, per key block n (last to first, as fwd.cu):
//       S = Q K(n)^T                 compute_scores   wgmma, A = Q and B = K from shared memory
//       softcap, mask, online softmax                 softmax.cuh's stages on the fp32 fragments
//       O += P V(n)                  accumulate_pv    wgmma, A = P from registers, B = V (transposed)
//     The consumers take turns issuing their S GEMM (named barriers, "ping-pong"): while one
//     warpgroup's tensor-core work runs, the other's softmax runs on the other units. Inside a
//     warpgroup the loop is software-pipelined (FA3's intra-warpgroup overlap): S(n) and P V of the
//     block before are in flight together, and S(n)'s softmax runs while that P V finishes.
//   The epilogue writes O / l from the accumulators and lse = m + log(l).
//
// Shared-memory tiles are TMA's 128-byte swizzle (64-byte for head dim 96): a tile of R rows x D
// columns is stored as D / W column panels of W = 64 (32) elements, each panel R rows of 128 (64)
// bytes whose 16-byte chunks are XOR-ed with the row's position in its 8-row (1024-byte) atom. TMA
// writes that layout (the tensor map's swizzle) and wgmma reads it (the matrix descriptor's layout type):
// 16-byte chunk c of row r is stored at c ^ (r % 8) with 128-byte rows, c ^ ((r / 2) % 4) with 64-byte
// rows: the XOR of address bits [4, 7) with [7, 10) (128 B), [4, 6) with [7, 9) (64 B).
//
// Not verified on a GPU: compiled with NVRTC 12.9 and 13 for sm_90a (tests/kernels/test_hopper_compile.py:
// HGMMA and UTMALDG in the SASS, no spills) and run on the CPU emulator against the fp32 reference
// (tests/kernels/test_hopper_emulated.py), which shows it right under the PTX ISA's definitions only.

#include "attention.cuh"
#include "hopper.cuh"
#include "softmax.cuh"

#if !defined(FA_HEAD_DIM) || !defined(FA_BLOCK_M) || !defined(FA_BLOCK_N) || !defined(FA_STAGES)
#error "compile with -DFA_HEAD_DIM -DFA_BLOCK_M -DFA_BLOCK_N -DFA_STAGES (kernels/tiles.py's 9.0a family)"
#endif

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "hopper_fwd.cu is for sm_90a only (wgmma, setmaxnreg): compile with --gpu-architecture=sm_90a"
#endif

namespace fa {
namespace h90 {

constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kBlockM = FA_BLOCK_M;
constexpr int kBlockN = FA_BLOCK_N;
constexpr int kStages = FA_STAGES;
constexpr int kConsumers = FA_CONSUMER_WGS;  // consumer warpgroups (tiles.py: FA_BLOCK_M / 64)
constexpr int kWgThreads = 128;
constexpr int kThreads = kWgThreads * (1 + kConsumers);
constexpr int kConsumerThreads = kWgThreads * kConsumers;

static_assert(kBlockM == 64 * kConsumers, "each consumer warpgroup owns 64 query rows (one wgmma m64)");
static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key block: whole k16 steps of P V, one wgmma N <= 256");
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim: whole swizzle panels, one wgmma N <= 256");
static_assert(kStages >= 1 && kStages <= 4, "FA_STAGES is 1 to 4");
static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");

// Registers after the reallocation (FA3's split): the producer keeps the minimum, the consumers share
// the rest of the 64K-register file. Each count is a multiple of 8 and
// 128 x (producer + consumers x consumer) <= 65536.
constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
static_assert(kWgThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register file overcommitted");

// hopper.cuh's wrappers (fa::sm90) by their names here; fa::smem_addr (primitives.cuh) is the one
// this file uses.
using sm90::CUtensorMap;
using sm90::fence_acc;
using sm90::make_desc;
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_init;
using sm90::mbar_wait;
using sm90::named_arrive;
using sm90::named_sync;
using sm90::Wgmma;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_wait;

// ---------------------------------------------------------------------------------------------
// Swizzled tiles: the layout TMA writes and wgmma reads
// ---------------------------------------------------------------------------------------------

// The swizzle panel: 64 elements (128-byte rows, 128-byte swizzle) where the head dim is a multiple of
// 64, else 32 (64-byte rows and swizzle: head dim 96). binding/tensor_maps.h boxes the TMA copies by
// the same width (its panel_cols), one copy per panel.
constexpr int kPanelCols = kHeadDim % 64 == 0 ? 64 : 32;
constexpr int kRowBytes = kPanelCols * 2;
constexpr int kPanels = kHeadDim / kPanelCols;
constexpr sm90::Swizzle kSwizzle = kRowBytes == 128 ? sm90::kSwizzle128B : sm90::kSwizzle64B;
constexpr int kAtomBytes = 8 * kRowBytes;                // 8 rows: the swizzle pattern's repeat

// ROWS x kHeadDim elements as kPanels panels of ROWS x kPanelCols; `base` 1024-byte aligned.
template <int ROWS>
struct SwizzledTile {
  static_assert(ROWS % 8 == 0, "whole swizzle atoms");
  static constexpr int kPanelBytes = ROWS * kRowBytes;
  static constexpr int kBytes = kPanels * kPanelBytes;
  u32 base;

  // wgmma operand "K-major" (rows x k, k contiguous: Q as A, K as B of S = Q K^T): the 64 (A) or N (B)
  // rows from `row0`, k step k0. Rows step by kRowBytes inside an atom and atoms by kAtomBytes (the
  // stride offset); within a swizzled row the k step is a byte offset the hardware swizzles.
  FA_DEVICE u64 k_major(int row0, int k0) const {
    const u32 addr = base + (k0 / kPanelCols) * kPanelBytes + row0 * kRowBytes + (k0 % kPanelCols) * 2;
    return make_desc(addr, 16, kAtomBytes, kSwizzle);
  }

  // wgmma B operand "MN-major" (k rows x n, n contiguous: V as B of O = P V, k = key): keys k0 ..
  // k0 + 15 and every column. The 8-key groups step by kAtomBytes (stride offset), the column panels by
  // kPanelBytes (leading offset).
  FA_DEVICE u64 mn_major(int k0) const {
    return make_desc(base + k0 * kRowBytes, kPanelBytes, kAtomBytes, kSwizzle);
  }
};

using QTile = SwizzledTile<kBlockM>;
using KVTile = SwizzledTile<kBlockN>;

// Dynamic shared memory: Q, then the K and V rings, then the mbarriers, from a 1024-byte aligned base
// (the swizzle atom; the kernel checks it).
struct Layout {
  u32 q, k, v, bars;
  FA_DEVICE static Layout of(u32 base) {
    Layout l;
    l.q = base;
    l.k = l.q + QTile::kBytes;
    l.v = l.k + kStages * KVTile::kBytes;
    l.bars = l.v + kStages * KVTile::kBytes;
    return l;
  }
  FA_DEVICE QTile sq() const { return QTile{q}; }
  FA_DEVICE KVTile sk(int stage) const { return KVTile{k + stage * KVTile::kBytes}; }
  FA_DEVICE KVTile sv(int stage) const { return KVTile{v + stage * KVTile::kBytes}; }
  // mbarriers: q_full, then per stage k_full, v_full, k_empty, v_empty, then v_tail.
  FA_DEVICE u32 q_full() const { return bars; }
  FA_DEVICE u32 k_full(int stage) const { return bars + 8 * (1 + 4 * stage); }
  FA_DEVICE u32 v_full(int stage) const { return bars + 8 * (2 + 4 * stage); }
  FA_DEVICE u32 k_empty(int stage) const { return bars + 8 * (3 + 4 * stage); }
  FA_DEVICE u32 v_empty(int stage) const { return bars + 8 * (4 + 4 * stage); }
  // The TMA of the V block that holds the sequence's last key (one per block: phase 0), which the
  // producer completes itself (load_values) before it arrives on that stage's v_full.
  FA_DEVICE u32 v_tail() const { return bars + 8 * (1 + 4 * kStages); }
};

constexpr int kBarrierBytes = 8 * (2 + 4 * kStages);
constexpr int kSmemBytes = QTile::kBytes + 2 * kStages * KVTile::kBytes + kBarrierBytes;
static_assert(kSmemBytes + 1024 <= 227 * 1024, "over sm_90's 227 KiB of shared memory per block (1 KiB reserved)");
#ifdef FA_SMEM_BYTES
static_assert(kSmemBytes == FA_SMEM_BYTES, "tiles.py's smem_bytes disagrees with this kernel's layout");
#endif

// The pipeline position of the i-th key block a block visits: its ring stage and the parity of that
// stage's use (the first use waits for phase 0 of *_full; *_empty's phase before that counts as done).
struct Slot {
  int stage;
  u32 parity;
  FA_DEVICE static Slot of(int i) { return Slot{i % kStages, static_cast<u32>((i / kStages) & 1)}; }
};

// Named barriers 1 .. kConsumers order the consumers' GEMM issue (ping-pong).
constexpr int kTurnBarrier0 = 1;

// ---------------------------------------------------------------------------------------------
// The block: which rows, which keys (as fwd.cu's Block, without the split)
// ---------------------------------------------------------------------------------------------

struct Block {
  Seq seq;
  Band band;
  int row0;    // first query row of the block in its sequence
  Range keys;  // key blocks to visit, last to first
  float logit_scale, tanh_scale;
  bool softcap;
  int page_size;  // keys per page when seq.k_pages is set (block_table)
};

FA_DEVICE Block block_of(const FaParams& p) {
  Block b;
  b.seq = locate_block(p);
  b.band = Band::of(p, b.seq.seqlen_q, b.seq.seqlen_k);
  const int m_blocks = gridDim.x;
  // Causal and right-bounded grids run the query blocks with the most keys first.
  const int m_block = b.band.right >= 0 ? m_blocks - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  b.row0 = m_block * kBlockM;
  b.keys = b.band.key_blocks(b.row0, kBlockM, kBlockN, b.seq.seqlen_q, b.seq.seqlen_k);
  b.softcap = p.softcap > 0.f;
  b.logit_scale = b.softcap ? p.softcap * kLog2e : p.scale_softmax_log2;
  b.tanh_scale = b.softcap ? p.scale_softmax / p.softcap : 0.f;
  b.page_size = p.page_block_size;
  return b;
}

// ---------------------------------------------------------------------------------------------
// The producer: TMA loads of Q once and of K / V through the ring
// ---------------------------------------------------------------------------------------------

// One tile by TMA, one copy per column panel, all completing on `bar` (armed with the whole tile's
// bytes first: out-of-bounds rows and columns arrive as zeros and count).
template <int ROWS>
FA_DEVICE void load_tile(SwizzledTile<ROWS> tile, const CUtensorMap& map, u32 bar, int row, int head, int batch) {
  mbar_arrive_expect_tx(bar, SwizzledTile<ROWS>::kBytes);
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    sm90::tma_load_4d(tile.base + panel * SwizzledTile<ROWS>::kPanelBytes, &map, bar, panel * kPanelCols, row, head,
                batch);
  }
}

// Key block n's (row, batch) in K's and V's tensor maps (binding/tensor_maps.h): (column, row, head,
// batch), with a packed (varlen) tensor's batch of 1 and its sequence's first row. A paged cache's maps
// are its pages, (column, row in page, head, page): the block's page from the block table, whose pages
// hold whole key blocks (tensor_maps.h refuses other page sizes), so one box never crosses a page.
struct KvCoords {
  int row, batch;
};

FA_DEVICE KvCoords kv_coords(const Block& blk, int n) {
  const Seq& s = blk.seq;
  const int key0 = n * kBlockN;
  if (s.k_pages != nullptr) return KvCoords{key0 % blk.page_size, s.k_pages[key0 / blk.page_size]};
  return KvCoords{static_cast<int>(s.k_row0) + key0, s.k_batch};
}

// V(n) into `stage`. Rows past the sequence's end must be zeros, as fwd.cu's zero-filling loads make
// them: P is 0 there, but 0 x NaN is NaN, and those rows are other cache slots (seqused_k, a page's
// unused tail, the next packed sequence), which may hold anything (torch.empty memory). So the block
// that holds the last key lands on v_tail; the producer zeroes its rows past the end (generic stores,
// then fence.proxy.async for wgmma's async-proxy reads) and arrives on v_full itself (count 1, no
// bytes): the consumers' waits are the same for every block.
FA_DEVICE void load_values(const Block& blk, const Layout& sm, const CUtensorMap& tm_v, int stage, int n,
                           KvCoords at) {
  const int valid = blk.seq.seqlen_k - n * kBlockN;  // >= 1: a visited block holds a key
  const KVTile tile = sm.sv(stage);
  if (valid >= kBlockN) {
    load_tile(tile, tm_v, sm.v_full(stage), at.row, blk.seq.kv_head, at.batch);
    return;
  }
  load_tile(tile, tm_v, sm.v_tail(), at.row, blk.seq.kv_head, at.batch);
  mbar_wait(sm.v_tail(), 0);
  // A swizzled row keeps its 16-byte chunks within its own kRowBytes: zero the rows' bytes whole.
  const Chunk16 zero{0u, 0u, 0u, 0u};
  for (int panel = 0; panel < kPanels; ++panel) {
    const u32 first = tile.base + panel * KVTile::kPanelBytes + valid * kRowBytes;
    const u32 end = tile.base + (panel + 1) * KVTile::kPanelBytes;
    for (u32 a = first; a < end; a += 16) st_shared16(a, zero);
  }
  sm90::fence_async_shared();
  mbar_arrive(sm.v_full(stage));
}

// Run by one thread.
FA_DEVICE void produce(const Block& blk, const Layout& sm, const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                       const CUtensorMap& tm_v) {
  const Seq& s = blk.seq;
  load_tile(sm.sq(), tm_q, sm.q_full(), static_cast<int>(s.q_row0) + blk.row0, s.head, s.q_batch);
  int i = 0;
  for (int n = blk.keys.end - 1; n >= blk.keys.begin; --n, ++i) {
    const Slot slot = Slot::of(i);
    const KvCoords at = kv_coords(blk, n);
    // The consumers have finished with what this stage held kStages blocks ago.
    mbar_wait(sm.k_empty(slot.stage), slot.parity ^ 1);
    load_tile(sm.sk(slot.stage), tm_k, sm.k_full(slot.stage), at.row, s.kv_head, at.batch);
    mbar_wait(sm.v_empty(slot.stage), slot.parity ^ 1);
    load_values(blk, sm, tm_v, slot.stage, n, at);
  }
}

// ---------------------------------------------------------------------------------------------
// The consumers: per warpgroup, 64 query rows
// ---------------------------------------------------------------------------------------------

constexpr int kSTiles = kBlockN / 8;   // 8-key n-tiles of S per warp (16 rows each)
constexpr int kOTiles = kHeadDim / 8;  // 8-column n-tiles of O
using ScoreAcc = float[1][kSTiles][4];
using OutAcc = float[1][kOTiles][4];
using RowStats = SoftmaxRows<1>;

// The same registers as wgmma's accumulator operand: TILES x 4 floats in order (hopper.cuh's D layout
// is the per-warp C layout of softmax.cuh, n-tile after n-tile).
template <int TILES>
FA_DEVICE float (&flat(float (&acc)[1][TILES][4]))[TILES * 4] {
  return reinterpret_cast<float (&)[TILES * 4]>(acc);
}

// S = Q K^T over every k step of the bucket: columns past the call's head dim are TMA's zeros in both
// tiles. (Skipping those steps as fwd.cu does would put a branch between the wgmmas, and ptxas then
// serialises every wgmma of the kernel: its warning C7520.)
FA_DEVICE void compute_scores(ScoreAcc& s, QTile q, KVTile k, int wg_row0) {
  wgmma_fence();
#pragma unroll
  for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
    Wgmma<kBlockN>::ss<0, 0>(flat(s), q.k_major(wg_row0, k0), k.k_major(0, k0), k0 > 0);
  }
  wgmma_commit();
}

// P packed from the S accumulators into wgmma's register A layout (the C layout of n-tiles 2k and
// 2k + 1 is the A layout of k step k, as in fwd.cu).
using ProbFrags = u32[kBlockN / 16][4];

FA_DEVICE void pack_probs(ProbFrags& frag, const ScoreAcc& p) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) acc_to_a_frag(frag[kk], p[0][2 * kk], p[0][2 * kk + 1]);
}

// O += P V, issued and committed; the caller waits.
FA_DEVICE void accumulate_pv(OutAcc& o, ProbFrags& frag, KVTile v) {
  fence_acc(flat(o));
  sm90::fence_regs(reinterpret_cast<u32(&)[kBlockN / 4]>(frag));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) Wgmma<kHeadDim>::rs<1>(flat(o), frag[kk], v.mn_major(kk * 16), 1);
  wgmma_commit();
}

// The ping-pong turn of consumer `wg` (0-based): barrier kTurnBarrier0 + wg completes when this
// warpgroup syncs and the previous one has arrived (256 threads).
FA_DEVICE void wait_turn(int wg) { named_sync(kTurnBarrier0 + wg, 2 * kWgThreads); }
FA_DEVICE void pass_turn(int wg) { named_arrive(kTurnBarrier0 + (wg + 1) % kConsumers, 2 * kWgThreads); }

// S of key block n (the i-th visited, in ring slot `slot`), issued in this warpgroup's ping-pong turn
// once K has landed; the caller waits for it.
FA_DEVICE void issue_scores(ScoreAcc& s, const Block& blk, const Layout& sm, int wg, int n, Slot slot) {
  const int wg_row0 = wg * 64;
  mbar_wait(sm.k_full(slot.stage), slot.parity);
  wait_turn(wg);
  compute_scores(s, sm.sq(), sm.sk(slot.stage), wg_row0);
  // The last consumer keeps the turn after its last block: no one would take it.
  if (wg != kConsumers - 1 || n > blk.keys.begin) pass_turn(wg);
}

// Retired S of key block n to P (softcap, mask, the softmax's row step); K's stage released. corr: O's
// rescaling, applied by the caller once no P V is writing O.
FA_DEVICE void scores_to_probs(ScoreAcc& s, const Block& blk, const Layout& sm, int wg, int n, Slot slot,
                               RowStats& st, float (&corr)[1][2]) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int key0 = n * kBlockN;
  fence_acc(flat(s));
  mbar_arrive(sm.k_empty(slot.stage));  // K read: the producer may refill the stage
  if (blk.softcap) apply_softcap(s, blk.tanh_scale);
  if (blk.band.crosses(blk.row0 + wg * 64, 64, key0, kBlockN, blk.seq.seqlen_k)) {
    apply_mask(s, blk.band, blk.row0 + wg * 64 + 16 * warp_in_wg, key0, blk.seq.seqlen_k, lane);
  }
  softmax_rows(s, st, blk.logit_scale, corr);
}

// The overlap holds S(n), P(n+1) and O at once: with two consumers (240 registers each) it fits; with
// three (160) ptxas spilled (d96: 144 bytes) and serialised the wgmmas, so those run one GEMM at a time.
constexpr bool kOverlap = kConsumers == 2;

// The key loop of one consumer warpgroup. With kOverlap, software-pipelined as FA3's intra-warpgroup
// overlap: S(n) is issued, then O += P(n+1) V(n+1) of the block before behind it; S(n)'s softmax runs
// while that P V is in flight, and O is rescaled only after its wait. Returns O unnormalised and the
// row statistics.
FA_DEVICE void consume(const Block& blk, const Layout& sm, int wg, OutAcc& o, RowStats& st) {
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
  }
  st.start();
  mbar_wait(sm.q_full(), 0);  // also with no key block: the Q tile's TMA must land before the epilogue
  if (blk.keys.end <= blk.keys.begin) return;

  // The first turn goes to consumer 0: the last consumer opens it.
  if (wg == kConsumers - 1) pass_turn(wg);

  float s[1][kSTiles][4];
  float corr[1][2];
  ProbFrags p;
  if constexpr (!kOverlap) {
    int i = 0;
    for (int n = blk.keys.end - 1; n >= blk.keys.begin; --n, ++i) {
      const Slot slot = Slot::of(i);
      issue_scores(s, blk, sm, wg, n, slot);
      wgmma_wait<0>();
      scores_to_probs(s, blk, sm, wg, n, slot, st, corr);
      rescale_output(o, corr);
      pack_probs(p, s);
      mbar_wait(sm.v_full(slot.stage), slot.parity);
      accumulate_pv(o, p, sm.sv(slot.stage));
      wgmma_wait<0>();
      fence_acc(flat(o));
      mbar_arrive(sm.v_empty(slot.stage));
    }
    return;
  }

  // The first key block: S alone (O is zero, nothing to overlap with).
  int n = blk.keys.end - 1;
  Slot prev = Slot::of(0);
  issue_scores(s, blk, sm, wg, n, prev);
  wgmma_wait<0>();
  scores_to_probs(s, blk, sm, wg, n, prev, st, corr);
  pack_probs(p, s);

  int i = 1;
  for (--n; n >= blk.keys.begin; --n, ++i) {
    const Slot slot = Slot::of(i);
    issue_scores(s, blk, sm, wg, n, slot);
    mbar_wait(sm.v_full(prev.stage), prev.parity);
    accumulate_pv(o, p, sm.sv(prev.stage));
    wgmma_wait<1>();  // S(n) retired; P V still in flight
    scores_to_probs(s, blk, sm, wg, n, slot, st, corr);
    wgmma_wait<0>();  // P V retired: O and the old P may be touched, V's stage released
    fence_acc(flat(o));
    mbar_arrive(sm.v_empty(prev.stage));
    rescale_output(o, corr);
    pack_probs(p, s);
    prev = slot;
  }

  // The last block's P V.
  mbar_wait(sm.v_full(prev.stage), prev.parity);
  accumulate_pv(o, p, sm.sv(prev.stage));
  wgmma_wait<0>();
  fence_acc(flat(o));
  mbar_arrive(sm.v_empty(prev.stage));
}

// O / l straight from the accumulators, a packed pair (4 bytes) per store: each quad of lanes writes 16
// contiguous bytes of a row. (Staging through the warpgroup's rows of the Q tile for 16-byte stores needs
// a named barrier between the writes and the reads, whose ordering the emulator's race model does not
// credit yet; the accumulator layout makes the direct stores safe without one.) lse = m + log(l), +inf for
// a row that sees nothing.
FA_DEVICE void store_output(const FaParams& p, const Block& blk, int wg, const OutAcc& o, RowStats& st) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const Seq& s = blk.seq;
  reduce_sums(st);
  u16* out = q_rows(static_cast<u16*>(p.o), p.o_batch_stride, p.o_row_stride, p.o_head_stride, s);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float sum = st.sum[0][hh];
    const float inv = sum > 0.f ? rcp_approx(sum) : 0.f;
    const int row = blk.row0 + wg * 64 + 16 * warp_in_wg + g + 8 * hh;
    if (row >= s.seqlen_q) continue;
    if (t == 0) p.lse[s.lse_row0 + row] = row_lse(st.max[0][hh], sum, blk.logit_scale, pos_inf());
    u32* dst = reinterpret_cast<u32*>(out + row * p.o_row_stride);
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      const int col = 8 * j + 2 * t;
      if (col < p.head_dim) dst[col / 2] = pack_float2(o[0][j][2 * hh] * inv, o[0][j][2 * hh + 1] * inv);
    }
  }
}

}  // namespace h90
}  // namespace fa

using namespace fa;
using namespace fa::h90;

// Q, K, V tensor maps: binding/tensor_maps.h (rank 4: column, row, head, batch; box kPanelCols x
// BLOCK_M or BLOCK_N; the swizzle of kPanelCols' row bytes).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fa_fwd_sm90a(const __grid_constant__ FaParams params, const __grid_constant__ CUtensorMap tm_q,
                 const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  extern __shared__ __align__(1024) unsigned char smem[];
  const Block blk = block_of(params);
  if (blk.row0 >= blk.seq.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const u32 base = smem_addr(smem);
  // The swizzle patterns repeat every 1024 bytes from an aligned address: a misaligned dynamic
  // shared-memory window would scramble every tile, so stop rather than compute garbage.
  if ((base & 1023u) != 0) __trap();
  const Layout sm = Layout::of(base);
  const int warpgroup = threadIdx.x / kWgThreads;

  if (threadIdx.x == 0) {
    sm90::prefetch_tensormap(&tm_q);
    sm90::prefetch_tensormap(&tm_k);
    sm90::prefetch_tensormap(&tm_v);
    mbar_init(sm.q_full(), 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(sm.k_full(st), 1);  // the producer's arrive.expect_tx; the TMA bytes complete it
      mbar_init(sm.v_full(st), 1);
      mbar_init(sm.k_empty(st), kConsumerThreads);
      mbar_init(sm.v_empty(st), kConsumerThreads);
    }
    mbar_init(sm.v_tail(), 1);
    sm90::fence_mbar_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce(blk, sm, tm_q, tm_k, tm_v);
    return;
  }
  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int wg = warpgroup - 1;
  float o[1][kOTiles][4];
  RowStats st;
  consume(blk, sm, wg, o, st);
  store_output(params, blk, wg, o, st);
}
