"""Validated calls, kept per what validation reads: a decode loop repeats one call's shapes thousands of
times, and checking them again each time cost more host time than the kernel (issue 26).

A call's validation (inputs.check_padded, kvcache's check) depends only on its tensors' metadata (type,
shape, strides, dtype, device) and on its other arguments' values when those are plain data, so `key`
builds a key of exactly those, and `remember`/`known` keep what validation gave. A call is keyed only
when every part is plain: plain tensors (not fake, traced or subclassed) where tensors are validated by
their metadata, and None, bools, ints, floats or tuples of ints for the rest; ALiBi slopes and any call
while torch.compile traces are validated as usual. A KV-cache call's index tensors (cache_seqlens,
block_table, ...) are keyed by their metadata, and what is kept is a template without them, to which
each call attaches its own (kvcache._bind); their values are never read for the key. So nothing kept
holds a tensor. The decision that follows has its own memos (interface.decide).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .inputs import AttnCall

_LIMIT = 512  # distinct calls kept; a process that exceeds it starts over
_lock = threading.Lock()
_kept: dict[tuple[object, ...] | None, Any] = {}  # (None is never a key: see remember)
_PLAIN = frozenset({type(None), bool, int, float})

Key = tuple[object, ...]


def key(
    kind: str,
    q: object,
    k: object,
    v: object,
    options: tuple[object, ...],
    window: object,
    more: tuple[object, ...] = (),
    indices: tuple[object, ...] = (),
) -> Key | None:
    """The key of a call of `kind` ("padded", "kvcache"): the metadata of its tensors q, k, v, its
    options with their types (validation tells 1, 1.0 and True apart; a dict would not), its window
    size, and `more`: tensors by their metadata (never their values), None, or plain values with their
    types; None where a part is not plain data. `indices`: the same for index tensors, keyed without
    their strides (inputs.check_index_tensor reads dtype, device and shape; the kernels' copies are made
    per call). A caller passing tensors keeps only what validation found of their metadata (kvcache's
    tensor-free templates)."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    types = tuple(map(type, options))
    if not _PLAIN.issuperset(types):
        return None
    if (
        type(window) is not tuple
        or len(window) != 2
        or type(window[0]) is not int
        or type(window[1]) is not int
    ):
        return None
    # Unrolled for q, k, v: a decode step builds this key every call.
    found = [
        kind, options, types, window, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
        k.device, v.shape, v.stride(), v.dtype, v.device,
    ]  # fmt: skip
    for t in more:  # each part's first item says its kind: None, a torch.Size, or a type
        if t is None:
            found.append(None)
        elif type(t) is torch.Tensor:
            found += (t.shape, t.stride(), t.dtype, t.device)
        elif type(t) in _PLAIN:
            found += (type(t), t)
        else:
            return None
    for t in indices:
        if t is None:
            found.append(None)
        elif type(t) is torch.Tensor:
            found += (t.shape, t.dtype, t.device)
        elif type(t) in _PLAIN:
            found += (type(t), t)
        else:
            return None
    return tuple(found)


# known(key): what validation gave for this key, or None (never seen, or None: not keyable, never kept).
# The dict's own get: a decode step calls it every time, and a Python frame around it costs.
known = _kept.get


def tensor_free(call: AttnCall) -> bool:
    """Whether an AttnCall holds no tensor: only such calls are kept (a kept tensor would outlive its
    caller). Keyed calls are (`key` refuses tensor options); interface.decide asks of any call."""
    kv = call.kv  # (its tensors one by one: KvLayout.features builds a set)
    return (
        call.alibi_slopes is None
        and call.varlen is None
        and kv.seqused_k is None
        and kv.leftpad_k is None
        and kv.kv_batch_idx is None
        and kv.block_table is None
    )


def remember(key: Key | None, validated: object) -> None:
    if key is None:
        return
    with _lock:
        if len(_kept) >= _LIMIT:
            _kept.clear()
        _kept[key] = validated


def clear() -> None:
    with _lock:
        _kept.clear()
