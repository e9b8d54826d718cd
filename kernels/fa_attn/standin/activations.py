"""flash-attn's activation helpers (flash_attn.ops.activations) for the stand-in, in plain torch with
flash-attn 2.8.3's names, arguments and results.

The formulas (x = y + bias where a bias is given):
  gelu (tanh approximation): 0.5 x (1 + tanh(c x (1 + 0.044715 x^2))), c = sqrt(2/pi) = 0.79788456
  its derivative: 0.5 x (1 - t^2)(c + 3 * 0.044715 c x^2) + 0.5 (1 + t), t the tanh above
  relu_bwd(g, x) = g where x >= 0, else 0;  sqrelu(x) = relu(x)^2, sqrelu_bwd(g, x) = 2 g relu(x)
  swiglu(x, y) = x sigmoid(x) y; swiglu_bwd(x, y, g) = (g y s (1 + x (1 - s)), g x s), s = sigmoid(x)
Results are in the input's dtype (bias_gelu_back's bias gradient in the bias's), as flash-attn's are;
the arithmetic runs in that dtype (flash-attn's TorchScript does the same; its swiglu, a CUDA jiterator
kernel, computes in fp32 and runs on CUDA tensors only, where this one runs on any device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

_C = 0.79788456  # sqrt(2 / pi), to flash-attn's 8 digits
_C3 = 0.1070322243  # 3 * 0.044715 * sqrt(2 / pi)


def _tanh_term(x: Tensor) -> Tensor:
    return torch.tanh(_C * x * (1 + 0.044715 * x * x))


def gelu_fwd(x: Tensor) -> Tensor:
    return (x * 0.5 * (1.0 + _tanh_term(x))).to(x.dtype)


def gelu_bwd(g: Tensor, x: Tensor) -> Tensor:
    t = _tanh_term(x)
    slope = 0.5 * x * ((1 - t * t) * (_C + _C3 * x * x)) + 0.5 * (1 + t)
    return (slope * g).to(x.dtype)


def bias_gelu(y: Tensor, bias: Tensor) -> Tensor:
    return gelu_fwd(bias + y).to(y.dtype)


def bias_gelu_back(g: Tensor, y: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """(grad of y, grad of bias) for y of shape (B, D) and bias (D,)."""
    grad = gelu_bwd(g, bias + y)
    return grad.to(y.dtype), grad.sum(dim=0, dtype=bias.dtype)


class GeLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, input: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(input, bias)
        return bias_gelu(input, bias)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: Tensor) -> tuple[Tensor, Tensor]:
        input, bias = ctx.saved_tensors  # type: ignore[attr-defined]
        return bias_gelu_back(grad_output, input, bias)


class FastGeLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, input: Tensor) -> Tensor:
        ctx.save_for_backward(input)
        return gelu_fwd(input)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: Tensor) -> Tensor:
        (input,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return gelu_bwd(grad_output, input)


def relu_bwd(g: Tensor, x: Tensor) -> Tensor:
    return torch.where(x >= 0, g, 0.0).to(x.dtype)


def sqrelu_fwd(x: Tensor) -> Tensor:
    r = F.relu(x)
    return (r * r).to(x.dtype)


def sqrelu_bwd(g: Tensor, x: Tensor) -> Tensor:
    return (2.0 * g * F.relu(x)).to(x.dtype)


def swiglu_fwd(x: Tensor, y: Tensor) -> Tensor:
    return (F.silu(x.float()) * y.float()).to(x.dtype)


def swiglu_bwd(x: Tensor, y: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    xf, yf, gf = x.float(), y.float(), g.float()
    s = torch.sigmoid(xf)
    dx = s * (1 + xf * (1 - s)) * gf * yf
    dy = xf * s * gf
    return dx.to(x.dtype), dy.to(y.dtype)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, y: Tensor) -> Tensor:
        ctx.save_for_backward(x, y)
        return swiglu_fwd(x, y)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, dout: Tensor) -> tuple[Tensor, Tensor]:
        x, y = ctx.saved_tensors  # type: ignore[attr-defined]
        return swiglu_bwd(x, y, dout)


bias_gelu_impl = GeLUFunction.apply
fast_gelu_impl = FastGeLUFunction.apply
swiglu = SwiGLUFunction.apply

NAMES = (
    "bias_gelu", "bias_gelu_back", "GeLUFunction", "bias_gelu_impl", "gelu_fwd", "gelu_bwd",
    "FastGeLUFunction", "fast_gelu_impl", "relu_bwd", "sqrelu_fwd", "sqrelu_bwd", "swiglu_fwd",
    "swiglu_bwd", "SwiGLUFunction", "swiglu",
)  # fmt: skip
