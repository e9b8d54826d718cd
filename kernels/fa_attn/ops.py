"""The `fa_attn::fwd` / `fa_attn::bwd` operators: schemas, fake (meta) kernels and autograd, in Python.

Defining them here (not in C++) means the schemas and fake kernels exist on every machine, with or
without the binding, so torch.compile can trace a call without graph breaks and CPU tests can trace the
ops with fake CUDA tensors. The binding (kernels/binding/attention.h, registered by forms/aten.cpp or
forms/stable.cpp) only adds the CUDA kernels; its C++ signatures must match these schemas exactly.

Only APIs present since torch 2.4 are used: torch.library.Library(..., "DEF").define,
torch.library.register_fake and torch.library.register_autograd (which accept ops defined this way).

Launch data travels as plain arguments so the ops stay pure functions of their inputs:
  module  - absolute path of the cubin/PTX file (from the wheel manifest)
  entries - extern "C" kernel names, comma-separated, launched in order
  launch  - [head_dim_bucket, then per entry: threads, block_m, block_n, smem_bytes, grid] where grid
            is 0 for "q_blocks" and 1 for "k_blocks" (docs/contracts.md section 2)
The forward carries the backward's launch data too (empty when no backward will run), so that the
autograd formula needs nothing but the op's own inputs.
"""

from __future__ import annotations

import torch

from .decision import KernelLaunch

NAMESPACE = "fa_attn"

_FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "str module, str entries, int[] launch, str bwd_module, str bwd_entries, int[] bwd_launch) "
    "-> (Tensor out, Tensor softmax_lse)"
)
_BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, str module, str entries, int[] launch) "
    "-> (Tensor dq, Tensor dk, Tensor dv)"
)

# The split-KV forward (decode): the keys of each (batch, head, query block) in num_splits shares, then
# an LSE-weighted combine; the outputs of fwd. No autograd: the runtime uses it for inference calls.
_FWD_SPLITKV_SCHEMA = (
    "fwd_splitkv(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "int num_splits, str module, str entries, int[] launch) -> (Tensor out, Tensor softmax_lse)"
)

# Kept alive for the life of the process: dropping a Library object unregisters its ops.
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define(_FWD_SCHEMA)
_lib.define(_BWD_SCHEMA)
_lib.define(_FWD_SPLITKV_SCHEMA)


NO_LAUNCH = KernelLaunch("", "", ())  # the forward's backward arguments when no backward will run


def lse_shape(q: torch.Tensor, cu_seqlens_q: torch.Tensor | None) -> tuple[int, ...]:
    """(batch, heads, seqlen_q) padded; (heads, total_q) varlen - flash-attn 2.x's layouts."""
    if cu_seqlens_q is not None:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


@torch.library.register_fake(f"{NAMESPACE}::fwd")
def _fwd_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    module,
    entries,
    launch,
    bwd_module,
    bwd_entries,
    bwd_launch,
):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake(f"{NAMESPACE}::fwd_splitkv")
def _fwd_splitkv_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    num_splits,
    module,
    entries,
    launch,
):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake(f"{NAMESPACE}::bwd")
def _bwd_fake(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    module,
    entries,
    launch,
):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )


def _fwd_setup_context(ctx, inputs, output):
    (
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        scale,
        causal,
        wl,
        wr,
        softcap,
        _m,
        _e,
        _l,
        bwd_module,
        bwd_entries,
        bwd_launch,
    ) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, causal, wl, wr, softcap, bwd_module, bwd_entries, bwd_launch)
    ctx.mark_non_differentiable(lse)  # like flash-attn: the LSE is an output, not a training signal


def _fwd_backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, softcap, bwd_module, bwd_entries, bwd_launch = ctx.args
    if not bwd_module:
        # Dispatch sends calls that need gradients to the fallback when there is no backward kernel;
        # reaching this means the forward was called directly with requires_grad and no bwd launch data.
        raise RuntimeError(
            "fa_attn::fwd was called without backward launch data, so it has no gradient; "
            "call fa_attn.flash_attn_func, which picks kernels for forward and backward"
        )
    dq, dk, dv = torch.ops.fa_attn.bwd(
        grad_out.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        max_q,
        max_k,
        scale,
        causal,
        wl,
        wr,
        softcap,
        bwd_module,
        bwd_entries,
        bwd_launch,
    )
    return (dq, dk, dv) + (None,) * 15


torch.library.register_autograd(f"{NAMESPACE}::fwd", _fwd_backward, setup_context=_fwd_setup_context)
