"""Every flash-attn 2.x function on fa_attn's fallback (CPU) against the float64 reference.

flash-attn's own test suite exercises each function over masks, GQA/MQA, windows, softcap, ALiBi and
dropout; these are the same semantics at tiny shapes, compared at the precision of the dtype under test.
"""

from __future__ import annotations

import math

import fa_attn
import numpy as np
import pytest
import torch
from reference import assert_close, flash_attn_lse, padded_attention, sequence_attention

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")

DTYPES = [torch.float64, torch.float32, torch.bfloat16]

# name -> (options for the call, shape overrides)
CASES = {
    "plain": ({}, {}),
    "causal-sq<sk": ({"causal": True}, {"sq": 5, "sk": 9}),
    "causal-sq>sk": ({"causal": True}, {"sq": 9, "sk": 4}),
    "window": ({"window_size": (2, 1)}, {}),
    "window-left-causal": ({"window_size": (3, -1), "causal": True}, {}),
    "window-list": ({"window_size": [1, 2]}, {}),
    "window-tensor": ({"window_size": torch.tensor([2, 0])}, {}),
    "window-numpy": ({"window_size": np.array([0, 3])}, {}),
    "softcap": ({"softcap": 2.0}, {}),
    "alibi": ({"alibi": "heads"}, {}),
    "alibi-causal": ({"alibi": "heads", "causal": True}, {}),
    "alibi-batch-window": ({"alibi": "batch", "window_size": (2, 2)}, {}),
    "mqa": ({}, {"h": 6, "hk": 1}),
    "head-dim-20": ({"causal": True}, {"d": 20}),
    "scale": ({"softmax_scale": 0.7}, {}),
}


