// The ATen form of the binding: CUDA kernels for fa_attn::fwd / fwd_splitkv / bwd (schemas:
// kernels/fa_attn/runtime/ops.py) registered with TORCH_LIBRARY_IMPL against ATen's C++ API. Its binary uses
// C++ symbols of libc10/libtorch_cpu, so it is built per torch minor and C++ ABI; torch minors from
// the stable-ABI floor on take forms/stable.cpp instead. The operators themselves are attention.h's.
//
// Built once per binding, so its compile time is the binding's (bench/build/binding_time.py measures it).
// Two choices keep it low:
// - The kernels are boxed (CppFunction::makeFromBoxedFunction): each reads its arguments off the
//   dispatcher's IValue stack by position. An unboxed function of 22 arguments made the compiler
//   instantiate the unboxing wrappers and infer its schema, a third of the compile's CPU. The arity is
//   checked against the registered schema when an operator is called (TORCH_BOX does the same for the
//   stable form), and tests/runtime/test_binding_load.py calls all three through the checks.
// - No header beyond what torch/library.h pulls in anyway: at::Tensor (its methods new_empty, clone,
//   view, sum) and c10::DeviceGuard, included below by name for what this file uses; <ATen/ATen.h>
//   declares every operator and took 2.5x as long, ATen/ops/empty.h another half second.
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstddef>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
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
    return like.new_empty(sizes, like.options().dtype(scalar_type(dtype)));
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
using MaybeTensor = std::optional<at::Tensor>;

// One operator call's arguments on the dispatcher's stack, read by their position in the schema
// (fa_attn/runtime/ops.py). They stay on the stack until `finish` replaces them with the outputs, so the
// string views and tensor references handed out live through the call.
class Args {
 public:
  Args(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t count) : stack_(*stack), count_(count) {
    const size_t declared = op.schema().arguments().size();
    FA_CHECK(declared == count && stack_.size() >= count, op.schema().name(), " takes ", declared,
             " arguments and this binding reads ", count, ": the binding was built for another schema");
    base_ = stack_.size() - count;
  }

  const at::Tensor& tensor(size_t i) const { return at(i).toTensor(); }
  MaybeTensor maybe_tensor(size_t i) const { return at(i).isNone() ? MaybeTensor() : MaybeTensor(tensor(i)); }
  int64_t integer(size_t i) const { return at(i).toInt(); }
  std::string_view text(size_t i) const {
    const auto view = at(i).toStringView();  // c10::string_view before torch 2.6, std::string_view after
    return std::string_view(view.data(), view.size());
  }
  std::vector<int64_t> integers(size_t i) const { return at(i).toIntVector(); }

  // The scalars every operator takes, in the schemas' order from `first`: max_seqlen_q, max_seqlen_k,
  // softmax_scale, causal, window_left, window_right, softcap.
  Options options(size_t first) const {
    return Options{integer(first),     integer(first + 1), at(first + 2).toDouble(), at(first + 3).toBool(),
                   integer(first + 4), integer(first + 5), at(first + 6).toDouble()};
  }

  template <class... Outputs>
  void finish(std::tuple<Outputs...>&& outputs) {
    torch::jit::drop(stack_, count_);
    std::apply([this](auto&&... t) { torch::jit::push(stack_, std::move(t)...); }, std::move(outputs));
  }

 private:
  const c10::IValue& at(size_t i) const { return stack_[base_ + i]; }

  torch::jit::Stack& stack_;
  size_t count_;
  size_t base_ = 0;
};

// module, entries, launch at `first`; `launch` owns the numbers KernelArgs points at.
KernelArgs kernel_args(const Args& args, size_t first, const std::vector<int64_t>& launch) {
  return KernelArgs{args.text(first), args.text(first + 1), launch.data(), launch.size()};
}

// fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, kv_batch_idx, block_table, <7 scalars>,
//     module, entries, launch, bwd_module, bwd_entries, bwd_launch) -> (out, softmax_lse)
void fwd(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args args(op, stack, 22);
  const std::vector<int64_t> launch = args.integers(18);
  args.finish(Ops::fwd(args.tensor(0), args.tensor(1), args.tensor(2), args.maybe_tensor(3), args.maybe_tensor(4),
                       {args.maybe_tensor(5), args.maybe_tensor(6), args.maybe_tensor(7), args.maybe_tensor(8)},
                       args.options(9), kernel_args(args, 16, launch)));
}

// fwd_splitkv(<fwd's first 16>, num_splits, module, entries, launch) -> (out, softmax_lse)
void fwd_splitkv(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args args(op, stack, 20);
  const std::vector<int64_t> launch = args.integers(19);
  args.finish(Ops::fwd_splitkv(
      args.tensor(0), args.tensor(1), args.tensor(2), args.maybe_tensor(3), args.maybe_tensor(4),
      {args.maybe_tensor(5), args.maybe_tensor(6), args.maybe_tensor(7), args.maybe_tensor(8)}, args.options(9),
      args.integer(16), kernel_args(args, 17, launch)));
}

// bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, <7 scalars>, module, entries, launch)
//     -> (dq, dk, dv)
void bwd(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args args(op, stack, 18);
  const std::vector<int64_t> launch = args.integers(17);
  args.finish(Ops::bwd(args.tensor(0), args.tensor(1), args.tensor(2), args.tensor(3), args.tensor(4),
                       args.tensor(5), args.maybe_tensor(6), args.maybe_tensor(7), args.options(8),
                       kernel_args(args, 15, launch)));
}

}  // namespace
}  // namespace fa_binding

// The dispatch key the kernels register under. Tests build with -DFA_BINDING_DISPATCH_KEY=CPU to call
// the operators with CPU tensors on a machine without a GPU: the reading of every argument and the input
// checks then run for real.
#ifndef FA_BINDING_DISPATCH_KEY
#define FA_BINDING_DISPATCH_KEY CUDA
#endif

TORCH_LIBRARY_IMPL(fa_attn, FA_BINDING_DISPATCH_KEY, m) {
  m.impl("fwd", torch::CppFunction::makeFromBoxedFunction<&fa_binding::fwd>());
  m.impl("bwd", torch::CppFunction::makeFromBoxedFunction<&fa_binding::bwd>());
  m.impl("fwd_splitkv", torch::CppFunction::makeFromBoxedFunction<&fa_binding::fwd_splitkv>());
}
