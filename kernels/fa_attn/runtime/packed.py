"""flash-attn 2.x's packed variants: q, k, v (or k, v) stacked in one tensor.

Each splits its packed tensor into views (no copy) and calls flash_attn_func / flash_attn_varlen_func
with the rest of its arguments (flash-attn 2.8.3's signature: their parameters after the packed tensors),
so it has their semantics, dispatch and errors; autograd writes the gradients of the views back into one
gradient of the packed tensor, as flash-attn's packed backward does.
"""

from __future__ import annotations

import torch

from .inputs import AttnOutput, InputError, IntLike, WindowSize
from .interface import flash_attn_func, flash_attn_varlen_func


def _split(name: str, packed: object, parts: int, ndim: int, layout: str) -> tuple[torch.Tensor, ...]:
    if not isinstance(packed, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor {layout}, got {type(packed).__name__}")
    stack_dim = ndim - 3  # the dim holding q/k/v (or k/v), just before heads
    if packed.dim() != ndim or packed.shape[stack_dim] != parts:
        raise InputError(
            f"{name}: expected {ndim} dims {layout} with {parts} at dim {stack_dim}, got shape "
            f"{tuple(packed.shape)}; stack with torch.stack(..., dim={stack_dim})"
        )
    return packed.unbind(dim=stack_dim)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """qkv (batch, seqlen, 3, heads, head_dim) -> out (batch, seqlen, heads, head_dim); the other
    arguments are flash_attn_func's."""
    q, k, v = _split("qkv", qkv, 3, 5, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, return_lse=return_lse,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """q (batch, seqlen_q, heads, head_dim), kv (batch, seqlen_k, 2, heads_k, head_dim); the other
    arguments are flash_attn_func's."""
    k, v = _split("kv", kv, 2, 5, "(batch, seqlen_k, 2, heads_k, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, return_lse=return_lse,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: IntLike,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """qkv (total, 3, heads, head_dim), one cu_seqlens and max_seqlen for q and k; the other arguments
    are flash_attn_varlen_func's."""
    q, k, v = _split("qkv", qkv, 3, 4, "(total_tokens, 3, heads, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs, return_lse=return_lse,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: IntLike,
    max_seqlen_k: IntLike,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """q (total_q, heads, head_dim), kv (total_k, 2, heads_k, head_dim); the other arguments are
    flash_attn_varlen_func's."""
    k, v = _split("kv", kv, 2, 4, "(total_tokens, 2, heads_k, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs, return_lse=return_lse,
    )  # fmt: skip
