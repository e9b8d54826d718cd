"""Validation of a flash_attn_func / flash_attn_varlen_func call, at the edge, into one typed object.

Everything after this (dispatch, kernels, fallback) works on an `AttnCall` whose shapes, dtypes and
options are known to be consistent; bad input stops here with a ValueError that names the argument
and the fix. Window and causal flags are normalised the way flash-attn 2.x does it in C++.

Integer arguments take every integer-like that flash-attn's own code accepts, because real callers
pass them: Python ints, numpy integers, and one-element integer tensors on any device (transformers
passes `max_seqlen_q=cu_seqlens.diff().max()`, a 0-d int32 tensor; flash-attn's tests pass
`window_size` as a 2-element tensor). Reading a CUDA tensor's value is a host sync, as in flash-attn.

Index tensors (cu_seqlens, block_table, cache_seqlens, cache_batch_idx, cache_leftpad) are checked
value by value only where that reads no device memory (`may_read`): on the CPU, or with
FA_CHECK_INDICES=1, and never while torch.compile traces or a CUDA graph captures. Otherwise their
shapes and dtypes are checked and their values trusted, as flash-attn trusts them: one device sync per
call is what a decode step cannot afford, and a capture or a compiled graph cannot have it at all.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import SupportsIndex

import torch

from .._env import switch

# The public API's argument and result types. An integer argument is any integer-like flash-attn's
# callers pass: an int, a numpy integer, a one-element integer tensor; a window is a pair of them.
IntLike = int | SupportsIndex | torch.Tensor
WindowSize = Sequence[IntLike] | torch.Tensor
# out; (out, softmax_lse) with return_lse; (out, softmax_lse, None) with return_attn_probs.
AttnOutput = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, None]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


class InputError(ValueError, RuntimeError):
    """A bad argument. A ValueError, fa's documented type; also a RuntimeError, which flash-attn raises
    for the same checks (its C++ TORCH_CHECKs), so code written for flash-attn catches it too."""


@dataclass(frozen=True)
class Varlen:
    cu_seqlens_q: torch.Tensor  # int32, (batch + 1,), on q's device (never read on the host here)
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int  # the caller's bound on every sequence's length (flash-attn requires it)
    max_seqlen_k: int


_FA_CHECK_INDICES = switch("FA_CHECK_INDICES")


def may_read(t: torch.Tensor) -> bool:
    """Whether validation may read t's values: t is a plain tensor (not fake, meta or traced) and either
    on the CPU (no device sync) or FA_CHECK_INDICES=1 asks for it, outside compile tracing and capture."""
    if type(t) is not torch.Tensor or torch.compiler.is_compiling():
        return False
    if t.is_cpu:  # (is_cpu, is_cuda: no torch.device made; a decode step asks at every call)
        return True
    if not _FA_CHECK_INDICES():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


@dataclass(frozen=True)
class KvLayout:
    """Where each sequence's keys are, beyond padded or packed k/v: the KV-cache layouts the forward
    kernels read (kernels/csrc/params.h), as int32 tensors on q's device; None where absent."""

    seqused_k: torch.Tensor | None = None  # (batch,) keys of each sequence, counted from its row 0
    leftpad_k: torch.Tensor | None = None  # (batch,) each sequence's first key
    kv_batch_idx: torch.Tensor | None = None  # (batch,) each sequence's row of k/v
    block_table: torch.Tensor | None = None  # (batch, pages per sequence): k/v are pages
    page_size: int = 0  # keys per page with block_table (k/v's dim 1)
    # The kernel features (tiles.FEATURES, decision.KV_LAYOUT_FEATURES) this layout needs: its tensors'
    # and those given, for a layout whose tensors travel beside it (kvcache: a kept call is tensor-free,
    # each call passes its own tensors to interface.run_kernels).
    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        named = (
            ("seqused_k", self.seqused_k),
            ("leftpad_k", self.leftpad_k),
            ("cache_batch_idx", self.kv_batch_idx),
            ("paged_kv", self.block_table),
        )
        present = frozenset(name for name, tensor in named if tensor is not None)
        if not present <= self.features:
            object.__setattr__(self, "features", self.features | present)


_NO_LAYOUT = KvLayout()


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
    # The KV-cache layout the kernels read (kvcache.py, paged varlen); dispatch.features_of adds its
    # features, and run_kernels passes its tensors.
    kv: KvLayout = field(default_factory=KvLayout)
    # Every row stride of q, k and v a multiple of 8, as the kernels load rows (interface.row_aligned);
    # validated once with the rest, so a repeated call does not ask its tensors again.
    rows_aligned: bool = False

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.dtype]

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or (self.window_right >= 0 and not self.causal)


