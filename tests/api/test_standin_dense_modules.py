"""The stand-in's flash_attn.ops.activations, flash_attn.ops.fused_dense, flash_attn.modules.mlp,
flash_attn.utils.distributed, flash_attn.flash_attn_triton and flash_attn.ops.triton.cross_entropy,
imported as real code imports them, against the formulas their modules document (float64, written here
from the formulas, never from the code under test). The tensor-parallel forms run on two real gloo ranks
(tp_ranks.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from two_ranks import run_ranks

pytestmark = pytest.mark.usefixtures("stand_in")


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def grad_of(f, *inputs: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    return torch.autograd.grad(f(*leaves), leaves, g)


def test_activations_match_their_formulas() -> None:
    from flash_attn.ops.activations import (
        bias_gelu,
        bias_gelu_back,
        bias_gelu_impl,
        fast_gelu_impl,
        gelu_bwd,
        gelu_fwd,
        relu_bwd,
        sqrelu_bwd,
        sqrelu_fwd,
        swiglu,
    )

    torch.manual_seed(0)
    x, y, g = (torch.randn(6, 5, dtype=torch.float64) * 3 for _ in range(3))
    bias = torch.randn(5, dtype=torch.float64)
    # flash-attn's constant sqrt(2/pi) has 8 digits: agreement to ~1e-8 relative, not to fp64 rounding
    assert torch.allclose(gelu_fwd(x), tanh_gelu(x), atol=1e-7)
    assert torch.allclose(gelu_bwd(g, x), grad_of(tanh_gelu, x, g=g)[0], atol=1e-7)
    assert torch.allclose(bias_gelu(y, bias), tanh_gelu(y + bias), atol=1e-7)
    dy, dbias = bias_gelu_back(g, y, bias)
    ref_dy, ref_dbias = grad_of(lambda a, b: tanh_gelu(a + b), y, bias, g=g)
    assert torch.allclose(dy, ref_dy, atol=1e-7)
    assert torch.allclose(dbias, ref_dbias, atol=1e-6)
    assert dbias.shape == bias.shape
    for fn, ref, inputs in (
        (lambda a, b: bias_gelu_impl(a, b), lambda a, b: tanh_gelu(a + b), (y, bias)),
        (lambda a: fast_gelu_impl(a), tanh_gelu, (x,)),
        (lambda a, b: swiglu(a, b), lambda a, b: a * torch.sigmoid(a) * b, (x, y)),
    ):
        assert torch.allclose(fn(*inputs), ref(*inputs), atol=1e-7)
        for got, want in zip(grad_of(fn, *inputs, g=g), grad_of(ref, *inputs, g=g), strict=True):
            assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(relu_bwd(g, x), torch.where(x >= 0, g, torch.zeros_like(g)))
    assert torch.allclose(sqrelu_fwd(x), x.clamp(min=0) ** 2)
    assert torch.allclose(sqrelu_bwd(g, x), grad_of(lambda a: a.clamp(min=0) ** 2, x, g=g)[0])
    half = x.half()
    assert gelu_fwd(half).dtype == torch.float16
    assert swiglu(half, half).dtype == torch.float16


@pytest.mark.parametrize("activation", ["gelu_approx", "relu", "sqrelu"])
@pytest.mark.parametrize("return_residual", [False, True])
def test_fused_mlp_is_fc2_of_activation_of_fc1(activation: str, return_residual: bool) -> None:
    from flash_attn.ops.fused_dense import FusedDense, FusedMLP, fused_dense_func, fused_mlp_func

    torch.manual_seed(1)
    mlp = FusedMLP(8, 24, 6, activation=activation, return_residual=return_residual, dtype=torch.float64)
    assert mlp.fc1.weight.shape == (24, 8)
    assert mlp.fc2.weight.shape == (6, 24)
    assert sorted(mlp.state_dict()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    act = {
        "gelu_approx": tanh_gelu,
        "relu": lambda t: t.clamp(min=0),
        "sqrelu": lambda t: t.clamp(min=0) ** 2,
    }
    h = act[activation](x @ mlp.fc1.weight.T + mlp.fc1.bias)
    want = h @ mlp.fc2.weight.T + mlp.fc2.bias
    got = mlp(x)
    if return_residual:
        got, residual = got
        assert residual is x
    assert torch.allclose(got, want)
    dout = torch.randn_like(want)
    params = [x, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias]
    for a, b in zip(
        torch.autograd.grad(got, params, dout), torch.autograd.grad(want, params, dout), strict=True
    ):
        assert torch.allclose(a, b)
    functional = fused_mlp_func(x, mlp.fc1.weight, mlp.fc2.weight, mlp.fc1.bias, mlp.fc2.bias, activation)
    assert torch.allclose(functional, want)  # type: ignore[arg-type]
    dense = FusedDense(8, 4, return_residual=True, dtype=torch.float64)
    out, residual = dense(x)
    assert torch.allclose(out, x @ dense.weight.T + dense.bias)
    assert residual is x
    assert torch.allclose(fused_dense_func(x, dense.weight), x @ dense.weight.T)  # type: ignore[arg-type]


def test_fused_mlp_refuses_what_flash_attn_refuses() -> None:
    from flash_attn.ops.fused_dense import FusedMLP, ParallelFusedMLP

    with pytest.raises(ValueError, match="activation: 'silu'"):
        FusedMLP(8, activation="silu")
    with pytest.raises(ValueError, match="checkpoint_lvl"):
        FusedMLP(8, checkpoint_lvl=3)
    with pytest.raises(ValueError, match="process_group"):
        ParallelFusedMLP(8)


def test_mlp_and_gated_mlp_match_their_formulas() -> None:
    from flash_attn.modules.mlp import GatedMlp, Mlp

    torch.manual_seed(2)
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    mlp = Mlp(16, dtype=torch.float64)
    assert mlp.fc1.weight.shape == (64, 16)  # hidden defaults to 4 * in_features
    assert torch.allclose(
        mlp(x), F.gelu(x @ mlp.fc1.weight.T + mlp.fc1.bias) @ mlp.fc2.weight.T + mlp.fc2.bias
    )
    for activation in (F.sigmoid, F.silu, F.relu):
        gated = GatedMlp(16, activation=activation, multiple_of=8, return_residual=True, dtype=torch.float64)
        hidden = (int(8 * 16 / 3) + 7) // 8 * 8  # 8/3 of in_features, up to a multiple of multiple_of
        assert gated.fc1.weight.shape == (2 * hidden, 16)
        assert gated.fc2.weight.shape == (16, hidden)
        y = x @ gated.fc1.weight.T + gated.fc1.bias
        value, gate = y[..., :hidden], y[..., hidden:]
        act = torch.sigmoid(gate) if activation is F.sigmoid else activation(gate)
        out, residual = gated(x)
        assert torch.allclose(out, (value * act) @ gated.fc2.weight.T + gated.fc2.bias)
        assert residual is x


def test_get_dim_for_local_rank_splits_in_units() -> None:
    from flash_attn.utils.distributed import get_dim_for_local_rank

    for dim, world, unit in ((96, 4, 1), (100, 3, 4), (7, 2, 1), (256, 3, 64)):
        shares = [get_dim_for_local_rank(dim, world, rank, unit) for rank in range(world)]
        assert sum(shares) == dim // unit * unit
        assert all(s % unit == 0 for s in shares)
        assert max(shares) - min(shares) <= unit
        assert shares == sorted(shares, reverse=True)


def test_tensor_parallel_layers_on_two_ranks_match_the_unsharded_mlp() -> None:
    cases = run_ranks("tp_ranks.py")
    expected = {
        f"{name}-{'sp' if sp else 'nosp'}"
        for name in (
            "ParallelMLP",
            "ParallelGatedMlp",
            "ParallelFusedMLP",
            "ParallelMHA",
            "ParallelGPT2Embeddings",
        )
        for sp in (True, False)
    } | {"collectives"}
    assert set(cases) == expected, cases.get("stderr")
    for name, errors in cases.items():
        assert all(float(e) < 1e-12 for e in errors), (name, errors)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool, scale: float
) -> torch.Tensor:
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        scores = scores + bias
    if causal:  # top-left: query i sees keys j <= i
        i = torch.arange(q.shape[1])[:, None]
        j = torch.arange(k.shape[1])[None, :]
        scores = scores.masked_fill(j > i, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias_kind", [None, "vector", "matrix"])
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(5, 5), (3, 7), (7, 3)])
def test_triton_attention_matches_its_formula(
    causal: bool, bias_kind: str | None, seqlen_q: int, seqlen_k: int
) -> None:
    from flash_attn.flash_attn_triton import (
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
    )

    torch.manual_seed(3)
    batch, heads, dim = 2, 3, 8
    q = torch.randn(batch, seqlen_q, heads, dim, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(batch, seqlen_k, heads, dim, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    rows = 1 if bias_kind == "vector" else seqlen_q
    bias = None if bias_kind is None else torch.randn(1, heads, rows, seqlen_k, dtype=torch.float64)
    got = flash_attn_func(q, k, v, bias, causal)  # positional, as Function.apply callers pass them
    want = reference_attention(q, k, v, bias, causal, 1 / math.sqrt(dim))
    assert torch.allclose(got, want)
    dout = torch.randn_like(want)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout), strict=True
    ):
        assert torch.allclose(a, b)
    kv = torch.stack([k, v], dim=2)
    assert torch.allclose(
        flash_attn_kvpacked_func(q, kv, bias, causal, 0.5), reference_attention(q, k, v, bias, causal, 0.5)
    )
    if seqlen_q == seqlen_k:
        qkv = torch.stack([q, k, v], dim=2)
        assert torch.allclose(flash_attn_qkvpacked_func(qkv, bias, causal), want)


def test_triton_attention_refuses_a_bias_of_another_shape() -> None:
    from flash_attn.flash_attn_triton import flash_attn_func

    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match=r"last 2 dimensions of bias must be \(1, seqlen_k\)"):
        flash_attn_func(q, q, q, torch.zeros(1, 2, 3, 4))


def test_cross_entropy_loss_function_returns_losses_and_z_losses() -> None:
    from flash_attn.losses.cross_entropy import cross_entropy_loss as from_losses
    from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

    assert from_losses is cross_entropy_loss
    torch.manual_seed(4)
    logits = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 3, -100, 10, 5, 2])
    losses, z_losses = cross_entropy_loss(
        logits, labels, label_smoothing=0.1, logit_scale=0.7, lse_square_scale=0.01
    )
    scaled = logits * 0.7
    lse = scaled.logsumexp(-1)
    picked = scaled.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    want = 0.9 * (lse - picked) + 0.1 * (lse - scaled.mean(-1)) + 0.01 * lse**2
    keep = labels != -100
    want = torch.where(keep, want, torch.zeros_like(want))
    assert losses.shape == z_losses.shape == (6,)
    assert losses.dtype == torch.float32
    assert torch.allclose(losses.double(), want, atol=1e-6)
    assert torch.allclose(
        z_losses.double(), torch.where(keep, 0.01 * lse**2, torch.zeros_like(lse)), atol=1e-6
    )
    assert not z_losses.requires_grad  # for logging, as flash-attn marks it
    g = torch.randn(6, dtype=torch.float64)
    (got,) = torch.autograd.grad(losses, logits, g.float())
    (ref,) = torch.autograd.grad(want, logits, g)
    assert torch.allclose(got, ref, atol=1e-6)


def test_gpt2_and_bert_embeddings_add_their_tables() -> None:
    from flash_attn.modules.embedding import BertEmbeddings, GPT2Embeddings

    torch.manual_seed(5)
    ids = torch.randint(0, 11, (2, 6))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2], [5, 4, 3, 2, 1, 0]])
    gpt2 = GPT2Embeddings(8, 11, 16, dtype=torch.float64)
    assert sorted(gpt2.state_dict()) == ["position_embeddings.weight", "word_embeddings.weight"]
    words, table = gpt2.word_embeddings.weight, gpt2.position_embeddings.weight
    assert torch.equal(gpt2(ids), words[ids] + table[torch.arange(6)])
    assert torch.equal(gpt2(ids, positions), words[ids] + table[positions])
    projected = GPT2Embeddings(8, 11, 0, word_embed_proj_dim=4, dtype=torch.float64)
    assert projected.word_embeddings.weight.shape == (11, 4)
    assert not hasattr(projected, "position_embeddings")  # max_position_embeddings <= 0: none
    want = projected.word_embeddings.weight[ids] @ projected.project_in.weight.T
    assert torch.allclose(projected(ids), want)
    bert = BertEmbeddings(8, 11, 16, 2, dtype=torch.float64)
    types = torch.randint(0, 2, (2, 6))
    w, p, t = (
        bert.word_embeddings.weight,
        bert.position_embeddings.weight,
        bert.token_type_embeddings.weight,
    )
    assert torch.equal(bert(ids), w[ids] + p[torch.arange(6)] + t[torch.zeros(6, dtype=torch.long)])
    assert torch.equal(bert(ids, positions, types), w[ids] + p[positions] + t[types])


def test_block_prenorm_postnorm_and_parallel_block_follow_their_formulas() -> None:
    """Blocks around two linear maps (mixer and mlp), so the formulas are written out here: prenorm
    residual = dropped + residual, hidden = norm(residual); postnorm hidden = norm(out + hidden);
    ParallelBlock norms the sum of both branches and the residual. No dropout (eval)."""
    from flash_attn.modules.block import Block, ParallelBlock

    torch.manual_seed(6)
    dim = 8

    def mixer(d: int) -> torch.nn.Linear:
        return torch.nn.Linear(d, d, dtype=torch.float64)

    def norm(d: int) -> torch.nn.LayerNorm:
        return torch.nn.LayerNorm(d, dtype=torch.float64)

    x, residual = torch.randn(2, 3, dim, dtype=torch.float64), torch.randn(2, 3, dim, dtype=torch.float64)
    pre = Block(dim, mixer, mixer, norm, prenorm=True).eval()
    assert sorted(name.split(".")[0] for name in pre.state_dict()) == sorted(
        ["mixer"] * 2 + ["mlp"] * 2 + ["norm1"] * 2 + ["norm2"] * 2
    )
    r1 = x + residual
    h = pre.mixer(pre.norm1(r1))
    r2 = h + r1
    got, got_residual = pre(x, residual)
    assert torch.allclose(got, pre.mlp(pre.norm2(r2)))
    assert torch.allclose(got_residual, r2)
    _, first_residual = pre(x)  # the first block: no residual yet
    assert torch.allclose(first_residual, x + pre.mixer(pre.norm1(x)))
    post = Block(dim, mixer, mixer, norm, prenorm=False).eval()
    h = post.norm1(post.mixer(x) + x)
    assert torch.allclose(post(x), post.norm2(post.mlp(h) + h))
    parallel = ParallelBlock(dim, mixer, mixer, norm).eval()
    x2 = torch.randn(2, 3, dim, dtype=torch.float64)
    out1, out2, summed = parallel(x, x2, residual)
    assert torch.allclose(summed, x + x2 + residual)
    assert torch.allclose(out1, parallel.mixer(parallel.norm1(summed)))
    assert torch.allclose(out2, parallel.mlp(parallel.norm2(summed)))
    tied = ParallelBlock(dim, mixer, mixer, norm, tied_norm=True, residual_in_fp32=True).eval()
    out1, out2, summed = tied(x.float(), None, None)
    assert summed.dtype == torch.float32  # residual_in_fp32
    assert torch.equal(out2, tied.mlp(tied.norm1(x.float().double())))  # tied: norm1 feeds the mlp too
