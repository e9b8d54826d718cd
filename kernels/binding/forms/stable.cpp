// The stable-ABI form of the binding: CUDA kernels for fa_attn::fwd / fwd_splitkv / bwd (schemas:
// kernels/fa_attn/runtime/ops.py) registered with STABLE_TORCH_LIBRARY_IMPL. Everything it asks of torch goes
// through torch's C shim (extern "C" aoti_torch_* / torch_* functions, called by the header-only
// torch::stable wrappers), never through an ATen or c10 C++ symbol, so one binary serves every torch
// from the floor it is built for on, whatever that torch's minor or C++ ABI.
//
// Built with TORCH_TARGET_VERSION set to the floor (buildtool/builder/binding.py), against that torch's
// headers: the headers then offer only what the floor's shim exports. The floor is 2.10 because the
// schemas' `str` and `int[]` arguments box as std::string / std::vector only from TORCH_VERSION_2_10_0
// (torch/csrc/stable/stableivalue_conversions.h), and torch::stable::empty, new_empty, view and sum
// are 2.10's too. The operators themselves are attention.h's, shared with forms/aten.cpp.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention.h"
#include "check.h"

#ifndef TORCH_TARGET_VERSION
#error "build the stable form with -DTORCH_TARGET_VERSION=<the floor> (buildtool/builder/binding.py does)"
#endif

namespace fa_binding {
namespace {

using torch::headeronly::ScalarType;
using StableTensor = torch::stable::Tensor;

constexpr DTypeRow<ScalarType> kDTypes[] = {{ScalarType::Half, DType::kHalf},
                                            {ScalarType::BFloat16, DType::kBFloat16},
                                            {ScalarType::Float, DType::kFloat},
                                            {ScalarType::Int, DType::kInt32}};

DType dtype_of(ScalarType type) { return dtype_in(kDTypes, type); }

ScalarType scalar_type(DType dtype) { return scalar_in(kDTypes, dtype); }

std::vector<int64_t> vec(torch::headeronly::IntHeaderOnlyArrayRef values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

struct StableForm {
  using Tensor = StableTensor;

  static View view(const Tensor& t) {
    const bool cuda = t.is_cuda();
    return View{t.data_ptr(), dtype_of(t.scalar_type()), cuda, cuda ? t.get_device_index() : -1,
                vec(t.sizes()), vec(t.strides()), t.is_contiguous()};
  }

  static Tensor empty(const std::vector<int64_t>& sizes, DType dtype, const Tensor& like) {
    return torch::stable::new_empty(like, sizes, scalar_type(dtype));
  }

  static Tensor contiguous_copy(const Tensor& t) {
    Tensor copy = torch::stable::new_empty(t, vec(t.sizes()));
    return torch::stable::copy_(copy, t);
  }

  static Tensor sum_groups(const Tensor& t, const std::vector<int64_t>& split, int64_t dim) {
    const std::vector<int64_t> dims{dim};
    return torch::stable::sum(torch::stable::view(t, split), dims);
  }

  class DeviceGuard {
   public:
    explicit DeviceGuard(int cuda_device_index) : guard_(cuda_device_index) {}

   private:
    torch::stable::accelerator::DeviceGuard guard_;
  };
};

using Ops = Attention<StableForm>;

KernelArgs kernel_args(const std::string& module, const std::string& entries, const std::vector<int64_t>& launch) {
  return KernelArgs{module, entries, launch.data(), launch.size()};
}

// One parameter per schema argument, in order (TORCH_BOX checks the count): Tensor, Tensor? as
// std::optional<Tensor>, int as int64_t, float as double, str as std::string, int[] as
// std::vector<int64_t>.
using MaybeTensor = std::optional<StableTensor>;

std::tuple<StableTensor, StableTensor> fwd(
    const StableTensor& q, const StableTensor& k, const StableTensor& v, const MaybeTensor& cu_q,
    const MaybeTensor& cu_k, const MaybeTensor& seqused_k, const MaybeTensor& leftpad_k,
    const MaybeTensor& kv_batch_idx, const MaybeTensor& block_table, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::string& module, const std::string& entries, const std::vector<int64_t>& launch,
    const std::string& /*bwd_module*/, const std::string& /*bwd_entries*/,
    const std::vector<int64_t>& /*bwd_launch*/) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::fwd(q, k, v, cu_q, cu_k, {seqused_k, leftpad_k, kv_batch_idx, block_table}, options,
                  kernel_args(module, entries, launch));
}

std::tuple<StableTensor, StableTensor> fwd_splitkv(
    const StableTensor& q, const StableTensor& k, const StableTensor& v, const MaybeTensor& cu_q,
    const MaybeTensor& cu_k, const MaybeTensor& seqused_k, const MaybeTensor& leftpad_k,
    const MaybeTensor& kv_batch_idx, const MaybeTensor& block_table, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    int64_t num_splits, const std::string& module, const std::string& entries, const std::vector<int64_t>& launch) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::fwd_splitkv(q, k, v, cu_q, cu_k, {seqused_k, leftpad_k, kv_batch_idx, block_table}, options,
                          num_splits, kernel_args(module, entries, launch));
}

std::tuple<StableTensor, StableTensor, StableTensor> bwd(
    const StableTensor& dout, const StableTensor& q, const StableTensor& k, const StableTensor& v,
    const StableTensor& out, const StableTensor& lse, const MaybeTensor& cu_q,
    const MaybeTensor& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, double softcap, const std::string& module,
    const std::string& entries, const std::vector<int64_t>& launch) {
  const Options options{max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap};
  return Ops::bwd(dout, q, k, v, out, lse, cu_q, cu_k, options, kernel_args(module, entries, launch));
}

}  // namespace
}  // namespace fa_binding

// The dispatch key the kernels register under. Tests build with -DFA_BINDING_DISPATCH_KEY=CPU to call
// the operators with CPU tensors on a machine without a GPU: the boxing of every schema argument (only
// checked at call time, unlike TORCH_LIBRARY_IMPL's) and the input checks then run for real.
#ifndef FA_BINDING_DISPATCH_KEY
#define FA_BINDING_DISPATCH_KEY CUDA
#endif

STABLE_TORCH_LIBRARY_IMPL(fa_attn, FA_BINDING_DISPATCH_KEY, m) {
  m.impl("fwd", TORCH_BOX(&fa_binding::fwd));
  m.impl("bwd", TORCH_BOX(&fa_binding::bwd));
  m.impl("fwd_splitkv", TORCH_BOX(&fa_binding::fwd_splitkv));
}
