"""flash-attn's attention module (flash_attn.modules.mha) for the stand-in, in plain torch around fa_attn's
functions: `MHA` with flash-attn 2.8.3's constructor, parameters and state_dict names (Wqkv, or Wq and Wkv
with cross_attn; out_proj; dwconv_*), so its checkpoints load with strict=True; the inner modules
(`FlashSelfAttention`, `FlashCrossAttention`, `SelfAttention`, `CrossAttention`), `get_alibi_slopes`,
and `InferenceParams` (flash_attn.utils.generation's: the KV cache state MHA's decode reads).

Every attention goes through fa_attn's public functions (the kernels, or the fallback with its reason),
whatever `use_flash_attn` says: flash-attn's use_flash_attn=False path is eager torch, and fa has one
attention. So ALiBi (use_alibi), window_size, cu_seqlens and key_padding_mask are served with either value.

Where fa's MHA differs from flash-attn 2.8.3's, on purpose:
  - key_padding_mask in self-attention: queries and keys are the unmasked tokens, packed (bert_padding)
    and run as varlen; with causal, query i sees the unmasked keys j <= i (flash-attn's eager path, for
    equal head counts); outputs at masked positions are zeros. flash-attn's GQA eager path shifts its
    causal mask by the padding instead. Cross-attention masks the keys only (flash-attn's semantics).
  - rotary with cu_seqlens (packed input) rotates each sequence from position 0 (flash-attn refuses it).
  - decoding with inference_params also honours window_size (flash-attn drops it there, so a sliding
    window model decodes as full attention), and slices the cache at batch_size_offset throughout.
  - dwconv works for self-attention with MQA/GQA too (flash-attn's fails there); with cross_attn it is
    refused at construction (flash-attn builds it and fails in forward).
  - fused_bias_fc is accepted and has no effect, as in flash-attn 2.8.3 (which never reads it).
`ParallelMHA` is MHA with its heads sharded over a process group (tensor_parallel.py's
ColumnParallelLinear Wqkv, each rank's [q, k, v] rows of its heads, and RowParallelLinear out_proj),
flash-attn's forward(x, seqlen=None, inference_params=None): with seqlen, x is (batch * seqlen, dim)
rows (this rank's share under sequence_parallel, gathered before the projection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..runtime.inputs import InputError
from ..runtime.kvcache import flash_attn_with_kvcache
from ..runtime.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .bert_padding import pad_input, unpad_input
from .rotary import RotaryEmbedding, apply_rotary_emb

Tensor = torch.Tensor

# What the stand-in's flash_attn.modules.mha gives (_standin._exports): flash-attn's module's names, with
# the packed functions and RotaryEmbedding it imports, because real code imports them from there
# (nanotron: flash_attn_varlen_kvpacked_func). InferenceParams is flash_attn.utils.generation's.
__all__ = [
    "MHA",
    "CrossAttention",
    "FlashCrossAttention",
    "FlashSelfAttention",
    "ParallelMHA",
    "RotaryEmbedding",
    "SelfAttention",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "get_alibi_slopes",
]


def get_alibi_slopes(nheads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.): for n a power of two, 2^(-8/n) to the powers 1..n; else
    those of the largest power of two below n, then every other slope of twice that power."""

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 2 ** math.floor(math.log2(nheads))
    if low == nheads:
        return geometric(nheads)
    return geometric(low) + geometric(2 * low)[0::2][: nheads - low]


@dataclass
class InferenceParams:
    """flash-attn's decode state (flash_attn.utils.generation): the caller advances seqlen_offset (and
    lengths_per_sample, per sequence) between steps; each MHA keeps its cache in key_value_memory_dict
    under its layer_idx."""

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict[Any, Tensor] = field(default_factory=dict)
    lengths_per_sample: Tensor | None = None

    def reset(self, max_seqlen: int, max_batch_size: int) -> None:
        self.max_seqlen = max_seqlen
        self.max_batch_size = max_batch_size
        self.seqlen_offset = 0
        if self.lengths_per_sample is not None:
            self.lengths_per_sample.zero_()


