// A CPU emulator for fa's device code: runs kernels/csrc/*.cu as host C++, one fiber per CUDA thread.
//
// Force-included ahead of a kernel source (`g++ -include emu.h -x c++ kernels/csrc/fwd.cu`), it
// stands in for the CUDA language (threadIdx, __syncthreads, __shared__, ...) and for
// kernels/csrc/primitives.cuh, whose include guard it defines so the real file is skipped. Every
// PTX-backed primitive there is written here again from the PTX ISA's definition of the instruction
// it wraps (fragment layouts of mma.sync and ldmatrix, shfl.sync.bfly, cp.async groups); the helpers
// composed from them (composed.cuh) are included as they are. So a kernel that runs correctly here has its indexing, masking, pipelining and synchronisation right, given that
// reading of the ISA. What it cannot show: speed, ptxas bugs, the exact rounding of the tensor cores
// and MUFU approximations (tanh.approx excepted: see below), and anything the hardware does that the
// ISA leaves open.
//
// What it checks, failing the launch with a message naming the thread and the address:
//   - shared memory: accesses outside the launch's dynamic size; reads of bytes never written; races
//     between threads in one barrier interval (read-after-write, write-after-read, write-after-write;
//     warps are not assumed to run in lockstep, as on Volta and newer); reads of a cp.async
//     destination before the issuing thread waited for it.
//   - global memory, for the accesses made through primitives (16-byte loads and stores, cp.async
//     sources, red.add): inside a registered allocation and aligned. Plain C++ stores of a kernel are
//     not seen here; the harness surrounds every buffer with canaries for those. Likewise plain C++
//     loads and stores of shared memory (bwd.cu's per-row lse and D) escape the race checks.
//   - warps: every lane of a warp reaches each collective (mma, ldmatrix, shfl) with the same
//     instruction from the same call site (the .aligned rule of mma.sync.aligned, ldmatrix.sync.aligned
//     and shfl.sync: every lane executes the same instruction, not just the same kind), and no lane has
//     exited; __syncthreads is reached by every thread of the block.
//   - cp.async: a thread that exits with copies not retired by a wait_group (committed or not).
//   - launch limits (emu_set_limits, from the unit's cubin or its tiles.py facts): threads within the
//     kernel's launch bounds, registers x threads within the block's register file, static plus
//     dynamic shared memory within the arch's per-block limit.
//   - deadlock: a block in which every live thread waits.
//
// tanh.approx.f32 is modelled with its documented error, not as the exact function: PTX ISA 9.1
// states a maximum relative error of 2^-11 over the whole range (2^-10.987 is its bound for the .f16
// form); the emulator takes the larger, 2^-10.987. Each result is y (1 + r 2^-10.987), clamped to
// [-1, 1], with r in [-1, 1] a fixed hash of the input: the same input always gives the same result,
// as on hardware, so a forward and a backward that both use tanh.approx agree, and one that computes
// tanh another way disagrees as it could on a GPU. The ISA gives only the maximum; with every result
// at the full bound the shipped softcap backward exceeds FA2's error rule (docs/reliability.md).
// ex2, lg2 and rcp stay exact.
//
// It also counts shared-memory wavefronts (bank conflicts) per access kind, for bench/smem_banks.py:
// ldmatrix phases exactly; per-thread loads, stores and cp.async by grouping the k-th execution of one
// call site by the lanes of a warp between two barriers (exact for code that all lanes run).
//
// Arch: EMU_ARCH=800 (and up) emulates cp.async as truly asynchronous (the copy lands at the
// wait_group that retires it, the latest the ISA allows); EMU_ARCH=750 the register-staged loads of
// the Turing path. One launch at a time per process (global state); blocks run one after another.
#ifndef FA_EMU_H_
#define FA_EMU_H_

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#ifndef EMU_ARCH
#error "compile with -DEMU_ARCH=750 or 800 (and up)"
#endif

#include "params.h"  // FaParams, host layout (the same bytes as the device's)

// ---- the CUDA language, as far as the kernels use it ----------------------------------------------
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

constexpr int kMaxSmem = 256 * 1024;
constexpr int kMaxThreads = 1024;
constexpr int kWarpSize = 32;

// One failure ends the launch: the first message wins and the calling fiber is abandoned (never
// resumed); called from the scheduler, it records the message and returns.
void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace emu

// The block's dynamic shared memory: `extern __shared__ unsigned char smem[]` in a kernel names this.
alignas(16) static unsigned char smem[emu::kMaxSmem];

