"""flash-attn 2.8.3's tests/test_rotary.py and tests/layers/test_rotary.py, ported from their intent to the
CPU (fp32/fp64 instead of fp16/bf16 on a GPU, sampled parameters instead of the full grid): the stand-in's
rotary functions (flash_attn.layers.rotary, flash_attn.ops.triton.rotary) against a reference written from
the documented formula (rotary.py's docstring), outputs and gradients, in place on leaf tensors as
flash-attn allows, packed with cu_seqlens, with tensor offsets, and under torch.compile; RotaryEmbedding
against transformers' GPT-NeoX rotary (the real library, as flash-attn's layers test does).

The reference: pair (a, b) of features (i, i + r/2), or (2i, 2i + 1) interleaved, of the first r = 2 *
cos.shape[-1] features at position p becomes (a cos[p, i] - b sin[p, i], b cos[p, i] + a sin[p, i]); the
rest pass through. Its gradient is the same map with -sin (the transpose)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("stand_in")


def reference(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
):
    """x (b, s, h, d), positions (b, s) rows of cos/sin -> fp64."""
    half = cos.shape[-1]
    xd = x.double()
    c = cos.double()[positions].unsqueeze(2)  # (b, s, 1, half)
    s = sin.double()[positions].unsqueeze(2)
    if interleaved:
        a, b = xd[..., 0 : 2 * half : 2], xd[..., 1 : 2 * half : 2]
        turned = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = xd[..., :half], xd[..., half : 2 * half]
        turned = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((turned, xd[..., 2 * half :]), dim=-1)


def tables(seqlen: int, rotary_dim: int, dtype: torch.dtype, g: torch.Generator):
    angle = torch.rand(seqlen, rotary_dim // 2, generator=g, dtype=torch.float64) * 2 * torch.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def positions_of(batch: int, seqlen: int, offsets: int | torch.Tensor) -> torch.Tensor:
    start = offsets if isinstance(offsets, torch.Tensor) else torch.full((batch,), offsets)
    return start.long().unsqueeze(1) + torch.arange(seqlen)


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}


SAMPLES = [
    # (dtype, inplace, interleaved, rotary fraction, tensor offsets)
    (torch.float32, False, False, 1.0, False),
    (torch.float32, True, True, 0.5, True),
    (torch.float64, True, False, 0.5, False),
    (torch.float64, False, True, 1.0, True),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_apply_rotary_emb_on_a_leaf(sample: tuple) -> None:
    """tests/test_rotary.py's test_rotary_emb_func: x is a leaf that requires grad, also with inplace."""
    from flash_attn.layers.rotary import apply_rotary_emb

    dtype, inplace, interleaved, fraction, tensor_offsets = sample
    g = torch.Generator().manual_seed(7)
    batch, seqlen, heads, dim = 2, 9, 3, 16
    cos, sin = tables(seqlen + 8, int(dim * fraction), dtype, g)
    offsets = torch.tensor([0, 5], dtype=torch.int32) if tensor_offsets else 3
    x = torch.randn(batch, seqlen, heads, dim, generator=g, dtype=dtype, requires_grad=True)
    original = x.detach().clone()
    out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets=offsets)
    positions = positions_of(batch, seqlen, offsets)
    torch.testing.assert_close(
        out.double(), reference(original, cos, sin, positions, interleaved), **tol(dtype)
    )
    if inplace:
        torch.testing.assert_close(x.detach(), out.detach())
    else:
        torch.testing.assert_close(x.detach(), original)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(
        x.grad.double(), reference(grad, cos, -sin, positions, interleaved), **tol(dtype)
    )


@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rotary_emb_packed_with_cu_seqlens(inplace: bool) -> None:
    """test_rotary_emb_varlen_func: each sequence of the packed rows from its own offset."""
    from flash_attn.layers.rotary import apply_rotary_emb

    g = torch.Generator().manual_seed(8)
    cu = torch.tensor([0, 4, 11, 12], dtype=torch.int32)
    offsets = torch.tensor([2, 0, 6], dtype=torch.int32)
    cos, sin = tables(20, 8, torch.float64, g)
    x = torch.randn(12, 2, 12, generator=g, dtype=torch.float64, requires_grad=True)
    original = x.detach().clone()
    out = apply_rotary_emb(x, cos, sin, True, inplace, offsets, cu, 7)
    grad = torch.randn_like(out)
    out.backward(grad)
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        positions = positions_of(1, rows.stop - rows.start, offsets[b : b + 1])
        want = reference(original[rows][None], cos, sin, positions, True)[0]
        torch.testing.assert_close(out[rows].detach(), want)
        torch.testing.assert_close(x.grad[rows], reference(grad[rows][None], cos, -sin, positions, True)[0])


