// Arch-specific device primitives shared by the forward (fwd.cu) and backward (bwd.cu) kernels.
//
// Device-only CUDA C++ for NVRTC: no CUDA header is included (a toolkit is just the NVRTC wheel), so
// every conversion, load and tensor-core op below is inline PTX on raw bits. Elements travel as
// `u16` (one fp16/bf16) or `u32` (two packed, low half = lower column). The element type is chosen
// at compile time: FA_DTYPE_BF16=1 for bf16, else fp16.
//
// Per-arch differences live here and nowhere else:
//   sm80+  mma.sync m16n8k16 (fp16, bf16), cp.async.cg 16 B with zero-fill, f16x2/bf16x2 cvt.
//   sm75   mma.sync m16n8k8 twice per k16 step (fp16 only), no cp.async: the "async" copy is a
//          register-staged ld.global + st.shared, so its wait is a no-op (the data is already in
//          shared memory when the call returns; the caller's __syncthreads still orders it).
// ldmatrix (and .trans) exists from sm75 on, so it is common to both.
//
// Fragment layouts (PTX ISA "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, t = lane % 4:
//   A 16x16 row-major, 4 regs: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..),
//                              a3 (row g+8, k 2t+8..)
//   B 16x8 "col", 2 regs:      b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g)
//   C 16x8 fp32, 4 floats:     c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, cols 2t, 2t+1)
// The m16n8k8 halves of sm75 are (a0, a1; b0) and (a2, a3; b1), so one A/B/C layout serves all archs
// and the kernels never see the difference.
//
// API stability: helper kernels build on these names; add new ones, do not rename or change these.
#ifndef FA_PRIMITIVES_CUH_
#define FA_PRIMITIVES_CUH_

#ifndef __CUDACC_RTC__
#error "primitives.cuh is device code for NVRTC only"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
#error "fa kernels need sm_75 or newer (mma.sync with fp16 operands, ldmatrix)"
#endif

#include "basics.cuh"  // u16/u32, kIsBf16 (FA_DTYPE_BF16, default 0), kLog2e, kLn2, FA_INF_BITS

#if FA_DTYPE_BF16 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "bf16 kernels need sm_80 or newer (Turing has no bf16 mma); tiles.py must not build them"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FA_HAS_CP_ASYNC 1
#else
#define FA_HAS_CP_ASYNC 0
#endif

#define FA_DEVICE __device__ __forceinline__

namespace fa {

// ---------------------------------------------------------------------------------------------
// Bit casts and address spaces
// ---------------------------------------------------------------------------------------------

FA_DEVICE float bits_to_float(u32 v) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(v));
  return f;
}

FA_DEVICE u32 float_to_bits(float f) {
  u32 v;
  asm("mov.b32 %0, %1;" : "=r"(v) : "f"(f));
  return v;
}

// 32-bit shared-state-space address of a generic pointer into shared memory (what ldmatrix,
// cp.async and st.shared take).
FA_DEVICE u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// ---------------------------------------------------------------------------------------------
// Element conversions (round to nearest even)
// ---------------------------------------------------------------------------------------------

FA_DEVICE float elem_to_float(u16 v) {
#if FA_DTYPE_BF16
  return bits_to_float(static_cast<u32>(v) << 16);  // bf16 is the top half of an fp32: exact
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
#endif
}

FA_DEVICE u16 float_to_elem(float f) {
  u16 v;
#if FA_DTYPE_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v) : "f"(f));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
#endif
  return v;
}

// Two floats -> one packed pair; `lo` lands in the low 16 bits (the lower column index).
FA_DEVICE u32 pack_float2(float lo, float hi) {
  u32 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // cvt.f16x2/bf16x2 puts its first source in the upper half.
#if FA_DTYPE_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
#else
  r = static_cast<u32>(float_to_elem(lo)) | (static_cast<u32>(float_to_elem(hi)) << 16);
#endif
  return r;
}

// Two floats in [0, 1]-ish range kept as an fp16 pair whatever the unit's dtype (the backward's P
// between S and dS): fp16's 11-bit significand, not bf16's 8. `lo` in the low 16 bits.
FA_DEVICE u32 pack_half2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source: upper half
  return r;
#else
  u16 l, h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
  return static_cast<u32>(l) | (static_cast<u32>(h) << 16);
#endif
}

