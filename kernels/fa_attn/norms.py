"""flash-attn's fused norms (flash_attn.ops.triton.layer_norm: layer_norm_fn, rms_norm_fn, RMSNorm), in
plain torch with flash-attn 2.8.3's signatures and results, for the stand-in (the model code that
imports them runs unchanged; torch.compile fuses what the Triton kernel fused).

One call: x (with optional dropout and rowscale) plus the optional parallel input x1 plus the optional
residual is the new residual; the norm of that, in fp32, times weight (weight + 1 with
zero_centered_weight) plus bias, in out_dtype (default x's dtype), is y; with weight1/bias1 a second
norm y1 of the same sum. prenorm=True also returns the residual: in residual's dtype, fp32 with
residual_in_fp32, else x's dtype. return_dropout_mask is not provided (fa keeps no mask): it raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import InputError

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
    if return_dropout_mask:
        raise InputError(
            "return_dropout_mask: fa_attn's layer_norm_fn keeps no dropout mask; pass False (torch.nn.Dropout "
            "before the norm gives you the mask's effect)"
        )
    if x1 is not None and rowscale is not None:
        raise InputError("rowscale: not supported with the parallel input x1 (as in flash-attn)")
    if rowscale is not None:
        x = x * rowscale[..., None]
    if dropout_p > 0:
        x = F.dropout(x, p=dropout_p)
        x1 = F.dropout(x1, p=dropout_p) if x1 is not None else None
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
    return outputs[0] if len(outputs) == 1 else outputs


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