def as_int(name: str, value: object) -> int:
    """An integer argument as a Python int: int, numpy integer, or a one-element integer tensor."""
    if isinstance(value, bool):
        raise InputError(f"{name}: expected an integer, got the bool {value!r}; pass an int")
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor):
        return int(check_integer_tensor(name, value).item())
    try:
        return operator.index(value)  # type: ignore[arg-type]  # numpy integers, 0-d integer arrays
    except TypeError:
        raise InputError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None


def check_integer_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    """A one-element integer tensor (not read: its dtype and size only)."""
    if value.numel() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise InputError(
            f"{name}: expected an integer, got a {value.dtype} tensor of shape {tuple(value.shape)}; "
            "pass an int or a one-element integer tensor"
        )
    return value


def window_pair(window_size: object) -> tuple[int, int]:
    """(left, right) from any pair flash-attn indexes as window_size[0], window_size[1]: a tuple or list
    of integer-likes, a 2-element integer tensor or numpy array."""
    try:
        count = len(window_size)  # type: ignore[arg-type]
    except TypeError:
        count = -1
    if count != 2 or isinstance(window_size, (str, bytes)):
        raise InputError(
            f"window_size: expected a pair of ints (left, right), got {window_size!r}; use (-1, -1) for no window"
        )
    pair = window_size
    return as_int("window_size[0]", pair[0]), as_int("window_size[1]", pair[1])  # type: ignore[index]


