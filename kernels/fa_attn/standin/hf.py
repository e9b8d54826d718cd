"""fa_attn as a Hugging Face transformers attention implementation, in one line:

    fa_attn.hf.register()    # then: AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_attn")

`register` adds `attention_forward` to transformers' AttentionInterface and a mask function to its
AttentionMaskInterface under one name. It needs no flash_attn package and works on any device (on the
CPU every call takes fa_attn's fallback). Batches take flash-attention-2's routes: a padded batch is
unpadded with its 2-D mask and run through flash_attn_varlen_func (left or right padding, prefill and
decode); a padding-free batch (sequences packed in one row, positions restarting per sequence, or
cu_seq_lens_q/k passed by the caller) runs varlen on the packed rows; anything else runs flash_attn_func.

A model whose attention passes sinks (`s_aux`, as gpt-oss) runs the fallback's exact sinks path
(fallback.sinks_attention: the sink is one extra logit column per head, dropped after the softmax),
with the reason `sinks-unsupported` (the kernels compute no sinks; never an approximation), over the
same keys the routes above would read (padding mask, packed sequences, causal, sliding window).

Transformers' own flash_attention_2 code path can run on fa_attn too, through the flash_attn stand-in
(flash_attn_compat.py says what transformers checks for it); that path needs a CUDA device.
"""

from __future__ import annotations

import contextvars
import importlib
import re
from typing import Any, cast

import torch
import torch.nn.functional as F

from ..reasons import Reason
from ..runtime.decision import Dispatch
from ..runtime.dispatch import report
from ..runtime.fallback import sinks_attention
from ..runtime.interface import flash_attn_func, flash_attn_varlen_func
from .bert_padding import pad_input, unpad_input

NAME = "fa_attn"


