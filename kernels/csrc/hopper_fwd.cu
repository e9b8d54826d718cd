// Attention forward for sm_90a (H100, compute capability 9.0 exactly), FlashAttention-3's design in
// fa's own code: O = softmax(Q K^T * scale) V and the row log-sum-exp, with the numerics contract of
// fwd.cu (lse, softmax_scale, window, softcap, causal, GQA/MQA, varlen, seqused_k / leftpad_k /
// kv_batch_idx). Not the paged KV cache (block_table): the binding refuses it for this unit and the
// routing sends such calls to the sm_90 unit (fwd.cu).
//
// Defines (kernels/tiles.py's sm_90a family; docs in /work/prompts/hopper_api.md's contract):
//   FA_HEAD_DIM     64, 96, 128, 192, 256 (a call's head_dim is any multiple of 8 <= it)
//   FA_BLOCK_M      query rows per block: 64 per consumer warpgroup (128: two, 192: three);
//                   threads = 128 x (1 + FA_BLOCK_M / 64)
//   FA_BLOCK_N      key rows per pipeline stage (a multiple of 16)
//   FA_STAGES       depth of the K/V pipeline (2)
//   FA_DTYPE_BF16   1 for bf16, else fp16
//
// Warp specialisation (one block = one query block of one (batch, head) pair):
//   warpgroup 0, the producer: gives registers back (setmaxnreg.dec); one thread loads Q once, then
//     streams K(n) and V(n) with TMA (cp.async.bulk.tensor) into an FA_STAGES-deep ring of swizzled
//     shared-memory tiles. Each stage has four mbarriers: k_full / v_full (armed with the bytes the
//     TMA brings: the copy completes the phase) and k_empty / v_empty (every consumer thread arrives
//     when it has finished reading the tile).
//   warpgroups 1 .. FA_BLOCK_M / 64, the consumers: take registers (setmaxnreg.inc); each owns 64 query
//     rows and, per key block n (last to first, as fwd.cu):
//       S = Q K(n)^T                 compute_scores   wgmma, A = Q and B = K from shared memory
//       softcap, mask, online softmax                 softmax.cuh's stages on the fp32 fragments
//       O += P V(n)                  accumulate_pv    wgmma, A = P from registers, B = V (transposed)
//     The consumers take turns issuing their S GEMM (named barriers, "ping-pong"): while one
//     warpgroup's tensor-core work runs, the other's softmax runs on the other units.
//   The epilogue writes O / l through the warpgroup's own rows of the Q tile and lse = m + log(l).
//
// Shared-memory tiles are TMA's 128-byte swizzle (64-byte for head dim 96): a tile of R rows x D
// columns is stored as D / W column panels of W = 64 (32) elements, each panel R rows of 128 (64)
// bytes whose 16-byte chunks are XOR-ed with the row's position in its 8-row (1024-byte) atom. TMA
// writes that layout (the tensor map's swizzle), wgmma reads it (the matrix descriptor's layout type),
// and the epilogue addresses it with SwizzledTile::at.
//
// Not verified on a GPU: compiled with NVRTC for sm_90a (tests/kernels/test_hopper_compile.py checks
// HGMMA and UTMALDG in the SASS and no spills); correctness needs the emulator or a device.

#include "attention.cuh"
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
constexpr int kConsumers = kBlockM / 64;  // consumer warpgroups
constexpr int kWgThreads = 128;
constexpr int kThreads = kWgThreads * (1 + kConsumers);
constexpr int kConsumerThreads = kWgThreads * kConsumers;

static_assert(kBlockM % 64 == 0, "each consumer warpgroup owns 64 query rows (one wgmma m64)");
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

// ---------------------------------------------------------------------------------------------
// sm_90a PTX wrappers this kernel needs. Move to hopper.cuh (hemu's) once its API covers them; they
// follow primitives.cuh's rules: inline PTX on raw bits, no CUDA header.
// ---------------------------------------------------------------------------------------------

// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned, passed as a __grid_constant__ kernel
// parameter (the TMA unit reads it from parameter space through its generic address).
struct alignas(64) TensorMap {
  u64 opaque[16];
};

FA_DEVICE u64 tensor_map_addr(const TensorMap& m) { return reinterpret_cast<u64>(&m); }

// mbarrier (PTX ISA 9.7.13.15): an 8-byte shared-memory object with a phase bit, an arrival count and
// a transaction-byte count; a phase completes when both reach zero.
FA_DEVICE void mbar_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// One arrival that also adds `bytes` to the transactions the phase waits for (the TMA that follows
// completes them).
FA_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