namespace emu {

enum class State { kReady, kWaitWarp, kWaitBlock, kDone };

struct CopyOp {  // one cp.async of 16 bytes
  uint32_t dst;
  const void* src;
  bool pred;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  Dim3 tid;
  int index = 0;  // linear thread index in the block
  State state = State::kReady;
  std::vector<CopyOp> open_group;             // cp.async issued since the last commit
  std::deque<std::vector<CopyOp>> committed;  // oldest first
  std::unordered_map<uintptr_t, int> site_count;  // executions of each call site since the last barrier
};

enum AccessKind { kAccLd, kAccSt, kAccCpAsync, kAccLdmatrix, kAccKinds };

struct BankStats {
  uint64_t instructions = 0, wavefronts = 0, ideal = 0;
};

// The accesses of one warp-wide shared-memory instruction, gathered lane by lane.
struct AccessGroup {
  int kind = 0;
  uint32_t bytes = 0;
  uint32_t lanes = 0;  // bit mask of the lanes that took part
  uint32_t addr[32];
};

// Inputs and outputs of one warp-wide instruction, gathered lane by lane.
struct WarpOp {
  int arrived = 0;
  int kind = 0;
  uintptr_t site = 0;  // the call site (return address) of the first lane to arrive
  uint32_t in[kWarpSize][12];
  uint32_t out[kWarpSize][4];
};

struct Allocation {
  uintptr_t begin, end;
  std::string name;
};

// Shadow state of one shared-memory byte.
struct Shadow {
  int32_t w_epoch = -1;  // barrier interval of the last write; -1: never written
  int16_t w_tid = -1;
  int16_t r_tid = -1;  // the one reader in r_epoch, or kManyReaders
  int32_t r_epoch = -1;
  int16_t pending_tid = -1;  // a cp.async of this thread will write the byte; -1: none
};
constexpr int16_t kManyReaders = -2;

// What the next launches may use (emu_set_limits): 0 means not known.
struct Limits {
  int max_threads = 0;  // the kernel's __launch_bounds__ (the cubin's EIATTR_MAX_THREADS)
  int registers = 0;    // per thread, from the cubin
  int static_smem = 0;  // bytes ptxas puts in the kernel beside the launch's dynamic size
  int smem_limit = 0;   // the arch's per-block maximum, static and dynamic together
};
constexpr int kRegistersPerBlock = 64 * 1024;  // every arch from sm75 on
constexpr int kRegisterUnit = 256;             // registers are allocated per warp in units of 256

struct Global {
  Dim3 block_idx, block_dim, grid_dim;
  Limits limits;
  int smem_bytes = 0;
  int threads = 0;
  std::vector<Fiber> fibers;
  Fiber* cur = nullptr;
  ucontext_t sched;
  std::deque<int> ready;
  std::vector<WarpOp> warps;
  int barrier_arrived = 0;
  int32_t epoch = 0;  // barrier intervals since the block started
  std::vector<Shadow> shadow;
  std::vector<Allocation> allocations;
  std::string error;
  bool failed = false;
  uint64_t collectives = 0;
  BankStats banks[kAccKinds];
  std::map<std::tuple<int, uintptr_t, int>, AccessGroup> groups;  // (warp, call site, k-th execution)
};

static Global g;  // internal linkage: each emulated kernel library has its own

inline void fail(const char* fmt, ...) {
  if (!g.failed) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g.error = buf;
    if (g.cur != nullptr) {
      char where[160];
      snprintf(where, sizeof where, " [block (%u, %u, %u), thread %d (warp %d, lane %d)]", g.block_idx.x,
               g.block_idx.y, g.block_idx.z, g.cur->index, g.cur->index / kWarpSize, g.cur->index % kWarpSize);
      g.error += where;
    }
    g.failed = true;
  }
  if (g.cur != nullptr) {  // abandon this fiber: back to the scheduler for good
    Fiber* f = g.cur;
    f->state = State::kDone;
    swapcontext(&f->ctx, &g.sched);
    abort();  // unreachable: a failed fiber is never resumed
  }
}

// Suspend the current fiber until someone makes it ready again.
inline void block_here(State why) {
  Fiber* f = g.cur;
  f->state = why;
  swapcontext(&f->ctx, &g.sched);
  if (g.failed) fail("abandoned");
}

inline int lane_of(const Fiber* f) { return f->index % kWarpSize; }
inline int warp_of(const Fiber* f) { return f->index / kWarpSize; }

// ---- global memory -----------------------------------------------------------------------------------
inline void check_global(const void* p, size_t n, size_t align, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % align != 0) fail("%s: global address %p is not %zu-byte aligned", what, p, align);
  for (const Allocation& al : g.allocations) {
    if (a >= al.begin && a + n <= al.end) return;
  }
  const Allocation* near = nullptr;
  uintptr_t best = UINTPTR_MAX;
  for (const Allocation& al : g.allocations) {
    const uintptr_t d = a < al.begin ? al.begin - a : a - al.begin;
    if (d < best) best = d, near = &al;
  }
  if (near != nullptr) {
    fail("%s: global access [%p, +%zu) is outside every buffer (nearest: %s, [%p, %p), offset %lld)", what, p, n,
         near->name.c_str(), reinterpret_cast<void*>(near->begin), reinterpret_cast<void*>(near->end),
         static_cast<long long>(a) - static_cast<long long>(near->begin));
  }
  fail("%s: global access [%p, +%zu) and no buffer is registered", what, p, n);
}

