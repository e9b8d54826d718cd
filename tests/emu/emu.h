// A CPU emulator for fa's device code: runs kernels/csrc/*.cu as host C++, one fiber per CUDA thread.
//
// This header is force-included ahead of a kernel source (`g++ -include emu.h -x c++ fwd.cu`); the
// emulator itself (scheduler, checks, PTX interpreter) is emu_runtime.cpp, a separate object linked
// into every emulated library. Here is only the CUDA language as the kernels use it (threadIdx,
// __syncthreads, __shared__, ...) and the entry the kernels' inline PTX reaches.
//
// The kernels compile against the real kernels/csrc/primitives.cuh. The harness (emu_harness.py)
// copies csrc to its build folder with every `asm [volatile] ("template" : outputs : inputs
// [: clobbers]);` of primitives.cuh rewritten into a call of emu::ptx(template, outputs, inputs):
// the interpreter parses the template text NVRTC would compile (cached per text) and executes it,
// with the warp-collective semantics (mma.sync and ldmatrix fragment layouts, shfl.sync) from the
// PTX ISA. An instruction it does not know, or one whose operands do not match its form, fails the
// launch naming it. So a fault in primitives.cuh's PTX (a dropped .trans, x4 for x2, the operand order
// of cvt.*x2, .bf16 for .f16, a shfl mask, a wait_group count) changes what runs here.
//
// What it checks, failing the launch with a message naming the block, the thread and the address:
//   - shared memory, by every access (the PTX ld/st/ldmatrix/cp.async, and the kernels' plain C++
//     loads and stores, which g++ -fsanitize=thread instruments and emu_runtime.cpp's __tsan_*
//     hooks receive): outside the launch's dynamic size; reads of bytes never written; races between
//     threads in one barrier interval (read-after-write, write-after-read, write-after-write; warps
//     are not assumed to run in lockstep, as on Volta and newer); reads of a cp.async destination
//     before the issuing thread waited for it; another block's shared memory.
//   - global memory, by every access to a registered buffer (PTX and plain): inside the allocation,
//     aligned for the vector forms; and between blocks of one launch, a plain (non-atomic) write of a
//     byte another block wrote or read, or a read of a byte another block wrote plainly or with
//     red.add, is a race (message names both blocks, the buffer and the offset). red.add against
//     red.add is atomic and allowed. The harness also keeps canaries around every buffer.
//   - warps: every lane of a warp reaches each collective (mma, ldmatrix, shfl) with the same
//     instruction from the same call site (the .aligned rule), no lane has exited, shfl.sync's
//     membermask holds every lane that executes it and every lane it reads; __syncthreads is reached
//     by every thread of the block.
//   - cp.async: a thread that exits with copies not retired by a wait_group (committed or not).
//   - instruction availability per arch (bf16 and k16 mma, cp.async from sm80; red.v2 from sm90).
//   - launch limits (emu_set_limits): launch bounds, registers x threads, static plus dynamic smem.
//   - deadlock: a block in which every live thread waits.
//
// sm_90a (kernels/csrc/hopper.cuh, a library built for arch "9.0a"):
//   - warpgroups: wgmma, its fence, commit and wait, and setmaxnreg are reached by all 128 threads of a
//     warpgroup from one call site; a block whose threads leave a warpgroup partial, or a thread that
//     exited, fails the launch ("partial warpgroup").
//   - wgmma reads shared memory through its descriptors (start, LBO, SBO, swizzle 128B/64B/32B/none,
//     K-major or MN-major by imm-trans) or A from registers, in the PTX ISA's fragment layouts. Its
//     accumulator registers hold NaN until the wgmma.wait_group that retires its group: any other
//     access of them before (a plain load or store, another asm) fails naming the wgmma and the thread;
//     a chained wgmma may accumulate into them. Shared memory a pending wgmma reads may not be written.
//     A wgmma.fence must precede a thread's first wgmma and separate an ordinary write of an
//     accumulator from the wgmma; bytes stored by the generic proxy need the writer's
//     fence.proxy.async before a wgmma reads them.
//   - mbarrier: arrival counts, transaction bytes (expect_tx raises, a TMA completes), phases; an
//     arrival when the phase has all its arrivals, or a TMA completing bytes no expect_tx announced,
//     fails; try_wait.parity suspends the thread until the phase of that parity completes (a wait that
//     never ends is a deadlock naming the barrier, its phase and what it misses).
//   - cp.async.bulk.tensor decodes the emulator's tensor map (emu_tensor_map_encode_tiled: the
//     driver's cuTensorMapEncodeTiled arguments, in the driver's enums) and copies the box, zero outside
//     the tensor, with the swizzle pattern on the shared addresses; a thread may read those bytes only
//     after it (or a thread it met at a barrier) saw the mbarrier phase they completed on.
//   - setmaxnreg: per-warpgroup register counts, .inc waits for registers another warpgroup's .dec
//     gave back to the block's 64K (never: a deadlock that says so).
//   Not modelled: named barriers (bar.sync id, n) order execution but do not end a race interval, TMA
//   stores, multicast and clusters, the descriptor's base offset, inner TMA boxes narrower than the
//   swizzle span.
//
// Scheduling: a window of blocks (FA_EMU_WINDOW, default 8) runs at once, every thread a fiber; at
// each barrier and warp collective, and one in four memory instructions, the scheduler picks the next
// fiber in an order drawn from a seed (emu_set_seed; the harness runs every launch under FA_EMU_SEEDS seeds). A barrier
// still orders the threads of its block. So a kernel whose result depends on the order of blocks or
// warps, or on a plain `+=` of global memory where an atomic is needed, fails under some seed or by
// the race rules (which do not depend on the order).
//
// What it cannot show: speed and timing, ptxas or NVVM bugs (it runs the C++ of the kernels, not the
// PTX module NVRTC emits), the exact rounding of the tensor cores and the MUFU approximations (ex2, lg2
// and rcp are exact here; tanh.approx.f32 is modelled with its documented error: PTX ISA 9.1 states a
// maximum relative error of 2^-11, 2^-10.987 for the .f16 form, and the emulator takes the larger;
// each result is y (1 + r 2^-10.987), clamped to [-1, 1], with r in [-1, 1] a fixed hash of the input,
// so the same input gives the same result, as on hardware), and anything the ISA leaves open.
//
// It also counts shared-memory wavefronts (bank conflicts) per access kind, for bench/kernels/smem_banks.py.
#ifndef FA_EMU_H_
#define FA_EMU_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#ifndef EMU_ARCH
#error "compile with -DEMU_ARCH=750 or 800 (and up)"
#endif

