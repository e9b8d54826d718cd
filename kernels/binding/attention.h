// fa_attn::fwd, fa_attn::fwd_splitkv and fa_attn::bwd, written once for both forms of the binding.
// The forward operators take the KV-cache layout (KvTensors); the backward takes none.
//
// A form (forms/aten.cpp: ATen, one build per torch minor and C++ ABI; forms/stable.cpp: torch's
// stable C ABI, one build for every torch from its floor on) supplies its tensor type and the few
// tensor operations the operators need; everything else (checks, FaParams, launching) is launch.h's.
// A form is a struct with:
//   using Tensor = ...;                                                       its tensor type
//   static View view(const Tensor&);                                          what launch.h reads
//   static Tensor empty(const std::vector<int64_t>& sizes, DType, const Tensor& like);  on like's device
//   static Tensor contiguous_copy(const Tensor&);
//   static Tensor sum_groups(const Tensor&, const std::vector<int64_t>& split, int64_t dim);
//                                                                             view as split, sum dim
//   class DeviceGuard { explicit DeviceGuard(int cuda_device_index); };
#ifndef FA_BINDING_ATTENTION_H_
#define FA_BINDING_ATTENTION_H_

#include <cstddef>
#include <optional>
#include <tuple>

#include "check.h"
#include "launch.h"

namespace fa_binding {

// A form's torch dtypes against ours, one row each; both directions of the conversion read the same
// table, so they cannot disagree.
template <class Scalar>
struct DTypeRow {
  Scalar scalar;
  DType dtype;
};

template <class Scalar, size_t N>
DType dtype_in(const DTypeRow<Scalar> (&table)[N], Scalar scalar) {
  for (const DTypeRow<Scalar>& row : table) {
    if (row.scalar == scalar) return row.dtype;
  }
  return DType::kOther;
}

template <class Scalar, size_t N>
Scalar scalar_in(const DTypeRow<Scalar> (&table)[N], DType dtype) {
  for (const DTypeRow<Scalar>& row : table) {
    if (row.dtype == dtype) return row.scalar;
  }
  fail("no tensor of ", dtype_name(dtype), " is ever allocated");
}

template <class Form>
struct Attention {
  using Tensor = typename Form::Tensor;
  using MaybeTensor = std::optional<Tensor>;

  // The KV-cache layout arguments of the forward operators (schemas: seqused_k, leftpad_k,
  // kv_batch_idx, block_table), each optional; launch.h's KvLayout says what they mean.
  struct KvTensors {
    const MaybeTensor& seqused_k;
    const MaybeTensor& leftpad_k;
    const MaybeTensor& kv_batch_idx;
    const MaybeTensor& block_table;
  };

  static std::tuple<Tensor, Tensor> fwd(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg,
                                        const MaybeTensor& cu_q, const MaybeTensor& cu_k, const KvTensors& kv_args,
                                        const Options& options, const KernelArgs& kernel) {
    return forward(q_arg, k_arg, v_arg, cu_q, cu_k, kv_args, options, std::nullopt, kernel);
  }

  // The split-KV forward (decode): partials of num_splits shares of the keys, then the LSE-weighted
  // combine; the outputs of fwd.
  static std::tuple<Tensor, Tensor> fwd_splitkv(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg,
                                                const MaybeTensor& cu_q, const MaybeTensor& cu_k,
                                                const KvTensors& kv_args, const Options& options,
                                                int64_t num_splits, const KernelArgs& kernel) {
    return forward(q_arg, k_arg, v_arg, cu_q, cu_k, kv_args, options, num_splits, kernel);
  }

