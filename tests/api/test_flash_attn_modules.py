"""The attention-adjacent modules the stand-in provides in plain torch (rotary, norms, cross-entropy),
each against flash-attn's semantics written out here (its reference functions' formulas), and with
flash-attn 2.8.3's signatures (flash_attn_2_8_3.CLASSES)."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
import torch.nn.functional as F
from flash_attn_2_8_3 import CLASSES, REQUIRED

pytestmark = pytest.mark.usefixtures("stand_in")


@pytest.mark.parametrize("path", list(CLASSES))
def test_class_signatures_are_flash_attn_2_8_3s(path: str) -> None:
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    for method, want in CLASSES[path].items():
        params = list(inspect.signature(getattr(cls, method)).parameters.values())[1:]  # after self
        got = [(p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in params]
        assert got == want, method


# ---- rotary --------------------------------------------------------------------------------------


def rope(x: torch.Tensor, positions: torch.Tensor, base: float, interleaved: bool) -> torch.Tensor:
    """RoPE as a complex rotation: pair p of each head (features (2p, 2p+1) interleaved, (p, p + d/2)
    otherwise) times exp(i * position * base^(-2p/d)), in float64."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[..., None] * freqs  # (seqlen, d/2)
    xd = x.double()
    if interleaved:
        pairs = torch.view_as_complex(xd.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    else:
        pairs = torch.complex(xd[..., : d // 2], xd[..., d // 2 :])
    turned = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    if interleaved:
        return torch.view_as_real(turned).flatten(-2)
    return torch.cat((turned.real, turned.imag), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_rotates_q_and_k_in_place(interleaved: bool) -> None:
    from flash_attn.layers.rotary import RotaryEmbedding

    qkv = torch.randn(2, 6, 3, 4, 16)
    original = qkv.clone()
    out = RotaryEmbedding(16, interleaved=interleaved)(qkv, seqlen_offset=3)
    positions = torch.arange(3, 9)
    # in place: autograd.Function.apply returns an alias of its input, as with flash-attn's Function
    assert out.data_ptr() == qkv.data_ptr()
    assert out.shape == qkv.shape
    for part in (0, 1):
        want = rope(original[:, :, part], positions, 10000.0, interleaved)
        torch.testing.assert_close(qkv[:, :, part].double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(qkv[:, :, 2], original[:, :, 2])  # v untouched


def test_rotary_embedding_gqa_layout_and_separate_kv() -> None:
    from flash_attn.layers.rotary import RotaryEmbedding

    module = RotaryEmbedding(8, base=500.0)
    qkv = torch.randn(1, 5, 4 + 2 * 2, 8)  # 4 query heads, 2 kv heads, stacked on the head dim
    original = qkv.clone()
    module(qkv, num_heads_q=4)
    positions = torch.arange(5)
    torch.testing.assert_close(
        qkv[:, :, :6].double(), rope(original[:, :, :6], positions, 500.0, False), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(qkv[:, :, 6:], original[:, :, 6:])
    q, kv = torch.randn(1, 5, 4, 8), torch.randn(1, 5, 2, 2, 8)
    q0, kv0 = q.clone(), kv.clone()
    module(q, kv)
    torch.testing.assert_close(q.double(), rope(q0, positions, 500.0, False), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        kv[:, :, 0].double(), rope(kv0[:, :, 0], positions, 500.0, False), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(kv[:, :, 1], kv0[:, :, 1])


def test_xpos_scales_queries_up_and_keys_down() -> None:
    """XPos (scale_base): each rotated pair of q times scale_i^power, of k divided by it, where
    scale_i = (2i + 0.4 d) / (1.4 d) and power = (position - seqlen // 2) / scale_base (flash-attn's)."""
    from flash_attn.layers.rotary import RotaryEmbedding

    d, seqlen, scale_base = 8, 4, 512
    plain, xpos = RotaryEmbedding(d), RotaryEmbedding(d, scale_base=scale_base)
    qkv = torch.randn(1, seqlen, 3, 1, d)
    a, b = plain(qkv.clone()), xpos(qkv.clone())
    per_pair = (torch.arange(0, d, 2) + 0.4 * d) / (1.4 * d)
    power = (torch.arange(seqlen) - seqlen // 2) / scale_base
    scale = (per_pair ** power[:, None]).repeat(1, 2)[:, None, :]  # (seqlen, 1, d): pair i at i and i + d/2
    torch.testing.assert_close(b[0, :, 0], a[0, :, 0] * scale)
    torch.testing.assert_close(b[0, :, 1], a[0, :, 1] / scale)


# ---- norms ---------------------------------------------------------------------------------------


def norm_reference(x, weight, bias, residual=None, eps=1e-6, rms=False, centered=False, residual_dtype=None):
    """flash-attn's layer_norm_ref / rms_norm_ref with upcast: sum in the residual's dtype, norm in fp32."""
    dtype = residual_dtype or (residual.dtype if residual is not None else x.dtype)
    summed = x.to(dtype) + (residual if residual is not None else 0)
    xf, w = summed.float(), weight.float() + (1.0 if centered else 0.0)
    if rms:
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w + (
            bias.float() if bias is not None else 0
        )
    else:
        y = F.layer_norm(xf, xf.shape[-1:], w, bias.float() if bias is not None else None, eps)
    return y.to(x.dtype), summed


@pytest.mark.parametrize("rms", [False, True])
def test_norm_fns_with_residual_and_prenorm(rms: bool) -> None:
    from flash_attn.ops.triton.layer_norm import layer_norm_fn

    x, residual = torch.randn(2, 5, 32).half(), torch.randn(2, 5, 32).half()
    weight, bias = torch.randn(32), torch.randn(32)
    y, summed = layer_norm_fn(x, weight, bias, residual, eps=1e-5, prenorm=True, is_rms_norm=rms)
    want_y, want_sum = norm_reference(x, weight, bias, residual, 1e-5, rms)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(summed, want_sum)
    assert (y.dtype, summed.dtype) == (torch.float16, torch.float16)


def test_rms_norm_residual_in_fp32_and_zero_centered_weight() -> None:
    from flash_attn.ops.triton.layer_norm import rms_norm_fn

    x = torch.randn(3, 16).bfloat16()
    weight = torch.randn(16) * 0.1
    y, summed = rms_norm_fn(x, weight, None, prenorm=True, residual_in_fp32=True, zero_centered_weight=True)
    want_y, want_sum = norm_reference(x, weight, None, None, 1e-6, True, True, torch.float32)
    assert summed.dtype == torch.float32
    torch.testing.assert_close(summed, want_sum)
    torch.testing.assert_close(y, want_y)


def test_rms_norm_module_is_rms_norm_fn_with_its_weight() -> None:
    from flash_attn.ops.triton.layer_norm import RMSNorm, rms_norm_fn

    module = RMSNorm(16, eps=1e-5)
    x = torch.randn(2, 16)
    assert module.bias is None
    torch.testing.assert_close(module(x), rms_norm_fn(x, torch.ones(16), None, eps=1e-5))
    torch.testing.assert_close(module(x), x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5))


# ---- cross-entropy -------------------------------------------------------------------------------


def test_cross_entropy_matches_torch_with_ignore_index_and_label_smoothing() -> None:
    """flash-attn's smoothing is s * (lse - mean(logits)) + (1 - s) * nll, which is torch's formula."""
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    logits = torch.randn(6, 11, requires_grad=True)
    target = torch.tensor([1, -100, 4, 10, 0, -100])
    for smoothing in (0.0, 0.1):
        ours = CrossEntropyLoss(label_smoothing=smoothing)(logits, target)
        want = F.cross_entropy(logits, target, ignore_index=-100, label_smoothing=smoothing)
        torch.testing.assert_close(ours, want)
    ours.backward()
    assert logits.grad is not None


def test_cross_entropy_logit_scale_z_loss_and_reductions() -> None:
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    logits, target = torch.randn(4, 7).half(), torch.tensor([0, 3, -100, 6])
    loss, z_loss = CrossEntropyLoss(
        reduction="none", logit_scale=0.5, lse_square_scale=1e-3, return_z_loss=True
    )(logits, target)
    scaled = logits.float() * 0.5
    lse = torch.logsumexp(scaled, -1)
    want_z = 1e-3 * lse.square() * (target != -100)
    want = F.cross_entropy(scaled, target, reduction="none") + want_z
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(z_loss, want_z)
    total = CrossEntropyLoss(reduction="sum")(logits, target)
    torch.testing.assert_close(total, F.cross_entropy(logits.float(), target, reduction="sum"))


def test_cross_entropy_refuses_a_process_group_with_what_to_do() -> None:
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    with pytest.raises(ValueError, match="process_group"):
        CrossEntropyLoss(process_group=object())