// What NVRTC defines: the kernels' sources take the device path.
#define __CUDACC_RTC__ 1
#define __CUDA_ARCH__ EMU_ARCH
#ifdef EMU_ARCH_SPECIFIC  // an sm_90a library: what NVRTC defines for --gpu-architecture=sm_90a
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#ifndef __CUDACC_VER_MAJOR__
#define __CUDACC_VER_MAJOR__ 12
#define __CUDACC_VER_MINOR__ 8
#endif

#define __global__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))  // each call site its own PTX site
#define __shared__
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// One operand of an inline-asm statement: an output (its address and size; `+` outputs also carry
// their value in) or an input value, with its constraint letter (h r l f d n).
struct Operand {
  char cons;
  char mode;  // '=' or '+' for outputs, 0 for inputs
  uint8_t size;
  void* ptr;
  uint64_t val;
};

template <class T>
inline uint64_t bits_of(const T& v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<uint64_t>(v);
  } else if constexpr (std::is_same_v<T, float>) {
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    return u;
  } else if constexpr (std::is_same_v<T, double>) {
    uint64_t u;
    __builtin_memcpy(&u, &v, 8);
    return u;
  } else {
    static_assert(std::is_integral_v<T>, "an asm operand of a type the emulator does not bind");
    return static_cast<uint64_t>(v);
  }
}

// A `+` output's value is read by the interpreter, not here: a read here would be a plain access of the
// register variable, which for a wgmma's pending accumulator is an error, and a chained wgmma may read it.
template <class T>
inline Operand out_op(char mode, char cons, T& ref) {
  static_assert(std::is_arithmetic_v<T> || std::is_pointer_v<T>, "an asm output of a type the emulator does not bind");
  return Operand{cons, mode, static_cast<uint8_t>(sizeof(T)), static_cast<void*>(&ref), 0};
}

template <class T>
inline Operand in_op(char cons, const T& v) {
  return Operand{cons, 0, static_cast<uint8_t>(sizeof(T)), nullptr, bits_of(v)};
}

// Executes the PTX `text` of one inline-asm statement for the calling thread (emu_runtime.cpp).
void ptx(const char* text, std::initializer_list<Operand> outs, std::initializer_list<Operand> ins);
void syncthreads();
unsigned char* block_smem();  // the calling block's dynamic shared memory
void set_tanh_exact(bool exact);

// The running thread's coordinates, set by the scheduler at every switch.
extern Dim3 cur_tid, cur_bid, cur_bdim, cur_gdim;

}  // namespace emu

#define threadIdx (::emu::cur_tid)
#define blockIdx (::emu::cur_bid)
#define blockDim (::emu::cur_bdim)
#define gridDim (::emu::cur_gdim)
inline void __syncthreads() { ::emu::syncthreads(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

#ifdef EMU_TANH_EXACT  // the exact tanh for tanh.approx, for tests that show what the error model catches
static const int emu_tanh_exact_ = (::emu::set_tanh_exact(true), 0);
#endif

#endif  // FA_EMU_H_
