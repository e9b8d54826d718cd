"""flash_attn_func / flash_attn_varlen_func: flash-attn 2.x's public API on fa's kernels or the fallback.

Each call: validate (inputs.py) -> decide the path (dispatch.py) -> run our ops (ops.py, CUDA kernels via
the binding) or torch SDPA (fallback.py). `return_attn_probs=True` returns (out, softmax_lse, None)
like flash-attn; the attention matrix S is never materialised, so the third item is always None.
`return_lse=True` returns (out, softmax_lse). The packed variants are in packed.py, the KV cache in
kvcache.py; both end in `decide` and `run_kernels` here.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..verify import selfcheck
from . import call_cache, decision, fallback, inputs, loader, ops, preload
from . import dispatch as _dispatch
from ._constant import assume_constant_result as _assume_constant_result
from .dispatch import Dispatch
from .inputs import AttnCall, AttnOutput, IntLike, WindowSize

# A fallback: (call, q, k, v, want_lse) -> (out, softmax_lse or None), as fallback.attention.
Fallback = Callable[
    [AttnCall, torch.Tensor, torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]
]


def needs_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def decide(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool | None = None
) -> Dispatch:
    """The path this call takes (memoised per device, dtype, head dim, direction and features).
    backward: needs_backward(q, k, v) when the caller asked already (None: asked here)."""
    if backward is None:
        backward = needs_backward(q, k, v)
    compiling = torch.compiler.is_compiling()
    if not compiling:  # a call kept by call_cache: its route, without rebuilding the decision's key
        kept = _kept_routes.get((id(call), backward))
        if kept is not None and kept[0] is call:
            return kept[1]
    # operator.index: under torch.compile with dynamic shapes these may be symbolic; the decision depends
    # on their values, so the graph specialises on them (a guard; dynamo keeps int() symbolic) and the
    # decision stays a constant.
    route = _decide_for(
        call.device.type,
        call.device.index,
        call.dtype_name,
        operator.index(call.head_dim),
        backward,
        tuple(sorted(_dispatch.features_of(call, backward))),
        operator.index(call.kv.page_size),
    )
    if not compiling and call_cache.tensor_free(call):
        if len(_kept_routes) >= 1024:
            _kept_routes.clear()
        _kept_routes[(id(call), backward)] = (call, route)
    return route


# torch.compile runs this for real while tracing and bakes the (constant) result into the graph: the
# decision reads files, the driver and the binding, none of which belongs in a graph. Every argument
# is a tensor property that the compiled graph is guarded on anyway.
@_assume_constant_result
def _decide_for(
    device_type: str,
    device_index: int | None,
    dtype: str,
    head_dim: int,
    backward: bool,
    features: tuple[str, ...],
    page_size: int,
) -> Dispatch:
    # Memoised: the manifest, the GPU, the driver and the binding do not change within a process, and
    # a call should not pay for re-deciding (or re-reading the driver version) every time.
    key = (device_type, device_index, dtype, head_dim, backward, features, page_size)
    known = _decisions.get(key)
    if known is None:
        facts = _dispatch.facts_for(
            device_type, device_index, dtype, head_dim, backward, frozenset(features), page_size
        )
        known = _decisions[key] = _dispatch.decide(
            facts, loader.manifest(), loader.load_binding, package_dir=loader.PACKAGE_DIR
        )
    return known


_decisions: dict[tuple[Any, ...], Dispatch] = {}


# Routes of tensor-free calls decided lately, by (id(call), backward), checked by identity: call_cache
# keeps a decode loop's call, so its route is one lookup away (a KV-cache call's too: its AttnCall is
# tensor-free, its index tensors travel beside it, run_kernels' `index`). (An entry keeps its call alive,
# so its id is not reused while the entry exists; calls holding tensors are never kept.)
_kept_routes: dict[tuple[int, bool], tuple[AttnCall, Dispatch]] = {}


def admit(
    call: AttnCall,
    route: Dispatch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    splitkv: bool = False,
    may_check: bool = True,
) -> Dispatch:
    """`route` once the units it would use are verified on this GPU for the call's class (selfcheck.admit:
    a record, or the first-use self-check), or the fallback when one failed or measured slower than SDPA
    here. A call without a backward that splits its keys (_launch) has its split-KV unit admitted too."""
    backward = needs_backward(q, k, v)
    if torch.compiler.is_compiling():
        return _compiled_route(call, q, backward, splitkv)
    splitkv = splitkv or _splits(call, route, q, backward, False)
    return selfcheck.admit(route, call, q.device, q.dtype, backward, splitkv=splitkv, may_check=may_check)


def route_for(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, splitkv: bool = False
) -> Dispatch:
    """The path a call runs on, admitted (a fallback needs no admission) and reported (last_dispatch(),
    the warning or FA_STRICT's error)."""
    # Asked once for decide, admit and report, which would each ask (a decode step pays every question).
    backward, compiling = needs_backward(q, k, v), torch.compiler.is_compiling()
    if compiling:
        route = _compiled_route(call, q, backward, splitkv)
    else:
        route = decide(call, q, k, v, backward)
        if route.path != "fallback":  # (admit's body, one frame less per call)
            splitkv = splitkv or _splits(call, route, q, backward, False)
            route = selfcheck.admit(route, call, q.device, q.dtype, backward, splitkv)
    _dispatch.report(route, compiling)
    return route


def _compiled_route(call: AttnCall, q: torch.Tensor, backward: bool, splitkv: bool) -> Dispatch:
    """route_for while torch.compile traces: the decision and its admission as one constant of plain
    arguments (_admitted_for), since dynamo can neither pass a baked constant on nor take its id()."""
    facts = (
        call.device.type, call.device.index, call.dtype_name, operator.index(call.head_dim), backward,
        tuple(sorted(_dispatch.features_of(call, backward))), operator.index(call.kv.page_size),
    )  # fmt: skip
    route = _decide_for(*facts)
    if route.path == "fallback":
        return route
    splitkv = splitkv or _splits(call, route, q, backward, True)
    return _admitted_for(facts, tuple(selfcheck.class_of(call)), splitkv, selfcheck.mode())


@_assume_constant_result
def _admitted_for(facts: tuple[Any, ...], cls: tuple[object, ...], splitkv: bool, chosen: str) -> Dispatch:
    """_decide_for's route (its facts) admitted for the call's class (selfcheck.traced), run for real
    while torch.compile traces and baked into the graph."""
    route = _decide_for(*facts)
    device_type, device_index, dtype, _head_dim, backward = facts[:5]
    device = torch.device(device_type) if device_index is None else torch.device(device_type, device_index)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    return selfcheck.traced(route, device, torch_dtype, cls, backward, splitkv, chosen)


def _splits(call: AttnCall, route: Dispatch, q: torch.Tensor, backward: bool, compiling: bool) -> bool:
    """Whether flash_attn_func's forward (num_splits: its heuristic) runs the split-KV unit (kept per
    tensor-free call and route, as _launch keeps its arguments: a decode step asks once)."""
    if backward or route.splitkv is None:
        return False
    if compiling:  # (no id() of the baked route)
        return _split_count(call, route, q, 0) > 1
    kept = _kept_splits.get((id(call), id(route)))
    if kept is not None and kept[0] is call and kept[1] is route:
        return kept[2]
    splits = _split_count(call, route, q, 0) > 1
    if call_cache.tensor_free(call):
        if len(_kept_splits) >= 1024:
            _kept_splits.clear()
        _kept_splits[(id(call), id(route))] = (call, route, splits)
    return splits


_kept_splits: dict[tuple[int, int], tuple[AttnCall, Dispatch, bool]] = {}


def _split_count(call: AttnCall, route: Dispatch, q: torch.Tensor, requested: int) -> int:
    """How many shares of the keys the split-KV forward takes (decision.num_splits: flash-attn's
    `num_splits`, 0 = its heuristic, 1 = no split); 1 where the wheel has no split-KV kernel or a
    backward will run."""
    split = route.splitkv
    if split is None or requested == 1:
        return 1
    block_m, block_n = split.launch[2], split.launch[3]  # the first entry, fa_fwd_splitkv
    return decision.num_splits(
        call.batch,
        call.heads,
        call.seqlen_q,
        call.seqlen_k,
        block_m,
        block_n,
        _sm_count(q.device),
        requested=requested,
    )


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def run_kernels(
    call: AttnCall,
    route: Dispatch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_splits: int = 0,
    index: IndexArgs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Our forward op (and its autograd backward) on padded or packed q, k, v, or k/v of the call's
    KV-cache layout (call.kv: pages, cache rows, per-sequence lengths; call.seqlen_k is the longest
    sequence's keys); for calls without a backward, the split-KV forward when `num_splits` (flash-attn's:
    0 = heuristic) says so. `index`: the index tensors when they travel beside a tensor-free call (the
    KV cache's: inputs.KvLayout.features says which), else the call's own."""
    assert route.fwd is not None
    assert route.head_dim is not None
    preload.before_call(route, q)  # the route's kernels load here, never inside a graph capture
    pad = route.head_dim - call.head_dim
    if pad:  # kernels need a multiple of 8; zero columns change neither q.k nor the kept outputs
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))  # (contiguous: rows aligned)
    elif not call.rows_aligned:
        q, k, v = row_aligned(q), row_aligned(k), row_aligned(v)
    split, args = _launch(call, route, q, num_splits, index)
    if split:
        out, lse = torch.ops.fa_attn.fwd_splitkv(q, k, v, *args)
    else:
        out, lse = torch.ops.fa_attn.fwd(q, k, v, *args)
    return (out[..., : call.head_dim] if pad else out), lse


def _launch(
    call: AttnCall, route: Dispatch, q: torch.Tensor, num_splits: int, index: IndexArgs | None
) -> tuple[bool, tuple[object, ...]]:
    """Whether the split-KV forward runs (_split_count), and the forward op's arguments after q, k, v
    (ops.py's schemas): the index tensors (`index`, else the call's) and the call's scalars, then the
    launch data of the split-KV forward or of the forward and its backward. All but the index tensors
    depend on the call's shapes and the route only, so they are kept per tensor-free call and route,
    like the route itself (decide): a decode step repeats them."""
    compiling = torch.compiler.is_compiling()
    memo = (0, 0, 0) if compiling else (id(call), id(route), num_splits)  # (no id() of a baked constant)
    kept = None if compiling else _kept_args.get(memo)
    if kept is None or kept[0] is not call or kept[1] is not route:
        splits = _split_count(call, route, q, num_splits)
        split = route.splitkv if splits > 1 else None
        tail: tuple[object, ...] = (
            call.seqlen_q, call.seqlen_k, call.softmax_scale, call.causal, call.window_left, call.window_right,
            call.softcap,
        )  # fmt: skip
        if split is not None:
            tail += (splits, split.module, split.entries, list(split.launch))
        else:
            fwd, bwd = route.fwd or ops.NO_LAUNCH, route.bwd or ops.NO_LAUNCH
            tail += (fwd.module, fwd.entries, list(fwd.launch), bwd.module, bwd.entries, list(bwd.launch))
        kept = (call, route, split is not None, tail, _index_args(call) + tail)
        if not compiling and call_cache.tensor_free(call):
            if len(_kept_args) >= 1024:
                _kept_args.clear()
            _kept_args[memo] = kept
    return kept[2], (kept[4] if index is None else index + kept[3])


# The op's index tensors: cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, kv_batch_idx, block_table.
IndexArgs = tuple[torch.Tensor | None, ...]


def _index_args(call: AttnCall) -> IndexArgs:
    varlen, kv = call.varlen, call.kv
    return (
        varlen.cu_seqlens_q if varlen else None, varlen.cu_seqlens_k if varlen else None, kv.seqused_k,
        kv.leftpad_k, kv.kv_batch_idx, kv.block_table,
    )  # fmt: skip


# What _launch found for tensor-free calls lately run, by (id(call), id(route), num_splits), checked by
# identity (an entry keeps its call and route alive, so their ids are not reused while it exists):
# (call, route, split-KV or not, the arguments after the index tensors, all the arguments).
_kept_args: dict[
    tuple[int, int, int], tuple[AttnCall, Dispatch, bool, tuple[object, ...], tuple[object, ...]]
] = {}


def row_aligned(t: torch.Tensor) -> torch.Tensor:
    """The kernels load 16-byte vectors per row: strides must be multiples of 8 elements. Copy the rare
    tensor that is not. (A misaligned start address is copied by the binding: torch.compile cannot
    trace storage_offset().)"""
    return t if inputs.multiples_of_8(t.stride()[:-1]) else t.contiguous()


def _finish(
    out: torch.Tensor, lse: torch.Tensor | None, return_lse: bool, return_attn_probs: bool
) -> AttnOutput:
    if return_attn_probs or return_lse:
        assert lse is not None  # asked for, so computed (_attend passes want_lse)
        return (out, lse, None) if return_attn_probs else (out, lse)
    return out


def _attend(
    call: AttnCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    run_fallback: Fallback,
    return_lse: bool,
    return_attn_probs: bool,
) -> AttnOutput:
    route = route_for(call, q, k, v)
    lse: torch.Tensor | None
    if route.path != "fallback":  # (a field, not a property: torch.compile reads it)
        out, lse = run_kernels(call, route, q, k, v)
    else:
        out, lse = run_fallback(call, q, k, v, return_lse or return_attn_probs)
    return _finish(out, lse, return_lse, return_attn_probs)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """q (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k, heads_k, head_dim) -> out like q.

    With return_lse=True returns (out, softmax_lse); with return_attn_probs=True (out, softmax_lse, None)
    like flash-attn (the attention matrix S is never materialised). softmax_lse is (batch, heads,
    seqlen_q), fp32, natural log, +inf for rows that see no key; with ALiBi under a purely causal mask it
    is flash-attn's (larger than the textbook LSE by slope * (i + seqlen_k - seqlen_q), fallback.py).
    window_size: any pair of integer-likes (tuple, list, 2-element tensor or numpy array). Calls the
    kernels cannot serve run on torch SDPA with the same semantics and warn once per reason (FA_STRICT=1
    raises instead).
    """
    options = (dropout_p, softmax_scale, causal, softcap, alibi_slopes, deterministic)
    key = None if torch.compiler.is_compiling() else call_cache.key("padded", q, k, v, options, window_size)
    call = call_cache.known(key)
    if call is None:
        call = inputs.check_padded(
            q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        )
        call_cache.remember(key, call)
    return _attend(call, q, k, v, fallback.attention, return_lse, return_attn_probs)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: IntLike,
    max_seqlen_k: IntLike,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    return_lse: bool = False,
) -> AttnOutput:
    """Packed q (total_q, heads, head_dim), k/v (total_k, heads_k, head_dim), int32 cu_seqlens of length
    batch + 1 -> out like q; softmax_lse (heads, total_q) on request.

    max_seqlen_q/k: any integer-like (int, numpy integer, one-element integer tensor), at least the
    longest sequence. block_table (batch, max_num_blocks_per_seq) int32: k/v are a paged cache
    (num_blocks, page_block_size, heads_k, head_dim) and sequence b reads its
    cu_seqlens_k[b+1] - cu_seqlens_k[b] keys from pages block_table[b]. The kernels read it when the
    page size is a multiple of their key block (flash-attn's own rule, a multiple of 256, always is;
    other sizes fall back with feature-unsupported "paged_kv"), forward only (a call that needs
    gradients falls back).
    """
    return varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table, return_lse,
    )  # fmt: skip


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: IntLike, max_seqlen_k: IntLike, dropout_p: float, softmax_scale: float | None,
    causal: bool, window_size: WindowSize, softcap: float, alibi_slopes: torch.Tensor | None,
    deterministic: bool, return_attn_probs: bool, block_table: torch.Tensor | None, return_lse: bool,
    seqused_k: torch.Tensor | None = None, leftpad_k: torch.Tensor | None = None,
) -> AttnOutput:  # fmt: skip
    """flash_attn_varlen_func, plus the key layouts of flash-attn's extension (flash_attn_ext.varlen_fwd):
    seqused_k and leftpad_k (inputs.check_varlen)."""
    call = inputs.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, block_table, seqused_k, leftpad_k,
    )  # fmt: skip
    return _attend(call, q, k, v, fallback.varlen_attention, return_lse, return_attn_probs)


def explain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: IntLike | None = None,
    max_seqlen_k: IntLike | None = None,
    **options: Any,
) -> Dispatch:
    """The path a call with these arguments would take, and why, without running it (or warning).

    Pass cu_seqlens_q/k and max_seqlen_q/k for a varlen call; other keywords as flash_attn_func's.
    """
    defaults = {
        "dropout_p": 0.0,
        "softmax_scale": None,
        "causal": False,
        "window_size": (-1, -1),
        "softcap": 0.0,
        "alibi_slopes": None,
        "deterministic": False,
    }
    unknown = set(options) - set(defaults)
    if unknown:
        raise ValueError(f"explain: unknown option(s) {sorted(unknown)}; use flash_attn_func's keywords")
    args = {**defaults, **options}
    if cu_seqlens_q is None and cu_seqlens_k is None:
        call = inputs.check_padded(q, k, v, **args)
    else:
        call = inputs.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **args)
    return admit(call, decide(call, q, k, v), q, k, v, may_check=False)