// ---- shared memory -----------------------------------------------------------------------------------
inline void check_smem_range(uint32_t addr, uint32_t n, uint32_t align, const char* what) {
  if (addr % align != 0) fail("%s: shared address %u is not %u-byte aligned", what, addr, align);
  if (static_cast<uint64_t>(addr) + n > static_cast<uint64_t>(g.smem_bytes)) {
    fail("%s: shared access [%u, %u) is outside the launch's %d bytes of dynamic shared memory", what, addr,
         addr + n, g.smem_bytes);
  }
}

// Wavefronts of one instruction: 32 banks of 4 bytes; accesses of B bytes are served 128 / B lanes per
// phase, and a phase takes as many wavefronts as the most distinct words any one bank holds.
inline void count_wavefronts(const AccessGroup& grp) {
  const uint32_t per_phase = 128 / grp.bytes;
  uint64_t wavefronts = 0, active = 0;
  for (uint32_t p0 = 0; p0 < 32; p0 += per_phase) {
    uint32_t words[32][32];
    int count[32] = {0};
    int worst = 0;
    for (uint32_t l = p0; l < p0 + per_phase; ++l) {
      if (!(grp.lanes >> l & 1u)) continue;
      ++active;
      for (uint32_t w = 0; w < grp.bytes / 4; ++w) {
        const uint32_t word = grp.addr[l] / 4 + w, bank = word % 32;
        bool seen = false;
        for (int i = 0; i < count[bank]; ++i) seen |= words[bank][i] == word;
        if (!seen) words[bank][count[bank]++] = word;
        worst = std::max(worst, count[bank]);
      }
    }
    wavefronts += static_cast<uint64_t>(worst);
  }
  BankStats& st = g.banks[grp.kind];
  st.instructions += 1;
  st.wavefronts += wavefronts;
  st.ideal += (active * grp.bytes + 127) / 128;
}

inline void record_access(int kind, uint32_t addr, uint32_t bytes, const void* site) {
  Fiber* f = g.cur;
  const uintptr_t s = reinterpret_cast<uintptr_t>(site);
  const int k = f->site_count[s]++;
  AccessGroup& grp = g.groups[std::make_tuple(warp_of(f), s, k)];
  grp.kind = kind;
  grp.bytes = bytes;
  grp.lanes |= 1u << lane_of(f);
  grp.addr[lane_of(f)] = addr;
}

// At a barrier every lane has finished its accesses of the interval: count them, restart the sites.
inline void flush_accesses() {
  for (const auto& entry : g.groups) count_wavefronts(entry.second);
  g.groups.clear();
  for (Fiber& f : g.fibers) f.site_count.clear();
}

inline void smem_read(uint32_t addr, void* dst, uint32_t n, uint32_t align, const char* what) {
  check_smem_range(addr, n, align, what);
  const int16_t me = static_cast<int16_t>(g.cur->index);
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = g.shadow[addr + i];
    if (s.pending_tid >= 0) {
      fail("%s: reads shared byte %u before the cp.async of thread %d that writes it was waited for", what,
           addr + i, s.pending_tid);
    }
    if (s.w_epoch < 0) fail("%s: reads shared byte %u, which nothing has written", what, addr + i);
    if (s.w_epoch == g.epoch && s.w_tid != me) {
      fail("%s: reads shared byte %u written by thread %d with no __syncthreads between (race)", what, addr + i,
           s.w_tid);
    }
    if (s.r_epoch != g.epoch) {
      s.r_epoch = g.epoch;
      s.r_tid = me;
    } else if (s.r_tid != me) {
      s.r_tid = kManyReaders;
    }
  }
  memcpy(dst, smem + addr, n);
}

// Race checks of a write by thread `me` in this interval; `pending` marks a cp.async destination.
inline void smem_claim(uint32_t addr, uint32_t n, int16_t me, const char* what) {
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = g.shadow[addr + i];
    if (s.pending_tid >= 0 && s.pending_tid != me) {
      fail("%s: writes shared byte %u while a cp.async of thread %d to it is in flight (race)", what, addr + i,
           s.pending_tid);
    }
    if (s.w_epoch == g.epoch && s.w_tid != me) {
      fail("%s: writes shared byte %u also written by thread %d with no __syncthreads between (race)", what,
           addr + i, s.w_tid);
    }
    if (s.r_epoch == g.epoch && s.r_tid != me) {
      fail("%s: writes shared byte %u read by thread %d with no __syncthreads between (race)", what, addr + i,
           s.r_tid == kManyReaders ? -1 : s.r_tid);
    }
  }
}

