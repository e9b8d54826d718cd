// The ATen form of the binding: CUDA kernels for fa_attn::fwd / fa_attn::bwd (schemas:
// kernels/fa_attn/runtime/ops.py) registered with TORCH_LIBRARY_IMPL against ATen's C++ API. Its binary uses
// C++ symbols of libc10/libtorch_cpu, so it is built per torch minor and C++ ABI; torch minors from
// the stable-ABI floor on take forms/stable.cpp instead. The operators themselves are attention.h's.
// Only the headers it uses: <ATen/ATen.h> declares every operator and took 2.5x as long to compile
// (the same undefined symbols either way; bench/build/build.py measures the bindings' compile time).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "attention.h"
#include "check.h"

namespace fa_binding {
namespace {

constexpr DTypeRow<at::ScalarType> kDTypes[] = {{at::kHalf, DType::kHalf},
                                                  {at::kBFloat16, DType::kBFloat16},
                                                  {at::kFloat, DType::kFloat},
                                                  {at::kInt, DType::kInt32}};

DType dtype_of(at::ScalarType type) { return dtype_in(kDTypes, type); }

at::ScalarType scalar_type(DType dtype) { return scalar_in(kDTypes, dtype); }

struct AtenForm {
  using Tensor = at::Tensor;

  static View view(const Tensor& t) {
    return View{t.data_ptr(), dtype_of(t.scalar_type()), t.is_cuda(), static_cast<int>(t.get_device()),
                t.sizes().vec(), t.strides().vec(), t.is_contiguous()};
  }

  static Tensor empty(const std::vector<int64_t>& sizes, DType dtype, const Tensor& like) {
    return at::empty(sizes, like.options().dtype(scalar_type(dtype)));
  }

  static Tensor contiguous_copy(const Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }

  static Tensor sum_groups(const Tensor& t, const std::vector<int64_t>& split, int64_t dim) {
    return t.view(split).sum(dim);
  }

  class DeviceGuard {
   public:
    explicit DeviceGuard(int cuda_device_index)
        : guard_(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_device_index))) {}

   private:
    c10::DeviceGuard guard_;
  };
};

using Ops = Attention<AtenForm>;

KernelArgs kernel_args(c10::string_view module, c10::string_view entries, at::IntArrayRef launch) {
  return KernelArgs{std::string_view(module.data(), module.size()),
                    std::string_view(entries.data(), entries.size()), launch.data(), launch.size()};
}

// The C++ signatures must match the schemas in fa_attn/runtime/ops.py exactly (TORCH_LIBRARY_IMPL checks).
using MaybeTensor = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor> fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaybeTensor& cu_q, const MaybeTensor& cu_k,
    const MaybeTensor& seqused_k, const MaybeTensor& leftpad_k, const MaybeTensor& kv_batch_idx,
    const MaybeTensor& block_table, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, c10::string_view module, c10::string_view entries,
    at::IntArrayRef launch, c10::string_view /*bwd_module*/, c10::string_view /*bwd_entries*/,
    at::IntArrayRef /*bwd_launch*/) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::fwd(q, k, v, cu_q, cu_k, {seqused_k, leftpad_k, kv_batch_idx, block_table}, options,
                  kernel_args(module, entries, launch));
}

std::tuple<at::Tensor, at::Tensor> fwd_splitkv(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaybeTensor& cu_q, const MaybeTensor& cu_k,
    const MaybeTensor& seqused_k, const MaybeTensor& leftpad_k, const MaybeTensor& kv_batch_idx,
    const MaybeTensor& block_table, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, int64_t num_splits, c10::string_view module,
    c10::string_view entries, at::IntArrayRef launch) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::fwd_splitkv(q, k, v, cu_q, cu_k, {seqused_k, leftpad_k, kv_batch_idx, block_table}, options,
                          num_splits, kernel_args(module, entries, launch));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const MaybeTensor& cu_q, const MaybeTensor& cu_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, c10::string_view module, c10::string_view entries,
    at::IntArrayRef launch) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::bwd(dout, q, k, v, out, lse, cu_q, cu_k, options, kernel_args(module, entries, launch));
}

}  // namespace
}  // namespace fa_binding

TORCH_LIBRARY_IMPL(fa_attn, CUDA, m) {
  m.impl("fwd", &fa_binding::fwd);
  m.impl("bwd", &fa_binding::bwd);
  m.impl("fwd_splitkv", &fa_binding::fwd_splitkv);
}