FA_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Spin until the phase with parity `parity` has completed (try_wait suspends for a while in hardware
// between polls).
FA_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "wait_%=:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The barriers' initialisation made visible to the async proxy (TMA) before any copy signals them.
FA_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Generic-proxy shared-memory writes (the epilogue's) ordered before async-proxy accesses (TMA, wgmma).
FA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// TMA: the box at coordinates (c0 = column, c1 = row, c2 = head, c3 = batch) of a rank-4 tensor map
// into shared memory at `dst`, completing its bytes on mbarrier `bar`. Out-of-bounds elements are
// written as zeros (and counted), so a partial tile still completes the whole box's bytes.
FA_DEVICE void tma_load_4d(u32 dst, const TensorMap& map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"(tensor_map_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

FA_DEVICE void prefetch_tensor_map(const TensorMap& map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map_addr(map)) : "memory");
}

// Register reallocation between warpgroups (every warp of the warpgroup executes it).
template <int REGS>
FA_DEVICE void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
FA_DEVICE void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}

// Named barriers 1..15 (0 is __syncthreads): `threads` arrivals complete one; sync waits, arrive does not.
FA_DEVICE void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
FA_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// wgmma's async protocol (PTX ISA 9.7.15.6): fence before the first wgmma that reads registers the
// warpgroup wrote (accumulators, A fragments), commit the issued ones as a group, wait until at most
// N groups are pending before touching their accumulators.
FA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
FA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Pins a register's value at this point of the program for the compiler: the accumulators of an
// in-flight wgmma must not be read, written or moved between the issue and the wait.
FA_DEVICE void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
FA_DEVICE void pin(u32& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1): start address, leading- and stride-dimension
// byte offsets (all >> 4, 14 bits each) and the swizzle mode in bits 62-63 (1: 128 B, 2: 64 B).
FA_DEVICE u64 smem_desc(u32 addr, u32 lead_bytes, u32 stride_bytes, u32 swizzle_mode) {
  return static_cast<u64>((addr & 0x3ffff) >> 4) | (static_cast<u64>((lead_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<u64>((stride_bytes >> 4) & 0x3fff) << 32) | (static_cast<u64>(swizzle_mode) << 62);
}

// wgmma.mma_async m64nNk16, fp32 accumulators d[N / 8][4] (each warp's 16 rows in mma.m16n8k16's C
// layout). The operand lists are spelt out per N, eight accumulators (two n-tiles) per group.
#define FA_ACC_G0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FA_ACC_G1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define FA_ACC_G2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define FA_ACC_G3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define FA_ACC_G4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FA_ACC_G5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define FA_ACC_G6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define FA_ACC_G7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define FA_ACC_G8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define FA_ACC_G9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define FA_ACC_G10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define FA_ACC_G11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define FA_ACC_G12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define FA_ACC_G13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define FA_ACC_G14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define FA_ACC_G15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define FA_ACC_L4 FA_ACC_G0 ", " FA_ACC_G1 ", " FA_ACC_G2 ", " FA_ACC_G3
#define FA_ACC_L5 FA_ACC_L4 ", " FA_ACC_G4
#define FA_ACC_L6 FA_ACC_L5 ", " FA_ACC_G5
#define FA_ACC_L7 FA_ACC_L6 ", " FA_ACC_G6
#define FA_ACC_L8 FA_ACC_L7 ", " FA_ACC_G7
#define FA_ACC_L9 FA_ACC_L8 ", " FA_ACC_G8
#define FA_ACC_L11 FA_ACC_L9 ", " FA_ACC_G9 ", " FA_ACC_G10
#define FA_ACC_L12 FA_ACC_L11 ", " FA_ACC_G11
#define FA_ACC_L16 FA_ACC_L12 ", " FA_ACC_G12 ", " FA_ACC_G13 ", " FA_ACC_G14 ", " FA_ACC_G15

#define FA_ACC_O(j) \
  "+f"(d[2 * j][0]), "+f"(d[2 * j][1]), "+f"(d[2 * j][2]), "+f"(d[2 * j][3]), "+f"(d[2 * j + 1][0]), \
      "+f"(d[2 * j + 1][1]), "+f"(d[2 * j + 1][2]), "+f"(d[2 * j + 1][3])
#define FA_ACC_O4 FA_ACC_O(0), FA_ACC_O(1), FA_ACC_O(2), FA_ACC_O(3)
#define FA_ACC_O5 FA_ACC_O4, FA_ACC_O(4)
#define FA_ACC_O6 FA_ACC_O5, FA_ACC_O(5)
#define FA_ACC_O7 FA_ACC_O6, FA_ACC_O(6)
#define FA_ACC_O8 FA_ACC_O7, FA_ACC_O(7)
#define FA_ACC_O9 FA_ACC_O8, FA_ACC_O(8)
#define FA_ACC_O11 FA_ACC_O9, FA_ACC_O(9), FA_ACC_O(10)
#define FA_ACC_O12 FA_ACC_O11, FA_ACC_O(11)
#define FA_ACC_O16 FA_ACC_O12, FA_ACC_O(12), FA_ACC_O(13), FA_ACC_O(14), FA_ACC_O(15)

#if FA_DTYPE_BF16
#define FA_WGMMA_AB "bf16.bf16"
#else
#define FA_WGMMA_AB "f16.f16"
#endif

template <int N>
struct Wgmma;  // m64nNk16 for the N this kernel's tiles use (S: BLOCK_N; O: the head dim)

// SS: A and B from shared memory (descriptors); RS: A from registers (this warp's 16 x 16 fragment in
// mma.m16n8k16's A layout). `accumulate` 0 ignores d's old value (D = A B). TRANS_B 1 reads B
// "MN-major" (V stored [key][dim]). I0.. are the operand numbers after the N / 2 accumulators.
#define FA_WGMMA(N, GROUPS, I0, I1, I2, I3, I4, I5, I6)                                                     \
  template <>                                                                                             \
  struct Wgmma<N> {                                                                                       \
    template <int TRANS_B>                                                                                \
    FA_DEVICE static void ss(float (&d)[N / 8][4], u64 a, u64 b, int accumulate) {                         \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #I2 ", 0;\n"                                    \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FA_WGMMA_AB " {" FA_ACC_L##GROUPS     \
                   "}, %" #I0 ", %" #I1 ", p, 1, 1, 0, %" #I3 ";\n}\n"                                     \
                   : FA_ACC_O##GROUPS                                                                     \
                   : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_B));                                      \
    }                                                                                                     \
    template <int TRANS_B>                                                                                \
    FA_DEVICE static void rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 b, int accumulate) {           \
      asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #I5 ", 0;\n"                                    \
                   " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FA_WGMMA_AB " {" FA_ACC_L##GROUPS     \
                   "}, {%" #I0 ", %" #I1 ", %" #I2 ", %" #I3 "}, %" #I4 ", p, 1, 1, %" #I6 ";\n}\n"          \
                   : FA_ACC_O##GROUPS                                                                     \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TRANS_B));  \
    }                                                                                                     \
  };