inline void smem_write(uint32_t addr, const void* src, uint32_t n, uint32_t align, const char* what) {
  check_smem_range(addr, n, align, what);
  const int16_t me = static_cast<int16_t>(g.cur->index);
  smem_claim(addr, n, me, what);
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = g.shadow[addr + i];
    s.w_epoch = g.epoch;
    s.w_tid = me;
  }
  memcpy(smem + addr, src, n);
}

// ---- warp collectives ------------------------------------------------------------------------------
enum Kind : int {
  kShfl = 1,
  kLdm = 2,  // + 4 * (x4 ? 1 : 0) + 8 * trans
  kMma = 32,
};

void compute_warp_op(WarpOp& w, int warp);

// Deposit this lane's inputs; the last lane to arrive computes every lane's outputs. `site` is the
// instruction's address in the kernel (the primitive's return address): .aligned instructions need
// every lane of the warp at the same one.
inline const uint32_t* warp_collective(int kind, const void* site, const uint32_t* in, int n_in) {
  Fiber* f = g.cur;
  const int warp = warp_of(f), lane = lane_of(f);
  WarpOp& w = g.warps[warp];
  for (int l = 0; l < kWarpSize; ++l) {
    if (g.fibers[warp * kWarpSize + l].state == State::kDone) {
      fail("warp-wide instruction (kind %d) with lane %d of the warp already exited", kind, l);
    }
  }
  const uintptr_t at = reinterpret_cast<uintptr_t>(site);
  if (w.arrived == 0) {
    w.kind = kind;
    w.site = at;
  } else if (w.kind != kind) {
    fail("lanes of warp %d diverge: this lane runs instruction kind %d while others wait in kind %d", warp, kind,
         w.kind);
  } else if (w.site != at) {
    fail("lanes of warp %d reach warp-wide instruction kind %d from different call sites (%p and %p): the "
         ".aligned form needs every lane at the same instruction",
         warp, kind, reinterpret_cast<void*>(at), reinterpret_cast<void*>(w.site));
  }
  memcpy(w.in[lane], in, sizeof(uint32_t) * n_in);
  ++g.collectives;
  if (++w.arrived < kWarpSize) {
    block_here(State::kWaitWarp);
  } else {
    compute_warp_op(w, warp);
    w.arrived = 0;
    for (int l = 0; l < kWarpSize; ++l) {
      Fiber& o = g.fibers[warp * kWarpSize + l];
      if (&o != f && o.state == State::kWaitWarp) {
        o.state = State::kReady;
        g.ready.push_back(o.index);
      }
    }
  }
  return w.out[lane];
}

// ---- numbers ---------------------------------------------------------------------------------------
inline float bits_f(uint32_t v) {
  float f;
  memcpy(&f, &v, 4);
  return f;
}
inline uint32_t f_bits(float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  return v;
}

