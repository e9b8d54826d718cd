"""flash_attn.modules.mha.MHA on the stand-in, against a float64 reference of the same math written out here
(projections with the module's weights, RoPE as a complex rotation, eager softmax attention), and
flash-attn 2.8.3's parameter names, so its checkpoints load (flash_attn_2_8_3.CLASSES has the signatures)."""

from __future__ import annotations

import importlib
import inspect
import math
import re

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.usefixtures("stand_in")

F64 = torch.float64
EMBED, HEADS = 32, 4  # head_dim 8


def mha_module():
    return importlib.import_module("flash_attn.modules.mha")


def generation():
    return importlib.import_module("flash_attn.utils.generation")


def rope(x: torch.Tensor, positions: torch.Tensor, base: float, interleaved: bool, dim: int) -> torch.Tensor:
    """The first `dim` features of each head turned as complex pairs ((2p, 2p+1) interleaved, (p, p + dim/2)
    otherwise) by position * base^(-2p/dim); x (batch, seqlen, heads, head_dim), positions (seqlen,)."""
    turn, rest = x[..., :dim], x[..., dim:]
    angle = positions.double()[:, None] * base ** (-torch.arange(0, dim, 2, dtype=F64) / dim)
    if interleaved:
        pairs = torch.view_as_complex(turn.reshape(*turn.shape[:-1], dim // 2, 2).contiguous())
    else:
        pairs = torch.complex(turn[..., : dim // 2], turn[..., dim // 2 :])
    turned = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    out = torch.view_as_real(turned).flatten(-2) if interleaved else torch.cat((turned.real, turned.imag), -1)
    return torch.cat((out, rest), dim=-1)


def attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), slopes=None, key_mask=None):
    """Softmax attention in float64: GQA by repeating kv heads, masks bottom-right aligned (flash-attn's),
    ALiBi as -slope * |i - j|; a row with no key left is zeros."""
    sq, sk, heads = q.shape[1], k.shape[1], q.shape[2]
    k, v = (t.repeat_interleave(heads // t.shape[2], dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or q.shape[-1] ** -0.5)
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    if slopes is not None:
        scores = scores - slopes.double()[:, None, None] * (i - j).abs()
    masked = torch.zeros(sq, sk, dtype=torch.bool)
    if causal:
        masked |= j > i
    if window[0] >= 0:
        masked |= j < i - window[0]
    if window[1] >= 0:
        masked |= j > i + window[1]
    masked = masked[None, None]
    if key_mask is not None:
        masked = masked | ~key_mask[:, None, None, :]
    weights = torch.softmax(scores.masked_fill(masked, -math.inf), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)


def linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x.double(), layer.weight.double(), bias)


def reference(m, x, x_kv=None, *, key_mask=None, positions=None, zero_rows=None):
    """MHA's forward in float64 with m's weights: q/k/v (flash-attn's layouts: q, then k, then v heads),
    rotary on q and k, attention with m's options, out_proj; zero_rows: rows whose context is zero."""
    h, hkv, d = m.num_heads, m.num_heads_kv, m.head_dim
    if m.cross_attn:
        q = linear(m.Wq, x).unflatten(-1, (h, d))
        kv = linear(m.Wkv, x if x_kv is None else x_kv).unflatten(-1, (2, hkv, d))
    else:
        projected = linear(m.Wqkv, x)
        q = projected[..., : h * d].unflatten(-1, (h, d))
        kv = projected[..., h * d :].unflatten(-1, (2, hkv, d))
    k, v = kv[:, :, 0], kv[:, :, 1]
    if m.rotary_emb_dim:
        rotary = m.rotary_emb
        at = torch.arange(x.shape[1]) if positions is None else positions
        q, k = (rope(t, at, rotary.base, rotary.interleaved, m.rotary_emb_dim) for t in (q, k))
    inner = m.inner_attn
    context = attention(
        q, k, v, causal=inner.causal, scale=inner.softmax_scale, window=tuple(inner.window_size),
        slopes=inner.alibi_slopes, key_mask=key_mask,
    )  # fmt: skip
    if zero_rows is not None:
        context = context.masked_fill(zero_rows[:, :, None, None], 0.0)
    return linear(m.out_proj, context.flatten(-2))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # rotary's cos/sin are fp32 (flash-attn's), so 1e-6, not fp64's precision
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


def build(**options):
    torch.manual_seed(0)
    return mha_module().MHA(EMBED, HEADS, dtype=F64, **options)


def inputs(batch: int = 2, seqlen: int = 6) -> torch.Tensor:
    return torch.randn(batch, seqlen, EMBED, dtype=F64, generator=torch.Generator().manual_seed(1))


# ---- signature and checkpoints --------------------------------------------------------------------


def test_forward_takes_kwargs_as_flash_attns() -> None:
    """CLASSES (test_flash_attn_modules) checks names and defaults; this, that the last is **kwargs."""
    last = list(inspect.signature(mha_module().MHA.forward).parameters.values())[-1]
    assert last.kind is inspect.Parameter.VAR_KEYWORD


# flash-attn 2.8.3's MHA state_dict for embed_dim 32, 4 heads: (key, shape), from its constructor.
FLASH_ATTN_KEYS = {
    "self": ({}, {"Wqkv.weight": (96, 32), "Wqkv.bias": (96,), "out_proj.weight": (32, 32), "out_proj.bias": (32,)}),
    "gqa, rotary, no biases": (
        {"num_heads_kv": 2, "rotary_emb_dim": 8, "qkv_proj_bias": False, "out_proj_bias": False},
        {"Wqkv.weight": (64, 32), "out_proj.weight": (32, 32)},
    ),
    "cross, mqa, alibi": (
        {"cross_attn": True, "num_heads_kv": 1, "use_alibi": True},
        {"Wq.weight": (32, 32), "Wq.bias": (32,), "Wkv.weight": (16, 32), "Wkv.bias": (16,),
         "out_proj.weight": (32, 32), "out_proj.bias": (32,)},
    ),
    "dwconv": (
        {"dwconv": True},
        {"Wqkv.weight": (96, 32), "Wqkv.bias": (96,), "dwconv_qkv.weight": (96, 1, 3), "dwconv_qkv.bias": (96,),
         "out_proj.weight": (32, 32), "out_proj.bias": (32,)},
    ),
    "dwconv, gqa": (
        {"dwconv": True, "num_heads_kv": 2},
        {"Wqkv.weight": (64, 32), "Wqkv.bias": (64,), "dwconv_q.weight": (32, 1, 3), "dwconv_q.bias": (32,),
         "dwconv_kv.weight": (32, 1, 3), "dwconv_kv.bias": (32,), "out_proj.weight": (32, 32),
         "out_proj.bias": (32,)},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FLASH_ATTN_KEYS))
def test_state_dict_is_flash_attns_and_a_checkpoint_loads_strictly(case: str) -> None:
    options, keys = FLASH_ATTN_KEYS[case]
    m = build(**options)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == keys
    checkpoint = {k: torch.randn(shape, dtype=F64) for k, shape in keys.items()}
    m.load_state_dict(checkpoint, strict=True)
    for key, value in checkpoint.items():
        assert torch.equal(m.state_dict()[key], value)


# ---- forward against the reference ----------------------------------------------------------------

CASES = {
    "self": {},
    "causal, softmax_scale": {"causal": True, "softmax_scale": 0.2},
    "gqa, causal": {"num_heads_kv": 2, "causal": True},
    "mqa, sliding window": {"num_heads_kv": 1, "causal": True, "window_size": (2, 0)},
    "alibi": {"use_alibi": True, "causal": True},
    "rotary": {"rotary_emb_dim": 8, "causal": True},
    "rotary partial, interleaved, gqa": {
        "rotary_emb_dim": 4,
        "rotary_emb_interleaved": True,
        "num_heads_kv": 2,
    },
    "rotary base": {"rotary_emb_dim": 8, "rotary_emb_base": 500.0, "use_flash_attn": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_self_attention_matches_the_reference(case: str) -> None:
    m = build(**CASES[case])
    x = inputs()
    close(m(x), reference(m, x))


@pytest.mark.parametrize("heads_kv", [4, 2])
def test_cross_attention_with_mixer_subset(heads_kv: int) -> None:
    m = build(cross_attn=True, num_heads_kv=heads_kv)
    x, x_kv = inputs(2, 5), inputs(2, 9)
    close(m(x, x_kv), reference(m, x, x_kv))
    close(m(x, x_kv, mixer_subset=slice(0, 1)), reference(m, x[:, :1], x_kv))


def right_padding(lengths: list[int], seqlen: int) -> torch.Tensor:
    return torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize(
    "options", [{"causal": True}, {"num_heads_kv": 2, "causal": True, "rotary_emb_dim": 8}, {}]
)
def test_self_attention_key_padding_mask(options: dict) -> None:
    """Kept tokens attend among themselves (query i to kept keys j <= i with causal); masked rows are
    zeros before out_proj (so out_proj's bias after it)."""
    m = build(**options)
    x = inputs(3, 6)
    mask = right_padding([6, 4, 1], 6)
    mask[0, 2] = False  # a hole, not only padding
    want = reference(m, x, key_mask=mask, zero_rows=~mask)
    close(m(x, key_padding_mask=mask), want)


def test_cross_attention_key_padding_mask_masks_keys_only() -> None:
    m = build(cross_attn=True, num_heads_kv=2)
    x, x_kv = inputs(2, 4), inputs(2, 7)
    mask = right_padding([7, 3], 7)
    close(m(x, x_kv, key_padding_mask=mask), reference(m, x, x_kv, key_mask=mask))


@pytest.mark.parametrize(
    "options", [{"causal": True}, {"num_heads_kv": 2, "causal": True}, {"rotary_emb_dim": 8, "causal": True}]
)
def test_packed_input_matches_each_sequence_alone(options: dict) -> None:
    m = build(**options)
    lengths = [5, 2, 6]
    x = inputs(3, 6)
    rows = torch.cat([x[b, :n] for b, n in enumerate(lengths)])
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
    out = m(rows, cu_seqlens=cu_seqlens, max_seqlen=max(lengths))
    want = torch.cat([reference(m, x[b : b + 1, :n])[0] for b, n in enumerate(lengths)])
    close(out, want)


def test_packed_cross_attention_takes_the_keys_offsets_in_kwargs() -> None:
    m = build(cross_attn=True)
    x, x_kv = inputs(2, 3), inputs(2, 5)
    cu_q, cu_k = torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([0, 5, 10], dtype=torch.int32)
    out = m(
        x.flatten(0, 1), x_kv.flatten(0, 1), cu_seqlens=cu_q, max_seqlen=3, cu_seqlens_k=cu_k, max_seqlen_k=5
    )
    close(out, reference(m, x, x_kv).flatten(0, 1))


def test_dwconv_convolves_each_channel_over_the_last_three_positions() -> None:
    m = build(dwconv=True, causal=True)
    x = inputs()
    conv = m.dwconv_qkv
    projected = linear(m.Wqkv, x)
    padded = F.pad(projected, (0, 0, 2, 0))  # two zero positions before the first
    w = conv.weight.double()[:, 0]  # (channels, 3): tap 2 is the current position
    mixed = sum(padded[:, t : t + x.shape[1]] * w[:, t] for t in range(3)) + conv.bias.double()
    h, d = m.num_heads, m.head_dim
    q, k, v = (mixed[..., i * h * d : (i + 1) * h * d].unflatten(-1, (h, d)) for i in range(3))
    want = linear(m.out_proj, attention(q, k, v, causal=True).flatten(-2))
    close(m(x), want)


def test_return_residual_checkpointing_and_dropout() -> None:
    m = build(return_residual=True, causal=True)
    x = inputs().requires_grad_()
    out, residual = m(x)
    assert residual is x
    close(out, reference(m, x.detach()))
    out.sum().backward()
    plain_grad = x.grad.clone()
    x.grad = None
    m.checkpointing = True
    m(x)[0].sum().backward()
    torch.testing.assert_close(x.grad, plain_grad)

    dropped = build(dropout=0.5, causal=True)
    y = inputs()
    dropped.train()
    torch.manual_seed(3)
    train_out = dropped(y)
    dropped.eval()
    assert not torch.allclose(train_out, dropped(y))  # p = 0.5 in train mode drops attention weights
    close(dropped(y), reference(dropped, y))  # and none in eval mode


# ---- decode with inference_params -----------------------------------------------------------------

DECODE = {
    "plain": {},
    "gqa, rotary (with_kvcache's)": {"num_heads_kv": 2, "rotary_emb_dim": 8},
    "interleaved rotary, window": {
        "rotary_emb_dim": 8,
        "rotary_emb_interleaved": True,
        "window_size": (3, 0),
    },
    "xpos (rotary before the cache)": {"rotary_emb_dim": 8, "rotary_emb_scale_base": 64.0},
}


@pytest.mark.parametrize("lengths_per_sample", [False, True])
@pytest.mark.parametrize("case", list(DECODE))
def test_prompt_then_two_steps_match_the_full_sequence(case: str, lengths_per_sample: bool) -> None:
    from flash_attn.utils.generation import InferenceParams

    m = build(causal=True, layer_idx=3, **DECODE[case])
    x = inputs(2, 7)
    full = m(x)  # XPos centres its scale on the cache length: max_seqlen is the full length here
    params = InferenceParams(max_seqlen=7, max_batch_size=2)
    steps = [m(x[:, :5], inference_params=params)]
    for t in (5, 6):
        params.seqlen_offset = t
        if lengths_per_sample:
            params.lengths_per_sample = torch.full((2,), t, dtype=torch.int32)
        steps.append(m(x[:, t : t + 1], inference_params=params))
    close(torch.cat(steps, dim=1), full.double())
    assert params.key_value_memory_dict[3].shape == (2, 7, 2, m.num_heads_kv, m.head_dim)


def test_inference_params_is_flash_attns() -> None:
    from flash_attn.utils.generation import InferenceParams

    params = InferenceParams(16, 2, lengths_per_sample=torch.tensor([3, 4]))
    params.seqlen_offset = 5
    params.reset(32, 4)
    assert (params.max_seqlen, params.max_batch_size, params.seqlen_offset) == (32, 4, 0)
    assert params.lengths_per_sample.tolist() == [0, 0]
    assert params.batch_size_offset == 0
    assert params.key_value_memory_dict == {}


# ---- what fa's MHA refuses, and the modules beside it it does not provide ---------------------------

REFUSED = {
    "dwconv with cross_attn": (lambda mha: mha.MHA(32, 4, cross_attn=True, dwconv=True), "dwconv: not supported"),
    "rotary with cross_attn": (lambda mha: mha.MHA(32, 4, cross_attn=True, rotary_emb_dim=8), "rotary_emb_dim:"),
    "heads": (lambda mha: mha.MHA(32, 4, num_heads_kv=3), "num_heads_kv: 3 must divide"),
    "decode without layer_idx": (
        lambda mha: mha.MHA(32, 4)(torch.randn(1, 2, 32), inference_params=generation().InferenceParams(4, 1)),
        "layer_idx: decoding",
    ),
    "dwconv with cu_seqlens": (
        lambda mha: mha.MHA(32, 4, dwconv=True)(torch.randn(3, 32), cu_seqlens=torch.tensor([0, 3]), max_seqlen=3),
        "cu_seqlens: dwconv",
    ),
    "key_padding_mask with cu_seqlens": (
        lambda mha: mha.MHA(32, 4)(
            torch.randn(3, 32), key_padding_mask=torch.ones(1, 3, dtype=torch.bool),
            cu_seqlens=torch.tensor([0, 3]), max_seqlen=3,
        ),
        "key_padding_mask: not with cu_seqlens",
    ),
    "packed cross without the keys' offsets": (
        lambda mha: mha.MHA(32, 4, cross_attn=True)(torch.randn(3, 32), cu_seqlens=torch.tensor([0, 3]), max_seqlen=3),
        "cu_seqlens: packed cross-attention also needs",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_options_name_the_option_and_what_to_do(case: str) -> None:
    call, message = REFUSED[case]
    with pytest.raises(ValueError, match="^" + re.escape(message)) as raised:
        call(mha_module())
    assert isinstance(raised.value, RuntimeError)  # flash-attn's own checks are RuntimeErrors/asserts


def test_mha_and_parallel_mha_import_together() -> None:
    """flash-attn's own models import both on one line (ParallelMHA on two ranks: tp_ranks.py)."""
    from flash_attn.modules.mha import MHA, ParallelMHA, flash_attn_varlen_kvpacked_func

    assert MHA is mha_module().MHA
    assert ParallelMHA is mha_module().ParallelMHA
    # nanotron imports the packed function from here
    assert (
        flash_attn_varlen_kvpacked_func is importlib.import_module("fa_attn").flash_attn_varlen_kvpacked_func
    )


@pytest.mark.parametrize(
    ("module", "instead"),
    [
        ("flash_attn.ops.layer_norm", "flash_attn.ops.triton.layer_norm.layer_norm_fn"),
        ("flash_attn.utils.pretrained", "flash_attn.utils.generation.InferenceParams"),
        ("flash_attn.utils.benchmark", "flash_attn.utils.generation.InferenceParams"),
    ],
)
def test_modules_beside_mha_are_not_provided(module: str, instead: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="does not provide") as raised:
        importlib.import_module(module)
    assert instead in str(raised.value)
