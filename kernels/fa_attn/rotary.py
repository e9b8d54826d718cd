"""Rotary position embedding (RoPE) in plain torch, with flash-attn's conventions.

`rotate` is what flash_attn_with_kvcache applies to q and the new k before the attention (kvcache.py);
`apply_rotary_emb` is flash-attn's public helper (flash_attn.layers.rotary) with its signature.

cos/sin are (seqlen_rotary, rotary_dim / 2); the first rotary_dim features of each head rotate, the rest
pass through. Non-interleaved (GPT-NeoX) pairs feature i with i + rotary_dim / 2; interleaved (GPT-J)
pairs 2i with 2i + 1. The rotation runs in fp32 (fp64 for fp64 inputs) and rounds once to x's dtype,
as flash-attn's kernels do.
"""

from __future__ import annotations

import torch

from .inputs import as_int


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


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """flash-attn's helper: x (batch, seqlen, heads, dim), or packed (total, heads, dim) with cu_seqlens;
    token t of a sequence uses row seqlen_offsets (+ its sequence's offset when a (batch,) tensor) + t.
    max_seqlen is accepted for flash-attn's signature and not needed here."""
    packed = cu_seqlens is not None
    if packed:
        assert cu_seqlens is not None
        starts = cu_seqlens[:-1].to(torch.long)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.long)
        seq_of = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), lengths)
        token = torch.arange(x.shape[0], device=x.device) - starts[seq_of]
        offsets = _offsets(seqlen_offsets, x.device, len(lengths))
        positions = (token + offsets[seq_of]).unsqueeze(0)  # (1, total)
        out = rotate(x.unsqueeze(0), cos, sin, positions, interleaved).squeeze(0)
    else:
        batch, seqlen = x.shape[0], x.shape[1]
        offsets = _offsets(seqlen_offsets, x.device, batch)
        positions = torch.arange(seqlen, device=x.device).unsqueeze(0) + offsets.unsqueeze(1)
        out = rotate(x, cos, sin, positions, interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out


def _offsets(seqlen_offsets: int | torch.Tensor, device: torch.device, batch: int) -> torch.Tensor:
    if isinstance(seqlen_offsets, torch.Tensor) and seqlen_offsets.dim() == 1:
        return seqlen_offsets.to(device=device, dtype=torch.long)
    return torch.full((batch,), as_int("seqlen_offsets", seqlen_offsets), dtype=torch.long, device=device)