  static std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& dout_arg, const Tensor& q_arg, const Tensor& k_arg,
                                                const Tensor& v_arg, const Tensor& out_arg, const Tensor& lse,
                                                const MaybeTensor& cu_q, const MaybeTensor& cu_k,
                                                const Options& options, const KernelArgs& kernel) {
    const Tensor q = aligned(q_arg), k = aligned(k_arg), v = aligned(v_arg);
    const Tensor dout = aligned(dout_arg), out = aligned(out_arg);
    const View vq = Form::view(q), vk = Form::view(k), vv = Form::view(v);
    const View vdout = Form::view(dout), vout = Form::view(out), vlse = Form::view(lse);
    const std::optional<View> vcu_q = maybe_view(cu_q), vcu_k = maybe_view(cu_k);
    const Shape s = check_shapes(vq, vk, vv, ptr(vcu_q), ptr(vcu_k), KvLayout{}, options);
    check_backward_inputs(vdout, vout, vq);
    check_lse(vlse, vq, s);
    const Launch launch = parse_launch(kernel, s);
    typename Form::DeviceGuard guard(vq.device);
    Tensor dq_accum = Form::empty(dq_accum_sizes(s, launch), DType::kFloat, q);
    Tensor dsoftmax_sum = Form::empty(dsoftmax_sum_sizes(s), DType::kFloat, q);
    Tensor dq = Form::empty(vq.sizes, vq.dtype, q);
    // With GQA the kernels write dk/dv per query head; the groups are summed below.
    const bool grouped = s.heads != s.heads_k;
    const std::vector<int64_t> dkv_sizes = grouped ? per_query_head_sizes(vk, s) : vk.sizes;
    Tensor dk = Form::empty(dkv_sizes, vk.dtype, q);
    Tensor dv = Form::empty(dkv_sizes, vv.dtype, q);
    const BackwardOutputs outputs{Form::view(dq), Form::view(dk), Form::view(dv), Form::view(dq_accum),
                                  Form::view(dsoftmax_sum)};
    const FaParams p =
        backward_params(s, vq, vk, vv, ptr(vcu_q), ptr(vcu_k), options, vdout, vout, vlse, outputs);
    launch_all(p, launch, vq.device);
    if (grouped) {
      dk = Form::sum_groups(dk, grouped_sizes(vk, s), group_dim(vk));
      dv = Form::sum_groups(dv, grouped_sizes(vk, s), group_dim(vk));
    }
    return {dq, dk, dv};
  }

 private:
  // fwd and fwd_splitkv: the same checks and outputs; `num_splits` given, the split-KV kernels (with
  // their fp32 partials) instead of the plain forward.
  static std::tuple<Tensor, Tensor> forward(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg,
                                            const MaybeTensor& cu_q, const MaybeTensor& cu_k,
                                            const KvTensors& kv_args, const Options& options,
                                            std::optional<int64_t> num_splits, const KernelArgs& kernel) {
    const Tensor q = aligned(q_arg), k = aligned(k_arg), v = aligned(v_arg);
    const View vq = Form::view(q), vk = Form::view(k), vv = Form::view(v);
    const std::optional<View> vcu_q = maybe_view(cu_q), vcu_k = maybe_view(cu_k);
    const KvViews kv_views = views(kv_args);
    const KvLayout kv = kv_views.layout();
    const Shape s = check_shapes(vq, vk, vv, ptr(vcu_q), ptr(vcu_k), kv, options);
    const Launch launch = parse_launch(kernel, s);
    typename Form::DeviceGuard guard(vq.device);
    Tensor out = Form::empty(vq.sizes, vq.dtype, q);
    Tensor lse = Form::empty(lse_sizes(s, lse_rows(s)), DType::kFloat, q);
    if (!num_splits) {
      const FaParams p = forward_params(s, vq, vk, vv, ptr(vcu_q), ptr(vcu_k), kv, options, Form::view(out),
                                        Form::view(lse));
      const fa_tensor_maps::Source tma = tma_source(vq, vk);  // used by an sm_90a unit only
      launch_all(p, launch, vq.device, &tma);
      return {out, lse};
    }
    Tensor o_accum = Form::empty(split_accum_sizes(s, *num_splits, launch.head_dim_bucket), DType::kFloat, q);
    Tensor lse_accum = Form::empty(split_accum_sizes(s, *num_splits, 0), DType::kFloat, q);
    const FaParams p = split_kv_params(s, vq, vk, vv, ptr(vcu_q), ptr(vcu_k), kv, options, Form::view(out),
                                       Form::view(lse), *num_splits, Form::view(o_accum), Form::view(lse_accum));
    launch_all(p, launch, vq.device);
    return {out, lse};
  }

  struct KvViews {
    std::optional<View> seqused_k, leftpad_k, kv_batch_idx, block_table;
    KvLayout layout() const { return KvLayout{ptr(seqused_k), ptr(leftpad_k), ptr(kv_batch_idx), ptr(block_table)}; }
  };

  static KvViews views(const KvTensors& t) {
    return KvViews{maybe_view(t.seqused_k), maybe_view(t.leftpad_k), maybe_view(t.kv_batch_idx),
                   maybe_view(t.block_table)};
  }

  static Tensor aligned(const Tensor& t) { return row_aligned(Form::view(t)) ? t : Form::contiguous_copy(t); }

  static std::optional<View> maybe_view(const MaybeTensor& t) {
    return t.has_value() ? std::optional<View>(Form::view(*t)) : std::nullopt;
  }

  static const View* ptr(const std::optional<View>& v) { return v.has_value() ? &*v : nullptr; }
};

}  // namespace fa_binding

#endif  // FA_BINDING_ATTENTION_H_
