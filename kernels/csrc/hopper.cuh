// Hopper (sm_90a) device primitives: warpgroup MMA, mbarriers, TMA, register reallocation.
//
// Device-only CUDA C++ for NVRTC, like primitives.cuh: no CUDA header, every instruction is inline
// PTX on raw bits, and the CPU emulator (tests/emu) runs these asm statements through its PTX
// interpreter after the same mechanical rewrite. Namespace fa::sm90. Facts from the PTX ISA 8.x,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (wgmma), "mbarrier", "cp.async.bulk.tensor"
// and "setmaxnreg"; nothing here has run on a GPU.
//
// Warpgroup: 4 consecutive warps, threads 128 w .. 128 w + 127 of the block. wgmma, its fence and its
// group commit/wait are executed by all 128 threads together (.sync.aligned). m64nNk16 makes the
// warpgroup compute D[64 x N] (+)= A[64 x 16] * B[16 x N]; N is a multiple of 8, 8 to 256.
//
// Fragment layouts, thread t of the warpgroup, warp w = t / 32, lane l, g = l / 4, q = l % 4:
//   D (fp32), N / 2 floats d[i]:  row 16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 q + (i % 2)
//                                 (mma.m16n8's C layout, repeated for every 8 columns).
//   A from registers (16-bit), 4 u32 (low half = lower k):
//     a[0] (row 16 w + g, k 2q..2q+1), a[1] (row 16 w + g + 8, k 2q..), a[2] (row 16 w + g, k 2q+8..),
//     a[3] (row 16 w + g + 8, k 2q+8..).
//
// Shared-memory matrix descriptor (64 bits; make_desc): bits 0-13 start address >> 4, 16-29 leading
// dimension byte offset (LBO) >> 4, 32-45 stride dimension byte offset (SBO) >> 4, 49-51 base offset,
// 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B). Canonical layouts of a 16-bit operand, with W the
// swizzle width in bytes (32, 64, 128) and "row" the M (A) or N (B) index:
//   K-major (no transpose), swizzled:  element (row, k) at  start + (row / 8) SBO + (row % 8) W + 2 k;
//                                      LBO unused (a k16 step is 32 bytes, inside any swizzle row).
//   K-major, no swizzle:               core matrices of 8 rows x 16 bytes, 128 contiguous bytes each:
//                                      start + (row / 8) SBO + (k / 8) LBO + (row % 8) 16 + 2 (k % 8).
//   MN-major (transposed), swizzled:   element (row, k) at  start + (row / (W/2)) LBO + (k / 8) SBO
//                                      + (k % 8) W + 2 (row % (W/2)).
//   MN-major, no swizzle:              start + (row / 8) SBO + (k / 8) LBO + (k % 8) 16 + 2 (row % 8).
// A swizzled address then has its 16-byte chunk bits [4, 4+b) XORed with bits [7, 7+b) of the same
// address, b = 3, 2, 1 for 128B, 64B, 32B (CUTLASS's Swizzle<b,4,3>): the pattern repeats every
// 8 W bytes, so a swizzled tile starts on a 1024-byte (128B) / 512 / 256 boundary (base offset 0).
// TMA writes its box with the same pattern (CU_TENSOR_MAP_SWIZZLE_128B etc.), so a TMA-loaded tile
// with rows of W bytes is a K-major swizzled operand as it lies.
//
// Async groups: wgmma.mma_async reads its shared-memory operands and writes its accumulators
// asynchronously. commit_group() closes the thread's pending wgmmas into a group; wait_group<N>()
// returns once at most N groups are pending. Until the wait that retires it, a wgmma's accumulator
// registers (and its A registers) must not be read or written, and the shared memory it reads must not
// be written. wgmma_fence() must come before the first wgmma of a sequence and after any ordinary
// write to its accumulator or A registers. fence_acc() keeps the compiler from moving accumulator
// accesses across the wait (a register dependence, no instruction).
//
// mbarrier (64-bit object in shared memory, 8-byte aligned): init with an arrival count; each phase
// completes when the pending arrivals reach 0 and the pending transaction bytes reach 0; the phase
// parity flips then. expect_tx raises the bytes the current phase waits for; a TMA load completes
// bytes on it (complete_tx). try_wait_parity(bar, p) is true once the phase with parity p completed.
//
// TMA: cp.async.bulk.tensor.Nd loads one box of a tensor described by a CUtensorMap (128 bytes, made by
// the driver's cuTensorMapEncodeTiled on the host, passed as a __grid_constant__ kernel parameter) to
// shared memory at the given coordinates (innermost first), zero-filling out-of-bounds elements, and
// completes the box's bytes on the mbarrier. One thread issues it.
#ifndef FA_HOPPER_CUH_
#define FA_HOPPER_CUH_