inline float half_to_float(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t float_to_half(float f) {  // round to nearest even (IEEE conversion)
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  memcpy(&h, &x, 2);
  return h;
}
inline float bf16_to_float(uint16_t b) { return bits_f(static_cast<uint32_t>(b) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = f_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }

}  // namespace emu

// ---- kernels/csrc/primitives.cuh, emulated ------------------------------------------------------------
#define FA_PRIMITIVES_CUH_
#define FA_DEVICE inline

#include "basics.cuh"  // the kernels' own types and constants
#if FA_DTYPE_BF16 && EMU_ARCH < 800
#error "bf16 kernels need sm_80 or newer (as primitives.cuh)"
#endif
#if EMU_ARCH >= 800
#define FA_HAS_CP_ASYNC 1
#else
#define FA_HAS_CP_ASYNC 0
#endif

// CUDA's built-in thread coordinates and integer min/max.
#define threadIdx (::emu::g.cur->tid)
#define blockIdx (::emu::g.block_idx)
#define blockDim (::emu::g.block_dim)
#define gridDim (::emu::g.grid_dim)
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

inline void __syncthreads() {
  using namespace emu;
  if (++g.barrier_arrived < g.threads) {
    block_here(State::kWaitBlock);
    return;
  }
  g.barrier_arrived = 0;
  ++g.epoch;
  flush_accesses();
  for (Fiber& o : g.fibers) {
    if (&o != g.cur && o.state == State::kWaitBlock) {
      o.state = State::kReady;
      g.ready.push_back(o.index);
    }
  }
}

namespace fa {

inline float bits_to_float(u32 v) { return emu::bits_f(v); }
inline u32 float_to_bits(float f) { return emu::f_bits(f); }

// cvta.to.shared: the offset into the block's shared window.
inline u32 smem_addr(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(smem);
  if (a < base || a > base + emu::kMaxSmem) emu::fail("smem_addr of a pointer that is not into shared memory");
  return static_cast<u32>(a - base);
}

inline float elem_to_float(u16 v) { return kIsBf16 ? emu::bf16_to_float(v) : emu::half_to_float(v); }
inline u16 float_to_elem(float f) { return kIsBf16 ? emu::float_to_bf16(f) : emu::float_to_half(f); }
inline u32 pack_float2(float lo, float hi) {
  return static_cast<u32>(float_to_elem(lo)) | (static_cast<u32>(float_to_elem(hi)) << 16);
}

// MUFU approximations as the exact functions (ex2(-inf) = +0, lg2(0) = -inf, as the ISA states).
inline float exp2_approx(float x) { return emu::ftz(std::exp2(emu::ftz(x))); }
inline float log2_approx(float x) { return std::log2(emu::ftz(x)); }
// tanh.approx.f32 within its documented error (see the header), never past 1.
constexpr double kTanhMaxRelError = 0.00049270099;  // 2^-10.987 (the .f32 bound is 2^-11 = 0.00048828)
inline float tanh_approx(float x) {
#ifdef EMU_TANH_EXACT  // the exact function, for tests that show what the error model catches
  return std::tanh(x);
#endif
  uint32_t h = emu::f_bits(x) * 0x9E3779B1u;  // a fixed hash of the input picks the error
  h ^= h >> 15;
  const double r = static_cast<double>(h & 0xffffu) / 32767.5 - 1.0;  // in [-1, 1]
  const double y = std::tanh(static_cast<double>(x)) * (1.0 + r * kTanhMaxRelError);
  return static_cast<float>(std::fmax(-1.0, std::fmin(1.0, y)));
}
inline float rcp_approx(float x) { return emu::ftz(1.f / emu::ftz(x)); }

#define EMU_SITE __attribute__((noinline))  // the caller's address names the instruction (bank stats, .aligned)
#define EMU_HERE __builtin_return_address(0)

EMU_SITE float shfl_xor(float v, int mask) {
  const u32 in[2] = {emu::f_bits(v), static_cast<u32>(mask)};
  return emu::bits_f(emu::warp_collective(emu::kShfl, EMU_HERE, in, 2)[0]);
}

EMU_SITE void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  const u32* out = emu::warp_collective(emu::kLdm + 4, EMU_HERE, &addr, 1);
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}
EMU_SITE void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  const u32* out = emu::warp_collective(emu::kLdm + 4 + 8, EMU_HERE, &addr, 1);
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}
EMU_SITE void ldmatrix_x2(u32 (&r)[2], u32 addr) {
  const u32* out = emu::warp_collective(emu::kLdm, EMU_HERE, &addr, 1);
  r[0] = out[0];
  r[1] = out[1];
}
EMU_SITE void ldmatrix_x2_trans(u32 (&r)[2], u32 addr) {
  const u32* out = emu::warp_collective(emu::kLdm + 8, EMU_HERE, &addr, 1);
  r[0] = out[0];
  r[1] = out[1];
}

EMU_SITE void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  u32 in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int i = 0; i < 4; ++i) in[6 + i] = emu::f_bits(c[i]);
  const u32* out = emu::warp_collective(emu::kMma, EMU_HERE, in, 10);
  for (int i = 0; i < 4; ++i) c[i] = emu::bits_f(out[i]);
}

struct alignas(16) Chunk16 {
  u32 x, y, z, w;
};

EMU_SITE void copy16_async(u32 dst_smem, const void* src, bool pred) {
  using namespace emu;
  record_access(FA_HAS_CP_ASYNC ? kAccCpAsync : kAccSt, dst_smem, 16, __builtin_return_address(0));
  if (pred) check_global(src, 16, 16, "copy16_async source");
#if FA_HAS_CP_ASYNC
  // cp.async: the destination is claimed now and written when a wait_group retires this copy.
  check_smem_range(dst_smem, 16, 16, "cp.async destination");
  const int16_t me = static_cast<int16_t>(g.cur->index);
  smem_claim(dst_smem, 16, me, "cp.async");
  for (u32 i = 0; i < 16; ++i) g.shadow[dst_smem + i].pending_tid = me;
  g.cur->open_group.push_back(CopyOp{dst_smem, src, pred});
#else
  Chunk16 c{0, 0, 0, 0};
  if (pred) memcpy(&c, src, 16);
  smem_write(dst_smem, &c, 16, 16, "register-staged copy");
#endif
}

inline void copy_commit() {
#if FA_HAS_CP_ASYNC
  emu::g.cur->committed.push_back(std::move(emu::g.cur->open_group));
  emu::g.cur->open_group.clear();
#endif
}

