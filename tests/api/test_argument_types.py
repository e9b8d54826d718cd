"""Every integer argument takes every integer-like flash-attn's callers pass (issue: transformers'
padding-free batches pass max_seqlen as a 0-d int32 tensor; flash-attn's tests pass window_size as a
2-element tensor), and the same result comes out whichever type carries the number."""

from __future__ import annotations

import fa_attn
import numpy as np
import pytest
import torch
from fa_attn.standin import bert_padding, rotary

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")


def integer_likes(n: int) -> dict[str, object]:
    """n as each integer-like type, by name."""
    kinds: dict[str, object] = {
        "int": n,
        "np.int32": np.int32(n),
        "np.int64": np.int64(n),
        "np.uint16": np.uint16(n),
    }
    kinds["np.0d-array"] = np.array(n)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        kinds[f"0d-{dtype}"] = torch.tensor(n, dtype=dtype)
    kinds["1-element-tensor"] = torch.tensor([n], dtype=torch.int32)
    kinds["transformers-max"] = (
        torch.tensor([0, n, n + 1], dtype=torch.int32).diff().max()
    )  # as transformers computes it
    return kinds


KINDS = list(integer_likes(9))
NOT_INTEGERS = {
    "bool": True,
    "float": 9.0,
    "float-tensor": torch.tensor(9.0),
    "2-element-tensor": torch.tensor([9, 9]),
    "str": "9",
}

LENS_Q, LENS_K = [4, 9, 2], [6, 3, 9]
CU_Q = torch.tensor([0, 4, 13, 15], dtype=torch.int32)
CU_K = torch.tensor([0, 6, 9, 18], dtype=torch.int32)


def packed(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(15, 4, 8, generator=gen),
        torch.randn(18, 2, 8, generator=gen),
        torch.randn(18, 2, 8, generator=gen),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_max_seqlen_any_integer_like(kind: str) -> None:
    q, k, v = packed()
    expected = fa_attn.flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 9, 9, causal=True)
    value = integer_likes(9)[kind]
    out = fa_attn.flash_attn_varlen_func(q, k, v, CU_Q, CU_K, value, value, causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    kv = torch.stack((k, v), dim=1)
    out = fa_attn.flash_attn_varlen_kvpacked_func(q, kv, CU_Q, CU_K, value, value, causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    qkv = torch.stack((k, k, v), dim=1)
    fa_attn.flash_attn_varlen_qkvpacked_func(qkv, CU_K, value)  # longest of CU_K is 9


@pytest.mark.parametrize("kind", list(NOT_INTEGERS))
def test_max_seqlen_not_an_integer(kind: str) -> None:
    q, k, v = packed()
    with pytest.raises(ValueError, match=r"^max_seqlen_q: expected an integer"):
        fa_attn.flash_attn_varlen_func(q, k, v, CU_Q, CU_K, NOT_INTEGERS[kind], 9)


@pytest.mark.parametrize(("given", "ok"), [(9, True), (10, True), (100, True), (8, False), (0, False)])
def test_max_seqlen_against_the_longest_sequence(given: int, ok: bool) -> None:
    """At least the longest sequence (9): equal is fine, larger is fine (flash-attn only idles blocks)."""
    q, k, v = packed()
    for name, args in (("max_seqlen_q", (given, 9)), ("max_seqlen_k", (9, given))):
        if ok:
            fa_attn.flash_attn_varlen_func(q, k, v, CU_Q, CU_K, *args)
            continue
        cu = "cu_seqlens_q" if name == "max_seqlen_q" else "cu_seqlens_k"
        with pytest.raises(
            ValueError,
            match=rf"^{name}: {given} is smaller than the longest sequence in {cu} \(9\); pass {name} >= 9",
        ):
            fa_attn.flash_attn_varlen_func(q, k, v, CU_Q, CU_K, *args)


WINDOWS = {
    "tuple": (3, 1),
    "list": [3, 1],
    "tensor-int64": torch.tensor([3, 1]),
    "tensor-int32": torch.tensor([3, 1], dtype=torch.int32),
    "numpy": np.array([3, 1]),
    "numpy-scalars": (np.int64(3), np.int32(1)),
    "0d-tensors": (torch.tensor(3), torch.tensor(1, dtype=torch.int16)),
}


@pytest.mark.parametrize("kind", list(WINDOWS))
def test_window_size_any_pair(kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 7, 2, 8, generator=gen) for _ in range(3))
    expected = fa_attn.flash_attn_func(q, k, v, window_size=(3, 1))
    window = WINDOWS[kind]
    torch.testing.assert_close(fa_attn.flash_attn_func(q, k, v, window_size=window), expected, rtol=0, atol=0)
    torch.testing.assert_close(
        fa_attn.flash_attn_kvpacked_func(q, torch.stack((k, v), 2), window_size=window),
        expected,
        rtol=0,
        atol=0,
    )
    qp, kp, vp = (t.reshape(-1, 2, 8) for t in (q, k, v))
    cu = torch.tensor([0, 7, 14], dtype=torch.int32)
    varlen = fa_attn.flash_attn_varlen_func(qp, kp, vp, cu, cu, 7, 7, window_size=window)
    torch.testing.assert_close(varlen.reshape(q.shape), expected, rtol=0, atol=0)
    cache = fa_attn.flash_attn_with_kvcache(q, k, v, window_size=window)
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "window", [(1,), (1, 2, 3), 3, torch.tensor([1]), (1.5, 0), (True, 0), "ab"], ids=str
)
def test_window_size_not_a_pair(window) -> None:
    q = torch.randn(1, 3, 1, 8)
    with pytest.raises(ValueError, match=r"^window_size"):
        fa_attn.flash_attn_func(q, q, q, window_size=window)


@pytest.mark.parametrize("kind", KINDS)
def test_kvcache_integer_arguments(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 1, 4, 8, generator=gen)
    k_cache, v_cache = torch.randn(2, 12, 2, 8, generator=gen), torch.randn(2, 12, 2, 8, generator=gen)
    k_new, v_new = torch.randn(2, 1, 2, 8, generator=gen), torch.randn(2, 1, 2, 8, generator=gen)
    base = {"k": k_new, "v": v_new, "causal": True}
    expected = fa_attn.flash_attn_with_kvcache(
        q, k_cache.clone(), v_cache.clone(), cache_seqlens=9, num_splits=2, **base
    )
    value, splits = integer_likes(9)[kind], integer_likes(2)[kind]
    if (
        kind == "1-element-tensor"
    ):  # a 1-D cache_seqlens holds one length per sequence: (batch,) as in flash-attn
        value = torch.tensor([9, 9], dtype=torch.int32)
    out = fa_attn.flash_attn_with_kvcache(
        q, k_cache.clone(), v_cache.clone(), cache_seqlens=value, num_splits=splits, **base
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_helpers_integer_arguments(kind: str) -> None:
    hidden = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    rows, indices, *_ = bert_padding.unpad_input(hidden, mask)
    two, five = integer_likes(2)[kind], integer_likes(5)[kind]
    if kind == "transformers-max":
        two = torch.tensor(2)
    torch.testing.assert_close(bert_padding.pad_input(rows, indices, two, five), hidden * mask.unsqueeze(-1))
    cos, sin = torch.ones(16, 4), torch.zeros(16, 4)
    x = torch.randn(2, 3, 1, 8)
    torch.testing.assert_close(rotary.apply_rotary_emb(x, cos, sin, seqlen_offsets=integer_likes(9)[kind]), x)
