"""flash-attn 2.x's compiled extension (`flash_attn_2_cuda`, which flash_attn_interface imports as
`flash_attn_gpu`), on fa_attn: what the stand-in hands to libraries that call it directly.

xformers (`xformers.ops.fmha.flash`) reads `flash_attn.flash_attn_interface.flash_attn_gpu` at import
and calls `fwd`, `varlen_fwd`, `bwd` and `varlen_bwd` with the C++ functions' positional arguments;
ring-attention and context-parallel code calls them through flash-attn's private wrappers
(flash_attn_privates.py). Each function here takes flash-attn 2.8.3's arguments in its order
(csrc/flash_attn/flash_api.cpp: mha_fwd, mha_varlen_fwd, mha_bwd, mha_varlen_bwd, mha_fwd_kvcache) and
returns its list of results, computed by fa_attn's public functions (kernels or fallback, with their
reasons). Differences, each one a thing fa does not keep:
- dropout (p_dropout > 0) runs on the fallback (the kernels have none), with a mask fa_attn draws and
  can draw again: `rng_state` is int64 (seed, 0), the seed taken from `gen` (a torch.Generator) or
  torch's default CPU generator (so torch.manual_seed makes it repeatable), and the mask is
  fallback.dropout_keep(rng_state): bwd/varlen_bwd given that rng_state replay it exactly, as
  flash-attn's replay its Philox state. Without dropout rng_state is zeros. The mask is fa_attn's own,
  not the bits flash-attn's kernel would draw for the same seed.
- `return_softmax` (flash-attn allows it only with p_dropout > 0, and so does fa) returns S_dmask,
  (batch, heads, seqlen_q, seqlen_k) rounded up to multiples of 128 (varlen: max_seqlen_q/k), zeros
  past the ends: softmax(S) itself, negated where dropout dropped the entry (flash-attn's sign code;
  its kernel stores the per-tile unnormalised exp(S - running max) instead, which only its own tests
  normalise);
- none in the backward's values: it reads the caller's `out` and `softmax_lse` (ring attention passes
  those merged over key blocks) on fa's backward kernel where the wheel has one for the call, and
  elsewhere (the fallback, features the backward kernels lack) with flash-attn's formula in torch
  (fallback.backward). `softmax_d` holds each row's sum(dout * out), as the kernel's, in flash-attn's shape.
`zero_tensors` is accepted and unused (it zeroes outputs fa writes in full anyway).
"""

from __future__ import annotations

import types
from typing import cast

import torch
import torch.nn.functional as F

from ..runtime import dispatch, fallback, inputs, interface, preload
from ..runtime.inputs import AttnCall, InputError
from ..runtime.interface import flash_attn_func, varlen_attention
from ..runtime.kvcache import flash_attn_with_kvcache

Tensor = torch.Tensor


def _into(given: Tensor | None, result: Tensor) -> Tensor:
    """flash-attn writes into a caller's output tensor when one is passed."""
    if given is None:
        return result
    given.copy_(result)
    return given


def _no_probs(q: Tensor) -> Tensor:
    return q.new_empty((0,))


def _rng_state(q: Tensor) -> Tensor:
    return torch.zeros((2,), dtype=torch.int64, device=q.device)


def _softmax_needs_dropout(return_softmax: bool, p_dropout: float) -> None:
    if return_softmax and not p_dropout > 0:
        raise InputError(
            "return_softmax: return_softmax is only supported when p_dropout > 0.0 (as in flash-attn); "
            "pass return_softmax=False, or a dropout"
        )


def _new_rng_state(q: Tensor, gen: object) -> Tensor:
    """(seed, 0), the seed drawn from `gen` or torch's default CPU generator (module docstring)."""
    generator = gen if isinstance(gen, torch.Generator) and gen.device.type == "cpu" else None
    seed = torch.randint(0, 2**62, (), generator=generator).item()
    return torch.tensor([seed, 0], dtype=torch.int64, device=q.device)