FA_WGMMA(64, 4, 32, 33, 34, 35, 36, 37, 38)
FA_WGMMA(80, 5, 40, 41, 42, 43, 44, 45, 46)
FA_WGMMA(96, 6, 48, 49, 50, 51, 52, 53, 54)
FA_WGMMA(112, 7, 56, 57, 58, 59, 60, 61, 62)
FA_WGMMA(128, 8, 64, 65, 66, 67, 68, 69, 70)
FA_WGMMA(144, 9, 72, 73, 74, 75, 76, 77, 78)
FA_WGMMA(176, 11, 88, 89, 90, 91, 92, 93, 94)
FA_WGMMA(192, 12, 96, 97, 98, 99, 100, 101, 102)
FA_WGMMA(256, 16, 128, 129, 130, 131, 132, 133, 134)
#undef FA_WGMMA

// ---------------------------------------------------------------------------------------------
// Swizzled tiles: the layout TMA writes and wgmma reads
// ---------------------------------------------------------------------------------------------

// The swizzle panel: 64 elements (128-byte rows, 128-byte swizzle) where the head dim is a multiple of
// 64, else 32 (64-byte rows and swizzle: head dim 96). binding/tensor_maps.h boxes the TMA copies by
// the same width (its panel_cols), one copy per panel.
constexpr int kPanelCols = kHeadDim % 64 == 0 ? 64 : 32;
constexpr int kRowBytes = kPanelCols * 2;
constexpr int kPanels = kHeadDim / kPanelCols;
constexpr u32 kSwizzleMode = kRowBytes == 128 ? 1 : 2;  // the descriptor's layout type: 128 B, 64 B
constexpr int kAtomBytes = 8 * kRowBytes;                // 8 rows: the swizzle pattern's repeat

