"""flash-attn's rotary position embedding helpers (flash_attn.layers.rotary) for the stand-in, in plain
torch with its signatures: `apply_rotary_emb`, `apply_rotary_emb_qkv_`, `apply_rotary_emb_kv_` and
`RotaryEmbedding`; the `_` forms rotate in place, as there. Every rotation is fa_attn.runtime.rope's
`rotate` (the one flash_attn_with_kvcache applies; its docstring says the conventions).
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.inputs import as_int
from ..runtime.rope import rotate


def _rotated(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    seqlen_offsets: int | torch.Tensor,
    cu_seqlens: torch.Tensor | None,
) -> torch.Tensor:
    """x (batch, seqlen, heads, dim), or packed (total, heads, dim) with cu_seqlens, rotated (a new tensor);
    token t of a sequence uses row seqlen_offsets (+ its sequence's offset when a (batch,) tensor) + t."""
    if cu_seqlens is not None:
        starts = cu_seqlens[:-1].to(torch.long)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.long)
        seq_of = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), lengths)
        token = torch.arange(x.shape[0], device=x.device) - starts[seq_of]
        offsets = _offsets(seqlen_offsets, x.device, len(lengths))
        positions = (token + offsets[seq_of]).unsqueeze(0)  # (1, total)
        return rotate(x.unsqueeze(0), cos, sin, positions, interleaved).squeeze(0)
    batch, seqlen = x.shape[0], x.shape[1]
    offsets = _offsets(seqlen_offsets, x.device, batch)
    positions = torch.arange(seqlen, device=x.device).unsqueeze(0) + offsets.unsqueeze(1)
    return rotate(x, cos, sin, positions, interleaved)


class _ApplyRotary(torch.autograd.Function):
    """flash-attn's ApplyRotaryEmb: the rotation (in place on x with inplace, which autograd allows inside
    a Function even for a leaf), and its transpose, the rotation by -sin, for the gradient. cos and sin
    get no gradient, as in flash-attn."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *options: Any
    ) -> torch.Tensor:
        """options: apply_rotary_emb's after sin (interleaved, inplace, seqlen_offsets, cu_seqlens,
        max_seqlen), as many as the caller passes; max_seqlen is not needed (cu_seqlens gives the lengths)."""
        interleaved, inplace, seqlen_offsets, cu_seqlens, _ = _with_defaults(
            options, (False, False, 0, None, None)
        )
        out = _rotated(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens)
        ctx.save_for_backward(cos, sin, cu_seqlens, *_tensor_offsets(seqlen_offsets))
        ctx.options = (interleaved, seqlen_offsets if isinstance(seqlen_offsets, int) else None)
        ctx.arguments = 3 + len(options)
        if inplace:
            return x.copy_(out)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin, cu_seqlens, *tensor_offsets = ctx.saved_tensors
        interleaved, int_offsets = ctx.options
        offsets = tensor_offsets[0] if tensor_offsets else int_offsets
        dx = _rotated(dout, cos, -sin, interleaved, offsets, cu_seqlens)
        return (dx, *_nones(ctx.arguments - 1))


def _nones(count: int) -> tuple[None, ...]:
    """No gradient for a Function's arguments after the first."""
    return (None,) * count


def _with_defaults(given: tuple[Any, ...], defaults: tuple[Any, ...]) -> tuple[Any, ...]:
    """A Function's optional arguments: those given, then the defaults of the rest."""
    return (*given, *defaults[len(given) :])


