"""flash-attn 2.x's compiled extension (`flash_attn_2_cuda`, which flash_attn_interface imports as
`flash_attn_gpu`), on fa_attn: what the stand-in hands to libraries that call it directly.

xformers (`xformers.ops.fmha.flash`) reads `flash_attn.flash_attn_interface.flash_attn_gpu` at import
and calls `fwd`, `varlen_fwd`, `bwd` and `varlen_bwd` with the C++ functions' positional arguments;
ring-attention and context-parallel code calls them through flash-attn's private wrappers
(flash_attn_privates.py). Each function here takes flash-attn 2.8.3's arguments in its order
(csrc/flash_attn/flash_api.cpp: mha_fwd, mha_varlen_fwd, mha_bwd, mha_varlen_bwd, mha_fwd_kvcache) and
returns its list of results, computed by fa_attn's public functions (kernels or fallback, with their
reasons). Differences, each one a thing fa does not keep:
- the attention probabilities (`return_softmax`) are never materialised: that result is an empty tensor;
- `rng_state` is zeros, and a backward with dropout raises (it cannot replay the forward's mask: use
  flash_attn_func, whose autograd keeps it);
- none in the backward's values: it reads the caller's `out` and `softmax_lse` (ring attention passes
  those merged over key blocks) on fa's backward kernel where the wheel has one for the call, and
  elsewhere (the fallback, features the backward kernels lack) with flash-attn's formula in torch
  (fallback.backward). `softmax_d` holds each row's sum(dout * out), as the kernel's, in flash-attn's shape.
`gen` (a torch.Generator) is accepted and unused, like `zero_tensors`.
"""

from __future__ import annotations

import types
from typing import cast

import torch
import torch.nn.functional as F

from . import dispatch, fallback, inputs, interface, preload
from .inputs import AttnCall, InputError
from .interface import flash_attn_func, varlen_attention
from .kvcache import flash_attn_with_kvcache

Tensor = torch.Tensor


def _into(given: Tensor | None, result: Tensor) -> Tensor:
    """flash-attn writes into a caller's output tensor when one is passed."""
    if given is None:
        return result
    given.copy_(result)
    return given


def _no_probs(q: Tensor) -> Tensor:
    return q.new_empty((0,))


def _rng_state(q: Tensor) -> Tensor:
    return torch.zeros((2,), dtype=torch.int64, device=q.device)