def check_tensor(name: str, t: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        # ValueError for every bad argument (not TypeError), so callers catch one documented type.
        raise InputError(f"{name}: expected a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise InputError(f"{name}: expected {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise InputError(
            f"{name}: dtype {t.dtype} is not supported; use torch.float16 or torch.bfloat16 "
            "(kernels) or torch.float32 (fallback)"
        )
    if t.numel() > 0 and t.stride(-1) != 1:
        raise InputError(
            f"{name}: the last dim must be contiguous (stride {t.stride(-1)}); pass {name}.contiguous()"
        )
    return t


def check_same(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_name: str = "k", v_name: str = "v"
) -> None:
    """k and v against q: dtype, device, head dim and GQA head counts (k/v of any layout)."""
    for name, t in ((k_name, k), (v_name, v)):
        if t.dtype != q.dtype:
            raise InputError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}; cast q, k, v to one dtype")
        if t.device != q.device:
            raise InputError(f"{name}: on {t.device} but q is on {q.device}; move q, k, v to one device")
    if k.shape != v.shape:
        raise InputError(
            f"{v_name}: shape {tuple(v.shape)} differs from {k_name}'s {tuple(k.shape)}; they must match"
        )
    if k.shape[-1] != q.shape[-1]:
        raise InputError(
            f"{k_name}: head dim {k.shape[-1]} differs from q's {q.shape[-1]}; q, k, v need one head dim"
        )
    heads, heads_k = q.shape[-2], k.shape[-2]
    if heads_k == 0 or heads % heads_k != 0:
        raise InputError(
            f"{k_name}: {heads_k} kv heads must divide q's {heads} heads (GQA/MQA); "
            "use nheads_k that divides nheads"
        )
    if q.shape[-1] == 0:
        raise InputError("q: head dim is 0; use a head dim of at least 1")


def normalize_window(window_size: object, causal: bool, seqlen_k: int) -> tuple[bool, int, int]:
    """flash-attn's normalisation: causal == window (-1, 0); sizes >= seqlen_k mean unbounded."""
    left, right = window_pair(window_size)
    if left < -1 or right < -1:
        raise InputError(f"window_size: ({left}, {right}) has a value below -1; use -1 for unbounded")
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if causal or (left < 0 and right == 0):
        return True, left, 0
    return False, left, right


@dataclass(frozen=True)
class Options:
    """The scalar options every function shares, validated."""

    softmax_scale: float
    softcap: float
    dropout_p: float
    alibi_slopes: torch.Tensor | None


def _as_float(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"{name}: expected a number, got {type(value).__name__} {value!r}") from None


def check_options(
    q: torch.Tensor,
    batch: int,
    heads: int,
    dropout_p: object,
    softmax_scale: object,
    softcap: object,
    alibi_slopes: object,
) -> Options:
    dropout = _as_float("dropout_p", dropout_p)
    if not 0.0 <= dropout < 1.0:
        raise InputError(f"dropout_p: {dropout} must be in [0, 1)")
    cap = _as_float("softcap", softcap)
    if not cap >= 0:
        raise InputError(f"softcap: {cap} must be >= 0 (0 turns it off)")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.shape not in ((heads,), (batch, heads)):
            shape = tuple(alibi_slopes.shape) if isinstance(alibi_slopes, torch.Tensor) else alibi_slopes
            raise InputError(f"alibi_slopes: expected shape ({heads},) or ({batch}, {heads}), got {shape}")
        if alibi_slopes.device != q.device:
            raise InputError(f"alibi_slopes: on {alibi_slopes.device} but q is on {q.device}")
        if not alibi_slopes.is_floating_point():
            raise InputError("alibi_slopes: must be a float tensor (torch.float32)")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        scale = _as_float("softmax_scale", softmax_scale)
        if not math.isfinite(scale):
            raise InputError(f"softmax_scale: {scale} is not finite; pass None for 1/sqrt(head_dim)")
    return Options(scale, cap, dropout, alibi_slopes)


def make_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    opts: Options,
    causal: object,
    window_size: object,
    deterministic: object,
    varlen: Varlen | None = None,
    kv: KvLayout | None = None,
    key_len: int | None = None,
) -> AttnCall:
    """The AttnCall of validated pieces; the window is normalised against seqlen_k, and the attention
    runs over key_len keys (default seqlen_k; a KV cache normalises against its capacity)."""
    is_causal, left, right = normalize_window(window_size, bool(causal), seqlen_k)
    return AttnCall(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k if key_len is None else key_len,
        heads=q.shape[-2],
        heads_k=k.shape[-2],
        head_dim=q.shape[-1],
        dtype=q.dtype,
        device=q.device,
        softmax_scale=opts.softmax_scale,
        causal=is_causal,
        window_left=left,
        window_right=right,
        softcap=opts.softcap,
        dropout_p=opts.dropout_p,
        alibi_slopes=opts.alibi_slopes,
        deterministic=bool(deterministic),
        varlen=varlen,
        kv=_NO_LAYOUT if kv is None else kv,
        rows_aligned=multiples_of_8(q.stride()[:-1] + k.stride()[:-1] + v.stride()[:-1]),
    )


def multiples_of_8(strides: tuple[int, ...]) -> bool:
    """Whether every stride is a multiple of 8 (16-byte rows of fp16/bf16)."""
    # Multiples of 8 (a power of two) exactly when their bitwise or is: one C-level reduce.
    return functools.reduce(operator.or_, strides, 0) % 8 == 0


def check_padded(
    q: object,
    k: object,
    v: object,
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    deterministic: object,
) -> AttnCall:
    layout = "(batch, seqlen, heads, head_dim)"
    q = check_tensor("q", q, 4, layout)
    k = check_tensor("k", k, 4, layout)
    v = check_tensor("v", v, 4, layout)
    check_same(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise InputError(f"k: batch {k.shape[0]} differs from q's {q.shape[0]}; q, k, v need one batch size")
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    opts = check_options(q, batch, heads, dropout_p, softmax_scale, softcap, alibi_slopes)
    return make_call(q, k, v, batch, seqlen_q, k.shape[1], opts, causal, window_size, deterministic)


def check_index_tensor(name: str, t: object, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An int32 index tensor (cu_seqlens, block_table, cache_seqlens, ...) of a known shape on q's device."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.int32 tensor of shape {shape}, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise InputError(f"{name}: dtype {t.dtype}; pass {name}.to(torch.int32)")
    if t.device != device:
        raise InputError(f"{name}: on {t.device} but q is on {device}; move it to q's device")
    if tuple(t.shape) != shape:
        raise InputError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    return t


def _check_cu_seqlens(
    name: str, cu: object, total: int | None, device: torch.device, exact: bool = True
) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """The offsets, and the per-sequence lengths where they may be read (`may_read`; else None);
    `total`: rows of the packed tensor the offsets index (None: paged keys). `exact`: the offsets must
    cover every row; keys need not (flash-attn reads k by its offsets only, so a preallocated key buffer
    longer than cu_seqlens_k[-1] is accepted, and its tail is never read)."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1:
        raise InputError(f"{name}: expected a 1-D torch.int32 tensor of length batch + 1")
    check_index_tensor(name, cu, tuple(cu.shape), device)
    if cu.numel() < 1:
        raise InputError(f"{name}: is empty; it needs batch + 1 offsets starting at 0")
    if not may_read(cu):
        return cu, None
    offsets = cu.tolist()  # host memory: the kernels trust these offsets, so they are checked here
    if offsets[0] != 0:
        raise InputError(f"{name}: starts at {offsets[0]}; the first offset must be 0")
    lengths = tuple(b - a for a, b in itertools.pairwise(offsets))
    if any(n < 0 for n in lengths):
        raise InputError(
            f"{name}: offsets {offsets} decrease; they must be non-decreasing (cumsum of lengths)"
        )
    if total is not None and (offsets[-1] > total or (exact and offsets[-1] != total)):
        raise InputError(
            f"{name}: last offset {offsets[-1]} != {total} rows in the packed tensor; "
            "it must equal the total number of tokens"
            + ("" if exact else " (or be fewer: rows past it are never read)")
        )
    return cu, lengths


def _max_seqlen(name: str, value: object, lengths: tuple[int, ...] | None, cu_name: str) -> int:
    """flash-attn sizes its grid by max_seqlen: one below the longest sequence would drop rows silently.
    A larger value is allowed (flash-attn allows it: it only costs idle blocks). Checked against the
    lengths where they were read."""
    given = as_int(name, value)
    if given < 0:
        raise InputError(f"{name}: {given} is negative; pass the longest sequence's length")
    longest = max(lengths or (), default=0)
    if given < longest:
        raise InputError(
            f"{name}: {given} is smaller than the longest sequence in {cu_name} ({longest}); "
            f"pass {name} >= {longest} (the largest difference of consecutive {cu_name} offsets)"
        )
    return given


def check_block_table(
    block_table: object,
    batch: int,
    num_blocks: int,
    page_size: int,
    lengths: tuple[int, ...] | None,
    device: torch.device,
) -> torch.Tensor:
    """A paged cache's (batch, max_blocks_per_seq) int32 page table; with the lengths known (None: not
    read), no sequence needs more pages than it has, and where it may be read every page exists."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise InputError("block_table: expected a 2-D torch.int32 tensor (batch, max_num_blocks_per_seq)")
    table = check_index_tensor("block_table", block_table, (batch, block_table.shape[1]), device)
    if page_size < 1:
        raise InputError("k_cache: a paged cache needs page_block_size >= 1 (its dim 1)")
    capacity = table.shape[1] * page_size
    for index, length in enumerate(lengths or ()):
        if length > capacity:
            raise InputError(
                f"block_table: sequence {index} has {length} keys but its {table.shape[1]} pages of "
                f"{page_size} hold {capacity}; add columns to block_table"
            )
    if lengths is None or not may_read(table):
        return table
    used = [-(-length // page_size) for length in lengths]
    pages = table.tolist()  # host memory: a bad page index would read out of bounds
    for index, (row, count) in enumerate(zip(pages, used, strict=True)):
        bad = [p for p in row[:count] if not 0 <= p < num_blocks]
        if bad:
            raise InputError(
                f"block_table: sequence {index} uses page {bad[0]}, outside the {num_blocks} pages of the "
                "cache; page indices must be in [0, num_blocks)"
            )
    return table


def check_varlen(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    deterministic: object,
    block_table: object = None,
    seqused_k: object = None,
    leftpad_k: object = None,
) -> AttnCall:
    """Packed q/k/v; with block_table, k/v are a paged cache (num_blocks, page_block_size, heads_k, dim)
    and sequence b's keys are the first cu_seqlens_k[b+1] - cu_seqlens_k[b] rows of its pages.
    seqused_k (batch,): keys of sequence b used, instead of its cu_seqlens_k length; leftpad_k (batch,):
    its keys start that many rows later (flash-attn's varlen_fwd arguments)."""
    q = check_tensor("q", q, 3, "(total_tokens, heads, head_dim)")
    paged = block_table is not None
    kv_layout = (
        "(num_blocks, page_block_size, heads_k, head_dim)" if paged else "(total_tokens, heads, head_dim)"
    )
    k = check_tensor("k", k, 4 if paged else 3, kv_layout)
    v = check_tensor("v", v, 4 if paged else 3, kv_layout)
    check_same(q, k, v)
    cu_q, lens_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    cu_k, lens_k = _check_cu_seqlens(
        "cu_seqlens_k", cu_seqlens_k, None if paged else k.shape[0], q.device, exact=False
    )
    batch = cu_q.shape[0] - 1
    if cu_k.shape[0] != cu_q.shape[0]:
        raise InputError(
            f"cu_seqlens_k: {cu_k.shape[0] - 1} sequences but cu_seqlens_q has {batch}; "
            "both need batch + 1 offsets"
        )
    used = None if seqused_k is None else check_index_tensor("seqused_k", seqused_k, (batch,), q.device)
    pad = None if leftpad_k is None else check_index_tensor("leftpad_k", leftpad_k, (batch,), q.device)
    max_q = _max_seqlen("max_seqlen_q", max_seqlen_q, lens_q, "cu_seqlens_q")
    max_k = _max_seqlen("max_seqlen_k", max_seqlen_k, lens_k if used is None else None, "cu_seqlens_k")
    kv = KvLayout(seqused_k=used, leftpad_k=pad)
    if paged:
        table = check_block_table(block_table, batch, k.shape[0], k.shape[1], lens_k, q.device)
        kv = replace(kv, block_table=table, page_size=k.shape[1])
    opts = check_options(q, batch, q.shape[1], dropout_p, softmax_scale, softcap, alibi_slopes)
    varlen = Varlen(cu_q, cu_k, max_q, max_k)
    return make_call(q, k, v, batch, max_q, max_k, opts, causal, window_size, deterministic, varlen, kv)
