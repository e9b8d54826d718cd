"""flash-attn 2.x's packed variants: q, k, v (or k, v) stacked in one tensor.

Each splits its packed tensor into views (no copy) and calls flash_attn_func / flash_attn_varlen_func
with the rest of its arguments as given, so it has their signature after the packed tensors, their
semantics, dispatch and errors; autograd writes the gradients of the views back into one
gradient of the packed tensor, as flash-attn's packed backward does.
"""

from __future__ import annotations

from typing import Any

import torch

from .inputs import AttnOutput, IntLike
from .interface import flash_attn_func, flash_attn_varlen_func


def _split(name: str, packed: object, parts: int, ndim: int, layout: str) -> tuple[torch.Tensor, ...]:
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor {layout}, got {type(packed).__name__}")  # noqa: TRY004
    stack_dim = ndim - 3  # the dim holding q/k/v (or k/v), just before heads
    if packed.dim() != ndim or packed.shape[stack_dim] != parts:
        raise ValueError(
            f"{name}: expected {ndim} dims {layout} with {parts} at dim {stack_dim}, got shape "
            f"{tuple(packed.shape)}; stack with torch.stack(..., dim={stack_dim})"
        )
    return packed.unbind(dim=stack_dim)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> AttnOutput:
    """qkv (batch, seqlen, 3, heads, head_dim) -> out (batch, seqlen, heads, head_dim). The other
    arguments are flash_attn_func's after q, k, v (dropout_p, softmax_scale, causal, window_size,
    softcap, alibi_slopes, deterministic, return_attn_probs), positional or keyword."""
    q, k, v = _split("qkv", qkv, 3, 5, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(q, k, v, *args, **kwargs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, *args: Any, **kwargs: Any) -> AttnOutput:
    """q (batch, seqlen_q, heads, head_dim), kv (batch, seqlen_k, 2, heads_k, head_dim); the other
    arguments are flash_attn_func's after q, k, v."""
    k, v = _split("kv", kv, 2, 5, "(batch, seqlen_k, 2, heads_k, head_dim)")
    return flash_attn_func(q, k, v, *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: IntLike, *args: Any, **kwargs: Any
) -> AttnOutput:
    """qkv (total, 3, heads, head_dim), one cu_seqlens and max_seqlen for q and k; the other arguments
    are flash_attn_varlen_func's after max_seqlen_k (dropout_p, softmax_scale, causal, ...)."""
    q, k, v = _split("qkv", qkv, 3, 4, "(total_tokens, 3, heads, head_dim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args, **kwargs)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: IntLike,
    max_seqlen_k: IntLike,
    *args: Any,
    **kwargs: Any,
) -> AttnOutput:
    """q (total_q, heads, head_dim), kv (total_k, 2, heads_k, head_dim); the other arguments are
    flash_attn_varlen_func's after max_seqlen_k."""
    k, v = _split("kv", kv, 2, 4, "(total_tokens, 2, heads_k, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kwargs
    )
