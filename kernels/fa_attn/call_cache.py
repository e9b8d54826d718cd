"""Validated calls, kept per what validation reads: a decode loop repeats one call's shapes thousands of
times, and checking them again each time cost more host time than the kernel (issue 26).

A padded call's validation (inputs.check_padded) depends only on its tensors' metadata (type, shape,
last stride, dtype, device) and its scalar options, so `padded_key` builds a key of exactly those, and
`remember`/`known` keep the AttnCall it gave. A call is keyed only when every part is plain data: plain
tensors (not fake, traced or subclassed), no ALiBi tensor, a window given as a tuple of ints, numbers
for the scalars; anything else (and any call while torch.compile traces) is validated as usual. The
decision that follows has its own memos (interface.decide).
"""

from __future__ import annotations

import threading

import torch

from .inputs import AttnCall

_LIMIT = 512  # distinct shapes kept; a process that exceeds it starts over
_lock = threading.Lock()
_calls: dict[tuple[object, ...], AttnCall] = {}
_SCALARS = (int, float)


def padded_key(
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
) -> tuple[object, ...] | None:
    """The key of a flash_attn_func call, or None where a part is not plain data."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if alibi_slopes is not None or type(window_size) is not tuple or len(window_size) != 2:
        return None
    if type(window_size[0]) is not int or type(window_size[1]) is not int:
        return None
    if not (isinstance(dropout_p, _SCALARS) and isinstance(softcap, _SCALARS)):
        return None
    if softmax_scale is not None and not isinstance(softmax_scale, _SCALARS):
        return None
    if type(causal) is not bool or type(deterministic) is not bool:
        return None
    # Of the strides, validation reads the last one only (the head dim must be contiguous).
    return (
        q.shape, k.shape, v.shape, q.stride(-1), k.stride(-1), v.stride(-1), q.dtype, k.dtype, v.dtype,
        q.device, k.device, v.device, dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
    )  # fmt: skip


def known(key: tuple[object, ...] | None) -> AttnCall | None:
    return None if key is None else _calls.get(key)


def tensor_free(call: AttnCall) -> bool:
    """Whether the call holds no tensor: only such calls are kept (a kept tensor would outlive its caller)."""
    return call.alibi_slopes is None and call.varlen is None and not call.kv.features


def remember(key: tuple[object, ...] | None, call: AttnCall) -> None:
    if key is None or not tensor_free(call):
        return
    with _lock:
        if len(_calls) >= _LIMIT:
            _calls.clear()
        _calls[key] = call


def clear() -> None:
    with _lock:
        _calls.clear()