@pytest.mark.parametrize("gqa", [False, True])
def test_apply_rotary_emb_qkv_in_place_with_its_own_k_tables(gqa: bool) -> None:
    """test_rotary_emb_qkv: q with cos/sin, k with cos_k/sin_k, v untouched; on a leaf; the 4-D GQA layout."""
    from flash_attn.layers.rotary import apply_rotary_emb_qkv_

    g = torch.Generator().manual_seed(9)
    cos, sin = tables(10, 8, torch.float64, g)
    cos_k, sin_k = cos * 0.9, sin * 0.9  # XPos-like tables: the map is then a scaled rotation
    heads_q, heads_k = (4, 2) if gqa else (3, 3)
    shape = (2, 6, heads_q + 2 * heads_k, 8) if gqa else (2, 6, 3, heads_q, 8)
    qkv = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    original = qkv.detach().clone()
    out = apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, False, 2, heads_q if gqa else None)

    def parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if gqa:
            return t[:, :, :heads_q], t[:, :, heads_q : heads_q + heads_k], t[:, :, heads_q + heads_k :]
        return t[:, :, 0], t[:, :, 1], t[:, :, 2]

    positions = positions_of(2, 6, 2)
    q, k, v = parts(out.detach())
    q0, k0, v0 = parts(original)
    torch.testing.assert_close(q, reference(q0, cos, sin, positions, False))
    torch.testing.assert_close(k, reference(k0, cos_k, sin_k, positions, False))
    torch.testing.assert_close(v, v0)
    grad = torch.randn_like(out)
    out.backward(grad)
    dq, dk, dv = parts(qkv.grad)
    gq, gk, gv = parts(grad)
    torch.testing.assert_close(dq, reference(gq, cos, -sin, positions, False))
    torch.testing.assert_close(dk, reference(gk, cos_k, -sin_k, positions, False))
    torch.testing.assert_close(dv, gv)