def tensors(b=2, sq=6, sk=7, h=4, hk=2, d=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, n: torch.randn(b, s, n, d, generator=gen, dtype=torch.float64).to(dtype)
    return make(sq, h), make(sk, hk), make(sk, hk)


def split_options(case: str, b: int, h: int):
    options, shape = CASES[case]
    options = dict(options)
    kind = options.pop("alibi", None)
    slopes = None
    if kind:
        gen = torch.Generator().manual_seed(7)
        slopes = torch.rand((h,) if kind == "heads" else (b, h), generator=gen) * 0.5
        options["alibi_slopes"] = slopes
    return options, shape, slopes


def reference_options(options: dict) -> dict:
    window = options.get("window_size", (-1, -1))
    return {
        "causal": options.get("causal", False),
        "window": (int(window[0]), int(window[1])),
        "scale": options.get("softmax_scale"),
        "softcap": options.get("softcap", 0.0),
    }


def causal_only(options: dict, sk: int) -> bool:
    """flash-attn's pure causal mask: causal with no left window (or one >= seqlen_k)."""
    left = int(options.get("window_size", (-1, -1))[0])
    return options.get("causal", False) and (left < 0 or left >= sk)


def expected_lse(ref_lse: torch.Tensor, slopes, options: dict, sq: int, sk: int) -> torch.Tensor:
    """(b, h, sq) reference LSEs as flash-attn returns them."""
    per = lambda b: None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
    causal = causal_only(options, sk)
    return torch.stack([flash_attn_lse(ref_lse[b], per(b), causal, sq, sk) for b in range(ref_lse.shape[0])])


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_flash_attn_func(case: str, dtype: torch.dtype) -> None:
    options, shape, slopes = split_options(case, 2, CASES[case][1].get("h", 4))
    q, k, v = tensors(dtype=dtype, **shape)
    out, lse, s_dmask = fa_attn.flash_attn_func(q, k, v, **options, return_attn_probs=True)
    assert s_dmask is None
    assert out.dtype == dtype
    assert lse.dtype in (torch.float32, torch.float64)
    ref_out, ref_lse = padded_attention(q, k, v, slopes=slopes, **reference_options(options))
    ref_lse = expected_lse(ref_lse, slopes, options, q.shape[1], k.shape[1])
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", lse, ref_lse, lse_dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["plain", "causal-sq<sk", "window-tensor", "alibi-causal", "mqa", "softcap"])
def test_kvpacked_func(case: str, dtype: torch.dtype) -> None:
    options, shape, slopes = split_options(case, 2, CASES[case][1].get("h", 4))
    q, k, v = tensors(dtype=dtype, **shape)
    out = fa_attn.flash_attn_kvpacked_func(q, torch.stack((k, v), dim=2), **options)
    ref_out, _ = padded_attention(q, k, v, slopes=slopes, **reference_options(options))
    assert_close("out", out, ref_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["plain", "window", "alibi", "softcap", "scale"])
@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_func(case: str, causal: bool, dtype: torch.dtype) -> None:
    options, _, slopes = split_options(case, 2, 4)
    options["causal"] = causal or options.get("causal", False)
    q, k, v = tensors(sq=7, sk=7, h=4, hk=4, dtype=dtype)
    out, lse, _ = fa_attn.flash_attn_qkvpacked_func(
        torch.stack((q, k, v), dim=2), **options, return_attn_probs=True
    )
    ref_out, ref_lse = padded_attention(q, k, v, slopes=slopes, **reference_options(options))
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", lse, expected_lse(ref_lse, slopes, options, 7, 7), lse_dtype(dtype))


def packed_sequences(lens_q, lens_k, h=4, hk=2, d=16, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    make = lambda n, heads: torch.randn(n, heads, d, generator=gen, dtype=torch.float64).to(dtype)
    cu = lambda lens: torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    return make(sum(lens_q), h), make(sum(lens_k), hk), make(sum(lens_k), hk), cu(lens_q), cu(lens_k)


def varlen_reference(q, k, v, lens_q, lens_k, options, slopes=None):
    outs, lses = [], []
    sq0 = sk0 = 0
    for index, (nq, nk) in enumerate(zip(lens_q, lens_k, strict=True)):
        per = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[index])
        out, lse, _ = sequence_attention(
            q[sq0 : sq0 + nq], k[sk0 : sk0 + nk], v[sk0 : sk0 + nk], slopes=per, **reference_options(options)
        )
        outs.append(out)
        lses.append(flash_attn_lse(lse, per, causal_only(options, nk), nq, nk))
        sq0, sk0 = sq0 + nq, sk0 + nk
    return torch.cat(outs), torch.cat(lses, dim=1)


LENS = ([3, 0, 6, 1], [5, 2, 6, 0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "case", ["plain", "causal-sq<sk", "window-list", "alibi-causal", "alibi-batch-window", "softcap"]
)
def test_varlen_func(case: str, dtype: torch.dtype) -> None:
    options, _, slopes = split_options(case, 4, 4)
    lens_q, lens_k = LENS
    q, k, v, cu_q, cu_k = packed_sequences(lens_q, lens_k, dtype=dtype)
    out, lse = fa_attn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **options, return_lse=True
    )
    ref_out, ref_lse = varlen_reference(q, k, v, lens_q, lens_k, options, slopes)
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", lse, ref_lse, lse_dtype(dtype))
    kv = torch.stack((k, v), dim=1)
    assert_close(
        "kvpacked",
        fa_attn.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 6, 6, **options),
        ref_out,
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_qkvpacked_func(causal: bool, dtype: torch.dtype) -> None:
    lens = [4, 1, 7]
    q, k, v, cu, _ = packed_sequences(lens, lens, h=3, hk=3, dtype=dtype)
    out = fa_attn.flash_attn_varlen_qkvpacked_func(
        torch.stack((q, k, v), dim=1), cu, max(lens), causal=causal
    )
    ref_out, _ = varlen_reference(q, k, v, lens, lens, {"causal": causal})
    assert_close("out", out, ref_out, dtype)


@pytest.mark.parametrize("page", [1, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_paged_block_table(page: int, causal: bool) -> None:
    """flash-attn >= 2.6: k/v in pages; sequence b's keys are the first len_k rows of its pages."""
    lens_q, lens_k = [2, 3, 1], [5, 7, 0]
    q, k, v, cu_q, cu_k = packed_sequences(lens_q, lens_k, dtype=torch.float64)
    blocks_per_seq = -(-max(lens_k) // page)
    num_blocks = 3 * blocks_per_seq + 2
    gen = torch.Generator().manual_seed(5)
    table = torch.randperm(num_blocks, generator=gen)[: 3 * blocks_per_seq].reshape(3, blocks_per_seq)
    # Slots no sequence writes hold NaN: flash-attn never reads them, so neither may the fallback.
    k_pages = torch.full((num_blocks, page, 2, 16), float("nan"), dtype=torch.float64)
    v_pages = torch.full((num_blocks, page, 2, 16), float("nan"), dtype=torch.float64)
    start = 0
    for b, n in enumerate(lens_k):  # write each sequence's keys into its pages
        for t in range(n):
            k_pages[table[b, t // page], t % page] = k[start + t]
            v_pages[table[b, t // page], t % page] = v[start + t]
        start += n
    out = fa_attn.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, cu_k, 3, 7, causal=causal, block_table=table.to(torch.int32)
    )
    ref_out, _ = varlen_reference(q, k, v, lens_q, lens_k, {"causal": causal})
    assert_close("out", out, ref_out, torch.float64)


def test_rows_past_the_last_sequence_are_never_read() -> None:
    """Packed k/v longer than cu_seqlens_k[-1] (a preallocated buffer): NaN in the tail reaches neither
    out nor any gradient, forward or backward."""
    lens_q, lens_k = [2, 3], [4, 0]
    q, k, v, cu_q, cu_k = packed_sequences(lens_q, lens_k, dtype=torch.float64)
    tail = torch.full((3, *k.shape[1:]), float("nan"), dtype=torch.float64)
    k_buf, v_buf = torch.cat((k, tail)), torch.cat((v, tail))
    q, k_buf, v_buf = (t.detach().requires_grad_() for t in (q, k_buf, v_buf))
    out = fa_attn.flash_attn_varlen_func(q, k_buf, v_buf, cu_q, cu_k, 3, 4)
    ref_out, _ = varlen_reference(q.detach(), k, v, lens_q, lens_k, {})
    assert_close("out", out, ref_out, torch.float64)
    out.sum().backward()
    assert q.grad is not None
    assert k_buf.grad is not None
    assert v_buf.grad is not None
    for name, grad in (("dq", q.grad), ("dk", k_buf.grad[: k.shape[0]]), ("dv", v_buf.grad[: k.shape[0]])):
        assert torch.isfinite(grad).all(), f"{name}: NaN from the unread tail"


def test_the_kernel_routes_gradients_past_the_last_sequence_are_zeros() -> None:
    """The kernel writes only the sequences' rows of dk/dv (torch.empty): the route zeros the rest, on
    the device, as the fallback's index_add into zeros does."""
    from fa_attn.standin.extension import unread_rows_zeroed

    grad = torch.full((7, 2, 3), float("nan"))
    grad[:4] = 1.0
    zeroed = unread_rows_zeroed(grad, torch.tensor([0, 4, 4], dtype=torch.int32))
    assert torch.equal(zeroed[:4], grad[:4])
    assert torch.equal(zeroed[4:], torch.zeros(3, 2, 3))


def test_dropout_statistics() -> None:
    """With v the identity over keys, out is the dropped probability matrix: each entry is 0 with
    probability dropout_p and p / (1 - dropout_p) otherwise (flash-attn's inverted dropout)."""
    sk = d = 32
    p = 0.3
    q, k, _ = tensors(b=2, sq=48, sk=sk, h=2, hk=2, d=d, dtype=torch.float64)
    v = torch.eye(sk, dtype=torch.float64).reshape(1, sk, 1, d).expand(2, sk, 2, d).contiguous()
    torch.manual_seed(0)
    out = fa_attn.flash_attn_func(q, k, v, dropout_p=p, causal=True)
    probs = torch.stack([sequence_attention(q[b], k[b], v[b], causal=True)[2] for b in range(2)])  # b h i j
    dropped = out.permute(0, 2, 1, 3)  # (b, h, i, j)
    live = probs > 0
    zero = (dropped == 0) & live
    n = int(live.sum())
    fraction = zero.sum().item() / n
    assert abs(fraction - p) < 5 * math.sqrt(p * (1 - p) / n), f"dropped {fraction:.3f} of {n}, expected {p}"
    kept = live & ~zero
    torch.testing.assert_close(dropped[kept], probs[kept] / (1 - p), rtol=1e-10, atol=1e-12)
    assert torch.all(dropped[~live] == 0)


@pytest.mark.parametrize("fn", ["func", "kvpacked", "qkvpacked"])
def test_gradients_match_reference(fn: str) -> None:
    q, k, v = tensors(b=1, sq=5, sk=5, h=2, hk=2, d=8, dtype=torch.float64)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, _ = padded_attention(*leaves, causal=True, window=(2, -1))
    ref_grads = torch.autograd.grad(ref_out, leaves, dout)
    if fn == "func":
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fa_attn.flash_attn_func(*inputs, causal=True, window_size=(2, -1))
        grads = torch.autograd.grad(out, inputs, dout)
    elif fn == "kvpacked":
        qg, kv = q.clone().requires_grad_(), torch.stack((k, v), dim=2).requires_grad_()
        out = fa_attn.flash_attn_kvpacked_func(qg, kv, causal=True, window_size=(2, -1))
        dq, dkv = torch.autograd.grad(out, (qg, kv), dout)
        grads = (dq, dkv[:, :, 0], dkv[:, :, 1])
    else:
        qkv = torch.stack((q, k, v), dim=2).requires_grad_()
        out = fa_attn.flash_attn_qkvpacked_func(qkv, causal=True, window_size=(2, -1))
        (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
        grads = dqkv.unbind(dim=2)
    for name, ours, ref in zip("qkv", grads, ref_grads, strict=True):
        assert_close(f"d{name}", ours, ref, torch.float64)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t: fa_attn.flash_attn_qkvpacked_func(t[0]), r"^qkv: expected 5 dims"),
        (lambda t: fa_attn.flash_attn_qkvpacked_func(torch.stack(t[:2], dim=2)), r"^qkv: .* with 3 at dim 2"),
        (lambda t: fa_attn.flash_attn_kvpacked_func(t[0], t[1]), r"^kv: expected 5 dims"),
        (lambda _t: fa_attn.flash_attn_varlen_qkvpacked_func("x", None, 1), r"^qkv: expected a torch.Tensor"),
    ],
)
def test_packed_layout_errors(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call(tensors(sq=4, sk=4, hk=4))


def test_deterministic_is_accepted_everywhere() -> None:
    q, k, v = tensors()
    a = fa_attn.flash_attn_func(q, k, v, deterministic=True)
    torch.testing.assert_close(a, fa_attn.flash_attn_func(q, k, v, deterministic=False))
