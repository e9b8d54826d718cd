// The tile a compile unit is built with: the -D defines kernels/tiles.py gives every NVRTC program
// (FwdTile.defines, BwdTile.defines), as the constants fwd.cu and bwd.cu share. Each kernel file adds
// its own knobs (FA_Q_IN_REGS and FA_SPLITKV) and checks the sizes its layout needs.
#ifndef FA_UNIT_CUH_
#define FA_UNIT_CUH_

#if !defined(FA_HEAD_DIM) || !defined(FA_BLOCK_M) || !defined(FA_BLOCK_N) || !defined(FA_WARPS)
#error "compile with -DFA_HEAD_DIM -DFA_BLOCK_M -DFA_BLOCK_N -DFA_WARPS (kernels/tiles.py)"
#endif
#ifndef FA_STAGES
#define FA_STAGES 1
#endif

namespace fa {

constexpr int kHeadDim = FA_HEAD_DIM;  // the head-dim bucket; a call's head_dim is at most this
constexpr int kBlockM = FA_BLOCK_M;    // query rows per block
constexpr int kBlockN = FA_BLOCK_N;    // key rows per block
constexpr int kWarps = FA_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = FA_STAGES;  // shared-memory buffers of the streamed operand (K and V; Q and dO)

static_assert(kStages == 1 || kStages == 2, "FA_STAGES is 1 or 2");

}  // namespace fa

#endif  // FA_UNIT_CUH_
