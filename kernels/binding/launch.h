// The launch logic both forms of the binding share (forms/aten.cpp, forms/stable.cpp): input checks,
// FaParams filling and launching on torch's current stream through the driver API. It sees tensors
// only as `View`s (pointer, dtype, device, sizes, strides), so it includes no torch header at all and
// compiles the same into either form; attention.h strings it together with a form's allocations.
//
// Python (fa_attn/runtime/dispatch.py) has already chosen the cubin/PTX file and passes it with the launch
// numbers from the wheel manifest; here we check what a kernel would otherwise read out of bounds.
// No CUDA header, no libtorch_cuda/libc10_cuda at link time (see cuda_driver.h), no Python C API.
#ifndef FA_BINDING_LAUNCH_H_
#define FA_BINDING_LAUNCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "geometry.h"  // the launch geometry launch_all uses (shared with the CPU emulator)
#include "params.h"
#include "tensor_maps.h"  // the sm_90a forward's TMA tensor maps (shared with the CPU emulator)

namespace fa_binding {

constexpr int64_t kSeqRound = 128;  // seqlen rounding of lse-shaped workspaces (params.h)

enum class DType { kHalf, kBFloat16, kFloat, kInt32, kOther };

const char* dtype_name(DType dtype);

// What the launch logic reads of a tensor, whichever form's tensor type it came from.
struct View {
  void* data;
  DType dtype;
  bool cuda;
  int device;  // the device index (-1 for a CPU tensor)
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // in elements
  bool contiguous;

  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  int64_t size(int64_t i) const { return sizes[i < 0 ? i + dim() : i]; }
  int64_t stride(int64_t i) const { return strides[i < 0 ? i + dim() : i]; }
};

// The scalar arguments of both operators, as the schemas (fa_attn/runtime/ops.py) name them.
struct Options {
  int64_t max_seqlen_q, max_seqlen_k;
  double softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap;
};

// The launch data of one direction: module (a cubin/PTX path), entries (comma-separated extern "C"
// names, in launch order) and launch ([head_dim_bucket, then per entry: threads, block_m, block_n,
// smem_bytes, grid]; docs/contracts.md section 2).
struct KernelArgs {
  std::string_view module;
  std::string_view entries;
  const int64_t* launch;
  size_t launch_size;
};

struct Entry {
  std::string name;
  int threads, block_m, block_n, smem_bytes, grid;
};

struct Launch {
  std::string module;
  int64_t head_dim_bucket;
  std::vector<Entry> entries;  // in launch order
};

// The KV-cache layout of a forward call (params.h): each a (batch,) int32 tensor, or a (batch,
// pages per sequence) one for block_table; null where the call has none. The backward takes none.
struct KvLayout {
  const View* seqused_k = nullptr;
  const View* leftpad_k = nullptr;
  const View* kv_batch_idx = nullptr;
  const View* block_table = nullptr;
};

struct Shape {
  bool varlen;
  int64_t batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, total_q, total_k;
  int64_t page_block_size;  // keys per page of a paged k/v (block_table); 0 otherwise
};

// Parses `kernel` and checks that the problem's head dim fits the compiled bucket, and that a paged
// k/v's pages hold whole key blocks of every entry (a key block is read from one page).
Launch parse_launch(const KernelArgs& kernel, const Shape& shape);

// True when every row of `t` starts on a 16-byte boundary as the kernels' vector loads need; a view
// that starts mid-row (x[:, 1:] of a packed buffer) can miss it even with good strides, and copying it
// is cheaper than a kernel variant for it (Python cannot check this under torch.compile).
bool row_aligned(const View& t);

// q, k, v (and cu_seqlens, null when padded; the KV-cache layout): dtypes, devices, dims, strides and
// shapes. With block_table, k/v are pages (num_pages, page_block_size, heads_k, dim) for padded and
// varlen q alike, and a padded call's keys per sequence are options.max_seqlen_k (at most the pages'
// capacity). The index values (cache rows, pages, lengths) are the caller's to check, like cu_seqlens:
// reading them here would cost a device sync.
Shape check_shapes(const View& q, const View& k, const View& v, const View* cu_q, const View* cu_k,
                   const KvLayout& kv, const Options& options);

// dout and out of the backward: q's shape, dtype, device and layout rules.
void check_backward_inputs(const View& dout, const View& out, const View& q);

// The fp32 LSE of the forward, as the backward receives it: on q's device, contiguous, its shape.
void check_lse(const View& lse, const View& q, const Shape& shape);

// (batch, heads, seqlen), or (heads, seqlen) when varlen: the LSE-shaped tensors.
std::vector<int64_t> lse_sizes(const Shape& shape, int64_t seqlen);

// The LSE's row count: seqlen_q padded, total_q varlen.
int64_t lse_rows(const Shape& shape);

// The backward's fp32 workspaces (params.h): dq_accum and dsoftmax_sum. Varlen pads every sequence by
// up to 128 rows, hence total + 128 * batch rows.
std::vector<int64_t> dq_accum_sizes(const Shape& shape, const Launch& launch);
std::vector<int64_t> dsoftmax_sum_sizes(const Shape& shape);

// k's sizes with heads_k replaced by heads: with GQA the kernels write dk/dv per query head.
std::vector<int64_t> per_query_head_sizes(const View& k, const Shape& shape);

// (..., heads_k, group, dim) and the group dim to sum: query head i belongs to kv head i / group.
std::vector<int64_t> grouped_sizes(const View& k, const Shape& shape);
int64_t group_dim(const View& k);

// FaParams of the forward: inputs, KV-cache layout, options and the out/lse outputs.
FaParams forward_params(const Shape& shape, const View& q, const View& k, const View& v, const View* cu_q,
                        const View* cu_k, const KvLayout& kv, const Options& options, const View& out,
                        const View& lse);

// The split-KV forward's fp32 partials (params.h): (num_splits, <lse's sizes>[, head_dim_bucket]) for
// o_accum (with the bucket) and lse_accum (head_dim_bucket 0).
std::vector<int64_t> split_accum_sizes(const Shape& shape, int64_t num_splits, int64_t head_dim_bucket);

// FaParams of the split-KV forward: the forward's, with num_splits and the partials' workspaces.
FaParams split_kv_params(const Shape& shape, const View& q, const View& k, const View& v, const View* cu_q,
                         const View* cu_k, const KvLayout& kv, const Options& options, const View& out,
                         const View& lse, int64_t num_splits, const View& o_accum, const View& lse_accum);

// The workspaces and gradients the backward writes, beside its inputs.
struct BackwardOutputs {
  View dq, dk, dv, dq_accum, dsoftmax_sum;
};

FaParams backward_params(const Shape& shape, const View& q, const View& k, const View& v, const View* cu_q,
                         const View* cu_k, const Options& options, const View& dout, const View& out,
                         const View& lse, const BackwardOutputs& outputs);

// A grid's y and z dimensions hold at most 65,535 blocks each (x: 2^31 - 1).
constexpr int64_t kGridYZLimit = fa_geometry::kGridYZLimit;

// The grid's y and z extents for batch x heads (batch, head) pairs (geometry.h fold_batch_heads, which
// the CPU emulator compiles too). Fails past limit x limit pairs. `limit` is a parameter so tests
// can fold small grids.
using PairGrid = fa_geometry::PairGrid;
PairGrid fold_batch_heads(int64_t batch, int64_t heads, int64_t limit = kGridYZLimit);

// Launches every entry of `launch` in order on torch's current stream of `device`.
// The TMA source of the forward's tensors: their dtype and extents (tensor_maps.h Source).
fa_tensor_maps::Source tma_source(const View& q, const View& k);

// `tma`: the forward's tensors for an sm_90a unit's tensor maps (null elsewhere; such a unit refuses).
void launch_all(const FaParams& params, const Launch& launch, int device, const fa_tensor_maps::Source* tma = nullptr);

}  // namespace fa_binding

#endif  // FA_BINDING_LAUNCH_H_
