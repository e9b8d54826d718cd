"""The SDPA/math fallback against an independent fp64 reference (CPU): masks, GQA, varlen, LSE, grads."""

from __future__ import annotations

import warnings

import fa_attn
import pytest
import torch
from runtime_reference import attention_ref

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")


def qkv(b=2, sq=5, sk=7, h=4, hk=2, d=16, dtype=torch.float32, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, n: torch.randn(b, s, n, d, generator=gen, dtype=torch.float64).to(dtype)
    q, k, v = make(sq, h), make(sk, hk), make(sk, hk)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


CASES = [
    {},  # plain (SDPA path)
    {"causal": True},  # causal, sq < sk: bottom-right aligned
    {"causal": True, "sq": 9, "sk": 4},  # causal, sq > sk: first rows see no key
    {"causal": True, "sq": 6, "sk": 6},  # causal square (SDPA is_causal path)
    {"window": (2, 1)},  # sliding window
    {"window": (3, -1), "causal": True},
    {"softcap": 2.0},
    {"alibi": True},
    {"h": 8, "hk": 1},  # MQA
    {"d": 100},  # head dim not a multiple of 8
    {"scale": 0.3},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("want_lse", [False, True])
def test_matches_reference_fp32(case: dict, want_lse: bool) -> None:
    shape = {k: case[k] for k in ("sq", "sk", "h", "hk", "d") if k in case}
    q, k, v = qkv(**shape)
    h = q.shape[2]
    alibi = torch.rand(h, generator=torch.Generator().manual_seed(1)) if case.get("alibi") else None
    opts = {
        "causal": case.get("causal", False),
        "window_size": case.get("window", (-1, -1)),
        "softcap": case.get("softcap", 0.0),
        "alibi_slopes": alibi,
        "softmax_scale": case.get("scale"),
    }
    ref_out, ref_lse = attention_ref(
        q,
        k,
        v,
        causal=opts["causal"],
        window=opts["window_size"],
        scale=case.get("scale"),
        softcap=opts["softcap"],
        alibi=alibi,
    )
    result = fa_attn.flash_attn_func(q, k, v, return_lse=want_lse, **opts)
    out = result[0] if want_lse else result
    assert out.shape == q.shape
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=1e-5)
    if want_lse:
        lse = result[1]
        assert lse.shape == (q.shape[0], h, q.shape[1])
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=1e-5)


def test_rows_without_keys_are_zero_with_inf_lse() -> None:
    q, k, v = qkv(sq=6, sk=2)
    out, lse, probs = fa_attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None  # S is never materialised
    assert torch.all(out[:, :4] == 0)
    assert torch.all(torch.isinf(lse[:, :, :4]))
    assert torch.all(torch.isfinite(lse[:, :, 4:]))


def test_bf16_within_tolerance() -> None:
    q, k, v = qkv(b=2, sq=33, sk=47, h=4, hk=2, d=64, dtype=torch.bfloat16)
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    out, lse = fa_attn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    sdpa_path = fa_attn.flash_attn_func(q, k, v)  # plain call, SDPA path
    torch.testing.assert_close(sdpa_path.double(), attention_ref(q, k, v)[0], atol=2e-2, rtol=2e-2)


def test_varlen_matches_per_sequence_reference() -> None:
    lens_q, lens_k = [3, 0, 5, 1], [4, 2, 5, 0]
    h, hk, d = 4, 2, 24
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), h, d, generator=gen)
    k = torch.randn(sum(lens_k), hk, d, generator=gen)
    v = torch.randn(sum(lens_k), hk, d, generator=gen)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out, lse = fa_attn.flash_attn_varlen_func(
        q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal=True, return_lse=True
    )
    assert out.shape == q.shape
    assert lse.shape == (h, sum(lens_q))
    sq0 = sk0 = 0
    for len_q, len_k in zip(lens_q, lens_k, strict=True):
        ref_out, ref_lse = attention_ref(
            q[sq0 : sq0 + len_q][None], k[sk0 : sk0 + len_k][None], v[sk0 : sk0 + len_k][None], causal=True
        )
        torch.testing.assert_close(out[sq0 : sq0 + len_q].double(), ref_out[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(lse[:, sq0 : sq0 + len_q].double(), ref_lse[0], atol=2e-5, rtol=1e-5)
        sq0 += len_q
        sk0 += len_k


def test_empty_batch_and_empty_sequences() -> None:
    q, k, v = qkv(b=0)
    out, lse = fa_attn.flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == q.shape
    assert lse.shape == (0, 4, 5)
    q, k, v = qkv(sq=0)
    assert fa_attn.flash_attn_func(q, k, v, causal=True).shape == q.shape
    q, k, v = qkv(sk=0)
    out = fa_attn.flash_attn_func(q, k, v)
    assert out.shape == q.shape
    assert torch.all(out == 0)


def test_dropout_is_applied_and_scaled() -> None:
    q, k, v = qkv(sq=64, sk=64, d=8)
    torch.manual_seed(0)
    dropped = fa_attn.flash_attn_func(q, k, v, dropout_p=0.5)
    assert not torch.allclose(dropped, fa_attn.flash_attn_func(q, k, v))
    # Inverted dropout keeps the expectation: the mean over many rows stays close.
    assert abs(dropped.mean() - fa_attn.flash_attn_func(q, k, v).mean()) < 0.05


@pytest.mark.parametrize(
    "opts",
    [{"causal": True}, {"window_size": (2, 0)}, {"softcap": 1.5}, {}],
    ids=["causal", "window", "softcap", "plain"],
)
def test_gradcheck_fp64(opts: dict) -> None:
    q, k, v = qkv(b=1, sq=3, sk=4, h=2, hk=1, d=4, dtype=torch.float64, grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: fa_attn.flash_attn_func(a, b, c, **opts), (q, k, v))


def test_varlen_gradients_flow() -> None:
    q = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(4, 1, 2, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 1, 2, dtype=torch.float64, requires_grad=True)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 2, 4], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda a, b, c: fa_attn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 2, 2, causal=True), (q, k, v)
    )


def test_no_warning_escalation_in_default_mode() -> None:
    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call must not warn again (warned once already or now)
        try:
            fa_attn.flash_attn_func(q, k, v)
        except fa_attn.FaFallbackWarning:
            pass
        fa_attn.flash_attn_func(q, k, v)
