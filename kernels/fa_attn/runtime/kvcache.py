"""flash_attn_with_kvcache: attention over a KV cache for inference, with flash-attn 2.x's semantics.

One call does, in order (flash-attn does all of it in one kernel; here the first two are torch ops):
  1. rotary embedding of q and of the new k (`rotary_cos`/`rotary_sin`, rope.py) at their positions
  2. the new k/v written into the cache in place, at rows cache_seqlens[b] .. + seqlen_new of sequence b
     (through `cache_batch_idx` or the pages of `block_table`)
  3. attention of q over each sequence's keys [cache_leftpad[b], cache_seqlens[b] + seqlen_new),
     bottom-right aligned (causal and windows as flash_attn_func's), GQA/MQA, softcap, ALiBi

Step 3 is `_attend_cache`: the kernels read the cache where it lies (the split-KV forward for decode
shapes, by decision.num_splits or the caller's `num_splits`), each layout a kernel feature
(inputs.KvLayout, kernels/csrc/params.h):
  seqused_k        cache_seqlens differing between sequences: a per-sequence key count
  leftpad_k        cache_leftpad: a per-sequence first key
  cache_batch_idx  a per-sequence cache row (an indirection on the batch index of k/v)
  paged_kv         block_table: k/v rows read through the page table, whose pages must hold whole key
                   blocks of the kernel (page_block_size a multiple of its key block; flash-attn's
                   rule, a multiple of 256, always is)
A cache in which every sequence has the same length needs none of them (the kernels see k_cache[:, :L]).
Wheels without a feature, pages smaller than the key block, ALiBi, and calls that need gradients through
a layout run the fallback (reason `feature-unsupported` or `backward-unsupported`). No index tensor
(cache_seqlens, cache_batch_idx, cache_leftpad, block_table) is read on the host, except where
inputs.may_read allows it (CPU tensors, FA_CHECK_INDICES=1) and flash-attn's own bound check on a paged
cache (`_paged_bound`): a decode step can be captured in a CUDA graph and compiled with fullgraph=True.
A cache_seqlens tensor makes the kernels read per-sequence key counts (seqused_k) over the whole cache
width; an int, when every sequence has the same length, bounds the keys on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import call_cache, fallback, interface, rope
from .inputs import (
    AttnCall,
    InputError,
    IntLike,
    KvLayout,
    WindowSize,
    as_int,
    check_block_table,
    check_index_tensor,
    check_integer_tensor,
    check_options,
    check_same,
    check_tensor,
    make_call,
    may_read,
)
from .interface import IndexArgs


@dataclass(frozen=True)
class Rotary:
    cos: torch.Tensor  # (seqlen_rotary, rotary_dim / 2)
    sin: torch.Tensor
    interleaved: bool


class CacheCall(NamedTuple):
    """A validated flash_attn_with_kvcache call. Its per-sequence facts are device tensors: nothing in
    a call reads them on the host (inputs.may_read says where validation does). `_check` makes one
    without tensors (a template, kept by call_cache per the arguments' metadata), `_bind` attaches a
    call's own. (A NamedTuple: a decode step makes one per call, a third of a frozen dataclass's cost.)"""

    attn: AttnCall  # the attention over the cache: seqlen_k bounds every sequence's keys, kv the layout
    capacity: int  # keys one sequence's cache can hold (seqlen_cache, or pages per sequence * page size)
    seqlen_new: int  # rows of k/v appended (0: none)
    cache_seqlens: torch.Tensor | None  # (batch,) integer keys before the append, when given as a tensor
    uniform: int | None  # the keys before the append, when given as one int for every sequence
    leftpad: torch.Tensor | None  # (batch,) int32 first valid key per sequence (cache_leftpad)
    batch_rows: torch.Tensor | None  # (batch,) int32 cache row per sequence (cache_batch_idx)
    block_table: torch.Tensor | None
    rotary: Rotary | None
    num_splits: int  # split-KV hint (0: heuristic); for the kernels' split-KV forward
    # The kernels' index tensors (interface.IndexArgs: seqused_k, leftpad_k, kv_batch_idx, block_table;
    # no cu_seqlens), beside `attn`, which holds none; None: there are none.
    index_args: IndexArgs | None

    def counts(self, device: torch.device) -> torch.Tensor | None:
        """(batch,) int64 keys before the append; None: every cache is full. Made only where a torch op
        needs them (rotary, the append, the fallback): the kernels take an int as it is."""
        if self.cache_seqlens is not None:
            return self.cache_seqlens.to(torch.long)
        if self.uniform is None:
            return None
        return torch.full((self.attn.batch,), self.uniform, dtype=torch.long, device=device)

    def rows(self, device: torch.device) -> torch.Tensor:
        """(batch,) int64 cache row per sequence: cache_batch_idx, else row b for sequence b. Made only
        where a torch op indexes the cache with them (the append, the fallback's gather)."""
        if self.batch_rows is not None:
            return self.batch_rows.long()
        return torch.arange(self.attn.batch, device=device)


def _uniform_count(value: object, batch: int, device: torch.device) -> int | None:
    """cache_seqlens checked: the count, when one for every sequence is known on the host (an int, or a
    one-element tensor validation may read); None when there is none or the device holds them (_bind)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        check_index_tensor("cache_seqlens", value, (batch,), device)
        return None
    if isinstance(value, torch.Tensor) and not may_read(value):  # one count for all, left on the device
        check_integer_tensor("cache_seqlens", value)
        return None
    count = as_int("cache_seqlens", value)
    if count < 0:
        raise InputError(f"cache_seqlens: {count} is negative")
    return count


def _check(
    q: object, k_cache: object, v_cache: object, k: object, v: object, rotary_cos: object,
    rotary_sin: object, cache_seqlens: object, cache_batch_idx: object, cache_leftpad: object,
    block_table: object, softmax_scale: object, causal: object, window_size: object, softcap: object,
    rotary_interleaved: object, alibi_slopes: object, num_splits: object,
) -> CacheCall:  # fmt: skip
    layout = "(batch, seqlen, heads, head_dim)"
    q = check_tensor("q", q, 4, layout)
    is_paged = block_table is not None
    cache_layout = "(num_blocks, page_block_size, heads_k, head_dim)" if is_paged else (
        "(batch_cache, seqlen_cache, heads_k, head_dim)"
    )  # fmt: skip
    k_cache = check_tensor("k_cache", k_cache, 4, cache_layout)
    v_cache = check_tensor("v_cache", v_cache, 4, cache_layout)
    check_same(q, k_cache, v_cache, "k_cache", "v_cache")
    batch, seqlen_q = q.shape[0], q.shape[1]
    device = q.device

    if is_paged:
        if cache_batch_idx is not None:
            raise InputError(
                "cache_batch_idx: not supported with a paged cache (block_table); pass one of them"
            )
        if cache_leftpad is not None:
            raise InputError(
                "cache_leftpad: not supported with a paged cache (block_table); pass one of them"
            )
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            raise InputError("block_table: expected a 2-D torch.int32 tensor (batch, max_num_blocks_per_seq)")
        capacity = block_table.shape[1] * k_cache.shape[1]  # the table itself: check_block_table below
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is not None:
            check_index_tensor("cache_batch_idx", cache_batch_idx, (batch,), device)
        elif k_cache.shape[0] != batch:
            raise InputError(
                f"k_cache: batch {k_cache.shape[0]} differs from q's {batch}; pass cache_batch_idx to pick "
                "cache rows, or a cache with q's batch"
            )

    seqlen_new = 0
    if k is not None or v is not None:
        if k is None or v is None:
            raise InputError("k, v: pass both new keys and new values, or neither")
        k = check_tensor("k", k, 4, layout)
        v = check_tensor("v", v, 4, layout)
        check_same(q, k, v)
        if k.shape[0] != batch or k.shape[2] != k_cache.shape[2]:
            raise InputError(
                f"k: shape {tuple(k.shape)} must be (batch {batch}, seqlen_new, heads_k {k_cache.shape[2]}, "
                f"head_dim {k_cache.shape[3]}) to be appended to the cache"
            )
        if cache_seqlens is None:
            raise InputError("cache_seqlens: required with new k/v (where in the cache they are written)")
        seqlen_new = k.shape[1]
    uniform = _uniform_count(cache_seqlens, batch, device)
    if uniform is not None and uniform + seqlen_new > capacity:
        raise InputError(
            f"cache_seqlens: {uniform} keys + {seqlen_new} new = {uniform + seqlen_new}, more than the "
            f"cache's {capacity}; allocate a longer cache (or more block_table columns)"
        )
    if cache_leftpad is not None:
        check_index_tensor("cache_leftpad", cache_leftpad, (batch,), device)
    if is_paged:  # the table's metadata; its values: _check_values
        check_block_table(block_table, batch, k_cache.shape[0], k_cache.shape[1], None, device)

    if rotary_cos is not None or rotary_sin is not None:
        _check_rotary(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_new, capacity)

    splits = as_int("num_splits", num_splits)
    if splits < 0:
        raise InputError(f"num_splits: {splits} must be >= 0 (0: choose automatically)")
    opts = check_options(q, batch, q.shape[2], 0.0, softmax_scale, softcap, alibi_slopes)

    # The layout's features and page size; its tensors are each call's (_bind), passed beside the call.
    # Counts the host does not know are the kernels' per-sequence key counts (seqused_k).
    needs = (
        ("seqused_k", isinstance(cache_seqlens, torch.Tensor) and uniform is None),
        ("leftpad_k", cache_leftpad is not None),
        ("cache_batch_idx", cache_batch_idx is not None),
        ("paged_kv", is_paged),
    )
    features = frozenset(name for name, needed in needs if needed)
    kv = KvLayout(page_size=k_cache.shape[1] if is_paged else 0, features=features)
    key_len = capacity if uniform is None else uniform + seqlen_new
    # flash-attn normalises the window against the cache's capacity; the attention then runs over key_len
    attn = make_call(
        q,
        k_cache,
        v_cache,
        batch,
        seqlen_q,
        capacity,
        opts,
        causal,
        window_size,
        False,
        kv=kv,
        key_len=key_len,
    )
    return CacheCall(attn, capacity, seqlen_new, None, uniform, None, None, None, None, splits, None)


def _bind(
    shape: CacheCall,
    cache_seqlens: object,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    rotary_interleaved: object,
    k_cache: torch.Tensor,
) -> CacheCall:
    """The call `shape` (_check's, validated for these arguments' metadata) with this call's tensors,
    their values checked (_check_counts, _check_values); `shape` itself when there are none. Its AttnCall
    stays shape's (tensor-free: its route and op arguments are kept, interface.decide); the kernels' index
    tensors go beside it (`index_args`)."""
    attn, counts, used = shape.attn, None, None
    counts_only = cache_batch_idx is None and cache_leftpad is None and block_table is None
    if isinstance(cache_seqlens, torch.Tensor) and shape.uniform is None:
        counts = cache_seqlens
        if cache_seqlens.dim() == 0:  # one count for all, left on the device
            counts = cache_seqlens.to(device=attn.device).reshape(()).expand(attn.batch)
        elif counts_only and may_read(cache_seqlens):  # a decode step: its counts are all to check
            _check_counts(cache_seqlens, shape.seqlen_new, shape.capacity, attn.batch)
        used = _key_counts(counts, shape.seqlen_new)
    elif counts_only and rotary_cos is None:
        return shape
    rot = None
    if rotary_cos is not None and rotary_sin is not None:
        rot = Rotary(rotary_cos, rotary_sin, bool(rotary_interleaved))
    index = (None, None, used, cache_leftpad, cache_batch_idx, block_table)
    req = CacheCall(
        shape.attn, shape.capacity, shape.seqlen_new, counts, shape.uniform, cache_leftpad, cache_batch_idx,
        block_table, rot, shape.num_splits, index,
    )  # fmt: skip
    if not counts_only:
        _check_values(req, cache_seqlens, k_cache.shape[0])
    return req


def _check_counts(cache_seqlens: torch.Tensor, seqlen_new: int, capacity: int, batch: int) -> None:
    """A (batch,) cache_seqlens that validation may read (inputs.may_read), without other index tensors:
    every sequence's keys after the append fit its cache."""
    if not _all_fit(cache_seqlens.tolist(), seqlen_new, capacity):
        _check_bounds(cache_seqlens, None, None, seqlen_new, capacity, batch)  # raises


def _check_values(req: CacheCall, cache_seqlens: object, cache_rows: int) -> None:
    """The checks that read index tensors' values, with cache_batch_idx, cache_leftpad or block_table
    (without them: _check_counts): where inputs.may_read allows (CPU tensors, FA_CHECK_INDICES=1), and
    flash-attn's own bound on a paged cache. cache_rows: k_cache's dim 0 (the pages of a paged cache)."""
    attn, rows = req.attn, req.batch_rows
    if rows is not None and may_read(rows):
        batch_cache = cache_rows
        bad = [i for i in rows.tolist() if not 0 <= i < batch_cache]
        if bad:
            raise InputError(
                f"cache_batch_idx: {bad[0]} is outside the cache's {batch_cache} rows; "
                "indices must be in [0, batch_cache)"
            )
    _check_bounds(cache_seqlens, req.uniform, req.leftpad, req.seqlen_new, req.capacity, attn.batch)
    if req.block_table is not None:
        ends = _known_ends(cache_seqlens, req.uniform, req.seqlen_new, req.capacity, attn.batch)
        if ends is not None:
            check_block_table(req.block_table, attn.batch, cache_rows, attn.kv.page_size, ends, attn.device)
        _paged_bound(cache_seqlens, req.seqlen_new, req.capacity)


def _key_counts(cache_seqlens: torch.Tensor, seqlen_new: int) -> torch.Tensor:
    """The kernels' seqused_k: each sequence's keys after the append, int32, contiguous; the caller's
    tensor itself when it already is that (a decode step without new keys makes no tensor)."""
    counts = cache_seqlens + seqlen_new if seqlen_new else cache_seqlens
    if counts.dtype != torch.int32:  # (a 1-D cache_seqlens is int32: _check; .to costs a torch call)
        counts = counts.to(torch.int32)
    return counts.contiguous()


def _host_values(value: object) -> list[int] | None:
    """A (batch,) index tensor's values where validation may read them (inputs.may_read), else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and may_read(value):
        return value.tolist()  # (an integer tensor's: ints)
    return None


def _all_fit(lengths: list[int], seqlen_new: int, capacity: int) -> bool:
    """Every count is >= 0 and fits the cache with the new keys (by min and max: no Python loop over the
    batch; _check_bounds' loop names the sequence that does not)."""
    return not lengths or (min(lengths) >= 0 and max(lengths) + seqlen_new <= capacity)


def _check_bounds(
    cache_seqlens: object,
    uniform: int | None,
    pad: torch.Tensor | None,
    seqlen_new: int,
    capacity: int,
    batch: int,
) -> None:
    """Every sequence's keys fit its cache and its first key is among them, where the values are host
    data (a bad count makes the kernels read out of bounds; on a GPU, FA_CHECK_INDICES=1 checks too).
    An int count alone was checked by _check."""
    if pad is None and not isinstance(cache_seqlens, torch.Tensor):
        return
    lengths = [uniform] * batch if uniform is not None else _host_values(cache_seqlens)
    starts = _host_values(pad) if pad is not None else None  # (None: every first key is 0)
    if starts is None and (lengths is None or _all_fit(lengths, seqlen_new, capacity)):
        return  # nothing to read, or every count fits
    for b in range(batch):
        n = lengths[b] if lengths is not None else None
        if n is not None and n < 0:
            raise InputError(f"cache_seqlens: {n} for sequence {b} is negative")
        if n is not None and n + seqlen_new > capacity:
            raise InputError(
                f"cache_seqlens: sequence {b} holds {n} keys + {seqlen_new} new = {n + seqlen_new}, more "
                f"than the cache's {capacity}; allocate a longer cache (or more block_table columns)"
            )
        end = n if n is not None else capacity
        if starts is not None and not 0 <= starts[b] <= end:
            raise InputError(
                f"cache_leftpad: {starts[b]} for sequence {b} must be in [0, cache_seqlens] ([0, {end}])"
            )


def _known_ends(
    cache_seqlens: object, uniform: int | None, seqlen_new: int, capacity: int, batch: int
) -> tuple[int, ...] | None:
    """Each sequence's keys after the append, where known on the host (None: not read)."""
    if cache_seqlens is None:
        return (capacity,) * batch
    if uniform is not None:
        return (uniform + seqlen_new,) * batch
    lengths = _host_values(cache_seqlens)
    return None if lengths is None else tuple(n + seqlen_new for n in lengths)


def _paged_bound(cache_seqlens: object, seqlen_new: int, capacity: int) -> None:
    """flash-attn's one host check on a paged cache (mha_fwd_kvcache, flash-attn PR #2711): the longest
    sequence fits the pages block_table gives it, else the kernels would index past the table. Like
    flash-attn, one `.max().item()` per call on a device tensor, and never while torch.compile traces or
    a CUDA graph captures (no read is possible there)."""
    if not isinstance(cache_seqlens, torch.Tensor) or type(cache_seqlens) is not torch.Tensor:
        return
    if cache_seqlens.numel() == 0 or cache_seqlens.is_meta or may_read(cache_seqlens):
        return  # host values were checked by _check_bounds; meta tensors have none
    if torch.compiler.is_compiling():
        return
    if cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    longest = int(cache_seqlens.max().item()) + seqlen_new
    if longest > capacity:
        raise InputError(
            f"block_table: the longest sequence needs {longest} keys (max(cache_seqlens) + {seqlen_new} new) "
            f"but block_table addresses {capacity}; add columns to block_table"
        )


def _check_rotary(
    q: torch.Tensor, cos: object, sin: object, interleaved: object, seqlen_new: int, capacity: int
) -> Rotary:
    if cos is None or sin is None:
        raise InputError("rotary_cos, rotary_sin: pass both, or neither")
    if seqlen_new == 0:
        raise InputError("rotary_cos: rotary embedding needs the new k and v (it rotates q and the new keys)")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise InputError(f"{name}: expected a 2-D tensor (seqlen_rotary, rotary_dim / 2)")
        if t.dtype != q.dtype or t.device != q.device:
            raise InputError(
                f"{name}: must have q's dtype {q.dtype} and device {q.device}; pass {name}.to(q)"
            )
    assert isinstance(cos, torch.Tensor)
    assert isinstance(sin, torch.Tensor)
    if cos.shape != sin.shape:
        raise InputError(f"rotary_sin: shape {tuple(sin.shape)} differs from rotary_cos's {tuple(cos.shape)}")
    if 2 * cos.shape[1] > q.shape[-1]:
        raise InputError(
            f"rotary_cos: rotary_dim {2 * cos.shape[1]} (2 x its dim 1) is larger than head_dim {q.shape[-1]}"
        )
    if cos.shape[0] < capacity:
        raise InputError(
            f"rotary_cos: {cos.shape[0]} positions, fewer than the cache's {capacity}; "
            "cos/sin need a row for every cache position"
        )
    return Rotary(cos, sin, bool(interleaved))


def _positions(req: CacheCall, seqlen: int, per_token: bool, device: torch.device) -> torch.Tensor:
    """(batch, seqlen) rotary positions: cache_seqlens[b] + t, or cache_seqlens[b] for every token."""
    counts = req.counts(device)
    assert counts is not None  # rotary and the append need cache_seqlens (_check)
    base = counts.unsqueeze(1)
    steps = torch.arange(seqlen, device=device).unsqueeze(0)
    return base + steps if per_token else base.expand(-1, seqlen)


def _append(
    req: CacheCall, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write the new rows into the cache in place (index_copy_ into the cache's (rows * seqlen) view)."""
    device = k_cache.device
    pos = _positions(req, req.seqlen_new, True, device)  # (batch, seqlen_new) cache rows
    width = k_cache.shape[1]
    if req.block_table is not None:
        pages = torch.gather(req.block_table.to(torch.long), 1, pos // width)
        flat = pages * width + pos % width
    else:
        flat = req.rows(device).unsqueeze(1) * width + pos
    for cache, new in ((k_cache, k), (v_cache, v)):
        if cache.shape[0] > 1 and cache.stride(0) != width * cache.stride(1):  # rows not one view: index
            cache[flat // width, flat % width] = new
        else:
            cache.view(-1, *cache.shape[2:]).index_copy_(0, flat.reshape(-1), new.reshape(-1, *new.shape[2:]))


def _attend_cache(
    req: CacheCall, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    call = req.attn
    route = interface.route_for(call, q, k_cache, v_cache, splitkv=True)
    if route.path != "fallback":
        if req.block_table is None and call.seqlen_k < k_cache.shape[1]:  # none reads past row seqlen_k
            k_cache, v_cache = k_cache.narrow(1, 0, call.seqlen_k), v_cache.narrow(1, 0, call.seqlen_k)
        return interface.run_kernels(call, route, q, k_cache, v_cache, req.num_splits, req.index_args)
    return _fallback(req, q, k_cache, v_cache, want_lse)


def _cache_keys(req: CacheCall, cache: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """(batch, seqlen_k, heads_k, dim): sequence b's keys from its first one on, read on the device."""
    width = req.attn.seqlen_k
    if req.block_table is not None:
        return fallback.gather_keys(cache, first, width, req.block_table)
    rows = req.rows(cache.device)
    slots = (first.unsqueeze(1) + torch.arange(width, device=cache.device)).clamp(
        0, max(cache.shape[1] - 1, 0)
    )
    return fallback.rows_of(cache.flatten(0, 1), rows.unsqueeze(1) * cache.shape[1] + slots)


def _fallback(
    req: CacheCall, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each sequence's keys [first key, cache_seqlens + seqlen_new) gathered into a padded batch on the
    device, then the fallback's attention with per-sequence key counts."""
    call = req.attn
    if req.block_table is None and req.leftpad is None and req.cache_seqlens is None and call.seqlen_k:
        # Every sequence has call.seqlen_k keys from its row 0 (an int cache_seqlens, or full caches): a
        # padded call on a view of the cache, whose plain cases SDPA serves directly.
        keys, values = k_cache, v_cache
        if req.batch_rows is not None:
            rows = req.rows(q.device)
            keys, values = fallback.rows_of(k_cache, rows), fallback.rows_of(v_cache, rows)
        if call.seqlen_k < keys.shape[1]:  # (a narrow costs a torch call: a full cache needs none)
            keys, values = keys.narrow(1, 0, call.seqlen_k), values.narrow(1, 0, call.seqlen_k)
        return fallback.attention(call, q, keys, values, want_lse)
    batch, seqlen_q = q.shape[0], q.shape[1]
    device = q.device
    first = (
        req.leftpad.long() if req.leftpad is not None else torch.zeros(batch, dtype=torch.long, device=device)
    )
    counts = req.counts(device)
    if counts is not None:
        ends = counts + req.seqlen_new
    else:
        ends = torch.full((batch,), req.capacity, dtype=torch.long, device=device)
    if batch == 0 or call.seqlen_k == 0:
        out = q.new_zeros(q.shape)
        lse = q.new_full((batch, q.shape[2], seqlen_q), float("inf"), dtype=torch.float32)
        return out, (lse if want_lse else None)
    keys, values = _cache_keys(req, k_cache, first), _cache_keys(req, v_cache, first)
    lengths = (torch.full((batch,), seqlen_q, dtype=torch.long, device=device), ends - first)
    return fallback.padded_attention(call, q, keys, values, want_lse, lengths)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: IntLike | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: WindowSize = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: IntLike = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (batch, seqlen_q, heads, head_dim) over a KV cache, after appending k/v to it.

    k_cache/v_cache: (batch_cache, seqlen_cache, heads_k, head_dim), or with block_table
    (num_blocks, page_block_size, heads_k, head_dim) and block_table (batch, max_num_blocks_per_seq) int32.
    k/v (batch, seqlen_new, heads_k, head_dim): written into the cache in place at rows
    cache_seqlens[b] .. + seqlen_new. cache_seqlens: an int (any integer-like) or a (batch,) int32 tensor;
    None means every sequence's cache is full. cache_batch_idx (batch,) int32: the cache row of each
    sequence. cache_leftpad (batch,) int32: the first valid key of each sequence.
    rotary_cos/sin (seqlen_rotary, rotary_dim / 2): rotate the new k at positions cache_seqlens[b] + t and
    q the same way when causal or windowed (else every query at cache_seqlens[b]); rotary_interleaved
    pairs features 2i, 2i + 1 (GPT-J) instead of i, i + rotary_dim / 2 (GPT-NeoX).
    Returns out like q, and softmax_lse (batch, heads, seqlen_q) fp32 with return_softmax_lse=True.
    No backward (as flash-attn). Which layouts run on the kernels: the module docstring.
    """
    # Without index tensors or rotary (an int cache_seqlens), every option is plain data, typed in one
    # pass; with them, they are keyed one by one (metadata), and each call's are attached (_bind). A
    # decode step's only index tensor is cache_seqlens: keyed beside k, v, without the absent ones.
    lengths_only = (
        cache_batch_idx is None and cache_leftpad is None and block_table is None and rotary_cos is None
    )
    plain = lengths_only and not isinstance(cache_seqlens, torch.Tensor)
    key = None
    if not torch.compiler.is_compiling():
        if plain:
            options = (
                rotary_sin, cache_seqlens, softmax_scale, causal, softcap, rotary_interleaved, alibi_slopes,
                num_splits,
            )  # fmt: skip
            key = call_cache.key("kvcache", q, k_cache, v_cache, options, window_size, (k, v))
        elif lengths_only:  # (rotary_sin without rotary_cos: a tensor option, so not keyed)
            lengths_options = (
                rotary_sin, softmax_scale, causal, softcap, rotary_interleaved, alibi_slopes, num_splits,
            )  # fmt: skip
            key = call_cache.key(
                "kvcache-lengths", q, k_cache, v_cache, lengths_options, window_size, (k, v), (cache_seqlens,)
            )  # fmt: skip
        else:
            scalars = (softmax_scale, causal, softcap, rotary_interleaved, alibi_slopes, num_splits)
            key = call_cache.key(
                "kvcache-index", q, k_cache, v_cache, scalars, window_size, (k, v, rotary_cos, rotary_sin),
                (cache_seqlens, cache_batch_idx, cache_leftpad, block_table),
            )  # fmt: skip
    shape = call_cache.known(key)
    if shape is None:
        shape = _check(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes,
            num_splits,
        )  # fmt: skip
        if not (isinstance(cache_seqlens, torch.Tensor) and shape.uniform is not None):  # (a value read)
            call_cache.remember(key, shape)
    req = shape
    if not plain:
        req = _bind(
            shape, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,
            rotary_interleaved, k_cache,
        )  # fmt: skip
    if req.rotary is not None:
        assert k is not None  # rotary needs the new keys (_check_rotary)
        cos, sin, interleaved = req.rotary.cos, req.rotary.sin, req.rotary.interleaved
        per_token = req.attn.causal or req.attn.has_window
        q = rope.rotate(q, cos, sin, _positions(req, q.shape[1], per_token, q.device), interleaved)
        k = rope.rotate(k, cos, sin, _positions(req, req.seqlen_new, True, q.device), interleaved)
    if k is not None and v is not None and req.seqlen_new:  # _check: seqlen_new > 0 means both given
        _append(req, k_cache, v_cache, k, v)
    out, lse = _attend_cache(req, q, k_cache, v_cache, return_softmax_lse)
    if return_softmax_lse:
        assert lse is not None  # asked for, so computed
        return out, lse
    return out