template <int N>
inline void copy_wait() {
#if FA_HAS_CP_ASYNC
  using namespace emu;
  Fiber* f = g.cur;
  while (static_cast<int>(f->committed.size()) > N) {
    for (const CopyOp& op : f->committed.front()) {
      unsigned char data[16] = {0};
      if (op.pred) memcpy(data, op.src, 16);
      memcpy(smem + op.dst, data, 16);
      for (u32 i = 0; i < 16; ++i) {
        Shadow& s = g.shadow[op.dst + i];
        s.pending_tid = -1;
        s.w_epoch = g.epoch;
        s.w_tid = static_cast<int16_t>(f->index);
      }
    }
    f->committed.pop_front();
  }
#endif
}

EMU_SITE Chunk16 ld_shared16(u32 addr) {
  emu::record_access(emu::kAccLd, addr, 16, __builtin_return_address(0));
  Chunk16 c;
  emu::smem_read(addr, &c, 16, 16, "ld.shared.v4");
  return c;
}
EMU_SITE void st_shared16(u32 addr, const Chunk16& c) {
  emu::record_access(emu::kAccSt, addr, 16, __builtin_return_address(0));
  emu::smem_write(addr, &c, 16, 16, "st.shared.v4");
}
EMU_SITE void st_shared32(u32 addr, u32 v) {
  emu::record_access(emu::kAccSt, addr, 4, __builtin_return_address(0));
  emu::smem_write(addr, &v, 4, 4, "st.shared.u32");
}
EMU_SITE void st_shared64(u32 addr, u32 lo, u32 hi) {
  emu::record_access(emu::kAccSt, addr, 8, __builtin_return_address(0));
  const u32 v[2] = {lo, hi};
  emu::smem_write(addr, v, 8, 8, "st.shared.v2");
}
EMU_SITE u32 ld_shared32(u32 addr) {
  emu::record_access(emu::kAccLd, addr, 4, __builtin_return_address(0));
  u32 v;
  emu::smem_read(addr, &v, 4, 4, "ld.shared.u32");
  return v;
}
inline Chunk16 ld_global16(const void* p) {
  emu::check_global(p, 16, 16, "ld.global.v4");
  Chunk16 c;
  memcpy(&c, p, 16);
  return c;
}
inline void st_global16(void* p, const Chunk16& c) {
  emu::check_global(p, 16, 16, "st.global.v4");
  memcpy(p, &c, 16);
}
inline void red_add_f32(float* p, float v) {
  emu::check_global(p, 4, 4, "red.global.add.f32");
  *p += v;  // blocks run one at a time, so the add is atomic here
}
inline void red_add_f32x2(float* p, float a, float b) {  // sm90's red.global.add.v2.f32, or two adds
  emu::check_global(p, 8, EMU_ARCH >= 900 ? 8 : 4, "red.global.add.v2.f32");
  p[0] += a;
  p[1] += b;
}

}  // namespace fa

#include "composed.cuh"  // the helpers built from the primitives: the kernels' own code, as is

