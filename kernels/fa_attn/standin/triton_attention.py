"""flash-attn's older Triton attention (flash_attn.flash_attn_triton) for the stand-in: its three
functions with their own signatures, which differ from flash_attn_func's:

  flash_attn_func(q, k, v, bias=None, causal=False, softmax_scale=None)
  flash_attn_kvpacked_func(q, kv, bias=None, causal=False, softmax_scale=None)
  flash_attn_qkvpacked_func(qkv, bias=None, causal=False, softmax_scale=None)

out = softmax(q k^T * scale + bias + causal mask) v per (batch, head), q (batch, seqlen_q, heads, dim),
k and v (batch, seqlen_k, heads, dim) (no grouped heads: the Triton version has none), scale
`softmax_scale or 1/sqrt(dim)`, bias broadcastable to (batch, heads, seqlen_q, seqlen_k) with last two
dims (1, seqlen_k) or (seqlen_q, seqlen_k), and the causal mask aligned top-left (query i sees keys
j <= i), as this Triton kernel aligns it (flash_attn_func's CUDA kernels align it bottom-right).
Computed with torch's SDPA (a float mask) in the inputs' dtype; gradients for q, k, v and, where
flash-attn asserts it has none, for the bias too. fp32/fp64 and CPU tensors are accepted (flash-attn's
needs fp16/bf16 on CUDA); head dims up to 128 as flash-attn's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..runtime.inputs import InputError

Tensor = torch.Tensor


def _mask(q: Tensor, k: Tensor, bias: Tensor | None, causal: bool) -> Tensor | None:
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    mask = None
    if bias is not None:
        if bias.dim() != 4 or tuple(bias.shape[2:]) not in ((1, seqlen_k), (seqlen_q, seqlen_k)):
            raise InputError(
                f"bias: shape {tuple(bias.shape)}; the last 2 dimensions of bias must be (1, seqlen_k) or "
                f"(seqlen_q, seqlen_k) = (1, {seqlen_k}) or ({seqlen_q}, {seqlen_k}), in 4 dimensions"
            )
        mask = bias.to(q.dtype)
    if causal:
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        blocked = torch.zeros(seqlen_q, seqlen_k, dtype=q.dtype, device=q.device)
        blocked = blocked.masked_fill(cols > rows, float("-inf"))
        mask = blocked if mask is None else mask + blocked
    return mask


def _attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool, scale: float | None
) -> Tensor:
    if q.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise InputError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: flash_attn_triton takes q (batch, "
            "seqlen_q, nheads, headdim) and k, v (batch, seqlen_k, nheads, headdim), the same heads"
        )
    if q.shape[-1] > 128:
        raise InputError(f"headdim: {q.shape[-1]}; flash_attn_triton supports head dimensions up to 128")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v dtypes {q.dtype}, {k.dtype}, {v.dtype}: they must be the same")
    scale = scale or 1.0 / math.sqrt(q.shape[-1])  # flash-attn's rule: 0 or None mean the default
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=_mask(q, k, bias, causal), scale=scale,
    )  # fmt: skip
    return out.transpose(1, 2)


def flash_attn_func(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
    softmax_scale: float | None = None,
) -> Tensor:  # fmt: skip
    return _attention(q, k, v, bias, causal, softmax_scale)


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    bias: Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> Tensor:
    return _attention(q, kv[:, :, 0], kv[:, :, 1], bias, causal, softmax_scale)


def flash_attn_qkvpacked_func(
    qkv: Tensor, bias: Tensor | None = None, causal: bool = False, softmax_scale: float | None = None
) -> Tensor:
    return _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], bias, causal, softmax_scale)


NAMES = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func")