FA_DEVICE float half_to_float(u16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}

// ---------------------------------------------------------------------------------------------
// Fast math (MUFU); inputs of -inf give 0 from exp2, as the masked softmax needs
// ---------------------------------------------------------------------------------------------

FA_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

FA_DEVICE float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

FA_DEVICE float tanh_approx(float x) {  // sm75+ (PTX 7.0)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

FA_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// Warp shuffle (butterfly); the quad reductions built on it are in composed.cuh
// ---------------------------------------------------------------------------------------------

FA_DEVICE float shfl_xor(float v, int mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
  return r;
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
// Register i receives matrix i in the mma fragment layout (.trans: transposed).
// ---------------------------------------------------------------------------------------------

FA_DEVICE void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

FA_DEVICE void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// x2: lanes 0-15 give the addresses (matrix l / 8); lanes 16-31 are ignored but must be valid.
FA_DEVICE void ldmatrix_x2(u32 (&r)[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

FA_DEVICE void ldmatrix_x2_trans(u32 (&r)[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// Tensor cores: c += a * b for one 16x8x16 step, fp32 accumulate
// ---------------------------------------------------------------------------------------------

FA_DEVICE void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#if FA_DTYPE_BF16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
#else
  // Turing: the k16 step as two k8 steps over the low (a0, a1; b0) and high (a2, a3; b1) k halves.
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b0));
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
}

// ---------------------------------------------------------------------------------------------
// Global -> shared copies of 16 bytes. `pred` false writes zeros (tails of sequences and head dims
// must read as 0 so that masked products stay finite).
//   sm80+: cp.async.cg (L2 only), grouped with copy_commit() / copy_wait<N>().
//   sm75:  synchronous ld.global + st.shared; commit/wait are no-ops.
// ---------------------------------------------------------------------------------------------

FA_DEVICE void copy16_async(u32 dst_smem, const void* src, bool pred) {
#if FA_HAS_CP_ASYNC
  // src-size 0 reads nothing and fills the 16 bytes with zeros.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_smem), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
#else
  u32 x = 0, y = 0, z = 0, w = 0;
  if (pred) {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                 : "l"(src));
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst_smem), "r"(x), "r"(y), "r"(z),
               "r"(w)
               : "memory");
#endif
}

FA_DEVICE void copy_commit() {
#if FA_HAS_CP_ASYNC
  asm volatile("cp.async.commit_group;" ::);
#endif
}

// Wait until at most N committed groups of this thread are still in flight.
template <int N>
FA_DEVICE void copy_wait() {
#if FA_HAS_CP_ASYNC
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// Plain 16-byte and 4-byte moves, and fp32 atomic add (dq accumulation in the backward)
// ---------------------------------------------------------------------------------------------

struct alignas(16) Chunk16 {
  u32 x, y, z, w;
};

FA_DEVICE Chunk16 ld_shared16(u32 addr) {
  Chunk16 c;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w)
               : "r"(addr));
  return c;
}

FA_DEVICE void st_shared16(u32 addr, const Chunk16& c) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(c.x), "r"(c.y), "r"(c.z),
               "r"(c.w)
               : "memory");
}

FA_DEVICE void st_shared32(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// Two 32-bit words at an 8-byte aligned address (an fp32 pair of an mma fragment).
FA_DEVICE void st_shared64(u32 addr, u32 lo, u32 hi) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(lo), "r"(hi) : "memory");
}

FA_DEVICE u32 ld_shared32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

FA_DEVICE Chunk16 ld_global16(const void* p) {
  Chunk16 c;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w)
               : "l"(p));
  return c;
}

FA_DEVICE void st_global16(void* p, const Chunk16& c) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(c.x), "r"(c.y), "r"(c.z),
               "r"(c.w)
               : "memory");
}

FA_DEVICE void red_add_f32(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// 0, from an instruction the compiler may not fold or hoist (volatile): an offset that makes values
// derived from it look new at each use, so ptxas recomputes them there instead of holding them in
// registers (bwd.cu FA_BWD_REBASE).
FA_DEVICE u32 opaque_zero() {
  u32 z;
  asm volatile("mov.u32 %0, 0;" : "=r"(z));
  return z;
}

}  // namespace fa

#include "composed.cuh"  // helpers built from the above (shared with the CPU emulator)

#endif  // FA_PRIMITIVES_CUH_