def _tensor(out: object) -> Tensor:
    assert isinstance(out, Tensor)  # return_attn_probs is never asked for here
    return out


class _Attention(nn.Module):
    """What the inner modules hold (flash-attn's attributes: causal, softmax_scale, drop, alibi_slopes
    as a buffer outside the state_dict, window_size, deterministic) and the options of one call."""

    alibi_slopes: Tensor | None

    def __init__(
        self,
        causal: bool,
        softmax_scale: float | None,
        attention_dropout: float,
        window_size: Sequence[int] = (-1, -1),
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.drop = nn.Dropout(attention_dropout)
        self.register_buffer("alibi_slopes", alibi_slopes, persistent=False)
        self.window_size = window_size
        self.deterministic = deterministic

    def _options(self, causal: bool | None) -> dict[str, Any]:
        slopes = self.alibi_slopes
        return {
            "dropout_p": self.drop.p if self.training else 0.0,
            "softmax_scale": self.softmax_scale,
            "causal": self.causal if causal is None else causal,
            "window_size": self.window_size,
            "alibi_slopes": slopes.float() if slopes is not None else None,
            "deterministic": self.deterministic,
        }

    def _cross(
        self,
        q: Tensor,
        kv: Tensor,
        causal: bool | None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
        cu_seqlens_k: Tensor | None = None,
        max_seqlen_k: int | None = None,
    ) -> Tensor:
        options = self._options(causal)
        if cu_seqlens is None:
            return _tensor(flash_attn_kvpacked_func(q, kv, **options))
        if max_seqlen is None or cu_seqlens_k is None or max_seqlen_k is None:
            raise InputError(
                "cu_seqlens: packed cross-attention also needs max_seqlen, cu_seqlens_k and max_seqlen_k "
                "(the keys' own offsets and bound); pass all four"
            )
        return _tensor(
            flash_attn_varlen_kvpacked_func(
                q, kv, cu_seqlens, cu_seqlens_k, max_seqlen, max_seqlen_k, **options
            )
        )


class FlashSelfAttention(_Attention):
    """flash-attn's: forward(qkv (batch, seqlen, 3, heads, head_dim), or (total, 3, heads, head_dim) with
    cu_seqlens and max_seqlen) -> (batch, seqlen, heads, head_dim) or (total, heads, head_dim)."""

    def __init__(
        self,
        causal: bool = False,
        softmax_scale: float | None = None,
        attention_dropout: float = 0.0,
        window_size: Sequence[int] = (-1, -1),
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__(causal, softmax_scale, attention_dropout, window_size, alibi_slopes, deterministic)

    def forward(
        self,
        qkv: Tensor,
        causal: bool | None = None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> Tensor:
        options = self._options(causal)
        if cu_seqlens is None:
            return _tensor(flash_attn_qkvpacked_func(qkv, **options))
        if max_seqlen is None:
            raise InputError("max_seqlen: required with cu_seqlens (the longest sequence's length, an int)")
        return _tensor(flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, **options))


class FlashCrossAttention(_Attention):
    """flash-attn's: forward(q (batch, seqlen_q, heads, head_dim), kv (batch, seqlen_k, 2, heads_k,
    head_dim)), or packed rows with cu_seqlens, max_seqlen, cu_seqlens_k and max_seqlen_k."""

    def __init__(
        self,
        causal: bool = False,
        softmax_scale: float | None = None,
        attention_dropout: float = 0.0,
        alibi_slopes: Tensor | None = None,
        window_size: Sequence[int] = (-1, -1),
        deterministic: bool = False,
    ) -> None:
        super().__init__(causal, softmax_scale, attention_dropout, window_size, alibi_slopes, deterministic)

    def forward(
        self,
        q: Tensor,
        kv: Tensor,
        causal: bool | None = None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
        cu_seqlens_k: Tensor | None = None,
        max_seqlen_k: int | None = None,
    ) -> Tensor:
        return self._cross(q, kv, causal, cu_seqlens, max_seqlen, cu_seqlens_k, max_seqlen_k)


def _masked_self(attend: Callable[..., Tensor], q: Tensor, kv: Tensor, mask: Tensor) -> Tensor:
    """Self-attention among the tokens mask keeps: q and kv packed by the same mask (so with causal,
    query i sees the kept keys j <= i), zeros at the masked positions."""
    batch, seqlen = q.shape[:2]
    q_rows, indices, cu_seqlens, max_seqlen, _ = unpad_input(q, mask)
    kv_rows = kv.flatten(0, 1)[indices]
    varlen = {
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "cu_seqlens_k": cu_seqlens,
        "max_seqlen_k": max_seqlen,
    }
    out = attend(q_rows, kv_rows, varlen)
    return pad_input(out, indices, batch, seqlen)


def _masked_keys(attend: Callable[..., Tensor], q: Tensor, kv: Tensor, mask: Tensor) -> Tensor:
    """Every query over the keys mask keeps (cross-attention): kv packed by the mask, q as whole rows;
    with causal, bottom-right aligned to each sequence's kept keys (flash-attn's CrossAttention)."""
    batch, seqlen_q = q.shape[:2]
    kv_rows, _, cu_seqlens_k, max_seqlen_k, _ = unpad_input(kv, mask)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * seqlen_q
    varlen = {
        "cu_seqlens": cu_seqlens_q,
        "max_seqlen": seqlen_q,
        "cu_seqlens_k": cu_seqlens_k,
        "max_seqlen_k": max_seqlen_k,
    }
    out: Tensor = attend(q.flatten(0, 1), kv_rows, varlen)
    return out.reshape(batch, seqlen_q, *out.shape[1:])


def _check_mask(mask: Tensor, kv: Tensor) -> None:
    if mask.dim() != 2 or tuple(mask.shape) != tuple(kv.shape[:2]):
        raise InputError(
            f"key_padding_mask: expected shape (batch, seqlen_k) = {tuple(kv.shape[:2])}, got "
            f"{tuple(mask.shape)} (True keeps a token, False masks it)"
        )


class SelfAttention(_Attention):
    """flash-attn's eager module, here on fa_attn's functions: forward(qkv, causal=None,
    key_padding_mask=None (batch, seqlen), True = keep); masked positions give zeros (module docstring)."""

    def __init__(
        self, causal: bool = False, softmax_scale: float | None = None, attention_dropout: float = 0.0
    ):
        super().__init__(causal, softmax_scale, attention_dropout)

    def forward(
        self, qkv: Tensor, causal: bool | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        if key_padding_mask is None:
            return _tensor(flash_attn_qkvpacked_func(qkv, **self._options(causal)))
        _check_mask(key_padding_mask, qkv)
        return _masked_self(
            lambda q, kv, varlen: self._cross(q, kv, causal, **varlen),
            qkv[:, :, 0],
            qkv[:, :, 1:],
            key_padding_mask,
        )


class CrossAttention(_Attention):
    """flash-attn's eager module, here on fa_attn's functions: forward(q, kv, causal=None,
    key_padding_mask=None (batch, seqlen_k), True = keep)."""

    def __init__(
        self, causal: bool = False, softmax_scale: float | None = None, attention_dropout: float = 0.0
    ):
        super().__init__(causal, softmax_scale, attention_dropout)

    def forward(
        self, q: Tensor, kv: Tensor, causal: bool | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        if key_padding_mask is None:
            return self._cross(q, kv, causal)
        _check_mask(key_padding_mask, kv)
        return _masked_keys(
            lambda q, kv, varlen: self._cross(q, kv, causal, **varlen), q, kv, key_padding_mask
        )


def _causal_conv(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """flash-attn's dwconv: a depthwise convolution of width 3 over the sequence, padded by 2 on each
    side and cut to the first seqlen outputs, so position t mixes t-2..t only."""
    out: Tensor = conv(x.transpose(1, 2))
    return out[..., :-2].transpose(1, 2).contiguous()


class MHA(nn.Module):
    """flash-attn's multi-head self- and cross-attention: projections, optional rotary, attention on
    fa_attn's functions, output projection (module docstring: what differs from flash-attn 2.8.3)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_heads_kv: int | None = None,
        cross_attn: bool = False,
        qkv_proj_bias: bool = True,
        out_proj_bias: bool = True,
        dropout: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        layer_idx: int | None = None,
        dwconv: bool = False,
        rotary_emb_dim: int = 0,
        rotary_emb_base: float = 10000.0,
        rotary_emb_scale_base: float | None = None,
        rotary_emb_interleaved: bool = False,
        use_alibi: bool = False,
        window_size: Sequence[int] = (-1, -1),
        fused_bias_fc: bool = False,  # noqa: ARG002 (flash-attn 2.8.3 takes it and never reads it; so does fa)
        use_flash_attn: bool = False,
        return_residual: bool = False,
        checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        heads_kv = num_heads if num_heads_kv is None else num_heads_kv
        if num_heads <= 0 or heads_kv <= 0 or num_heads % heads_kv:
            raise InputError(f"num_heads_kv: {heads_kv} must divide num_heads {num_heads} (MQA/GQA groups)")
        if embed_dim % num_heads:
            raise InputError(
                f"num_heads: {num_heads} must divide embed_dim {embed_dim} (head_dim = their ratio)"
            )
        if rotary_emb_dim > 0 and cross_attn:
            raise InputError(
                "rotary_emb_dim: rotary embedding with cross_attn=True is not supported (nor in flash-attn's "
                "MHA: queries and keys come from different sequences); rotate x and x_kv before the call"
            )
        if dwconv and cross_attn:
            raise InputError(
                "dwconv: not supported with cross_attn=True (flash-attn's MHA builds it and fails in forward); "
                "pass dwconv=False, or convolve x and x_kv before the call"
            )
        self.embed_dim = embed_dim
        self.cross_attn = cross_attn
        self.causal = causal
        self.layer_idx = layer_idx
        self.dwconv = dwconv
        self.rotary_emb_dim = rotary_emb_dim
        self.use_flash_attn = use_flash_attn
        self.return_residual = return_residual
        self.checkpointing = checkpointing
        self.num_heads = num_heads
        self.num_heads_kv = heads_kv
        self.head_dim = embed_dim // num_heads
        qkv_dim = self.head_dim * (num_heads + 2 * heads_kv)
        kv_dim = 2 * self.head_dim * heads_kv
        if rotary_emb_dim > 0:
            self.rotary_emb = RotaryEmbedding(
                rotary_emb_dim,
                base=rotary_emb_base,
                scale_base=rotary_emb_scale_base,
                interleaved=rotary_emb_interleaved,
                device=device,
            )
        if cross_attn:
            self.Wq = nn.Linear(embed_dim, embed_dim, bias=qkv_proj_bias, **factory)
            self.Wkv = nn.Linear(embed_dim, kv_dim, bias=qkv_proj_bias, **factory)
        else:
            self.Wqkv = nn.Linear(embed_dim, qkv_dim, bias=qkv_proj_bias, **factory)
        if dwconv:
            if heads_kv == num_heads:
                self.dwconv_qkv = nn.Conv1d(
                    qkv_dim, qkv_dim, 3, padding=2, groups=qkv_dim, device=device, dtype=dtype
                )
            else:
                self.dwconv_q = nn.Conv1d(
                    embed_dim, embed_dim, 3, padding=2, groups=embed_dim, device=device, dtype=dtype
                )
                self.dwconv_kv = nn.Conv1d(
                    kv_dim, kv_dim, 3, padding=2, groups=kv_dim, device=device, dtype=dtype
                )
        slopes = torch.tensor(get_alibi_slopes(num_heads), device=device) if use_alibi else None
        self.inner_attn = FlashSelfAttention(causal, softmax_scale, dropout, window_size, slopes)
        self.inner_cross_attn = FlashCrossAttention(causal, softmax_scale, dropout, slopes, window_size)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias, **factory)

    def allocate_inference_cache(
        self, batch_size: int, max_seqlen: int, dtype: torch.dtype | None = None
    ) -> Tensor:
        """An empty KV cache (batch_size, max_seqlen, 2, num_heads_kv, head_dim) for key_value_memory_dict."""
        weight = self.out_proj.weight
        return torch.empty(
            batch_size,
            max_seqlen,
            2,
            self.num_heads_kv,
            self.head_dim,
            dtype=dtype or weight.dtype,
            device=weight.device,
        )

    def forward(
        self,
        x: Tensor,
        x_kv: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
        mixer_subset: Any = None,
        inference_params: Any = None,
        **kwargs: Any,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (batch, seqlen, embed_dim), or (total, embed_dim) with cu_seqlens and max_seqlen; x_kv and
        mixer_subset with cross_attn; key_padding_mask (batch, seqlen_k), True = keep; inference_params
        to decode over a KV cache. kwargs go to the inner attention (causal=, and cu_seqlens_k= and
        max_seqlen_k= for packed cross-attention). Returns out, or (out, x) with return_residual."""
        self._check_call(key_padding_mask, cu_seqlens, max_seqlen, inference_params)
        q, kv, qkv = self._project(x, x_kv, mixer_subset)
        if inference_params is not None:
            context = self._decode(q, kv, inference_params)
        else:
            if self.rotary_emb_dim > 0:
                q, kv, qkv = self._rotate(q, kv, qkv, cu_seqlens, max_seqlen)
            context = self._attend(q, kv, qkv, key_padding_mask, cu_seqlens, max_seqlen, kwargs)
        out = self.out_proj(context.flatten(-2))
        return (out, x) if self.return_residual else out

    def _check_call(
        self, key_padding_mask: Tensor | None, cu_seqlens: Tensor | None, max_seqlen: int | None, params: Any
    ) -> None:
        packed = cu_seqlens is not None or max_seqlen is not None
        if packed and (cu_seqlens is None or max_seqlen is None):
            raise InputError(
                "cu_seqlens, max_seqlen: packed input (total, embed_dim) needs both; pass both or neither"
            )
        if packed and key_padding_mask is not None:
            raise InputError(
                "key_padding_mask: not with cu_seqlens (packed input has no padding); pass one of them"
            )
        if packed and self.dwconv:
            raise InputError(
                "cu_seqlens: dwconv convolves along padded (batch, seqlen) rows (as flash-attn's MHA); pass "
                "padded x with key_padding_mask instead"
            )
        if params is None:
            return
        if packed or key_padding_mask is not None:
            raise InputError(
                "inference_params: decoding takes padded x (batch, seqlen, embed_dim) without cu_seqlens or "
                "key_padding_mask (as flash-attn's MHA); give per-sequence lengths in lengths_per_sample"
            )
        if self.dwconv:
            raise InputError(
                "inference_params: decoding with dwconv is not supported (nor in flash-attn's MHA: the "
                "convolution needs the previous tokens' projections, which the KV cache does not keep)"
            )
        if self.layer_idx is None:
            raise InputError(
                "layer_idx: decoding with inference_params needs MHA(..., layer_idx=n) (its cache key)"
            )

    def _project(
        self, x: Tensor, x_kv: Tensor | None, mixer_subset: Any
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """q (..., heads, head_dim), kv (..., 2, heads_kv, head_dim), and for self-attention with equal
        head counts qkv (..., 3, heads, head_dim), of which q and kv are views."""
        h, hkv, d = self.num_heads, self.num_heads_kv, self.head_dim
        if self.cross_attn:
            q = self.Wq(x if mixer_subset is None else x[:, mixer_subset])
            kv = self.Wkv(x if x_kv is None else x_kv)
            return q.unflatten(-1, (h, d)), kv.unflatten(-1, (2, hkv, d)), None
        if x_kv is not None or mixer_subset is not None:
            raise InputError("x_kv, mixer_subset: only with cross_attn=True; for self-attention pass x alone")
        return self._split(self.Wqkv(x))

    def _split(self, projected: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """A self-attention projection (..., heads * head_dim + 2 * heads_kv * head_dim) -> q, kv, qkv."""
        h, hkv, d = self.num_heads, self.num_heads_kv, self.head_dim
        if h == hkv:
            if self.dwconv:
                projected = _causal_conv(self.dwconv_qkv, projected)
            qkv = projected.unflatten(-1, (3, h, d))
            return qkv[..., 0, :, :], qkv[..., 1:, :, :], qkv
        # slices, not split(): rotary changes q and k in place, which split's outputs forbid
        q, kv = projected[..., : h * d], projected[..., h * d :]
        if self.dwconv:
            q, kv = _causal_conv(self.dwconv_q, q), _causal_conv(self.dwconv_kv, kv)
        return q.unflatten(-1, (h, d)), kv.unflatten(-1, (2, hkv, d)), None

    def _rotate(
        self, q: Tensor, kv: Tensor, qkv: Tensor | None, cu_seqlens: Tensor | None, max_seqlen: int | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """q, kv (and qkv) with rotary on q and k, from position 0 of each sequence (packed: of each
        cu_seqlens span). The rotations are autograd Functions (rotary.py): use the tensors returned."""
        if cu_seqlens is None and qkv is not None:
            qkv = self.rotary_emb(qkv)
            return qkv[..., 0, :, :], qkv[..., 1:, :, :], qkv
        # q and kv may be views of one projection: rotate out of place, so neither rotation writes
        # into the other's base (autograd forbids that for a Function's outputs).
        if cu_seqlens is None:
            max_seqlen = q.shape[1]
        assert max_seqlen is not None
        rotary = self.rotary_emb
        rotary._update_cos_sin_cache(max_seqlen, q.device, q.dtype)
        cos, sin = rotary._cos_cached, rotary._sin_cached
        assert cos is not None
        assert sin is not None
        xpos = rotary.scale is not None
        cos_k = rotary._cos_k_cached if xpos else cos
        sin_k = rotary._sin_k_cached if xpos else sin
        assert cos_k is not None
        assert sin_k is not None
        q = apply_rotary_emb(q, cos, sin, rotary.interleaved, False, 0, cu_seqlens, max_seqlen)
        k = apply_rotary_emb(
            kv.select(-3, 0), cos_k, sin_k, rotary.interleaved, False, 0, cu_seqlens, max_seqlen
        )
        kv = torch.stack((k, kv.select(-3, 1)), dim=-3)
        return q, kv, None if qkv is None else torch.cat((q.unsqueeze(-3), kv), dim=-3)

    def _run(self, module: nn.Module, *tensors: Tensor, **options: Any) -> Tensor:
        if self.checkpointing:  # recompute the attention in backward instead of keeping its activations
            out = checkpoint(module, *tensors, use_reentrant=False, **options)
        else:
            out = module(*tensors, **options)
        return _tensor(out)

    def _attend(
        self,
        q: Tensor,
        kv: Tensor,
        qkv: Tensor | None,
        key_padding_mask: Tensor | None,
        cu_seqlens: Tensor | None,
        max_seqlen: int | None,
        kwargs: dict[str, Any],
    ) -> Tensor:
        if key_padding_mask is not None:
            _check_mask(key_padding_mask, kv)
            causal = kwargs.pop("causal", None)
            if kwargs:
                raise InputError(f"{', '.join(kwargs)}: not taken with key_padding_mask (only causal=)")

            def attend(q: Tensor, kv: Tensor, varlen: dict[str, Any]) -> Tensor:
                return self._run(self.inner_cross_attn, q, kv, causal=causal, **varlen)

            masked = _masked_keys if self.cross_attn else _masked_self
            return masked(attend, q, kv, key_padding_mask)
        if qkv is not None:
            return self._run(self.inner_attn, qkv, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, **kwargs)
        if cu_seqlens is not None and not self.cross_attn:  # self-attention: the keys are the queries' tokens
            kwargs = {"cu_seqlens_k": cu_seqlens, "max_seqlen_k": max_seqlen, **kwargs}
        return self._run(self.inner_cross_attn, q, kv, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, **kwargs)

    def _decode(self, q: Tensor, kv: Tensor, params: Any) -> Tensor:
        """One step of generation: the first (seqlen_offset 0) writes the prompt's keys and values into
        the cache and attends over them; later ones go through flash_attn_with_kvcache, which appends
        the new keys and values in place and attends over the cache (rotating q and k, unless XPos)."""
        batch, seqlen = q.shape[:2]
        first = params.batch_size_offset
        lengths = params.lengths_per_sample
        if lengths is not None:
            lengths = lengths[first : first + batch]
        cache = self._cache(params, kv)[first : first + batch]
        inner = self.inner_cross_attn
        rotary = self.rotary_emb if self.rotary_emb_dim > 0 else None
        fused_rotary = rotary is not None and rotary.scale is None and params.seqlen_offset > 0
        if rotary is not None and not fused_rotary:
            offset = lengths if lengths is not None else params.seqlen_offset
            rotary(q, kv, seqlen_offset=offset, max_seqlen=params.max_seqlen)
        if params.seqlen_offset == 0:
            if seqlen > cache.shape[1]:
                raise InputError(
                    f"inference_params.max_seqlen: {cache.shape[1]} cache rows, fewer than the prompt's {seqlen}"
                )
            cache[:, :seqlen] = kv
            return _tensor(inner(q, cache[:, :seqlen]))
        rotary_cos = rotary_sin = None
        if fused_rotary:
            assert rotary is not None
            rotary._update_cos_sin_cache(params.max_seqlen, q.device, q.dtype)
            rotary_cos, rotary_sin = rotary._cos_cached, rotary._sin_cached
        options = inner._options(None)
        return _tensor(
            flash_attn_with_kvcache(
                q,
                cache[:, :, 0],
                cache[:, :, 1],
                kv[:, :, 0],
                kv[:, :, 1],
                rotary_cos=rotary_cos,
                rotary_sin=rotary_sin,
                cache_seqlens=lengths if lengths is not None else params.seqlen_offset,
                softmax_scale=options["softmax_scale"],
                causal=options["causal"],
                window_size=options["window_size"],
                rotary_interleaved=rotary.interleaved if rotary is not None else False,
                alibi_slopes=options["alibi_slopes"],
            )
        )

    def _cache(self, params: Any, kv: Tensor) -> Tensor:
        """This layer's cache in params.key_value_memory_dict, allocated on first use as flash-attn does:
        (max_batch_size, max_seqlen, 2, num_heads_kv, head_dim) in kv's dtype."""
        cache: Tensor | None = params.key_value_memory_dict.get(self.layer_idx)
        if cache is None:
            cache = torch.empty(
                params.max_batch_size, params.max_seqlen, *kv.shape[2:], dtype=kv.dtype, device=kv.device
            )
            params.key_value_memory_dict[self.layer_idx] = cache
        if params.batch_size_offset + kv.shape[0] > cache.shape[0]:
            raise InputError(
                f"inference_params.max_batch_size: the cache holds {cache.shape[0]} sequences, fewer than "
                f"batch_size_offset {params.batch_size_offset} + batch {kv.shape[0]}"
            )
        return cache


class ParallelMHA(MHA):
    """flash-attn's tensor-parallel MHA: this rank's share of the heads (get_dim_for_local_rank), Wqkv a
    ColumnParallelLinear holding [q, k, v] of those heads, out_proj a RowParallelLinear summing the
    ranks' outputs (module docstring). ALiBi slopes are this rank's slice of all heads' slopes."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        process_group: Any,
        num_heads_kv: int | None = None,
        qkv_proj_bias: bool = True,
        out_proj_bias: bool = True,
        dropout: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        layer_idx: int | None = None,
        rotary_emb_dim: int = 0,
        rotary_emb_base: float = 10000.0,
        rotary_emb_scale_base: float | None = None,
        rotary_emb_interleaved: bool = False,
        use_alibi: bool = False,
        window_size: Sequence[int] = (-1, -1),
        use_flash_attn: bool = False,
        checkpointing: bool = False,
        sequence_parallel: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        from torch import distributed as dist

        from .tensor_parallel import ColumnParallelLinear, RowParallelLinear, get_dim_for_local_rank

        heads_kv = num_heads if num_heads_kv is None else num_heads_kv
        if num_heads <= 0 or heads_kv <= 0 or num_heads % heads_kv or embed_dim % num_heads:
            raise InputError(
                f"num_heads, num_heads_kv: {num_heads}, {heads_kv}: num_heads_kv must divide num_heads, and "
                f"num_heads embed_dim {embed_dim}"
            )
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        local, local_kv = (get_dim_for_local_rank(n, world, rank) for n in (num_heads, heads_kv))
        if local_kv == 0 or local != local_kv * (num_heads // heads_kv):
            raise InputError(
                f"num_heads_kv: {heads_kv} kv heads over {world} ranks leave rank {rank} {local_kv}; give "
                "each rank at least one kv head and its query heads (num_heads_kv a multiple of the group size)"
            )
        head_dim = embed_dim // num_heads
        super().__init__(
            local * head_dim, local, local_kv, False, qkv_proj_bias, out_proj_bias, dropout, softmax_scale,
            causal, layer_idx, False, rotary_emb_dim, rotary_emb_base, rotary_emb_scale_base,
            rotary_emb_interleaved, False, window_size, False, use_flash_attn, False, checkpointing, device,
            dtype,
        )  # fmt: skip
        self.embed_dim = embed_dim
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel
        self.world_size, self.local_rank = world, rank
        self.num_heads_per_rank, self.num_heads_kv_per_rank = local, local_kv
        qkv_dim = head_dim * (num_heads + 2 * heads_kv)
        self.Wqkv = ColumnParallelLinear(
            embed_dim, qkv_dim, process_group, qkv_proj_bias, sequence_parallel,
            multiple_of=head_dim * (num_heads // heads_kv + 2), device=device, dtype=dtype,
        )  # fmt: skip
        self.out_proj = RowParallelLinear(
            embed_dim,
            embed_dim,
            process_group,
            out_proj_bias,
            sequence_parallel,
            multiple_of=head_dim,
            device=device,
            dtype=dtype,
        )
        if use_alibi:
            first = sum(get_dim_for_local_rank(num_heads, world, r) for r in range(rank))
            slopes = torch.tensor(get_alibi_slopes(num_heads), device=device)[first : first + local]
            self.inner_attn = FlashSelfAttention(causal, softmax_scale, dropout, window_size, slopes)
            self.inner_cross_attn = FlashCrossAttention(causal, softmax_scale, dropout, slopes, window_size)

    def forward(  # type: ignore[override]  # flash-attn's ParallelMHA takes these
        self, x: Tensor, seqlen: int | None = None, inference_params: Any = None, **kwargs: Any
    ) -> Tensor:
        """x (batch, seqlen, embed_dim), or (batch * seqlen, embed_dim) rows with seqlen (under
        sequence_parallel, this rank's rows) -> the same layout, embed_dim features (this rank's rows of
        the sum over ranks under sequence_parallel)."""
        self._check_call(None, None, None, inference_params)
        projected = self.Wqkv(x)
        if seqlen is not None:
            projected = projected.unflatten(0, (-1, seqlen))
        q, kv, qkv = self._split(projected)
        if inference_params is not None:
            context = self._decode(q, kv, inference_params)
        else:
            if self.rotary_emb_dim > 0:
                q, kv, qkv = self._rotate(q, kv, qkv, None, None)
            context = self._attend(q, kv, qkv, None, None, None, kwargs)
        context = context.flatten(-2)
        if seqlen is not None:
            context = context.flatten(0, 1)
        return _tensor(self.out_proj(context))
