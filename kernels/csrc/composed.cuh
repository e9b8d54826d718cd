// Device helpers built only from the primitives in primitives.cuh, with no inline PTX of their own.
//
// primitives.cuh includes this file at its end. The CPU emulator (tests/emu/emu.h), which replaces
// primitives.cuh with its own definitions of the PTX-backed functions, includes this same file, so
// these helpers run there exactly as written here and are tested, not re-stated.
#ifndef FA_COMPOSED_CUH_
#define FA_COMPOSED_CUH_

#ifndef FA_PRIMITIVES_CUH_
#error "include primitives.cuh (or the emulator's stand-in for it) before composed.cuh"
#endif

namespace fa {

FA_DEVICE float pos_inf() { return bits_to_float(FA_INF_BITS); }

FA_DEVICE float unpack_lo(u32 v) { return elem_to_float(static_cast<u16>(v & 0xffffu)); }
FA_DEVICE float unpack_hi(u32 v) { return elem_to_float(static_cast<u16>(v >> 16)); }

FA_DEVICE float fmax2(float a, float b) { return a > b ? a : b; }

// Reductions over the 4 lanes of a quad (the lanes that share a fragment row).
FA_DEVICE float quad_max(float v) {
  v = fmax2(v, shfl_xor(v, 1));
  return fmax2(v, shfl_xor(v, 2));
}

FA_DEVICE float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

}  // namespace fa

#endif  // FA_COMPOSED_CUH_
