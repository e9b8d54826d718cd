"""flash-attn 2.8.3's tests/losses/test_cross_entropy.py, ported from its intent to the CPU: the stand-in's
`flash_attn.losses.cross_entropy.CrossEntropyLoss` against torch's cross-entropy (the reference), losses
and gradients, over sampled vocabularies, label smoothing, logit scale, z-loss, ignored rows and a
precomputed lse, in fp32 and fp64 (flash-attn's file runs fp16/bf16/fp32 on a GPU).

The reference, from the documented formula (cross_entropy.py's docstring): per row, torch's
F.cross_entropy of the scaled logits (label smoothing as torch's, which is flash-attn's) plus
lse_square_scale * logsumexp^2; ignored rows give 0; "mean" divides by the rows not ignored. With a
precomputed lse, flash-attn's backward takes the softmax from it (P = exp(logit - lse)): the logits get
the full gradient, as if lse were their own logsumexp, and the lse tensor gets none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.usefixtures("stand_in")


def _reference(x, y, smoothing, scale, z, ignore_index=-100, reduction="mean"):
    logits = x.double() * scale
    ce = F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing, ignore_index=ignore_index)
    kept = y != ignore_index
    loss = ce + torch.where(kept, z * torch.logsumexp(logits, -1).square(), 0.0)
    if reduction == "mean":
        return loss.sum() / kept.sum()
    return loss.sum() if reduction == "sum" else loss


SAMPLES = [
    # (rows, vocab, label smoothing, logit scale, z-loss scale, reduction, dtype)
    (8, 50, 0.0, 1.0, 0.0, "mean", torch.float32),
    (13, 257, 0.1, 0.7, 1e-3, "mean", torch.float64),
    (6, 1000, 0.0, 1.3, 1e-2, "sum", torch.float32),
    (9, 31, 0.2, 1.0, 0.0, "none", torch.float64),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
@pytest.mark.parametrize("precomputed", [False, True])
def test_losses_and_gradients_match_torch(sample: tuple, precomputed: bool) -> None:
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    rows, vocab, smoothing, scale, z, reduction, dtype = sample
    g = torch.Generator().manual_seed(rows * vocab)
    x = (torch.randn(rows, vocab, generator=g, dtype=dtype) * 3).requires_grad_()
    y = torch.randint(0, vocab, (rows,), generator=g)
    y[torch.rand(rows, generator=g) < 0.25] = -100  # ignored rows, as flash-attn's test sets them
    ref_x = x.detach().clone().requires_grad_()
    want = _reference(ref_x, y, smoothing, scale, z, reduction=reduction)
    loss_fn = CrossEntropyLoss(
        label_smoothing=smoothing, logit_scale=scale, lse_square_scale=z, reduction=reduction
    )
    lse = torch.logsumexp(x.detach().float() * scale, -1) if precomputed else None
    got = loss_fn(x, y, precomputed_lse=lse)
    tol = 1e-5 if dtype == torch.float32 else 1e-6  # the losses are fp32, as flash-attn's
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    grad = torch.randn_like(want)
    got.backward(grad.to(got.dtype))
    want.backward(grad)
    torch.testing.assert_close(x.grad.double(), ref_x.grad.double(), rtol=tol, atol=tol)


def test_a_precomputed_lse_gets_no_gradient_and_gives_the_logits_theirs() -> None:
    """flash-attn's CrossEntropyLossFunction.backward returns None for precomputed_lse: a caller's lse
    computed with autograd is not counted twice."""
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 40, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 40, (5,), generator=g)
    lse = torch.logsumexp(x, -1)  # with autograd, through x
    CrossEntropyLoss(lse_square_scale=1e-2)(x, y, precomputed_lse=lse).backward()
    ref = x.detach().clone().requires_grad_()
    _reference(ref, y, 0.0, 1.0, 1e-2).backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-6, atol=1e-6)


def test_return_z_loss_gives_the_z_part_for_logging() -> None:
    from flash_attn.losses.cross_entropy import CrossEntropyLoss

    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 20, generator=g, dtype=torch.float64)
    y = torch.randint(0, 20, (7,), generator=g)
    y[2] = -100
    loss, z_loss = CrossEntropyLoss(lse_square_scale=0.1, return_z_loss=True)(x, y)
    kept = y != -100
    want_z = (0.1 * torch.logsumexp(x, -1).square())[kept].sum() / kept.sum()
    torch.testing.assert_close(z_loss.double(), want_z, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss.double(), _reference(x, y, 0.0, 1.0, 0.1), rtol=1e-6, atol=1e-6)
    assert not z_loss.requires_grad