#ifndef __CUDACC_RTC__
#error "hopper.cuh is device code for NVRTC only"
#endif

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "hopper.cuh needs sm_90a (wgmma and setmaxnreg are arch-specific): --gpu-architecture=sm_90a"
#endif

#include "primitives.cuh"  // FA_DEVICE, and basics.cuh's u16/u32/u64, FA_DTYPE_BF16

namespace fa {
namespace sm90 {

// The driver's opaque tensor map: 128 bytes, 64-byte aligned (the layout of CUDA's CUtensorMap).
struct alignas(64) CUtensorMap {
  u64 opaque[16];
};

enum Swizzle : u32 { kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3 };

// ---------------------------------------------------------------------------------------------
// Addresses, warpgroups, election
// ---------------------------------------------------------------------------------------------

FA_DEVICE u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// True in exactly one lane of the calling (fully active) warp: the leader elect.sync picks.
FA_DEVICE bool elect_one() {
  u32 pred;
  asm volatile(
      "{ .reg .b32 r; .reg .pred p; elect.sync r|p, 0xffffffff; selp.u32 %0, 1, 0, p; }"
      : "=r"(pred));
  return pred != 0;
}

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors
// ---------------------------------------------------------------------------------------------

FA_DEVICE u64 make_desc(u32 smem, u32 lbo_bytes, u32 sbo_bytes, Swizzle swizzle) {
  return static_cast<u64>((smem & 0x3FFFF) >> 4) | (static_cast<u64>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<u64>((sbo_bytes >> 4) & 0x3FFF) << 32) | (static_cast<u64>(swizzle) << 62);
}

// The same descriptor with its start address moved by `bytes` (a multiple of 16): the next k16 step
// of a K-major tile is +32 bytes inside the swizzle row.
FA_DEVICE u64 desc_advance(u64 desc, u32 bytes) { return desc + (bytes >> 4); }

// ---------------------------------------------------------------------------------------------
// wgmma: fence, groups, and m64nNk16 f32 += {f16, bf16}
// ---------------------------------------------------------------------------------------------

FA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

FA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int kPending>
FA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// A register dependence on every accumulator (no instruction): accesses of d stay on their side of
// the wgmma_fence / wgmma_wait around them.
template <int R>
FA_DEVICE void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int R>
FA_DEVICE void fence_regs(u32 (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#if FA_DTYPE_BF16
#define FA_SM90_AB ".bf16.bf16"
#else
#define FA_SM90_AB ".f16.f16"
#endif

// The accumulator operand list "%0, ..., %(R-1)" of a wgmma with R = N / 2 registers, and the
// matching "+f" operands d[0..R-1]. Written once here so that one wrapper serves every N.
#define FA_SM90_R(n) "%" #n
#define FA_SM90_R4(a, b, c, d) FA_SM90_R(a) ", " FA_SM90_R(b) ", " FA_SM90_R(c) ", " FA_SM90_R(d)
#define FA_SM90_ACC4 FA_SM90_R4(0, 1, 2, 3)
#define FA_SM90_ACC8 FA_SM90_ACC4 ", " FA_SM90_R4(4, 5, 6, 7)
#define FA_SM90_ACC12 FA_SM90_ACC8 ", " FA_SM90_R4(8, 9, 10, 11)
#define FA_SM90_ACC16 FA_SM90_ACC12 ", " FA_SM90_R4(12, 13, 14, 15)
#define FA_SM90_ACC20 FA_SM90_ACC16 ", " FA_SM90_R4(16, 17, 18, 19)
#define FA_SM90_ACC24 FA_SM90_ACC20 ", " FA_SM90_R4(20, 21, 22, 23)
#define FA_SM90_ACC28 FA_SM90_ACC24 ", " FA_SM90_R4(24, 25, 26, 27)
#define FA_SM90_ACC32 FA_SM90_ACC28 ", " FA_SM90_R4(28, 29, 30, 31)
#define FA_SM90_ACC36 FA_SM90_ACC32 ", " FA_SM90_R4(32, 33, 34, 35)
#define FA_SM90_ACC40 FA_SM90_ACC36 ", " FA_SM90_R4(36, 37, 38, 39)
#define FA_SM90_ACC44 FA_SM90_ACC40 ", " FA_SM90_R4(40, 41, 42, 43)
#define FA_SM90_ACC48 FA_SM90_ACC44 ", " FA_SM90_R4(44, 45, 46, 47)
#define FA_SM90_ACC52 FA_SM90_ACC48 ", " FA_SM90_R4(48, 49, 50, 51)
#define FA_SM90_ACC56 FA_SM90_ACC52 ", " FA_SM90_R4(52, 53, 54, 55)
#define FA_SM90_ACC60 FA_SM90_ACC56 ", " FA_SM90_R4(56, 57, 58, 59)
#define FA_SM90_ACC64 FA_SM90_ACC60 ", " FA_SM90_R4(60, 61, 62, 63)
#define FA_SM90_ACC68 FA_SM90_ACC64 ", " FA_SM90_R4(64, 65, 66, 67)
#define FA_SM90_ACC72 FA_SM90_ACC68 ", " FA_SM90_R4(68, 69, 70, 71)
#define FA_SM90_ACC76 FA_SM90_ACC72 ", " FA_SM90_R4(72, 73, 74, 75)
#define FA_SM90_ACC80 FA_SM90_ACC76 ", " FA_SM90_R4(76, 77, 78, 79)
#define FA_SM90_ACC84 FA_SM90_ACC80 ", " FA_SM90_R4(80, 81, 82, 83)
#define FA_SM90_ACC88 FA_SM90_ACC84 ", " FA_SM90_R4(84, 85, 86, 87)
#define FA_SM90_ACC92 FA_SM90_ACC88 ", " FA_SM90_R4(88, 89, 90, 91)
#define FA_SM90_ACC96 FA_SM90_ACC92 ", " FA_SM90_R4(92, 93, 94, 95)
#define FA_SM90_ACC100 FA_SM90_ACC96 ", " FA_SM90_R4(96, 97, 98, 99)
#define FA_SM90_ACC104 FA_SM90_ACC100 ", " FA_SM90_R4(100, 101, 102, 103)
#define FA_SM90_ACC108 FA_SM90_ACC104 ", " FA_SM90_R4(104, 105, 106, 107)
#define FA_SM90_ACC112 FA_SM90_ACC108 ", " FA_SM90_R4(108, 109, 110, 111)
#define FA_SM90_ACC116 FA_SM90_ACC112 ", " FA_SM90_R4(112, 113, 114, 115)
#define FA_SM90_ACC120 FA_SM90_ACC116 ", " FA_SM90_R4(116, 117, 118, 119)
#define FA_SM90_ACC124 FA_SM90_ACC120 ", " FA_SM90_R4(120, 121, 122, 123)
#define FA_SM90_ACC128 FA_SM90_ACC124 ", " FA_SM90_R4(124, 125, 126, 127)

// One "+f" accumulator operand (the emulator's rewrite replaces this definition, nothing else).
#define FA_SM90_ACC_OUT(x) "+f"(x)
#define FA_SM90_D4(d, i) \
  FA_SM90_ACC_OUT(d[i]), FA_SM90_ACC_OUT(d[i + 1]), FA_SM90_ACC_OUT(d[i + 2]), FA_SM90_ACC_OUT(d[i + 3])
#define FA_SM90_OPS4(d) FA_SM90_D4(d, 0)
#define FA_SM90_OPS8(d) FA_SM90_OPS4(d), FA_SM90_D4(d, 4)
#define FA_SM90_OPS12(d) FA_SM90_OPS8(d), FA_SM90_D4(d, 8)
#define FA_SM90_OPS16(d) FA_SM90_OPS12(d), FA_SM90_D4(d, 12)
#define FA_SM90_OPS20(d) FA_SM90_OPS16(d), FA_SM90_D4(d, 16)
#define FA_SM90_OPS24(d) FA_SM90_OPS20(d), FA_SM90_D4(d, 20)
#define FA_SM90_OPS28(d) FA_SM90_OPS24(d), FA_SM90_D4(d, 24)
#define FA_SM90_OPS32(d) FA_SM90_OPS28(d), FA_SM90_D4(d, 28)
#define FA_SM90_OPS36(d) FA_SM90_OPS32(d), FA_SM90_D4(d, 32)
#define FA_SM90_OPS40(d) FA_SM90_OPS36(d), FA_SM90_D4(d, 36)
#define FA_SM90_OPS44(d) FA_SM90_OPS40(d), FA_SM90_D4(d, 40)
#define FA_SM90_OPS48(d) FA_SM90_OPS44(d), FA_SM90_D4(d, 44)
#define FA_SM90_OPS52(d) FA_SM90_OPS48(d), FA_SM90_D4(d, 48)
#define FA_SM90_OPS56(d) FA_SM90_OPS52(d), FA_SM90_D4(d, 52)
#define FA_SM90_OPS60(d) FA_SM90_OPS56(d), FA_SM90_D4(d, 56)
#define FA_SM90_OPS64(d) FA_SM90_OPS60(d), FA_SM90_D4(d, 60)
#define FA_SM90_OPS68(d) FA_SM90_OPS64(d), FA_SM90_D4(d, 64)
#define FA_SM90_OPS72(d) FA_SM90_OPS68(d), FA_SM90_D4(d, 68)
#define FA_SM90_OPS76(d) FA_SM90_OPS72(d), FA_SM90_D4(d, 72)
#define FA_SM90_OPS80(d) FA_SM90_OPS76(d), FA_SM90_D4(d, 76)
#define FA_SM90_OPS84(d) FA_SM90_OPS80(d), FA_SM90_D4(d, 80)
#define FA_SM90_OPS88(d) FA_SM90_OPS84(d), FA_SM90_D4(d, 84)
#define FA_SM90_OPS92(d) FA_SM90_OPS88(d), FA_SM90_D4(d, 88)
#define FA_SM90_OPS96(d) FA_SM90_OPS92(d), FA_SM90_D4(d, 92)
#define FA_SM90_OPS100(d) FA_SM90_OPS96(d), FA_SM90_D4(d, 96)
#define FA_SM90_OPS104(d) FA_SM90_OPS100(d), FA_SM90_D4(d, 100)
#define FA_SM90_OPS108(d) FA_SM90_OPS104(d), FA_SM90_D4(d, 104)
#define FA_SM90_OPS112(d) FA_SM90_OPS108(d), FA_SM90_D4(d, 108)
#define FA_SM90_OPS116(d) FA_SM90_OPS112(d), FA_SM90_D4(d, 112)
#define FA_SM90_OPS120(d) FA_SM90_OPS116(d), FA_SM90_D4(d, 116)
#define FA_SM90_OPS124(d) FA_SM90_OPS120(d), FA_SM90_D4(d, 120)
#define FA_SM90_OPS128(d) FA_SM90_OPS124(d), FA_SM90_D4(d, 124)

// Wgmma<N>::ss: A and B from shared memory (descriptors); Wgmma<N>::rs: A from registers (the layout
// above), B from a descriptor. kTransA / kTransB (0 or 1) are the imm-trans operands: 1 reads that
// operand MN-major. scale_d 0 computes D = A B (the accumulators' old values are ignored), 1 D += A B.
// i0.. are the operand numbers after the N / 2 accumulators (the preprocessor cannot add).
template <int kN>
struct Wgmma;

#define FA_SM90_WGMMA(N, ACC, OPS, i0, i1, i2, i3, i4, i5, i6)                                        \
  template <>                                                                                          \
  struct Wgmma<N> {                                                                                    \
    template <int kTransA, int kTransB>                                                                \
    FA_DEVICE static void ss(float (&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {                \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %" #i2 ", 0; "                                     \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" FA_SM90_AB " {" ACC "}, %" #i0 \
                   ", %" #i1 ", p, 1, 1, %" #i3 ", %" #i4 "; }"                                        \
                   : OPS(d)                                                                            \
                   : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));             \
    }                                                                                                  \
    template <int kTransB>                                                                             \
    FA_DEVICE static void rs(float (&d)[N / 2], const u32 (&a)[4], u64 desc_b, u32 scale_d) {         \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %" #i5 ", 0; "                                     \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" FA_SM90_AB " {" ACC "}, {%" #i0 \
                   ", %" #i1 ", %" #i2 ", %" #i3 "}, %" #i4 ", p, 1, 1, %" #i6 "; }"                  \
                   : OPS(d)                                                                            \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),           \
                     "n"(kTransB));                                                                    \
    }                                                                                                  \
  };

FA_SM90_WGMMA(8, FA_SM90_ACC4, FA_SM90_OPS4, 4, 5, 6, 7, 8, 9, 10)
FA_SM90_WGMMA(16, FA_SM90_ACC8, FA_SM90_OPS8, 8, 9, 10, 11, 12, 13, 14)
FA_SM90_WGMMA(24, FA_SM90_ACC12, FA_SM90_OPS12, 12, 13, 14, 15, 16, 17, 18)
FA_SM90_WGMMA(32, FA_SM90_ACC16, FA_SM90_OPS16, 16, 17, 18, 19, 20, 21, 22)
FA_SM90_WGMMA(40, FA_SM90_ACC20, FA_SM90_OPS20, 20, 21, 22, 23, 24, 25, 26)
FA_SM90_WGMMA(48, FA_SM90_ACC24, FA_SM90_OPS24, 24, 25, 26, 27, 28, 29, 30)
FA_SM90_WGMMA(56, FA_SM90_ACC28, FA_SM90_OPS28, 28, 29, 30, 31, 32, 33, 34)
FA_SM90_WGMMA(64, FA_SM90_ACC32, FA_SM90_OPS32, 32, 33, 34, 35, 36, 37, 38)
FA_SM90_WGMMA(72, FA_SM90_ACC36, FA_SM90_OPS36, 36, 37, 38, 39, 40, 41, 42)
FA_SM90_WGMMA(80, FA_SM90_ACC40, FA_SM90_OPS40, 40, 41, 42, 43, 44, 45, 46)
FA_SM90_WGMMA(88, FA_SM90_ACC44, FA_SM90_OPS44, 44, 45, 46, 47, 48, 49, 50)
FA_SM90_WGMMA(96, FA_SM90_ACC48, FA_SM90_OPS48, 48, 49, 50, 51, 52, 53, 54)
FA_SM90_WGMMA(104, FA_SM90_ACC52, FA_SM90_OPS52, 52, 53, 54, 55, 56, 57, 58)
FA_SM90_WGMMA(112, FA_SM90_ACC56, FA_SM90_OPS56, 56, 57, 58, 59, 60, 61, 62)
FA_SM90_WGMMA(120, FA_SM90_ACC60, FA_SM90_OPS60, 60, 61, 62, 63, 64, 65, 66)
FA_SM90_WGMMA(128, FA_SM90_ACC64, FA_SM90_OPS64, 64, 65, 66, 67, 68, 69, 70)
FA_SM90_WGMMA(136, FA_SM90_ACC68, FA_SM90_OPS68, 68, 69, 70, 71, 72, 73, 74)
FA_SM90_WGMMA(144, FA_SM90_ACC72, FA_SM90_OPS72, 72, 73, 74, 75, 76, 77, 78)
FA_SM90_WGMMA(152, FA_SM90_ACC76, FA_SM90_OPS76, 76, 77, 78, 79, 80, 81, 82)
FA_SM90_WGMMA(160, FA_SM90_ACC80, FA_SM90_OPS80, 80, 81, 82, 83, 84, 85, 86)
FA_SM90_WGMMA(168, FA_SM90_ACC84, FA_SM90_OPS84, 84, 85, 86, 87, 88, 89, 90)
FA_SM90_WGMMA(176, FA_SM90_ACC88, FA_SM90_OPS88, 88, 89, 90, 91, 92, 93, 94)
FA_SM90_WGMMA(184, FA_SM90_ACC92, FA_SM90_OPS92, 92, 93, 94, 95, 96, 97, 98)
FA_SM90_WGMMA(192, FA_SM90_ACC96, FA_SM90_OPS96, 96, 97, 98, 99, 100, 101, 102)
FA_SM90_WGMMA(200, FA_SM90_ACC100, FA_SM90_OPS100, 100, 101, 102, 103, 104, 105, 106)
FA_SM90_WGMMA(208, FA_SM90_ACC104, FA_SM90_OPS104, 104, 105, 106, 107, 108, 109, 110)
FA_SM90_WGMMA(216, FA_SM90_ACC108, FA_SM90_OPS108, 108, 109, 110, 111, 112, 113, 114)
FA_SM90_WGMMA(224, FA_SM90_ACC112, FA_SM90_OPS112, 112, 113, 114, 115, 116, 117, 118)
FA_SM90_WGMMA(232, FA_SM90_ACC116, FA_SM90_OPS116, 116, 117, 118, 119, 120, 121, 122)
FA_SM90_WGMMA(240, FA_SM90_ACC120, FA_SM90_OPS120, 120, 121, 122, 123, 124, 125, 126)
FA_SM90_WGMMA(248, FA_SM90_ACC124, FA_SM90_OPS124, 124, 125, 126, 127, 128, 129, 130)
FA_SM90_WGMMA(256, FA_SM90_ACC128, FA_SM90_OPS128, 128, 129, 130, 131, 132, 133, 134)

// ---------------------------------------------------------------------------------------------
// mbarrier (shared::cta, 64-bit) and the fences around it
// ---------------------------------------------------------------------------------------------

FA_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the mbarrier inits of this thread visible to the other threads and to the async proxy (TMA).
FA_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses (a wgmma
// reading a tile this thread stored, a TMA store).
FA_DEVICE void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

FA_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival, and `bytes` more transaction bytes for the current phase (the producer before its TMA).
FA_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

FA_DEVICE void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// True once the phase of parity `parity` (0 or 1) has completed; the thread may be suspended a while.
FA_DEVICE bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

FA_DEVICE void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` (a multiple of 32) threads meet.
FA_DEVICE void named_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

FA_DEVICE void named_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------------------------
// TMA: tensor-map loads into shared memory, completing bytes on an mbarrier
// ---------------------------------------------------------------------------------------------

FA_DEVICE void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

FA_DEVICE void tma_load_2d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

FA_DEVICE void tma_load_3d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4}], [%5];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

FA_DEVICE void tma_load_4d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, %5}], [%6];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

FA_DEVICE void tma_load_5d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1, int c2, int c3,
                           int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, %5, %6}], [%7];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}

// ---------------------------------------------------------------------------------------------
// Register reallocation between warpgroups (every thread of the warpgroup, same count; 24..256, a
// multiple of 8): the producer gives registers back, the consumers take them.
// ---------------------------------------------------------------------------------------------

template <int kRegs>
FA_DEVICE void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, a multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <int kRegs>
FA_DEVICE void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, a multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace sm90
}  // namespace fa

#endif  // FA_HOPPER_CUH_
