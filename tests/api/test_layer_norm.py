"""flash-attn 2.8.3's tests/ops/triton/test_layer_norm.py, ported from its intent to the CPU (fp32/fp64,
sampled parameters): the stand-in's layer_norm_fn / rms_norm_fn with residual, parallel x1 and a second
weight, rowscale, prenorm, residual_in_fp32, zero-centered weights and dropout (its masks returned with
return_dropout_mask=True), against a reference written here from the documented formula (norms.py's
docstring), outputs and gradients of every input; layer_norm_linear_fn; and flash-attn's own
layer_norm_ref / rms_norm_ref (which flash-attn's test uses as its reference) against the same."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.usefixtures("stand_in")


def formula(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, rowscale=None,
            masks=(None, None), p=0.0, rms=False, centered=False):  # fmt: skip
    """fp64: summed = drop(x * rowscale) + drop(x1) + residual; y = norm(summed) * w (+ 1 centered) + b."""
    xd = x.double() * (rowscale.double()[..., None] if rowscale is not None else 1.0)
    if masks[0] is not None:
        xd = xd * masks[0] / (1 - p)
    summed = xd
    if x1 is not None:
        summed = summed + x1.double() * (masks[1] / (1 - p) if masks[1] is not None else 1.0)
    if residual is not None:
        summed = summed + residual.double()
    if rms:
        normed = summed / torch.sqrt(summed.square().mean(-1, keepdim=True) + eps)
    else:
        centred = summed - summed.mean(-1, keepdim=True)
        normed = centred / torch.sqrt(centred.square().mean(-1, keepdim=True) + eps)

    def affine(w, b):
        w = w.double() + 1.0 if centered else w.double()
        return normed * w + (b.double() if b is not None else 0.0)

    return affine(weight, bias), (affine(weight1, bias1) if weight1 is not None else None), summed


SAMPLES = [
    # (rms, has residual, has x1 and weight1, rowscale, dropout_p, zero-centered, residual_in_fp32, dtype)
    (False, True, False, False, 0.0, False, False, torch.float64),
    (True, True, False, True, 0.0, True, False, torch.float64),
    (False, False, True, False, 0.2, False, True, torch.float32),
    (True, True, True, False, 0.3, False, False, torch.float64),
    (True, False, False, True, 0.1, True, True, torch.float32),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_layer_norm_fn_outputs_masks_and_gradients(sample: tuple) -> None:
    from flash_attn.ops.triton.layer_norm import layer_norm_fn

    rms, has_res, has_x1, has_rowscale, p, centered, res_fp32, dtype = sample
    g = torch.Generator().manual_seed(hash(sample) % 1000)
    rows, n = 6, 32

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    x, weight, bias = leaf(2, rows // 2, n), leaf(n), leaf(n)
    residual = leaf(2, rows // 2, n) if has_res else None
    x1, weight1, bias1 = (leaf(2, rows // 2, n), leaf(n), leaf(n)) if has_x1 else (None, None, None)
    rowscale = torch.rand(2, rows // 2, generator=g, dtype=dtype) if has_rowscale else None
    results = layer_norm_fn(
        x, weight, bias, residual, x1, weight1, bias1, eps=1e-5, dropout_p=p, rowscale=rowscale, prenorm=True,
        residual_in_fp32=res_fp32, zero_centered_weight=centered, is_rms_norm=rms, return_dropout_mask=True,
    )  # fmt: skip
    *outputs, mask, mask1 = results
    if p == 0:
        assert mask is None
        assert mask1 is None
    else:
        assert mask.dtype == torch.bool
        assert mask.shape == x.shape
        assert (mask1 is not None) == has_x1
        kept = mask.double().mean().item()
        assert 1 - p - 0.25 < kept < 1 - p + 0.25
    y, y1, summed = (outputs[0], outputs[1], outputs[2]) if has_x1 else (outputs[0], None, outputs[1])
    want_y, want_y1, want_summed = formula(
        x, weight, bias, residual, x1, weight1, bias1, 1e-5, rowscale, (mask, mask1), p, rms, centered
    )
    assert y.dtype == dtype
    assert summed.dtype == (residual.dtype if has_res else (torch.float32 if res_fp32 else dtype))
    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y.double(), want_y, **close)
    torch.testing.assert_close(summed.double(), want_summed, **close)
    if has_x1:
        torch.testing.assert_close(y1.double(), want_y1, **close)
    leaves = [t for t in (x, weight, bias, residual, x1, weight1, bias1) if t is not None]
    grads_out = [torch.randn_like(t) for t in outputs]
    got = torch.autograd.grad(outputs, leaves, grads_out)
    want_outputs = [t for t in (want_y, want_y1, want_summed) if t is not None]
    want = torch.autograd.grad(want_outputs, leaves, [t.double() for t in grads_out])
    for ours, ref in zip(got, want, strict=True):
        torch.testing.assert_close(ours.double(), ref.double(), **close)


@pytest.mark.parametrize("rms", [False, True])
def test_flash_attns_reference_functions_are_the_formula(rms: bool) -> None:
    """layer_norm_ref / rms_norm_ref: flash-attn's test compares its kernels with them; here with the formula,
    dropout from the masks given."""
    from flash_attn.ops.triton.layer_norm import layer_norm_ref, rms_norm_ref

    g = torch.Generator().manual_seed(3)
    x, residual, x1 = (torch.randn(4, 16, generator=g, dtype=torch.float64) for _ in range(3))
    weight, bias, weight1 = (torch.randn(16, generator=g, dtype=torch.float64) for _ in range(3))
    masks = (torch.rand(4, 16, generator=g) > 0.3, torch.rand(4, 16, generator=g) > 0.3)
    ref = rms_norm_ref if rms else layer_norm_ref
    y, y1, summed = ref(
        x, weight, bias, residual, x1, weight1, None, 1e-6, 0.3, None, True, True, masks[0], masks[1]
    )
    want = formula(x, weight, bias, residual, x1, weight1, None, 1e-6, None, masks, 0.3, rms, True)
    for ours, ref_value in zip((y, y1, summed), want, strict=True):
        torch.testing.assert_close(ours, ref_value)
    upcast = ref(x.float(), weight.float(), bias.float(), upcast=True)
    assert upcast.dtype == torch.float32


@pytest.mark.parametrize("prenorm", [False, True])
def test_layer_norm_linear_fn_is_the_norm_then_the_linear(prenorm: bool) -> None:
    from flash_attn.ops.triton.layer_norm import layer_norm_linear_fn

    g = torch.Generator().manual_seed(4)
    x, residual = (
        torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    norm_weight, norm_bias = (
        torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    linear_weight = torch.randn(6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    linear_bias = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    result = layer_norm_linear_fn(
        x, norm_weight, norm_bias, linear_weight, linear_bias, residual, 1e-5, prenorm
    )
    y, _, summed = formula(x, norm_weight, norm_bias, residual, eps=1e-5)
    want = F.linear(y, linear_weight, linear_bias)
    out = result[0] if prenorm else result
    close = {"rtol": 1e-5, "atol": 1e-5}  # the norm runs in fp32, as flash-attn's kernel
    torch.testing.assert_close(out, want, **close)
    if prenorm:
        torch.testing.assert_close(result[1], summed)
    leaves = [x, residual, norm_weight, norm_bias, linear_weight, linear_bias]
    grad = torch.randn_like(want)
    for ours, ref in zip(
        torch.autograd.grad(out, leaves, grad), torch.autograd.grad(want, leaves, grad), strict=True
    ):
        torch.testing.assert_close(ours, ref, **close)