// ROWS x kHeadDim elements as kPanels panels of ROWS x kPanelCols; `base` 1024-byte aligned.
template <int ROWS>
struct SwizzledTile {
  static_assert(ROWS % 8 == 0, "whole swizzle atoms");
  static constexpr int kPanelBytes = ROWS * kRowBytes;
  static constexpr int kBytes = kPanels * kPanelBytes;
  u32 base;

  // Element (row, col): 16-byte chunk c of a row moves to c ^ (the row's place in its atom), the XOR
  // the hardware applies to address bits [4, 7) with bits [7, 10).
  FA_DEVICE u32 at(int row, int col) const {
    const int panel = col / kPanelCols, c = col % kPanelCols;
    const int key = kRowBytes == 128 ? (row & 7) : ((row >> 1) & 3);
    return base + static_cast<u32>(panel * kPanelBytes + row * kRowBytes + (((c >> 3) ^ key) << 4) + (c & 7) * 2);
  }

  // wgmma operand "K-major" (rows x k, k contiguous: Q as A, K as B of S = Q K^T): the 64 (A) or N (B)
  // rows from `row0`, k step k0. Rows step by kRowBytes inside an atom and atoms by kAtomBytes (the
  // stride offset); within a swizzled row the k step is a byte offset the hardware swizzles.
  FA_DEVICE u64 k_major(int row0, int k0) const {
    const u32 addr = base + (k0 / kPanelCols) * kPanelBytes + row0 * kRowBytes + (k0 % kPanelCols) * 2;
    return smem_desc(addr, 16, kAtomBytes, kSwizzleMode);
  }

  // wgmma B operand "MN-major" (k rows x n, n contiguous: V as B of O = P V, k = key): keys k0 ..
  // k0 + 15 and every column. The 8-key groups step by kAtomBytes (stride offset), the column panels by
  // kPanelBytes (leading offset).
  FA_DEVICE u64 mn_major(int k0) const {
    return smem_desc(base + k0 * kRowBytes, kPanelBytes, kAtomBytes, kSwizzleMode);
  }
};

using QTile = SwizzledTile<kBlockM>;
using KVTile = SwizzledTile<kBlockN>;

// Dynamic shared memory: Q, then the K and V rings, then the mbarriers; the base rounded up to the
// 1024-byte atom (tiles.py's smem_bytes includes the 1 KiB of slack).
struct Layout {
  u32 q, k, v, bars;
  FA_DEVICE static Layout of(u32 raw) {
    Layout l;
    l.q = (raw + 1023) & ~1023u;
    l.k = l.q + QTile::kBytes;
    l.v = l.k + kStages * KVTile::kBytes;
    l.bars = l.v + kStages * KVTile::kBytes;
    return l;
  }
  FA_DEVICE QTile sq() const { return QTile{q}; }
  FA_DEVICE KVTile sk(int stage) const { return KVTile{k + stage * KVTile::kBytes}; }
  FA_DEVICE KVTile sv(int stage) const { return KVTile{v + stage * KVTile::kBytes}; }
  // mbarriers: q_full, then per stage k_full, v_full, k_empty, v_empty.
  FA_DEVICE u32 q_full() const { return bars; }
  FA_DEVICE u32 k_full(int stage) const { return bars + 8 * (1 + 4 * stage); }
  FA_DEVICE u32 v_full(int stage) const { return bars + 8 * (2 + 4 * stage); }
  FA_DEVICE u32 k_empty(int stage) const { return bars + 8 * (3 + 4 * stage); }
  FA_DEVICE u32 v_empty(int stage) const { return bars + 8 * (4 + 4 * stage); }
};

constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);
constexpr int kSmemBytes = 1024 + QTile::kBytes + 2 * kStages * KVTile::kBytes + kBarrierBytes;
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

// Named barriers: 1 .. kConsumers order the consumers' GEMM issue (ping-pong), then one per
// consumer for its epilogue.
constexpr int kTurnBarrier0 = 1;
constexpr int kEpilogueBarrier0 = 1 + kConsumers;

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
  return b;
}

// ---------------------------------------------------------------------------------------------
// The producer: TMA loads of Q once and of K / V through the ring
// ---------------------------------------------------------------------------------------------

// One tile by TMA, one copy per column panel, all completing on `bar` (armed with the whole tile's
// bytes first: out-of-bounds rows and columns arrive as zeros and count).
template <int ROWS>
FA_DEVICE void load_tile(SwizzledTile<ROWS> tile, const TensorMap& map, u32 bar, int row, int head, int batch) {
  mbar_arrive_expect_tx(bar, SwizzledTile<ROWS>::kBytes);
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    tma_load_4d(tile.base + panel * SwizzledTile<ROWS>::kPanelBytes, map, bar, panel * kPanelCols, row, head,
                batch);
  }
}

