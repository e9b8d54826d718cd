"""fa_attn behind torch's own scaled_dot_product_attention (SDPA) flash path, through the registry for
external flash-attention implementations that torch 2.13 added (torch/nn/attention/_registry.py; torch's
FA3 and FA4 adapters use it).

`import fa_attn` registers fa under the name "fa" and activates nothing (torch asks providers to let users
opt in). After

    torch.nn.attention.activate_flash_attention_impl("fa")

every call that SDPA sends to its flash backend (F.scaled_dot_product_attention on CUDA, and so every
model that uses SDPA) runs `aten::_scaled_dot_product_flash_attention` and its backward here: fa's
kernels where they serve the call, else fa's fallback, with fa's reasons (last_dispatch(), explain(),
FA_STRICT). `torch.nn.attention.restore_flash_attention_impl()` puts torch's own back. fa's fallback
runs with SDPA's flash backend excluded, so it never calls back into itself.

What differs from torch's FA2: dropout is refused (fa keeps no RNG state to replay it in the backward:
use dropout 0, or restore torch's implementation); the backward is flash_attn_ext.bwd (fa's backward
kernel on out and logsumexp, or on the fallback flash-attn's formula on them). On torch before
2.13 there is no registry: `supported()` is False,
nothing is registered, and SDPA keeps torch's implementation; call fa_attn's functions directly there.
Not verified on a GPU: tests/api runs it with the emulated kernels.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.library import Library
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..runtime.dispatch import FaFallbackWarning
from ..runtime.interface import flash_attn_func
from . import extension as flash_attn_ext

NAME = "fa"
# The dispatch key the implementations are registered for: SDPA's flash path runs on CUDA. (tests/api
# registers them for the CPU, where the emulated kernels run.)
DISPATCH_KEY = "CUDA"
# SDPA's other backends: what fa's fallback may use while SDPA's flash path is fa itself.
_NOT_FLASH = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]


def supported() -> bool:
    """Whether this torch has the registry (torch >= 2.13)."""
    return hasattr(torch.nn.attention, "register_flash_attention_impl")


def register() -> bool:
    """Add fa to torch's registry, not activated; False on a torch without the registry."""
    if not supported():
        return False
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=activate)
    return True


@dataclass
class Handle:
    """What the registry keeps while fa is active; remove() unregisters fa's implementations."""

    library: Library | None

    def remove(self) -> None:
        self.library = None  # dropping the Library deregisters its kernels (as torch's FA4 adapter does)


NO_CUDA = (
    "fa is now SDPA's flash path on CUDA, but torch sees no CUDA device here: SDPA calls on this machine "
    "keep running torch's own CPU kernels, not fa (fa_attn's functions still run, on its fallback)"
)


def activate() -> Handle:
    """The registry's register_fn: fa's implementations of SDPA's flash operators. Without a CUDA device
    they can never be reached, which is said once, here, instead of nothing happening silently."""
    if DISPATCH_KEY == "CUDA" and not torch.cuda.is_available():
        warnings.warn(NO_CUDA, FaFallbackWarning, stacklevel=3)
    library = Library("aten", "IMPL", DISPATCH_KEY)
    library.impl("_scaled_dot_product_flash_attention", _forward, DISPATCH_KEY)
    library.impl("_scaled_dot_product_flash_attention_backward", _backward, DISPATCH_KEY)
    return Handle(library)


def _bshd(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """SDPA's (batch, heads, seqlen, dim) as flash-attn's (batch, seqlen, heads, dim): views."""
    return tuple(t.transpose(1, 2) for t in tensors)


def _forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    if dropout_p > 0:
        raise RuntimeError(
            f"dropout_p: {dropout_p}: fa's SDPA flash implementation does not run dropout (it keeps no RNG "
            "state for the backward); use dropout_p=0, or torch.nn.attention.restore_flash_attention_impl()"
        )
    q, k, v = _bshd(query, key, value)
    with sdpa_kernel(_NOT_FLASH):
        out, lse = cast(
            tuple[torch.Tensor, torch.Tensor],
            flash_attn_func(q, k, v, 0.0, scale, is_causal, return_lse=True),
        )
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=query.device)
    unused = torch.zeros((), dtype=torch.uint64, device=query.device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=query.device)
    # cum_seq_q/k are None for a dense call, as in torch's own FA3/FA4 adapters.
    return (out.transpose(1, 2), lse, None, None, q.shape[1], k.shape[1], rng_state, unused, debug_mask)


def _backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dout, q, k, v, o = _bshd(grad_out, query, key, value, out)
    softmax_scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    with sdpa_kernel(_NOT_FLASH):
        dq, dk, dv, _ = flash_attn_ext.bwd(
            dout, q, k, v, o, logsumexp, None, None, None, None, dropout_p, softmax_scale, is_causal,
            -1, 0 if is_causal else -1, 0.0, False, None, None,
        )  # fmt: skip
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