def _s_dmask(probs: Tensor, keep: Tensor, dtype: torch.dtype, rows: int, cols: int) -> Tensor:
    """S_dmask: probs (b, h, sq, sk) negated where dropped, in (b, h, rows, cols) zeros."""
    signed = torch.where(keep, probs, -probs).to(dtype)
    padded = signed.new_zeros((*signed.shape[:2], rows, cols))
    padded[..., : signed.shape[2], : signed.shape[3]] = signed
    return padded


def _replayed_keep(rng_state: Tensor | None, shape: tuple[int, ...], p_dropout: float, q: Tensor) -> Tensor:
    if rng_state is None or rng_state.numel() < 1:
        raise InputError(
            f"rng_state: the backward of a call with p_dropout {p_dropout} needs the rng_state its forward "
            "returned (the 4th result of _flash_attn_forward / flash_attn_gpu.fwd), to replay its dropout mask"
        )
    return fallback.dropout_keep(rng_state, shape, p_dropout, q.device)


def fwd(
    q: Tensor, k: Tensor, v: Tensor, out_: Tensor | None, alibi_slopes_: Tensor | None, p_dropout: float,
    softmax_scale: float, is_causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    return_softmax: bool, gen_: object,
) -> list[Tensor]:  # fmt: skip
    """mha_fwd -> [out, softmax_lse (batch, heads, seqlen_q), S_dmask (empty without return_softmax),
    rng_state]."""
    _softmax_needs_dropout(return_softmax, p_dropout)
    if p_dropout > 0:
        call = inputs.check_padded(
            q, k, v, p_dropout, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
            alibi_slopes_, False,
        )  # fmt: skip
        interface.route_for(call, q, k, v)  # the fallback, with its reason reported (kernels: no dropout)
        rng = _new_rng_state(q, gen_)
        shape = (call.batch, call.heads, q.shape[1], k.shape[1])
        keep = fallback.dropout_keep(rng, shape, p_dropout, q.device)
        out, lse = fallback.attention(call, q, k, v, True, keep)
        assert lse is not None
        probs = _no_probs(q)
        if return_softmax:
            rows, cols = _round128(shape[2]), _round128(shape[3])
            probs = _s_dmask(fallback.attention_probs(call, q, k), keep, q.dtype, rows, cols)
        return [_into(out_, out), lse, probs, rng]
    out, lse = cast(
        tuple[Tensor, Tensor],
        flash_attn_func(
            q, k, v, p_dropout, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
            alibi_slopes_, False, return_lse=True,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse, _no_probs(q), _rng_state(q)]


def varlen_fwd(
    q: Tensor, k: Tensor, v: Tensor, out_: Tensor | None, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    seqused_k: Tensor | None, leftpad_k_: Tensor | None, block_table_: Tensor | None,
    alibi_slopes_: Tensor | None, max_seqlen_q: int, max_seqlen_k: int, p_dropout: float,
    softmax_scale: float, zero_tensors: bool, is_causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, return_softmax: bool, gen_: object,
) -> list[Tensor]:  # fmt: skip
    """mha_varlen_fwd -> [out, softmax_lse (heads, total_q), S_dmask (empty without return_softmax),
    rng_state]."""
    _softmax_needs_dropout(return_softmax, p_dropout)
    if p_dropout > 0:
        call = inputs.check_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
            is_causal, (window_size_left, window_size_right), softcap, alibi_slopes_, False, block_table_,
            seqused_k, leftpad_k_,
        )  # fmt: skip
        interface.route_for(call, q, k, v)
        rng = _new_rng_state(q, gen_)
        shape = (call.batch, call.heads, max(max_seqlen_q, 1), max(max_seqlen_k, 1))
        keep = fallback.dropout_keep(rng, shape, p_dropout, q.device)
        out, lse = fallback.varlen_attention(call, q, k, v, True, keep)
        assert lse is not None
        probs = _no_probs(q)
        if return_softmax:
            rows, cols = _round128(max_seqlen_q), _round128(max_seqlen_k)
            probs = _s_dmask(fallback.varlen_probs(call, q, k), keep, q.dtype, rows, cols)
        return [_into(out_, out), lse, probs, rng]
    out, lse = cast(
        tuple[Tensor, Tensor],
        varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
            is_causal, (window_size_left, window_size_right), softcap, alibi_slopes_, False, False,
            block_table_, True, seqused_k, leftpad_k_,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse, _no_probs(q), _rng_state(q)]


