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

from typing import Any

import torch

from .decision import KernelLaunch

NAMESPACE = "fa_attn"

# The forward operators' KV-cache layout (kernels/csrc/params.h): per-sequence key counts, first keys,
# k/v batch rows and a page table, each optional int32 (inputs.KvLayout); the backward takes none.
_KV_LAYOUT = "Tensor? seqused_k, Tensor? leftpad_k, Tensor? kv_batch_idx, Tensor? block_table"

_FWD_SCHEMA = (
    f"fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, {_KV_LAYOUT}, "
    "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, "
    "float softcap, str module, str entries, int[] launch, str bwd_module, str bwd_entries, int[] bwd_launch) "
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
    f"fwd_splitkv(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, {_KV_LAYOUT}, "
    "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, "
    "float softcap, int num_splits, str module, str entries, int[] launch) -> (Tensor out, Tensor softmax_lse)"
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


# The outputs' shapes come from the tensors alone; the scalars and launch data that follow do not
# change them (the fake kernels still take every argument of the schema). The split-KV forward has
# the forward's outputs and its leading arguments.
@torch.library.register_fake(f"{NAMESPACE}::fwd_splitkv")  # type: ignore[untyped-decorator]
@torch.library.register_fake(f"{NAMESPACE}::fwd")  # type: ignore[untyped-decorator]
def _fwd_fake(
    q: torch.Tensor, _k: torch.Tensor, _v: torch.Tensor, cu_seqlens_q: torch.Tensor | None, *_rest: object
) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake(f"{NAMESPACE}::bwd")  # type: ignore[untyped-decorator]
def _bwd_fake(
    _dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_rest: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )


# Where the forward's arguments sit (the schema above): the backward takes the same tensors and scalars,
# then the launch data the forward carries for it.
_FWD_TENSORS = slice(0, 5)  # q, k, v, cu_seqlens_q, cu_seqlens_k
_KV_TENSORS = slice(5, 9)  # seqused_k, leftpad_k, kv_batch_idx, block_table
_SCALARS = slice(9, 16)  # max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left/right, softcap
_BWD_LAUNCH = slice(19, 22)  # bwd_module, bwd_entries, bwd_launch
_FWD_ARGS = 22


def _fwd_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, cu_q, cu_k = inputs[_FWD_TENSORS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    # No backward kernel reads a KV-cache layout (the decision sends such calls that need gradients to
    # the fallback); one here can only come from a direct call of the op.
    ctx.kv_layout = any(t is not None for t in inputs[_KV_TENSORS])
    ctx.args = inputs[_SCALARS] + inputs[_BWD_LAUNCH]
    ctx.mark_non_differentiable(lse)  # like flash-attn: the LSE is an output, not a training signal


def _fwd_backward(
    ctx: Any, grad_out: torch.Tensor, _grad_lse: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    if ctx.kv_layout:
        raise RuntimeError(
            "fa_attn::fwd with a KV-cache layout (seqused_k, leftpad_k, kv_batch_idx, block_table) has no "
            "gradient; call it without requires_grad, or use fa_attn's functions, which fall back for it"
        )
    bwd_module = ctx.args[-3]
    if not bwd_module:
        # Dispatch sends calls that need gradients to the fallback when there is no backward kernel;
        # reaching this means the forward was called directly with requires_grad and no bwd launch data.
        raise RuntimeError(
            "fa_attn::fwd was called without backward launch data, so it has no gradient; "
            "call fa_attn.flash_attn_func, which picks kernels for forward and backward"
        )
    # bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, <the scalars>, <the launch>)
    dq, dk, dv = torch.ops.fa_attn.bwd(grad_out.contiguous(), *ctx.saved_tensors, *ctx.args)
    return (dq, dk, dv) + (None,) * (_FWD_ARGS - 3)


torch.library.register_autograd(f"{NAMESPACE}::fwd", _fwd_backward, setup_context=_fwd_setup_context)
