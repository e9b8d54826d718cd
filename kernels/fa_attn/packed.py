"""flash-attn 2.x's packed variants: q, k, v (or k, v) stacked in one tensor.

Each splits its packed tensor into views (no copy) and calls flash_attn_func / flash_attn_varlen_func,
so it has their semantics, dispatch and errors; autograd writes the gradients of the views back into one
gradient of the packed tensor, as flash-attn's packed backward does.
"""

from __future__ import annotations

import torch

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


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv (batch, seqlen, 3, heads, head_dim) -> out (batch, seqlen, heads, head_dim); as flash_attn_func."""
    q, k, v = _split("qkv", qkv, 3, 5, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q (batch, seqlen_q, heads, head_dim), kv (batch, seqlen_k, 2, heads_k, head_dim); as flash_attn_func."""
    k, v = _split("kv", kv, 2, 5, "(batch, seqlen_k, 2, heads_k, head_dim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv (total, 3, heads, head_dim), one cu_seqlens and max_seqlen for q and k; as flash_attn_varlen_func."""
    q, k, v = _split("qkv", qkv, 3, 4, "(total_tokens, 3, heads, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q (total_q, heads, head_dim), kv (total_k, 2, heads_k, head_dim); as flash_attn_varlen_func."""
    k, v = _split("kv", kv, 2, 4, "(total_tokens, 2, heads_k, head_dim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip
