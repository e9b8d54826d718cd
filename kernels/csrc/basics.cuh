// Types and constants of the device code, shared as they are by primitives.cuh and the CPU emulator
// (tests/emu/emu.h), which replaces primitives.cuh but not these. No CUDA header, no inline PTX.
#ifndef FA_BASICS_CUH_
#define FA_BASICS_CUH_

#ifndef FA_DTYPE_BF16
#define FA_DTYPE_BF16 0
#endif

// +inf without <cmath>: fp32 bit pattern 0x7f800000 (computed at run time via bits_to_float).
#define FA_INF_BITS 0x7f800000u

namespace fa {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

constexpr bool kIsBf16 = FA_DTYPE_BF16 != 0;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace fa

#endif  // FA_BASICS_CUH_
