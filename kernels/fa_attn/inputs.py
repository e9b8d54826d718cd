"""Validation of a flash_attn_func / flash_attn_varlen_func call, at the edge, into one typed object.

Everything after this (dispatch, kernels, fallback) works on an `AttnCall` whose shapes, dtypes and
options are known to be consistent; bad input stops here with a ValueError that names the argument
and the fix. Window and causal flags are normalised the way flash-attn 2.x does it in C++.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class Varlen:
    cu_seqlens_q: torch.Tensor  # int32, (batch + 1,)
    cu_seqlens_k: torch.Tensor
    seqlens_q: tuple[int, ...]  # per-sequence lengths, read once on the host
    seqlens_k: tuple[int, ...]
    max_seqlen_q: int
    max_seqlen_k: int


@dataclass(frozen=True)
class AttnCall:
    batch: int
    seqlen_q: int  # max over the batch for varlen
    seqlen_k: int
    heads: int
    heads_k: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    softmax_scale: float
    causal: bool
    window_left: int  # -1: unbounded
    window_right: int  # -1: unbounded; 0 when causal
    softcap: float  # 0: off
    dropout_p: float
    alibi_slopes: torch.Tensor | None
    deterministic: bool
    varlen: Varlen | None

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.dtype]

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or (self.window_right >= 0 and not self.causal)


def _check_tensor(name: str, t: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        # ValueError for every bad argument (not TypeError), so callers catch one documented type.
        raise ValueError(f"{name}: expected a torch.Tensor {layout}, got {type(t).__name__}")  # noqa: TRY004
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{name}: dtype {t.dtype} is not supported; use torch.float16 or torch.bfloat16 "
            "(kernels) or torch.float32 (fallback)"
        )
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dim must be contiguous (stride {t.stride(-1)}); pass {name}.contiguous()"
        )
    return t


def _check_same(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(
                f"{name}: dtype {t.dtype} differs from q's {q.dtype}; cast all three to one dtype"
            )
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device} but q is on {q.device}; move q, k, v to one device")
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; k and v must match")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: head dim {k.shape[-1]} differs from q's {q.shape[-1]}; q, k, v need one head dim"
        )
    heads, heads_k = q.shape[-2], k.shape[-2]
    if heads_k == 0 or heads % heads_k != 0:
        raise ValueError(
            f"k: {heads_k} kv heads must divide q's {heads} heads (GQA/MQA); use nheads_k that divides nheads"
        )
    if q.shape[-1] == 0:
        raise ValueError("q: head dim is 0; use a head dim of at least 1")


def _window(window_size: object, causal: bool, seqlen_k: int) -> tuple[bool, int, int]:
    """flash-attn's normalisation: causal == window (-1, 0); sizes >= seqlen_k mean unbounded."""
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)
    ):
        raise ValueError(
            f"window_size: expected a pair of ints (left, right), got {window_size!r}; "
            "use (-1, -1) for no window"
        )
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size: {window_size!r} has a value below -1; use -1 for unbounded")
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if causal or (left < 0 and right == 0):
        return True, left, 0
    return False, left, right


def _options(
    q: torch.Tensor,
    batch: int,
    heads: int,
    dropout_p: float,
    softmax_scale: float | None,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
) -> float:
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p: {dropout_p} must be in [0, 1)")
    if softcap < 0:
        raise ValueError(f"softcap: {softcap} must be >= 0 (0 turns it off)")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.shape not in ((heads,), (batch, heads)):
            shape = tuple(alibi_slopes.shape) if isinstance(alibi_slopes, torch.Tensor) else alibi_slopes
            raise ValueError(f"alibi_slopes: expected shape ({heads},) or ({batch}, {heads}), got {shape}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes: on {alibi_slopes.device} but q is on {q.device}")
        if not alibi_slopes.is_floating_point():
            raise ValueError("alibi_slopes: must be a float tensor (torch.float32)")
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale: {softmax_scale} is not finite; pass None for 1/sqrt(head_dim)")
    return float(softmax_scale)


def check_padded(
    q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
) -> AttnCall:
    layout = "(batch, seqlen, heads, head_dim)"
    q = _check_tensor("q", q, 4, layout)
    k = _check_tensor("k", k, 4, layout)
    v = _check_tensor("v", v, 4, layout)
    _check_same(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: batch {k.shape[0]} differs from q's {q.shape[0]}; q, k, v need one batch size")
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    scale = _options(q, batch, heads, dropout_p, softmax_scale, softcap, alibi_slopes)
    causal, left, right = _window(window_size, bool(causal), seqlen_k)
    return AttnCall(
        batch,
        seqlen_q,
        seqlen_k,
        heads,
        heads_k,
        head_dim,
        q.dtype,
        q.device,
        scale,
        causal,
        left,
        right,
        float(softcap),
        float(dropout_p),
        alibi_slopes,
        bool(deterministic),
        None,
    )


def _check_cu_seqlens(name: str, cu: object, total: int, device: torch.device) -> tuple[int, ...]:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D torch.int32 tensor of length batch + 1")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name}: dtype {cu.dtype}; pass {name}.to(torch.int32)")
    if cu.device != device:
        raise ValueError(f"{name}: on {cu.device} but q is on {device}; move it to q's device")
    if cu.numel() < 1:
        raise ValueError(f"{name}: is empty; it needs batch + 1 offsets starting at 0")
    offsets = cu.tolist()  # one host sync; the kernels trust these offsets, so they are checked here
    if offsets[0] != 0:
        raise ValueError(f"{name}: starts at {offsets[0]}; the first offset must be 0")
    lengths = tuple(b - a for a, b in itertools.pairwise(offsets))
    if any(n < 0 for n in lengths):
        raise ValueError(
            f"{name}: offsets {offsets} decrease; they must be non-decreasing (cumsum of lengths)"
        )
    if offsets[-1] != total:
        raise ValueError(
            f"{name}: last offset {offsets[-1]} != {total} rows in the packed tensor; "
            "it must equal the total number of tokens"
        )
    return lengths


def check_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    deterministic,
) -> AttnCall:
    layout = "(total_tokens, heads, head_dim)"
    q = _check_tensor("q", q, 3, layout)
    k = _check_tensor("k", k, 3, layout)
    v = _check_tensor("v", v, 3, layout)
    _check_same(q, k, v)
    lens_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    lens_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if len(lens_q) != len(lens_k):
        raise ValueError(
            f"cu_seqlens_k: {len(lens_k)} sequences but cu_seqlens_q has {len(lens_q)}; "
            "both need batch + 1 offsets"
        )
    for name, value, lens in (("max_seqlen_q", max_seqlen_q, lens_q), ("max_seqlen_k", max_seqlen_k, lens_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < max(lens, default=0):
            raise ValueError(
                f"{name}: {value!r} is smaller than the longest sequence "
                f"({max(lens, default=0)}); pass the max of the sequence lengths"
            )
    batch = len(lens_q)
    heads, head_dim = q.shape[1], q.shape[2]
    scale = _options(q, batch, heads, dropout_p, softmax_scale, softcap, alibi_slopes)
    causal, left, right = _window(window_size, bool(causal), max_seqlen_k)
    varlen = Varlen(cu_seqlens_q, cu_seqlens_k, lens_q, lens_k, max_seqlen_q, max_seqlen_k)
    return AttnCall(
        batch,
        max_seqlen_q,
        max_seqlen_k,
        heads,
        k.shape[1],
        head_dim,
        q.dtype,
        q.device,
        scale,
        causal,
        left,
        right,
        float(softcap),
        float(dropout_p),
        alibi_slopes,
        bool(deterministic),
        varlen,
    )