namespace emu {

// ---- the instructions' definitions (PTX ISA) ------------------------------------------------------------
// Element e (0: low half, 1: high half) of a packed register.
inline float elem(uint32_t r, int e) { return fa::elem_to_float(static_cast<uint16_t>(e ? r >> 16 : r & 0xffffu)); }

inline void compute_warp_op(WarpOp& w, int warp) {
  (void)warp;
  if (w.kind == kShfl) {
    // shfl.sync.bfly.b32 with c = 0x1f: lane l reads lane l ^ b.
    for (int l = 0; l < kWarpSize; ++l) {
      const int src = l ^ static_cast<int>(w.in[l][1] & 31u);
      w.out[l][0] = w.in[src][0];
    }
    return;
  }
  if ((w.kind & ~12) == kLdm) {
    // ldmatrix.m8n8.b16: matrix i's 8 row addresses come from lanes 8i..8i+7 (x2: lanes 0-15). Without
    // .trans, lane l's register i holds row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (lower
    // column in the low half); with .trans it holds column l/4, rows 2(l%4) and 2(l%4)+1.
    const bool x4 = (w.kind & 4) != 0, trans = (w.kind & 8) != 0;
    const int mats = x4 ? 4 : 2;
    AccessGroup grp;  // one phase per matrix: its 8 row addresses of 16 bytes
    grp.kind = kAccLdmatrix;
    grp.bytes = 16;
    grp.lanes = x4 ? 0xffffffffu : 0xffffu;
    for (int l = 0; l < 8 * mats; ++l) grp.addr[l] = w.in[l][0];
    count_wavefronts(grp);
    for (int l = 0; l < kWarpSize; ++l) {
      if (l >= 8 * mats) continue;
      const uint32_t a = w.in[l][0];
      // Each row address is a 16-byte aligned run of 8 elements: checked and race-accounted as a read
      // by the lane that gave it (a failure names that lane).
      Fiber* saved = g.cur;
      g.cur = &g.fibers[warp * kWarpSize + l];
      uint16_t row[8];
      smem_read(a, row, 16, 16, trans ? "ldmatrix.trans" : "ldmatrix");
      g.cur = saved;
    }
    for (int l = 0; l < kWarpSize; ++l) {
      for (int i = 0; i < mats; ++i) {
        uint16_t v[2];
        for (int e = 0; e < 2; ++e) {
          const int r = trans ? 2 * (l % 4) + e : l / 4;
          const int c = trans ? l / 4 : 2 * (l % 4) + e;
          memcpy(&v[e], smem + w.in[8 * i + r][0] + 2 * c, 2);
        }
        w.out[l][i] = static_cast<uint32_t>(v[0]) | (static_cast<uint32_t>(v[1]) << 16);
      }
    }
    return;
  }
  if (w.kind == kMma) {
    // mma.m16n8k16.row.col, g = lane/4, t = lane%4:
    //   A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
    //   B: b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
    //   C: c0, c1 (g, 2t, 2t+1), c2, c3 (g+8, 2t, 2t+1)
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < kWarpSize; ++l) {
      const int gr = l / 4, t = l % 4;
      const uint32_t* in = w.in[l];
      for (int e = 0; e < 2; ++e) {
        A[gr][2 * t + e] = elem(in[0], e);
        A[gr + 8][2 * t + e] = elem(in[1], e);
        A[gr][2 * t + 8 + e] = elem(in[2], e);
        A[gr + 8][2 * t + 8 + e] = elem(in[3], e);
        B[2 * t + e][gr] = elem(in[4], e);
        B[2 * t + 8 + e][gr] = elem(in[5], e);
        C[gr][2 * t + e] = bits_f(in[6 + e]);
        C[gr + 8][2 * t + e] = bits_f(in[8 + e]);
      }
    }
    // sm80+: one m16n8k16; sm75 (primitives.cuh): two m16n8k8 over k 0..7 (a0, a1; b0) and k 8..15
    // (a2, a3; b1), the fp32 result rounded in between. Products of 16-bit inputs are exact in double.
    constexpr int kSteps = EMU_ARCH >= 800 ? 1 : 2;
    float D[16][8];
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        float d = C[m][n];
        for (int s = 0; s < kSteps; ++s) {
          double acc = d;
          for (int k = s * 16 / kSteps; k < (s + 1) * 16 / kSteps; ++k) acc += static_cast<double>(A[m][k]) * B[k][n];
          d = static_cast<float>(acc);
        }
        D[m][n] = d;
      }
    }
    for (int l = 0; l < kWarpSize; ++l) {
      const int gr = l / 4, t = l % 4;
      w.out[l][0] = f_bits(D[gr][2 * t]);
      w.out[l][1] = f_bits(D[gr][2 * t + 1]);
      w.out[l][2] = f_bits(D[gr + 8][2 * t]);
      w.out[l][3] = f_bits(D[gr + 8][2 * t + 1]);
    }
    return;
  }
  fail("internal: unknown warp instruction kind %d", w.kind);
}

// ---- launching -------------------------------------------------------------------------------------------
typedef void (*KernelFn)(FaParams);

static KernelFn g_kernel = nullptr;
static FaParams g_params;

inline void fiber_main() {
  g_kernel(g_params);
  Fiber* f = g.cur;
  if (g.barrier_arrived > 0) fail("thread exits while %d others wait at __syncthreads", g.barrier_arrived);
  if (!f->committed.empty() || !f->open_group.empty()) {
    fail("thread exits with cp.async copies no wait_group retired (%zu committed groups, %zu copies not "
         "committed)",
         f->committed.size(), f->open_group.size());
  }
  const int warp = warp_of(f);
  if (g.warps[warp].arrived > 0) {
    fail("thread exits while %d lanes of its warp wait in a warp-wide instruction", g.warps[warp].arrived);
  }
  f->state = State::kDone;  // uc_link returns to the scheduler
}

inline bool run_block(size_t stack_bytes) {
  for (Fiber& f : g.fibers) {
    getcontext(&f.ctx);
    f.stack.resize(stack_bytes);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &g.sched;
    f.state = State::kReady;
    f.open_group.clear();
    f.committed.clear();
    makecontext(&f.ctx, fiber_main, 0);
    g.ready.push_back(f.index);
  }
  g.barrier_arrived = 0;
  g.epoch = 0;
  for (WarpOp& w : g.warps) w.arrived = 0;
  std::fill(g.shadow.begin(), g.shadow.end(), Shadow{});
  memset(smem, 0xff, emu::kMaxSmem);  // fp16/bf16 NaN: an unwritten element that slips through shows
  while (!g.ready.empty() && !g.failed) {
    const int i = g.ready.front();
    g.ready.pop_front();
    Fiber& f = g.fibers[i];
    if (f.state != State::kReady) continue;
    g.cur = &f;
    swapcontext(&g.sched, &f.ctx);
    g.cur = nullptr;
    if (f.state == State::kReady) g.ready.push_back(i);  // (not used: fibers only stop to wait or exit)
  }
  g.ready.clear();
  if (g.failed) return false;
  flush_accesses();
  for (const Fiber& f : g.fibers) {
    if (f.state != State::kDone) {
      g.cur = nullptr;
      fail("deadlock: thread %d waits at %s and no thread can run", f.index,
           f.state == State::kWaitBlock ? "__syncthreads" : "a warp-wide instruction");
      return false;
    }
  }
  return true;
}

}  // namespace emu

