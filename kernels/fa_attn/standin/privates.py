"""flash-attn 2.8.3's private forward/backward functions, which real code calls directly.

Ring-attention, context-parallel and RL trainers call `_flash_attn_forward`, `_flash_attn_backward` and
their varlen forms (flash_attn_interface.py) to build their own autograd; diffusers requires
`_wrapped_flash_attn_forward` / `_wrapped_flash_attn_backward` (flash-attn 2.7+'s torch.library ops of
the same functions) before it enables its flash backends. Each function here has flash-attn 2.8.3's
signature and results and runs on flash_attn_ext (fa_attn's stand-in for the compiled extension, whose
docstring lists what differs). The `_wrapped_*` forms are torch.library custom ops (namespace fa_attn,
with fake kernels), so torch.compile traces a caller without graph breaks, as with flash-attn's; like
flash-attn's, the backward ops write the gradients into the dq, dk, dv they are given.
"""

from __future__ import annotations

import torch

from . import extension as flash_attn_ext

Tensor = torch.Tensor


def _flash_attn_forward(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float, alibi_slopes: Tensor | None,
    return_softmax: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (out, softmax_lse, S_dmask, rng_state)."""
    out, lse, probs, rng = flash_attn_ext.fwd(
        q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left,
        window_size_right, softcap, return_softmax, None,
    )  # fmt: skip
    return out, lse, probs, rng


def _flash_attn_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int = -1,
    window_size_right: int = -1, softcap: float = 0.0, alibi_slopes: Tensor | None = None,
    return_softmax: bool = False, block_table: Tensor | None = None, leftpad_k: Tensor | None = None,
    seqused_k: Tensor | None = None, zero_tensors: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (out, softmax_lse (heads, total_q), S_dmask, rng_state)."""
    out, lse, probs, rng = flash_attn_ext.varlen_fwd(
        q, k, v, None, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left,
        window_size_right, softcap, return_softmax, None,
    )  # fmt: skip
    return out, lse, probs, rng


def _flash_attn_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq: Tensor | None,
    dk: Tensor | None, dv: Tensor | None, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float, alibi_slopes: Tensor | None,
    deterministic: bool, rng_state: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Writes the gradients into dq, dk, dv; -> softmax_d."""
    *_, softmax_d = flash_attn_ext.bwd(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, dropout_p, softmax_scale, causal,
        window_size_left, window_size_right, softcap, deterministic, None, rng_state,
    )  # fmt: skip
    return softmax_d


def _flash_attn_varlen_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq: Tensor | None,
    dk: Tensor | None, dv: Tensor | None, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, alibi_slopes: Tensor | None, deterministic: bool,
    rng_state: Tensor | None = None, zero_tensors: bool = False,
) -> Tensor:  # fmt: skip
    """Writes the gradients into dq, dk, dv; -> softmax_d."""
    *_, softmax_d = flash_attn_ext.varlen_bwd(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left,
        window_size_right, softcap, deterministic, None, rng_state,
    )  # fmt: skip
    return softmax_d


# ---- the torch.library forms ----------------------------------------------------------------------

_wrapped_flash_attn_forward = torch.library.custom_op("fa_attn::flash_attn_forward", mutates_args=())(
    _flash_attn_forward
)
_wrapped_flash_attn_varlen_forward = torch.library.custom_op(
    "fa_attn::flash_attn_varlen_forward", mutates_args=()
)(_flash_attn_varlen_forward)
_wrapped_flash_attn_backward = torch.library.custom_op(
    "fa_attn::flash_attn_backward", mutates_args=("dq", "dk", "dv")
)(_flash_attn_backward)
_wrapped_flash_attn_varlen_backward = torch.library.custom_op(
    "fa_attn::flash_attn_varlen_backward", mutates_args=("dq", "dk", "dv")
)(_flash_attn_varlen_backward)


def _round128(n: int) -> int:
    return (n + 127) // 128 * 128


def _forward_results(
    q: Tensor, lse_shape: tuple[int, ...], probs_shape: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (
        torch.empty_like(q),
        q.new_empty(lse_shape, dtype=torch.float32),
        q.new_empty(probs_shape),
        q.new_empty((2,), dtype=torch.int64),
    )


@_wrapped_flash_attn_forward.register_fake
def _forward_fake(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, *rest: object
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    probs = (batch, heads, _round128(seqlen_q), _round128(k.shape[1])) if rest[-1] else (0,)  # return_softmax
    return _forward_results(q, (batch, heads, seqlen_q), probs)


@_wrapped_flash_attn_varlen_forward.register_fake
def _varlen_forward_fake(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int = -1,
    window_size_right: int = -1, softcap: float = 0.0, alibi_slopes: Tensor | None = None,
    return_softmax: bool = False, *_rest: object, **_options: object,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    batch, heads = cu_seqlens_q.shape[0] - 1, q.shape[1]
    probs = (batch, heads, _round128(max_seqlen_q), _round128(max_seqlen_k)) if return_softmax else (0,)
    return _forward_results(q, (heads, q.shape[0]), probs)


@_wrapped_flash_attn_backward.register_fake
def _backward_fake(dout: Tensor, q: Tensor, *_rest: object, **_options: object) -> Tensor:
    return q.new_empty((q.shape[0], q.shape[2], _round128(q.shape[1])), dtype=torch.float32)


@_wrapped_flash_attn_varlen_backward.register_fake
def _varlen_backward_fake(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq: Tensor | None,
    dk: Tensor | None, dv: Tensor | None, cu_seqlens_q: Tensor, *_rest: object, **_options: object,
) -> Tensor:  # fmt: skip
    batch = cu_seqlens_q.shape[0] - 1
    return q.new_empty((q.shape[1], q.shape[0] + 128 * batch), dtype=torch.float32)


# flash_attn_interface's two helpers, which ring-attention code imports with the privates
# (maybe_contiguous before calling _flash_attn_forward, round_multiple to size softmax_lse).
def maybe_contiguous(x: Tensor | None) -> Tensor | None:
    """x with a contiguous last dimension (what the kernels take), as flash-attn 2.8.3's helper."""
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def round_multiple(x: int, m: int) -> int:
    """x rounded up to a multiple of m, as flash-attn 2.8.3's helper."""
    return (x + m - 1) // m * m


NAMES = (
    "maybe_contiguous",
    "round_multiple",
    "_flash_attn_forward",
    "_flash_attn_varlen_forward",
    "_flash_attn_backward",
    "_flash_attn_varlen_backward",
    "_wrapped_flash_attn_forward",
    "_wrapped_flash_attn_varlen_forward",
    "_wrapped_flash_attn_backward",
    "_wrapped_flash_attn_varlen_backward",
)