def test_apply_rotary_emb_kv_in_place_on_a_leaf() -> None:
    from flash_attn.layers.rotary import apply_rotary_emb_kv_

    g = torch.Generator().manual_seed(10)
    cos, sin = tables(8, 4, torch.float64, g)
    kv = torch.randn(2, 5, 2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    original = kv.detach().clone()
    offsets = torch.tensor([1, 3])
    out = apply_rotary_emb_kv_(kv, cos, sin, True, offsets)
    positions = positions_of(2, 5, offsets)
    torch.testing.assert_close(out[:, :, 0].detach(), reference(original[:, :, 0], cos, sin, positions, True))
    torch.testing.assert_close(out[:, :, 1].detach(), original[:, :, 1])
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(kv.grad[:, :, 0], reference(grad[:, :, 0], cos, -sin, positions, True))
    torch.testing.assert_close(kv.grad[:, :, 1], grad[:, :, 1])


def test_in_place_rotary_compiles() -> None:
    """test_compiled_rotary's intent: in-place rotary on a leaf under torch.compile, forward and backward."""
    from flash_attn.layers.rotary import apply_rotary_emb

    g = torch.Generator().manual_seed(11)
    cos, sin = tables(8, 8, torch.float32, g)
    x = torch.randn(1, 8, 2, 8, generator=g, requires_grad=True)
    original = x.detach().clone()

    def step(x: torch.Tensor) -> torch.Tensor:
        return apply_rotary_emb(x, cos, sin, False, True).square().sum()

    torch.compile(step, backend="aot_eager")(x).backward()
    rotated = reference(original, cos, sin, positions_of(1, 8, 0), False)
    torch.testing.assert_close(x.detach().double(), rotated, rtol=1e-5, atol=1e-5)
    want = reference(2 * rotated, cos, -sin, positions_of(1, 8, 0), False)  # d(sum y^2)/dx = R^T 2y
    torch.testing.assert_close(x.grad.double(), want, rtol=1e-5, atol=1e-5)


def test_ops_triton_apply_rotary_and_its_conjugate() -> None:
    """flash_attn.ops.triton.rotary.apply_rotary (ModernBERT imports it): conjugate=True undoes the rotation,
    inplace writes into x."""
    from flash_attn.ops.triton.rotary import apply_rotary

    g = torch.Generator().manual_seed(12)
    cos, sin = tables(6, 8, torch.float64, g)
    x = torch.randn(2, 6, 2, 10, generator=g, dtype=torch.float64)
    out = apply_rotary(x, cos, sin, interleaved=False)
    torch.testing.assert_close(out, reference(x, cos, sin, positions_of(2, 6, 0), False))
    back = out.clone()
    assert apply_rotary(back, cos, sin, conjugate=True, inplace=True) is back
    torch.testing.assert_close(back, x)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_torch_and_rotate_half(interleaved: bool) -> None:
    from flash_attn.layers.rotary import apply_rotary_emb_torch, rotate_half

    g = torch.Generator().manual_seed(13)
    cos, sin = tables(5, 6, torch.float64, g)
    x = torch.randn(3, 5, 2, 8, generator=g, dtype=torch.float64)
    want = reference(x, cos, sin, positions_of(3, 5, 0), interleaved)
    torch.testing.assert_close(apply_rotary_emb_torch(x, cos, sin, interleaved), want)
    # rotate_half is the 90-degree turn: cos 0, sin 1
    full = torch.randn(2, 4, 1, 6, generator=g, dtype=torch.float64)
    quarter = reference(full, torch.zeros(4, 3), torch.ones(4, 3), positions_of(2, 4, 0), interleaved)
    torch.testing.assert_close(rotate_half(full, interleaved), quarter)


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary_embedding_matches_transformers_gpt_neox(rotary_dim: int) -> None:
    """tests/layers/test_rotary.py: RotaryEmbedding on a leaf qkv against transformers' GPT-NeoX rotary
    (apply_rotary_pos_emb with cos/sin of the same inverse frequencies), outputs and gradients."""
    from flash_attn.layers.rotary import RotaryEmbedding
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(14)
    batch, seqlen, heads, dim = 2, 7, 3, 16
    qkv = torch.randn(batch, seqlen, 3, heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
    ref_qkv = qkv.detach().clone().requires_grad_()
    out = RotaryEmbedding(rotary_dim)(qkv)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    emb = torch.cat([torch.outer(torch.arange(seqlen, dtype=torch.float64), inv_freq)] * 2, dim=-1)
    q, k = (ref_qkv[:, :, i].transpose(1, 2) for i in (0, 1))  # transformers' (batch, heads, seqlen, dim)
    q_rot, k_rot = apply_rotary_pos_emb(
        q[..., :rotary_dim], k[..., :rotary_dim], emb.cos()[None], emb.sin()[None]
    )
    q_ref, k_ref = (
        torch.cat((r, t[..., rotary_dim:]), -1).transpose(1, 2) for r, t in ((q_rot, q), (k_rot, k))
    )
    # RotaryEmbedding's cos/sin tables are fp32 (flash-attn computes them so), cast to qkv's dtype
    torch.testing.assert_close(out[:, :, 0], q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[:, :, 1], k_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[:, :, 2], ref_qkv[:, :, 2])
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.autograd.backward([q_ref, k_ref, ref_qkv[:, :, 2]], [grad[:, :, 0], grad[:, :, 1], grad[:, :, 2]])
    torch.testing.assert_close(qkv.grad, ref_qkv.grad, rtol=1e-6, atol=1e-6)


def test_modernberts_unpadded_rotary_call_site() -> None:
    """transformers 4.48-4.57's ModernBERT imports flash_attn.ops.triton.rotary.apply_rotary at module import
    and calls it inside its own autograd Function on the packed (total, 3, heads, dim) qkv: q and k as one
    (total, 2 * heads, dim) view rotated in place with cu_seqlens, and the conjugate in place for the
    gradient. The same calls here, against the reference."""
    from flash_attn.ops.triton.rotary import apply_rotary

    class UnpaddedRotary(torch.autograd.Function):
        @staticmethod
        def forward(ctx, qkv, cos, sin, cu_seqlens, max_seqlen):
            qkv = qkv.contiguous()
            total, _three, _heads, dim = qkv.shape
            qk = qkv[:, :2].view(total, -1, dim)
            apply_rotary(
                qk, cos, sin, seqlen_offsets=0, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, inplace=True
            )
            ctx.save_for_backward(cos, sin, cu_seqlens)
            ctx.max_seqlen = max_seqlen
            return qkv

        @staticmethod
        def backward(ctx, grad):
            cos, sin, cu_seqlens = ctx.saved_tensors
            grad = grad.contiguous()
            total, _three, _heads, dim = grad.shape
            dqk = grad[:, :2].view(total, -1, dim)
            apply_rotary(
                dqk, cos, sin, seqlen_offsets=0, cu_seqlens=cu_seqlens, max_seqlen=ctx.max_seqlen, inplace=True,
                conjugate=True,
            )  # fmt: skip
            return grad, None, None, None, None

    g = torch.Generator().manual_seed(15)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    cos, sin = tables(8, 8, torch.float64, g)
    qkv = torch.randn(8, 3, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    original = qkv.detach().clone()  # in place: ModernBERT's qkv is contiguous, so the Function rotates it
    out = UnpaddedRotary.apply(qkv, cos, sin, cu, 5)
    grad = torch.randn_like(out)
    out.backward(grad.clone())  # its backward rotates the gradient it gets in place, as ModernBERT's
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        positions = positions_of(1, rows.stop - rows.start, 0)
        for part in (0, 1):
            want = reference(original[rows, part][None], cos, sin, positions, False)[0]
            torch.testing.assert_close(out.detach()[rows, part], want)
            torch.testing.assert_close(
                qkv.grad[rows, part], reference(grad[rows, part][None], cos, -sin, positions, False)[0]
            )
        torch.testing.assert_close(out.detach()[rows, 2], original[rows, 2])
        torch.testing.assert_close(qkv.grad[rows, 2], grad[rows, 2])