// Run by one thread. Rows are addressed in the tensor maps' coordinates (binding/tensor_maps.h):
// (column, row, head, batch), with a packed (varlen) tensor's batch of 1 and its sequence's first row.
FA_DEVICE void produce(const Block& blk, const Layout& sm, const TensorMap& tm_q, const TensorMap& tm_k,
                       const TensorMap& tm_v) {
  const Seq& s = blk.seq;
  load_tile(sm.sq(), tm_q, sm.q_full(), static_cast<int>(s.q_row0) + blk.row0, s.head, s.q_batch);
  int i = 0;
  for (int n = blk.keys.end - 1; n >= blk.keys.begin; --n, ++i) {
    const Slot slot = Slot::of(i);
    const int row = static_cast<int>(s.k_row0) + n * kBlockN;
    // The consumers have finished with what this stage held kStages blocks ago.
    mbar_wait(sm.k_empty(slot.stage), slot.parity ^ 1);
    load_tile(sm.sk(slot.stage), tm_k, sm.k_full(slot.stage), row, s.kv_head, s.k_batch);
    mbar_wait(sm.v_empty(slot.stage), slot.parity ^ 1);
    load_tile(sm.sv(slot.stage), tm_v, sm.v_full(slot.stage), row, s.kv_head, s.k_batch);
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

// S = Q K^T over every k step of the bucket: columns past the call's head dim are TMA's zeros in both
// tiles. (Skipping those steps as fwd.cu does would put a branch between the wgmmas, and ptxas then
// serialises every wgmma of the kernel: its warning C7520.)
FA_DEVICE void compute_scores(ScoreAcc& s, QTile q, KVTile k, int wg_row0) {
  wgmma_fence();
#pragma unroll
  for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
    Wgmma<kBlockN>::ss<0>(s[0], q.k_major(wg_row0, k0), k.k_major(0, k0), k0 > 0);
  }
  wgmma_commit();
}

// O += P V: P packed from the S accumulators into wgmma's register A layout (the C layout of n-tiles
// 2k and 2k + 1 is the A layout of k step k, as in fwd.cu).
FA_DEVICE void accumulate_pv(OutAcc& o, const ScoreAcc& p, KVTile v) {
  u32 frag[kBlockN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) acc_to_a_frag(frag[kk], p[0][2 * kk], p[0][2 * kk + 1]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) Wgmma<kHeadDim>::rs<1>(o[0], frag[kk], v.mn_major(kk * 16), 1);
  wgmma_commit();
}

template <int TILES>
FA_DEVICE void pin_all(float (&acc)[1][TILES][4]) {
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) pin(acc[0][j][e]);
  }
}

// The ping-pong turn of consumer `wg` (0-based): barrier kTurnBarrier0 + wg completes when this
// warpgroup syncs and the previous one has arrived (256 threads).
FA_DEVICE void wait_turn(int wg) { named_sync(kTurnBarrier0 + wg, 2 * kWgThreads); }
FA_DEVICE void pass_turn(int wg) { named_arrive(kTurnBarrier0 + (wg + 1) % kConsumers, 2 * kWgThreads); }

// The key loop of one consumer warpgroup. Returns O unnormalised and the row statistics.
FA_DEVICE void consume(const FaParams& p, const Block& blk, const Layout& sm, int wg, OutAcc& o, RowStats& st) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
  const int wg_row0 = wg * 64;                          // the warpgroup's rows in the block
  const int warp_row = blk.row0 + wg_row0 + 16 * warp_in_wg;  // this warp's first row in the sequence
  const int seqlen_k = blk.seq.seqlen_k;
  const int blocks = blk.keys.end - blk.keys.begin;