def _kernel_grads(
    call: AttnCall, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor] | None:
    """d(q, k, v) from the backward kernel, reading the caller's out and softmax_lse as flash-attn's bwd
    does; None where the call's backward does not run on the kernels (then the forward runs again)."""
    with torch.enable_grad():  # the decision for a call that needs gradients
        lq, lk, lv = (t.detach().requires_grad_(True) for t in (q, k, v))
        route = interface.admit(call, interface.decide(call, lq, lk, lv), lq, lk, lv)
    bwd = route.bwd
    if route.path == "fallback" or bwd is None or route.head_dim is None:
        return None
    dispatch.report(route)
    preload.before_call(route, q)
    pad = route.head_dim - call.head_dim
    tensors = [dout, q, k, v, out]
    if pad:  # as the forward padded them: zero columns change neither q.k nor the kept outputs
        tensors = [F.pad(t, (0, pad)) for t in tensors]
    dout, q, k, v, out = (interface.row_aligned(t) for t in tensors)
    varlen = call.varlen
    dq, dk, dv = torch.ops.fa_attn.bwd(
        dout.contiguous(), q, k, v, out.contiguous(), lse,
        varlen.cu_seqlens_q if varlen else None, varlen.cu_seqlens_k if varlen else None,
        call.seqlen_q, call.seqlen_k, call.softmax_scale, call.causal, call.window_left, call.window_right,
        call.softcap, bwd.module, bwd.entries, list(bwd.launch),
    )  # fmt: skip
    if pad:
        dq, dk, dv = (t[..., : call.head_dim] for t in (dq, dk, dv))
    if varlen is not None and call.kv.block_table is None:
        dk, dv = unread_rows_zeroed(dk, varlen.cu_seqlens_k), unread_rows_zeroed(dv, varlen.cu_seqlens_k)
    return dq, dk, dv


def unread_rows_zeroed(grad: Tensor, cu_seqlens: Tensor) -> Tensor:
    """grad (total, ...) with rows at or past cu_seqlens[-1] zeroed, on the device (no host read). A
    packed key buffer may be longer than its sequences (inputs accepts that, as flash-attn does); the
    kernel writes only the sequences' rows of its torch.empty gradients, and the fallback gives zeros
    past them, so the kernel route does too rather than hand back uninitialised memory."""
    rows = torch.arange(grad.shape[0], device=grad.device)
    return grad.masked_fill((rows >= cu_seqlens[-1]).view(-1, *([1] * (grad.dim() - 1))), 0)


def _softmax_d(dout: Tensor, out: Tensor) -> Tensor:
    """sum over the head dim of dout * out, fp32, heads before rows: (..., heads, rows)."""
    return (dout.float() * out.float()).sum(-1).transpose(-1, -2)


def _round128(n: int) -> int:
    return (n + 127) // 128 * 128


def bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq_: Tensor | None,
    dk_: Tensor | None, dv_: Tensor | None, alibi_slopes_: Tensor | None, p_dropout: float,
    softmax_scale: float, is_causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    deterministic: bool, gen_: object, rng_state: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """mha_bwd -> [dq, dk, dv, softmax_d (batch, heads, seqlen_q rounded up to 128)]. With p_dropout, the
    forward's mask is replayed from rng_state (module docstring)."""
    call = inputs.check_padded(
        q, k, v, p_dropout, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
        alibi_slopes_, deterministic,
    )  # fmt: skip
    tensors = (dout, q, k, v, out, softmax_lse)
    if p_dropout > 0:
        shape = (call.batch, call.heads, q.shape[1], k.shape[1])
        dq, dk, dv = fallback.backward(call, tensors, _replayed_keep(rng_state, shape, p_dropout, q))
    else:
        grads = _kernel_grads(call, dout, q, k, v, out, softmax_lse)
        dq, dk, dv = grads if grads is not None else fallback.backward(call, tensors)
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    softmax_d = dout.new_zeros((batch, heads, _round128(seqlen_q)), dtype=torch.float32)
    softmax_d[..., :seqlen_q] = _softmax_d(dout, out)
    return [_into(dq_, dq), _into(dk_, dk), _into(dv_, dv), softmax_d]


def varlen_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, dq_: Tensor | None,
    dk_: Tensor | None, dv_: Tensor | None, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
    alibi_slopes_: Tensor | None, max_seqlen_q: int, max_seqlen_k: int, p_dropout: float,
    softmax_scale: float, zero_tensors: bool, is_causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, deterministic: bool, gen_: object, rng_state: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """mha_varlen_bwd -> [dq, dk, dv, softmax_d (heads, total_q + 128 * batch), rows in the first total_q
    columns]. With p_dropout, the forward's mask is replayed from rng_state (module docstring)."""
    call = inputs.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
        (window_size_left, window_size_right), softcap, alibi_slopes_, deterministic,
    )  # fmt: skip
    tensors = (dout, q, k, v, out, softmax_lse)
    if p_dropout > 0:
        shape = (call.batch, call.heads, max(max_seqlen_q, 1), max(max_seqlen_k, 1))
        dq, dk, dv = fallback.backward(call, tensors, _replayed_keep(rng_state, shape, p_dropout, q))
    else:
        grads = _kernel_grads(call, dout, q, k, v, out, softmax_lse)
        dq, dk, dv = grads if grads is not None else fallback.backward(call, tensors)
    total_q, heads, batch = q.shape[0], q.shape[1], cu_seqlens_q.shape[0] - 1
    softmax_d = dout.new_zeros((heads, total_q + 128 * batch), dtype=torch.float32)
    softmax_d[:, :total_q] = _softmax_d(dout, out)
    return [_into(dq_, dq), _into(dk_, dk), _into(dv_, dv), softmax_d]


def fwd_kvcache(
    q: Tensor, kcache: Tensor, vcache: Tensor, k_: Tensor | None, v_: Tensor | None,
    seqlens_k_: Tensor | None, rotary_cos_: Tensor | None, rotary_sin_: Tensor | None,
    cache_batch_idx_: Tensor | None, leftpad_k_: Tensor | None, block_table_: Tensor | None,
    alibi_slopes_: Tensor | None, out_: Tensor | None, softmax_scale: float, is_causal: bool,
    window_size_left: int, window_size_right: int, softcap: float, is_rotary_interleaved: bool,
    num_splits: int,
) -> list[Tensor]:  # fmt: skip
    """mha_fwd_kvcache -> [out, softmax_lse (batch, heads, seqlen_q)]; appends k_/v_ to the cache."""
    out, lse = cast(
        tuple[Tensor, Tensor],
        flash_attn_with_kvcache(
            q, kcache, vcache, k_, v_, rotary_cos_, rotary_sin_, seqlens_k_, cache_batch_idx_, leftpad_k_,
            block_table_, softmax_scale, is_causal, (window_size_left, window_size_right), softcap,
            is_rotary_interleaved, alibi_slopes_, num_splits, return_softmax_lse=True,
        ),
    )  # fmt: skip
    return [_into(out_, out), lse]


NAMES = ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache")


def module() -> types.ModuleType:
    """The extension as a module object, named as flash-attn's (`flash_attn_2_cuda`)."""
    ext = types.ModuleType("flash_attn_2_cuda", "fa_attn standing in for flash-attn's compiled extension")
    for name in NAMES:
        setattr(ext, name, globals()[name])
    return ext
