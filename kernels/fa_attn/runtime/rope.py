"""Rotary position embedding (RoPE) at given positions, with flash-attn's conventions: what
flash_attn_with_kvcache applies to q and the new k before the attention (kvcache.py), and what the
stand-in's flash_attn.layers.rotary helpers (fa_attn/standin/rotary.py) build on.

cos/sin are (seqlen_rotary, rotary_dim / 2); the first rotary_dim features of each head rotate, the rest
pass through. Non-interleaved (GPT-NeoX) pairs feature i with i + rotary_dim / 2; interleaved (GPT-J)
pairs 2i with 2i + 1. The rotation runs in fp32 (fp64 for fp64 inputs) and rounds once to x's dtype,
as flash-attn's kernels do.
"""

from __future__ import annotations

import torch


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """x (batch, seqlen, heads, dim) rotated at positions (batch, seqlen) (rows of cos/sin); a new tensor."""
    half = cos.shape[-1]
    if half == 0 or x.numel() == 0:
        return x
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = cos.to(compute)[positions].unsqueeze(2)  # (b, s, 1, half)
    s = sin.to(compute)[positions].unsqueeze(2)
    rot = x[..., : 2 * half].to(compute)
    if interleaved:
        even, odd = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)
    else:
        first, second = rot[..., :half], rot[..., half:]
        rotated = torch.cat((first * c - second * s, second * c + first * s), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half :]), dim=-1)