def fwd(
    q: Tensor, k: Tensor, v: Tensor, out_: Tensor | None, alibi_slopes_: Tensor | None, p_dropout: float,
    softmax_scale: float, is_causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    return_softmax: bool, gen_: object,
) -> list[Tensor]:  # fmt: skip
    """mha_fwd -> [out, softmax_lse (batch, heads, seqlen_q), p (empty), rng_state]."""
    out, lse = cast(
        tuple[Tensor, Tensor],
        flash_attn_func(
            q, k, v, p_dropout, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
            alibi_slopes_, False, return_lse=True,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse, _no_probs(q), _rng_state(q)]


def varlen_fwd(
    q: Tensor, k: Tensor, v: Tensor, out_: Tensor | None, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Tensor | None, leftpad_k_: Tensor | None, block_table_: Tensor | None,
    alibi_slopes_: Tensor | None, max_seqlen_q: int, max_seqlen_k: int, p_dropout: float,
    softmax_scale: float, zero_tensors: bool, is_causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, return_softmax: bool, gen_: object,
) -> list[Tensor]:  # fmt: skip
    """mha_varlen_fwd -> [out, softmax_lse (heads, total_q), p (empty), rng_state]."""
    out, lse = cast(
        tuple[Tensor, Tensor],
        varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
            is_causal, (window_size_left, window_size_right), softcap, alibi_slopes_, False, False,
            block_table_, True, seqused_k, leftpad_k_,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse, _no_probs(q), _rng_state(q)]


def _no_dropout(p_dropout: float) -> None:
    if p_dropout > 0:
        raise InputError(
            f"p_dropout: {p_dropout}: fa_attn's flash_attn_gpu.bwd cannot replay the forward's dropout mask "
            "(it keeps no rng_state); train with flash_attn_func (its autograd keeps the mask), or dropout 0"
        )


def _kernel_grads(
    call: AttnCall, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor] | None:
    """d(q, k, v) from the backward kernel, reading the caller's out and softmax_lse as flash-attn's bwd
    does; None where the call's backward does not run on the kernels (then the forward runs again)."""
    with torch.enable_grad():  # the decision for a call that needs gradients
        lq, lk, lv = (t.detach().requires_grad_(True) for t in (q, k, v))
        route = interface.admit(call, interface.decide(call, lq, lk, lv), lq, lk, lv)
    bwd = route.bwd
    if route.path == "fallback" or bwd is None or route.head_dim is None:
        return None
    dispatch.report(route)
    preload.before_call(route, q)
    pad = route.head_dim - call.head_dim
    tensors = [dout, q, k, v, out]
    if pad:  # as the forward padded them: zero columns change neither q.k nor the kept outputs
        tensors = [F.pad(t, (0, pad)) for t in tensors]
    dout, q, k, v, out = (interface.row_aligned(t) for t in tensors)
    varlen = call.varlen
    dq, dk, dv = torch.ops.fa_attn.bwd(
        dout.contiguous(), q, k, v, out.contiguous(), lse,
        varlen.cu_seqlens_q if varlen else None, varlen.cu_seqlens_k if varlen else None,
        call.seqlen_q, call.seqlen_k, call.softmax_scale, call.causal, call.window_left, call.window_right,
        call.softcap, bwd.module, bwd.entries, list(bwd.launch),
    )  # fmt: skip
    if pad:
        dq, dk, dv = (t[..., : call.head_dim] for t in (dq, dk, dv))
    return dq, dk, dv


def _softmax_d(dout: Tensor, out: Tensor) -> Tensor:
    """sum over the head dim of dout * out, fp32, heads before rows: (..., heads, rows)."""
    return (dout.float() * out.float()).sum(-1).transpose(-1, -2)


def _round128(n: int) -> int:
    return (n + 127) // 128 * 128


def bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq_: Tensor | None,
    dk_: Tensor | None, dv_: Tensor | None, alibi_slopes_: Tensor | None, p_dropout: float,
    softmax_scale: float, is_causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    deterministic: bool, gen_: object, rng_state: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """mha_bwd -> [dq, dk, dv, softmax_d (batch, heads, seqlen_q rounded up to 128)]."""
    _no_dropout(p_dropout)
    call = inputs.check_padded(
        q, k, v, 0.0, softmax_scale, is_causal, (window_size_left, window_size_right), softcap, alibi_slopes_,
        deterministic,
    )  # fmt: skip
    grads = _kernel_grads(call, dout, q, k, v, out, softmax_lse)
    dq, dk, dv = grads if grads is not None else fallback.backward(call, (dout, q, k, v, out, softmax_lse))
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    softmax_d = dout.new_zeros((batch, heads, _round128(seqlen_q)), dtype=torch.float32)
    softmax_d[..., :seqlen_q] = _softmax_d(dout, out)
    return [_into(dq_, dq), _into(dk_, dk), _into(dv_, dv), softmax_d]


def varlen_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq_: Tensor | None,
    dk_: Tensor | None, dv_: Tensor | None, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    alibi_slopes_: Tensor | None, max_seqlen_q: int, max_seqlen_k: int, p_dropout: float,
    softmax_scale: float, zero_tensors: bool, is_causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, deterministic: bool, gen_: object, rng_state: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """mha_varlen_bwd -> [dq, dk, dv, softmax_d (heads, total_q + 128 * batch), rows in the first total_q
    columns]."""
    _no_dropout(p_dropout)
    call = inputs.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, softmax_scale, is_causal,
        (window_size_left, window_size_right), softcap, alibi_slopes_, deterministic,
    )  # fmt: skip
    grads = _kernel_grads(call, dout, q, k, v, out, softmax_lse)
    dq, dk, dv = grads if grads is not None else fallback.backward(call, (dout, q, k, v, out, softmax_lse))
    total_q, heads, batch = q.shape[0], q.shape[1], cu_seqlens_q.shape[0] - 1
    softmax_d = dout.new_zeros((heads, total_q + 128 * batch), dtype=torch.float32)
    softmax_d[:, :total_q] = _softmax_d(dout, out)
    return [_into(dq_, dq), _into(dk_, dk), _into(dv_, dv), softmax_d]


def fwd_kvcache(
    q: Tensor, kcache: Tensor, vcache: Tensor, k_: Tensor | None, v_: Tensor | None,
    seqlens_k_: Tensor | None, rotary_cos_: Tensor | None, rotary_sin_: Tensor | None,
    cache_batch_idx_: Tensor | None, leftpad_k_: Tensor | None, block_table_: Tensor | None,
    alibi_slopes_: Tensor | None, out_: Tensor | None, softmax_scale: float, is_causal: bool,
    window_size_left: int, window_size_right: int, softcap: float, is_rotary_interleaved: bool,
    num_splits: int,
) -> list[Tensor]:  # fmt: skip
    """mha_fwd_kvcache -> [out, softmax_lse (batch, heads, seqlen_q)]; appends k_/v_ to the cache."""
    out, lse = cast(
        tuple[Tensor, Tensor],
        flash_attn_with_kvcache(
            q, kcache, vcache, k_, v_, rotary_cos_, rotary_sin_, seqlens_k_, cache_batch_idx_, leftpad_k_,
            block_table_, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
            is_rotary_interleaved, alibi_slopes_, num_splits, return_softmax_lse=True,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse]


NAMES = ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache")


def module() -> types.ModuleType:
    """The extension as a module object, named as flash-attn's (`flash_attn_2_cuda`)."""
    ext = types.ModuleType("flash_attn_2_cuda", "fa_attn standing in for flash-attn's compiled extension")
    for name in NAMES:
        setattr(ext, name, globals()[name])
    return ext
