"""flash-attn's fused norms (flash_attn.ops.triton.layer_norm: layer_norm_fn, rms_norm_fn, RMSNorm), in
plain torch with flash-attn 2.8.3's signatures and results, for the stand-in (the model code that
imports them runs unchanged; torch.compile fuses what the Triton kernel fused).

One call: x (with optional dropout and rowscale) plus the optional parallel input x1 plus the optional
residual is the new residual; the norm of that, in fp32, times weight (weight + 1 with
zero_centered_weight) plus bias, in out_dtype (default x's dtype), is y; with weight1/bias1 a second
norm y1 of the same sum. prenorm=True also returns the residual: in residual's dtype, fp32 with
residual_in_fp32, else x's dtype. With return_dropout_mask, the keep masks of the dropout (bool, x's
shape; None without dropout, mask1 None without x1) follow the outputs, as flash-attn returns them.
layer_norm_ref / rms_norm_ref (flash-attn's unfused references) and layer_norm_linear_fn (the norm, then
F.linear) are given too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..runtime.inputs import InputError

Tensor = torch.Tensor


def _norm(
    summed: Tensor, weight: Tensor, bias: Tensor | None, eps: float, rms: bool, centered: bool
) -> Tensor:
    x = summed.float()
    w = weight.float() + 1.0 if centered else weight.float()
    if rms:
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w
        return y + bias.float() if bias is not None else y
    return F.layer_norm(x, x.shape[-1:], w, bias.float() if bias is not None else None, eps)


def layer_norm_fn(
    x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None = None, x1: Tensor | None = None,
    weight1: Tensor | None = None, bias1: Tensor | None = None, eps: float = 1e-6, dropout_p: float = 0.0,
    rowscale: Tensor | None = None, prenorm: bool = False, residual_in_fp32: bool = False,
    zero_centered_weight: bool = False, is_rms_norm: bool = False, return_dropout_mask: bool = False,
    out_dtype: torch.dtype | None = None, out: Tensor | None = None, residual_out: Tensor | None = None,
) -> Tensor | tuple[Tensor, ...]:  # fmt: skip
    """y; (y, residual) with prenorm; (y, y1[, residual]) with weight1."""
    if x1 is not None and rowscale is not None:
        raise InputError("rowscale: not supported with the parallel input x1 (as in flash-attn)")
    if rowscale is not None:
        x = x * rowscale[..., None]
    mask = mask1 = None
    if dropout_p > 0:
        x, mask = _dropout(x, dropout_p)
        if x1 is not None:
            x1, mask1 = _dropout(x1, dropout_p)
    residual_dtype = (
        residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    )
    summed = x.to(residual_dtype) if x.dtype != residual_dtype else x
    if x1 is not None:
        summed = summed + x1.to(residual_dtype)
    if residual is not None:
        summed = summed + residual
    dtype = out_dtype or x.dtype
    y = _norm(summed, weight, bias, eps, is_rms_norm, zero_centered_weight).to(dtype)
    if out is not None:
        y = out.copy_(y)
    if residual_out is not None:
        summed = residual_out.copy_(summed)
    outputs: tuple[Tensor, ...] = (y,)
    if weight1 is not None:
        outputs += (_norm(summed, weight1, bias1, eps, is_rms_norm, zero_centered_weight).to(dtype),)
    if prenorm:
        outputs += (summed,)
    if return_dropout_mask:
        masked: tuple[Tensor | None, ...] = (*outputs, mask, mask1)
        return masked  # type: ignore[return-value]  # flash-attn's layout: masks None without dropout
    return outputs[0] if len(outputs) == 1 else outputs


def _dropout(x: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """x with dropout, and its keep mask (bool, x's shape)."""
    keep = torch.rand(x.shape, device=x.device) >= p
    return x.masked_fill(~keep, 0.0) / (1.0 - p), keep


def rms_norm_fn(
    x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None = None, x1: Tensor | None = None,
    weight1: Tensor | None = None, bias1: Tensor | None = None, eps: float = 1e-6, dropout_p: float = 0.0,
    rowscale: Tensor | None = None, prenorm: bool = False, residual_in_fp32: bool = False,
    zero_centered_weight: bool = False, return_dropout_mask: bool = False,
    out_dtype: torch.dtype | None = None, out: Tensor | None = None, residual_out: Tensor | None = None,
) -> Tensor | tuple[Tensor, ...]:  # fmt: skip
    """layer_norm_fn with is_rms_norm=True: x / sqrt(mean(x^2) + eps) * weight (+ bias)."""
    return layer_norm_fn(
        x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm, residual_in_fp32,
        zero_centered_weight, True, return_dropout_mask, out_dtype, out, residual_out,
    )  # fmt: skip


class RMSNorm(torch.nn.Module):
    """flash-attn's RMSNorm module: a weight (ones; zeros with zero_centered_weight), no bias; forward(x,
    residual=None, prenorm=False, residual_in_fp32=False) as rms_norm_fn."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        dropout_p: float = 0.0,
        zero_centered_weight: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.drop = torch.nn.Dropout(dropout_p) if dropout_p > 0.0 else None
        self.zero_centered_weight = zero_centered_weight
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.weight) if self.zero_centered_weight else torch.nn.init.ones_(self.weight)

    def forward(
        self, x: Tensor, residual: Tensor | None = None, prenorm: bool = False, residual_in_fp32: bool = False
    ) -> Tensor | tuple[Tensor, ...]:
        return rms_norm_fn(
            x,
            self.weight,
            None,
            residual=residual,
            eps=self.eps,
            dropout_p=self.drop.p if self.drop is not None and self.training else 0.0,
            prenorm=prenorm,
            residual_in_fp32=residual_in_fp32,
            zero_centered_weight=self.zero_centered_weight,
        )


def layer_norm_linear_fn(
    x: Tensor, norm_weight: Tensor, norm_bias: Tensor | None, linear_weight: Tensor,
    linear_bias: Tensor | None, residual: Tensor | None = None, eps: float = 1e-6, prenorm: bool = False,
    residual_in_fp32: bool = False, is_rms_norm: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """F.linear of the norm (layer_norm_fn's, in x's dtype, then linear_weight's); (out, residual) with
    prenorm."""
    y, summed = layer_norm_fn(
        x, norm_weight, norm_bias, residual, eps=eps, prenorm=True, residual_in_fp32=residual_in_fp32,
        is_rms_norm=is_rms_norm,
    )  # fmt: skip
    out = F.linear(y.to(linear_weight.dtype), linear_weight, linear_bias)
    return (out, summed) if prenorm else out


def _reference(
    x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, x1: Tensor | None,
    weight1: Tensor | None, bias1: Tensor | None, eps: float, dropout_p: float, rowscale: Tensor | None,
    prenorm: bool, zero_centered_weight: bool, dropout_mask: Tensor | None, dropout_mask1: Tensor | None,
    upcast: bool, rms: bool,
) -> Tensor | tuple[Tensor, ...]:  # fmt: skip
    """flash-attn's unfused reference: in the inputs' dtypes (fp32 with upcast), outputs in x's dtype."""
    dtype = x.dtype

    def up(t: Tensor | None) -> Tensor | None:
        return t.float() if upcast and t is not None else t

    x, weight, bias, residual, x1 = up(x), up(weight), up(bias), up(residual), up(x1)  # type: ignore[assignment]
    weight1, bias1 = up(weight1), up(bias1)
    if zero_centered_weight:
        weight = weight + 1.0
        weight1 = weight1 + 1.0 if weight1 is not None else None
    if x1 is not None and rowscale is not None:
        raise InputError("rowscale: not supported with the parallel input x1 (as in flash-attn)")
    if rowscale is not None:
        x = x * rowscale[..., None]
    if dropout_p > 0:
        x = (
            x.masked_fill(~dropout_mask, 0.0) / (1 - dropout_p)
            if dropout_mask is not None
            else F.dropout(x, dropout_p)
        )
        if x1 is not None:
            x1 = (
                x1.masked_fill(~dropout_mask1, 0.0) / (1 - dropout_p)
                if dropout_mask1 is not None
                else F.dropout(x1, dropout_p)
            )
    if x1 is not None:
        x = x + x1
    if residual is not None:
        x = (x + residual).to(x.dtype)

    def norm(w: Tensor, b: Tensor | None) -> Tensor:
        if rms:
            y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w
            return (y + b if b is not None else y).to(dtype)
        return F.layer_norm(x.to(w.dtype), x.shape[-1:], w, b, eps).to(dtype)

    outputs = (norm(weight, bias),) + ((norm(weight1, bias1),) if weight1 is not None else ())
    outputs += (x,) if prenorm else ()
    return outputs[0] if len(outputs) == 1 else outputs


def _reference_fn(rms: bool, what: str) -> Callable[..., Tensor | tuple[Tensor, ...]]:
    def reference(
        x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None = None, x1: Tensor | None = None,
        weight1: Tensor | None = None, bias1: Tensor | None = None, eps: float = 1e-6, dropout_p: float = 0.0,
        rowscale: Tensor | None = None, prenorm: bool = False, zero_centered_weight: bool = False,
        dropout_mask: Tensor | None = None, dropout_mask1: Tensor | None = None, upcast: bool = False,
    ) -> Tensor | tuple[Tensor, ...]:  # fmt: skip
        return _reference(
            x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
            zero_centered_weight, dropout_mask, dropout_mask1, upcast, rms,
        )  # fmt: skip

    reference.__name__ = reference.__qualname__ = f"{'rms' if rms else 'layer'}_norm_ref"
    reference.__doc__ = f"flash-attn's unfused {what} reference (dropout from the given masks when passed)."
    return reference


layer_norm_ref = _reference_fn(False, "LayerNorm")
rms_norm_ref = _reference_fn(True, "RMSNorm: x / sqrt(mean(x^2) + eps) * weight (+ bias)")