// ---- the C interface the Python harness calls (tests/emu/harness.py) ---------------------------------
extern "C" {

int emu_sizeof_params() { return static_cast<int>(sizeof(FaParams)); }

void emu_reset_allocations() { emu::g.allocations.clear(); }

// The limits the next launches are held to (see Limits; 0: not known, not checked).
void emu_set_limits(int max_threads, int registers, int static_smem, int smem_limit) {
  emu::g.limits = emu::Limits{max_threads, registers, static_smem, smem_limit};
}

void emu_register(const void* p, uint64_t bytes, const char* name) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  emu::g.allocations.push_back(emu::Allocation{a, a + bytes, name});
}

const char* emu_error() { return emu::g.error.c_str(); }

uint64_t emu_collectives() { return emu::g.collectives; }

// Shared-memory statistics of the last launch: for each access kind (ld.shared, st.shared, cp.async,
// ldmatrix) instructions, wavefronts and the conflict-free wavefronts, 12 numbers in all.
void emu_bank_stats(uint64_t* out) {
  for (int k = 0; k < emu::kAccKinds; ++k) {
    out[3 * k] = emu::g.banks[k].instructions;
    out[3 * k + 1] = emu::g.banks[k].wavefronts;
    out[3 * k + 2] = emu::g.banks[k].ideal;
  }
}

// Runs kernel `fn` over the grid, one block at a time. Returns 0, or 1 with emu_error() set.
int emu_launch(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned threads, int smem_bytes,
               const FaParams* params) {
  using namespace emu;
  g.error.clear();
  g.failed = false;
  g.collectives = 0;
  for (BankStats& b : g.banks) b = BankStats{};
  g.groups.clear();
  if (threads == 0 || threads > static_cast<unsigned>(kMaxThreads) || threads % kWarpSize != 0) {
    g.error = "threads per block must be a positive multiple of 32 up to 1024";
    return 1;
  }
  if (smem_bytes < 0 || smem_bytes > kMaxSmem) {
    g.error = "dynamic shared memory above the emulator's 256 KiB";
    return 1;
  }
  const Limits& lim = g.limits;
  char why[256] = {0};
  const int per_warp = (lim.registers * kWarpSize + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  if (lim.max_threads > 0 && threads > static_cast<unsigned>(lim.max_threads)) {
    snprintf(why, sizeof why, "launch of %u threads per block exceeds the kernel's launch bounds of %d", threads,
             lim.max_threads);
  } else if (lim.registers > 0 && static_cast<int64_t>(per_warp) * (threads / kWarpSize) > kRegistersPerBlock) {
    snprintf(why, sizeof why, "launch of %u threads x %d registers needs %lld registers per block; a block has %d",
             threads, lim.registers, static_cast<long long>(per_warp) * (threads / kWarpSize), kRegistersPerBlock);
  } else if (lim.smem_limit > 0 && lim.static_smem + smem_bytes > lim.smem_limit) {
    snprintf(why, sizeof why, "launch needs %d B of shared memory (%d static + %d dynamic); a block may use %d",
             lim.static_smem + smem_bytes, lim.static_smem, smem_bytes, lim.smem_limit);
  }
  if (why[0] != 0) {
    g.error = why;
    return 1;
  }
  g_kernel = reinterpret_cast<KernelFn>(fn);
  g_params = *params;
  g.threads = static_cast<int>(threads);
  g.smem_bytes = smem_bytes;
  g.block_dim = Dim3{threads, 1, 1};
  g.grid_dim = Dim3{gx, gy, gz};
  g.fibers = std::vector<Fiber>(threads);
  for (unsigned i = 0; i < threads; ++i) {
    g.fibers[i].index = static_cast<int>(i);
    g.fibers[i].tid = Dim3{i, 0, 0};
  }
  g.warps = std::vector<WarpOp>(threads / kWarpSize);
  g.shadow.assign(static_cast<size_t>(smem_bytes), Shadow{});
  for (unsigned z = 0; z < gz; ++z) {
    for (unsigned y = 0; y < gy; ++y) {
      for (unsigned x = 0; x < gx; ++x) {
        g.block_idx = Dim3{x, y, z};
        if (!run_block(256 * 1024)) return 1;
      }
    }
  }
  return 0;
}

}  // extern "C"

#endif  // FA_EMU_H_