#pragma unroll
  for (int j = 0; j < kOTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
  }
  st.start();
  mbar_wait(sm.q_full(), 0);  // also with no key block: the Q tile's TMA must land before the epilogue
  if (blocks <= 0) return;     // writes over it

  // The first turn goes to consumer 0: the last consumer opens it. Each consumer passes the turn on
  // after issuing its S GEMM, except the last consumer after its last block (no one would take it).
  if (wg == kConsumers - 1) pass_turn(wg);

  int i = 0;
  for (int n = blk.keys.end - 1; n >= blk.keys.begin; --n, ++i) {
    const Slot slot = Slot::of(i);
    const int key0 = n * kBlockN;
    float s[1][kSTiles][4];

    mbar_wait(sm.k_full(slot.stage), slot.parity);
    wait_turn(wg);
    compute_scores(s, sm.sq(), sm.sk(slot.stage), wg_row0);
    if (wg != kConsumers - 1 || n > blk.keys.begin) pass_turn(wg);
    wgmma_wait<0>();
    pin_all(s);
    mbar_arrive(sm.k_empty(slot.stage));  // K read: the producer may refill the stage

    if (blk.softcap) apply_softcap(s, blk.tanh_scale);
    if (blk.band.crosses(blk.row0 + wg_row0, 64, key0, kBlockN, seqlen_k)) {
      apply_mask(s, blk.band, warp_row, key0, seqlen_k, lane);
    }
    online_softmax(s, o, st, blk.logit_scale);

    mbar_wait(sm.v_full(slot.stage), slot.parity);
    pin_all(o);
    accumulate_pv(o, s, sm.sv(slot.stage));
    wgmma_wait<0>();
    pin_all(o);
    mbar_arrive(sm.v_empty(slot.stage));
  }
}

// O / l staged through the warpgroup's own 64 rows of the Q tile (which only its own S GEMMs read,
// all retired), then 16-byte stores; lse = m + log(l), +inf for a row that sees nothing.
FA_DEVICE void store_output(const FaParams& p, const Block& blk, const Layout& sm, int wg, const OutAcc& o,
                            RowStats& st) {
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int tid = threadIdx.x & (kWgThreads - 1);
  const Seq& s = blk.seq;
  const QTile sq = sm.sq();
  const int wg_row0 = wg * 64;
  reduce_sums(st);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float sum = st.sum[0][hh];
    const float inv = sum > 0.f ? rcp_approx(sum) : 0.f;
    const int r = wg_row0 + 16 * warp_in_wg + g + 8 * hh;  // row in the block
    const int row = blk.row0 + r;
    if (t == 0 && row < s.seqlen_q) p.lse[s.lse_row0 + row] = row_lse(st.max[0][hh], sum, blk.logit_scale, pos_inf());
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      st_shared32(sq.at(r, 8 * j + 2 * t), pack_float2(o[0][j][2 * hh] * inv, o[0][j][2 * hh + 1] * inv));
    }
  }
  named_sync(kEpilogueBarrier0 + wg, kWgThreads);
  u16* out = q_rows(static_cast<u16*>(p.o), p.o_batch_stride, p.o_row_stride, p.o_head_stride, s);
  constexpr int kChunksPerRow = kHeadDim / 8;
#pragma unroll 1
  for (int i = tid; i < 64 * kChunksPerRow; i += kWgThreads) {
    const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
    const int row = blk.row0 + wg_row0 + r;
    if (row < s.seqlen_q && col < p.head_dim) {
      st_global16(out + row * p.o_row_stride + col, ld_shared16(sq.at(wg_row0 + r, col)));
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
    fa_fwd_sm90a(const __grid_constant__ FaParams params, const __grid_constant__ TensorMap tm_q,
                 const __grid_constant__ TensorMap tm_k, const __grid_constant__ TensorMap tm_v) {
  if (!has_pair(params)) return;  // past the last (batch, head) pair of a folded grid
  extern __shared__ __align__(16) unsigned char smem[];
  const Block blk = block_of(params);
  if (blk.row0 >= blk.seq.seqlen_q) return;  // varlen: this sequence is shorter than the grid
  const Layout sm = Layout::of(smem_addr(smem));
  const int warpgroup = threadIdx.x / kWgThreads;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(tm_q);
    prefetch_tensor_map(tm_k);
    prefetch_tensor_map(tm_v);
    mbar_init(sm.q_full(), 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(sm.k_full(st), 1);  // the producer's arrive.expect_tx; the TMA bytes complete it
      mbar_init(sm.v_full(st), 1);
      mbar_init(sm.k_empty(st), kConsumerThreads);
      mbar_init(sm.v_empty(st), kConsumerThreads);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) produce(blk, sm, tm_q, tm_k, tm_v);
    return;
  }
  regs_alloc<kConsumerRegs>();
  const int wg = warpgroup - 1;
  float o[1][kOTiles][4];
  RowStats st;
  consume(params, blk, sm, wg, o, st);
  store_output(params, blk, sm, wg, o, st);
}