def _tensor_offsets(seqlen_offsets: int | torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (seqlen_offsets,) if isinstance(seqlen_offsets, torch.Tensor) else ()


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
    With inplace, x is rotated in place (also a leaf that requires grad, as flash-attn's autograd
    Function allows) and returned. max_seqlen is accepted for flash-attn's signature and not needed here."""
    if isinstance(seqlen_offsets, torch.Tensor) and seqlen_offsets.dim() == 0:
        seqlen_offsets = as_int("seqlen_offsets", seqlen_offsets)
    result: torch.Tensor = _ApplyRotary.apply(  # type: ignore[no-untyped-call]
        x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens
    )
    return result


def _offsets(seqlen_offsets: int | torch.Tensor, device: torch.device, batch: int) -> torch.Tensor:
    if isinstance(seqlen_offsets, torch.Tensor) and seqlen_offsets.dim() == 1:
        return seqlen_offsets.to(device=device, dtype=torch.long)
    return torch.full((batch,), as_int("seqlen_offsets", seqlen_offsets), dtype=torch.long, device=device)


def _q_and_k(qkv: torch.Tensor, num_heads_q: int | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The parts of a packed tensor that rotate: (q, k) of qkv (batch, seqlen, 3, heads, dim) or
    (batch, seqlen, num_heads_q + 2 * heads_k, dim); (None, k) of kv (batch, seqlen, 2, heads_k, dim),
    which num_heads_q=-1 names here."""
    if num_heads_q == -1:
        return None, qkv[:, :, 0]
    if qkv.dim() == 5:
        return qkv[:, :, 0], qkv[:, :, 1]
    if num_heads_q is None:
        raise ValueError("num_heads_q: required when qkv is (batch, seqlen, heads_q + 2 * heads_k, dim)")
    heads_k = (qkv.shape[2] - num_heads_q) // 2
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q : num_heads_q + heads_k]


class _ApplyRotaryPacked(torch.autograd.Function):
    """flash-attn's ApplyRotaryEmbQKV_ / ApplyRotaryEmbKV_: q (with cos/sin) and k (with cos_k/sin_k)
    of a packed tensor rotated in place; the gradient rotates the same parts of dout by -sin."""

    @staticmethod
    def forward(
        ctx: Any, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *options: Any
    ) -> torch.Tensor:
        """options: apply_rotary_emb_qkv_'s after sin (cos_k, sin_k, interleaved, seqlen_offsets,
        num_heads_q), as many as the caller passes (flash-attn's Function takes them with its defaults)."""
        cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q = _with_defaults(
            options, (None, None, False, 0, None)
        )
        cos_k = cos if cos_k is None else cos_k
        sin_k = sin if sin_k is None else sin_k
        _rotate_parts(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q)
        ctx.save_for_backward(cos, sin, cos_k, sin_k, *_tensor_offsets(seqlen_offsets))
        ctx.options = (interleaved, seqlen_offsets if isinstance(seqlen_offsets, int) else None, num_heads_q)
        ctx.arguments = 3 + len(options)
        return qkv

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin, cos_k, sin_k, *tensor_offsets = ctx.saved_tensors
        interleaved, int_offsets, num_heads_q = ctx.options
        offsets = tensor_offsets[0] if tensor_offsets else int_offsets
        dqkv = dout.clone()
        _rotate_parts(dqkv, cos, -sin, cos_k, -sin_k, interleaved, offsets, num_heads_q)
        return (dqkv, *_nones(ctx.arguments - 1))


def _rotate_parts(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: torch.Tensor,
    sin_k: torch.Tensor,
    interleaved: bool,
    offsets: int | torch.Tensor,
    num_heads_q: int | None,
) -> None:
    q, k = _q_and_k(qkv, num_heads_q)
    if q is not None:
        q.copy_(_rotated(q, cos, sin, interleaved, offsets, None))
    k.copy_(_rotated(k, cos_k, sin_k, interleaved, offsets, None))


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
    _q_and_k(qkv, num_heads_q)  # the layout's error before any work
    result: torch.Tensor = _ApplyRotaryPacked.apply(  # type: ignore[no-untyped-call]
        qkv, cos, sin, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, interleaved,
        seqlen_offsets, num_heads_q,
    )  # fmt: skip
    return result


class _ApplyRotaryKV(torch.autograd.Function):
    """flash-attn's ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets): k of kv rotated in
    place (_ApplyRotaryPacked with kv's layout)."""

    @staticmethod
    def forward(
        ctx: Any, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *options: Any
    ) -> torch.Tensor:
        """options: apply_rotary_emb_kv_'s after sin (interleaved, seqlen_offsets)."""
        interleaved, seqlen_offsets = _with_defaults(options, (False, 0))
        out = _ApplyRotaryPacked.forward(ctx, kv, cos, sin, cos, sin, interleaved, seqlen_offsets, -1)
        ctx.arguments = 3 + len(options)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads: tuple[torch.Tensor | None, ...] = _ApplyRotaryPacked.backward(ctx, dout)
        return grads


def apply_rotary_emb_kv_(
    kv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
) -> torch.Tensor:
    """kv (batch, seqlen, 2, heads_k, dim): k rotated in place; returns kv."""
    result: torch.Tensor = _ApplyRotaryKV.apply(kv, cos, sin, interleaved, seqlen_offsets)  # type: ignore[no-untyped-call]
    return result


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,  # noqa: ARG001 (flash-attn's signature; cu_seqlens gives the lengths)
    interleaved: bool = False,
    inplace: bool = False,
    conjugate: bool = False,
) -> torch.Tensor:
    """flash_attn.ops.triton.rotary.apply_rotary: the rotation alone (no autograd Function; callers such
    as ModernBERT wrap it in their own), by -sin with conjugate (the backward's); into x with inplace."""
    out = _rotated(x, cos, -sin if conjugate else sin, interleaved, seqlen_offsets, cu_seqlens)
    return x.copy_(out) if inplace else out


def rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """flash-attn's helper: (-x2, x1) of the halves, or of each (even, odd) pair when interleaved."""
    if not interleaved:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def apply_rotary_emb_torch(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """flash-attn's plain-torch rotary: x (batch, seqlen, heads, dim), cos/sin (seqlen, rotary_dim / 2) or
    (batch, seqlen, rotary_dim / 2), position t of each sequence at row t; in x's dtype, autograd through."""
    rotary_dim = cos.shape[-1] * 2
    if interleaved:
        cos, sin = (t.repeat_interleave(2, dim=-1).unsqueeze(-2) for t in (cos, sin))
    else:
        cos, sin = (torch.cat((t, t), dim=-1).unsqueeze(-2) for t in (cos, sin))
    rot = x[..., :rotary_dim]
    return torch.cat((rot * cos + rotate_half(rot, interleaved) * sin, x[..., rotary_dim:]), dim=-1)


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
        qkv = apply_rotary_emb(qkv, cos, sin, self.interleaved, True, seqlen_offset)
        assert cos_k is not None or not xpos
        kv = apply_rotary_emb_kv_(
            kv,
            cos if cos_k is None else cos_k,
            sin if sin_k is None else sin_k,
            self.interleaved,
            seqlen_offset,
        )
        return qkv, kv
