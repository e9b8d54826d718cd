"""Rotary position embedding (RoPE) in plain torch, with flash-attn's conventions.

`rotate` is what flash_attn_with_kvcache applies to q and the new k before the attention (kvcache.py);
`apply_rotary_emb`, `apply_rotary_emb_qkv_`, `apply_rotary_emb_kv_` and `RotaryEmbedding` are flash-attn's
public helpers (flash_attn.layers.rotary) with its signatures; the `_` forms rotate in place, as there.

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
    max_seqlen: int | None = None,  # noqa: ARG001 (flash-attn's signature; the lengths come from cu_seqlens)
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


def _rotate_into(
    part: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, offsets: int | torch.Tensor
) -> None:
    part.copy_(apply_rotary_emb(part, cos, sin, interleaved, False, offsets))


def apply_rotary_emb_qkv_(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: torch.Tensor | None = None,
    sin_k: torch.Tensor | None = None,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    num_heads_q: int | None = None,
) -> torch.Tensor:
    """qkv (batch, seqlen, 3, heads, dim), or (batch, seqlen, num_heads_q + 2 * heads_k, dim) with
    num_heads_q: q and k rotated in place (k with cos_k/sin_k when given); returns qkv."""
    if qkv.dim() == 5:
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    else:
        if num_heads_q is None:
            raise ValueError("num_heads_q: required when qkv is (batch, seqlen, heads_q + 2 * heads_k, dim)")
        heads_k = (qkv.shape[2] - num_heads_q) // 2
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q : num_heads_q + heads_k]
    _rotate_into(q, cos, sin, interleaved, seqlen_offsets)
    _rotate_into(
        k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, interleaved, seqlen_offsets
    )
    return qkv


def apply_rotary_emb_kv_(
    kv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
) -> torch.Tensor:
    """kv (batch, seqlen, 2, heads_k, dim): k rotated in place; returns kv."""
    _rotate_into(kv[:, :, 0], cos, sin, interleaved, seqlen_offsets)
    return kv


class RotaryEmbedding(torch.nn.Module):
    """flash-attn's rotary module: inv_freq = 1 / base^(2i / dim); with scale_base, XPos (queries scaled
    up and keys down by the same power of a per-frequency scale). forward(qkv, kv=None, seqlen_offset=0,
    max_seqlen=None, num_heads_q=None) rotates qkv in place (or q = qkv and kv), as flash-attn's."""

    inv_freq: torch.Tensor
    scale: torch.Tensor | None

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        scale_base: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.base = float(base)
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        self.interleaved = interleaved
        self.scale_base = scale_base
        scale = (
            (torch.arange(0, dim, 2, device=device, dtype=torch.float32) + 0.4 * dim) / (1.4 * dim)
            if scale_base is not None
            else None
        )
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached: torch.Tensor | None = None
        self._sin_cached: torch.Tensor | None = None
        self._cos_k_cached: torch.Tensor | None = None
        self._sin_k_cached: torch.Tensor | None = None

    def _compute_inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor:
        return 1.0 / (
            self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)
        )

    def _update_cos_sin_cache(self, seqlen: int, device: torch.device | None, dtype: torch.dtype) -> None:
        cached = self._cos_cached
        if (
            cached is not None
            and seqlen <= self._seq_len_cached
            and cached.device == device
            and cached.dtype == dtype
            and not (self.training and cached.is_inference())
        ):
            return
        self._seq_len_cached = seqlen
        t = torch.arange(seqlen, device=device, dtype=torch.float32)
        inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._compute_inv_freq(device)
        freqs = torch.outer(t, inv_freq)  # fp32: positions times frequencies lose precision in bf16
        if self.scale is None:
            self._cos_cached, self._sin_cached = torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)
            return
        assert self.scale_base is not None  # scale exists only with scale_base
        power = torch.arange(seqlen, dtype=self.scale.dtype, device=self.scale.device) - seqlen // 2
        scale = self.scale.to(device=power.device) ** (power / self.scale_base).unsqueeze(1)
        self._cos_cached = (torch.cos(freqs) * scale).to(dtype)
        self._sin_cached = (torch.sin(freqs) * scale).to(dtype)
        self._cos_k_cached = (torch.cos(freqs) / scale).to(dtype)
        self._sin_k_cached = (torch.sin(freqs) / scale).to(dtype)

    def forward(
        self,
        qkv: torch.Tensor,
        kv: torch.Tensor | None = None,
        seqlen_offset: int | torch.Tensor = 0,
        max_seqlen: int | None = None,
        num_heads_q: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, qkv.device, qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, qkv.device, qkv.dtype)
        cos, sin = self._cos_cached, self._sin_cached
        assert cos is not None, "a tensor seqlen_offset needs max_seqlen (flash-attn's rule)"
        assert sin is not None
        xpos = self.scale is not None
        cos_k = self._cos_k_cached if xpos else None
        sin_k = self._sin_k_cached if xpos else None
        if kv is None:
            return apply_rotary_emb_qkv_(
                qkv, cos, sin, cos_k, sin_k, self.interleaved, seqlen_offset, num_heads_q
            )
        _rotate_into(qkv, cos, sin, self.interleaved, seqlen_offset)
        assert cos_k is not None or not xpos
        kv = apply_rotary_emb_kv_(
            kv,
            cos if cos_k is None else cos_k,
            sin if sin_k is None else sin_k,
            self.interleaved,
            seqlen_offset,
        )
        return qkv, kv