def _flash_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: object = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: object,
) -> torch.Tensor | None:
    """The 2-D (batch, kv_length) padding mask, or None when every key is valid (flash-attention-2's rule).

    One difference: transformers keeps the mask for flash_attention_2 under a static cache (whose last
    rows are not written yet) and drops it for other names. Without a mask, the valid keys are the first
    q_offset + q_length: the mask is then that many ones, as long as the mask transformers would have
    kept (attention_forward reads only the keys the mask covers)."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
        return attention_mask
    seen = int(q_offset + q_length)
    if kv_offset == 0 and kv_length > seen:
        device = q_offset.device if isinstance(q_offset, torch.Tensor) else None
        return torch.ones(batch_size, seen, dtype=torch.bool, device=device)
    return None


def _packed_cu_seqlens(position_ids: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """cu_seqlens of a padding-free row: sequences packed in one row, positions restarting at each."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] <= 1:
        return None
    flat = position_ids.reshape(-1)
    starts = (flat == flat.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    total = torch.tensor([flat.numel()], device=flat.device)
    return torch.cat((starts, total)).to(torch.int32)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query/key/value (batch, heads, seqlen, head_dim) ->
    (out (batch, seqlen, heads, head_dim), None)."""
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask: fa_attn takes transformers' 2-D padding mask, got shape {tuple(attention_mask.shape)}; "
            'register with fa_attn.hf.register() so transformers builds that mask, or use attn_implementation="sdpa"'
        )
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: pad v to the query head dim, crop the output
        v = F.pad(v, (0, head_dim - v_head_dim))
    causal = bool(module.is_causal if is_causal is None else is_causal)
    options: dict[str, Any] = {
        "dropout_p": dropout,
        "softmax_scale": scaling,
        "causal": causal,
        "softcap": 0.0 if softcap is None else softcap,
    }
    if sliding_window is not None and k.shape[1] > sliding_window:
        # transformers counts the current token in the window; flash-attn's bounds are inclusive
        options["window_size"] = (sliding_window - 1, sliding_window - 1)
    batch = q.shape[0]
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        out = _with_sinks(module, q, k, v, sinks, attention_mask, options, kwargs)
    elif attention_mask is not None:
        out = _padded(q, k, v, attention_mask.bool(), options)
    else:
        cu_q, cu_k, max_q, max_k = _varlen_args(kwargs, batch)
        if cu_q is not None and cu_k is not None and max_q is not None and max_k is not None:
            flat = [t.reshape(-1, *t.shape[-2:]) for t in (q, k, v)]
            rows = cast(
                torch.Tensor,
                flash_attn_varlen_func(flat[0], flat[1], flat[2], cu_q, cu_k, max_q, max_k, **options),
            )
            out = rows.reshape(batch, -1, *rows.shape[-2:])
        else:
            out = cast(torch.Tensor, flash_attn_func(q, k, v, **options))
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


def _varlen_args(kwargs: dict[str, Any], batch: int) -> tuple[Any, Any, Any, Any]:
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of a padding-free batch (the caller's cu_seq_lens_q/k,
    or the packed row's position_ids), all None otherwise."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if cu_q is None or cu_k is None or max_q is None or max_k is None:
        cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids"), batch)
        max_q = max_k = None if cu_q is None else cu_q.diff().max()
    return cu_q, cu_k, max_q, max_k


def _with_sinks(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    mask: torch.Tensor | None,
    options: dict[str, Any],
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """Attention with sinks on the fallback (the kernels have none), reported as `sinks-unsupported`.
    The visible keys are those the flash routes read: the padding mask's keys (padded queries out 0),
    the packed sequence's own keys, the causal diagonal aligned at each sequence's end, the window."""
    report(
        Dispatch(
            path="fallback",
            arch=None,
            reasons=(
                Reason(
                    "sinks-unsupported",
                    f"{type(module).__name__} passes attention sinks (s_aux, one extra logit per head), which "
                    "fa's kernels do not compute; the fallback computes them exactly",
                    "nothing to fix (outputs and gradients are exact); the kernels run models without sinks",
                ),
            ),
        )
    )
    batch, sq, sk, device = q.shape[0], q.shape[1], k.shape[1], q.device
    rows, cols = torch.arange(sq, device=device), torch.arange(sk, device=device)
    allowed = torch.ones(1, 1, sq, sk, dtype=torch.bool, device=device)
    cu_q, cu_k, _, _ = (None,) * 4 if mask is not None else _varlen_args(kwargs, batch)
    if cu_q is not None and cu_k is not None:  # padding-free: every row of the batch is one stream
        q, k, v = (t.reshape(1, -1, *t.shape[-2:]) for t in (q, k, v))
        rows, cols = torch.arange(q.shape[1], device=device), torch.arange(k.shape[1], device=device)
        seq_q = torch.searchsorted(cu_q[1:].long(), rows, right=True)
        seq_k = torch.searchsorted(cu_k[1:].long(), cols, right=True)
        allowed = (seq_q.unsqueeze(1) == seq_k.unsqueeze(0)).view(1, 1, rows.numel(), cols.numel())
        diagonal = rows - cu_q[1:].long()[seq_q] + cu_k[1:].long()[seq_q]  # each sequence's end aligned
    else:
        if mask is not None:
            mask = mask.bool()
            k, v = k[:, : mask.shape[1]], v[:, : mask.shape[1]]  # a static cache's unwritten rows
            sk = mask.shape[1]
            cols = cols[:sk]
            allowed = mask.view(batch, 1, 1, sk)
            if sq == sk:  # padded queries give out 0, as the varlen route's pad_input
                allowed = allowed & mask.view(batch, 1, sq, 1)
        diagonal = rows + (sk - sq)
    diagonal, cols = diagonal.unsqueeze(1), cols.unsqueeze(0)
    if options["causal"]:
        allowed = allowed & (cols <= diagonal)
    if "window_size" in options:
        left, right = options["window_size"]
        allowed = allowed & (cols >= diagonal - left) & (cols <= diagonal + right)
    scale = options["softmax_scale"]
    out = sinks_attention(
        q,
        k,
        v,
        sinks,
        allowed,
        q.shape[-1] ** -0.5 if scale is None else scale,
        softcap=options["softcap"],
        dropout_p=options["dropout_p"],
    )
    return out.reshape(batch, -1, *out.shape[-2:])


def _padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, options: dict[str, Any]
) -> torch.Tensor:
    """Unpad with the (batch, kv_len) mask, varlen, pad back (flash-attention-2's padded route)."""
    batch, q_len = q.shape[0], q.shape[1]
    k, v = k[:, : mask.shape[1]], v[:, : mask.shape[1]]  # a static cache can hold more rows than the mask
    k_rows, indices_k, cu_k, max_k, _ = unpad_input(k, mask)
    v_rows = v.reshape(-1, *v.shape[2:])[indices_k]
    if q_len == k.shape[1]:
        q_rows, indices_q, cu_q, max_q = q.reshape(-1, *q.shape[2:])[indices_k], indices_k, cu_k, max_k
    elif q_len == 1:  # decode: one query per sequence
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        q_rows, indices_q, max_q = q.squeeze(1), cu_q[:-1], 1
    else:  # queries are the last q_len positions (left padding)
        q_rows, indices_q, cu_q, max_q, _ = unpad_input(q, mask[:, -q_len:])
    out = cast(
        torch.Tensor, flash_attn_varlen_func(q_rows, k_rows, v_rows, cu_q, cu_k, max_q, max_k, **options)
    )
    return pad_input(out, indices_q, batch, q_len)


# Names transformers' flash-attention loader serves with fa_attn's functions: those registered that contain
# "flash", and the others once name-keyed models use them (_serve_name_keyed_models).
_FLASH_NAMES: set[str] = set()


def register(name: str = NAME) -> str:
    """Register fa_attn with transformers under `name` (default "fa_attn"); returns the name to pass as
    attn_implementation. Calling it again is harmless.

    Falcon, GPT-Neo, GPT-J and Bark pick their attention class from a map keyed by name: a name
    containing "flash" gets their flash-attention class, and any other name (the default too) is added
    to those maps with that class, run on fa_attn's functions. A name containing "flash" (e.g.
    "fa_flash") is what other code keyed on that word needs: padding-free trainers (sentence-transformers, trl) enable packing only for such names. Under a
    "flash" name transformers also loads flash-attention functions by that name (a hub kernel when it is
    none of flash_attention_2/3/4); `register` makes its loader answer that name with fa_attn's own
    flash_attn_func / flash_attn_varlen_func / flash_attn_with_kvcache / pad_input / unpad_input."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise ImportError(
            f"fa_attn.hf.register needs transformers (pip install transformers): {error}"
        ) from None
    if "flash" in name:
        if re.fullmatch(r"flash_attention_\d", name) or "/" in name or ":" in name or "|" in name:
            raise ValueError(
                f"name: {name!r} is transformers' own flash-attention or hub-kernel name; pick another "
                "(e.g. 'fa_flash', or the default 'fa_attn')"
            )
        _serve_flash_name(name)
    else:
        _serve_name_keyed_models(name)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _flash_mask)
    return name


def _serve_flash_name(name: str) -> None:
    """transformers' flash-attention loader (modeling_flash_attention_utils._lazy_imports) answers `name`
    with fa_attn's functions; every other name goes to the loader it had."""
    from transformers import modeling_flash_attention_utils as utils

    _FLASH_NAMES.add(name)
    if getattr(utils._lazy_imports, "_fa_attn", False):
        return
    loader = utils._lazy_imports

    def _lazy_imports(implementation: str | None, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        if implementation in _FLASH_NAMES:
            from ..runtime.kvcache import flash_attn_with_kvcache

            return flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, pad_input, unpad_input
        return loader(implementation, *args, **kwargs)

    _lazy_imports._fa_attn = True  # type: ignore[attr-defined]
    utils._lazy_imports = _lazy_imports
    # These models import transformers' flash-attention forward only when a flash_attn package or the
    # kernels library is there at their import; their flash class calls it by name.
    for family in _FLASH_IMPORTING_MODELS:
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:
            continue
        if not hasattr(module, "_flash_attention_forward"):
            module._flash_attention_forward = utils._flash_attention_forward  # type: ignore[attr-defined]


# The implementation name a name-keyed model's attention class runs under (_serve_name_keyed_models).
_IMPLEMENTATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("fa_attn_hf_name", default=None)


def _serve_name_keyed_models(name: str) -> None:
    """Under a name without "flash", Falcon, GPT-Neo, GPT-J and Bark look the name itself up in their
    attention class maps (a KeyError before). Give the name their flash-attention class, run on fa_attn's
    functions: a subclass whose forward has transformers' flash-attention forward load the functions by
    `name` (which the loader answers with fa_attn's, as for a "flash" name), since these classes call it
    without naming an implementation."""
    _serve_flash_name(name)
    for family in _FLASH_IMPORTING_MODELS:
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:
            continue
        classes = getattr(module, f"{family.upper()}_ATTENTION_CLASSES", None)
        if not isinstance(classes, dict) or "flash_attention_2" not in classes or name in classes:
            continue
        flash_class = classes["flash_attention_2"]
        classes[name] = type(
            flash_class.__name__, (flash_class,), {"forward": _forward_as(name, flash_class.forward)}
        )
        flash_forward = module._flash_attention_forward
        if not getattr(flash_forward, "_fa_attn", False):
            module._flash_attention_forward = _naming(flash_forward)  # type: ignore[attr-defined]


def _forward_as(name: str, forward: Any) -> Any:
    def named_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        token = _IMPLEMENTATION.set(name)
        try:
            return forward(self, *args, **kwargs)
        finally:
            _IMPLEMENTATION.reset(token)

    return named_forward


def _naming(flash_forward: Any) -> Any:
    """transformers' _flash_attention_forward, given the implementation a named class runs under."""

    def call(*args: Any, **kwargs: Any) -> Any:
        name = _IMPLEMENTATION.get()
        if name is not None and kwargs.get("attn_implementation") is None:
            kwargs["attn_implementation"] = name
        return flash_forward(*args, **kwargs)

    call._fa_attn = True  # type: ignore[attr-defined]
    return call


# transformers 5.x models whose attention class is picked from a name-keyed map (`flash_attention_2` for
# any name containing "flash") and that import `_flash_attention_forward` conditionally.
_FLASH_IMPORTING_MODELS = ("falcon", "gpt_neo", "gptj", "bark")
