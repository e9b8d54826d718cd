"""Validated calls kept by their metadata (fa_attn/call_cache.py): a repeated call is validated once,
and anything validation reads still decides (a different dtype still raises, options still count)."""

from __future__ import annotations

import fa_attn
import pytest
import torch
from fa_attn import call_cache, interface

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")


def key(q, k, v, window_size=(-1, -1), **options):
    args = {"dropout_p": 0.0, "softmax_scale": None, "causal": False, "softcap": 0.0, "alibi_slopes": None,
            "deterministic": False, **options}  # fmt: skip
    return call_cache.key("padded", q, k, v, tuple(args.values()), window_size)


def test_a_repeated_call_is_validated_once() -> None:
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8)
    fa_attn.flash_attn_func(q, k, k, causal=True)
    kept = call_cache.known(key(q, k, k, causal=True))
    assert kept is not None
    assert kept.causal is True
    fa_attn.flash_attn_func(q, k, k, causal=True)
    assert call_cache.known(key(q, k, k, causal=True)) is kept


def test_what_validation_reads_is_in_the_key() -> None:
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8)
    assert key(q, k, k) != key(q, k, k, causal=True)
    assert key(q, k, k) != key(q, k.half(), k)
    assert key(q, k, k) != key(q, k, k, window_size=(2, 0))
    assert key(q, k, k) != key(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), k)  # last stride


def test_a_bad_call_after_a_good_one_still_raises() -> None:
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8)
    fa_attn.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="dtype"):
        fa_attn.flash_attn_func(q, k.half(), k)


def test_only_plain_data_is_keyed() -> None:
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8)
    assert key(q, k, k, window_size=[-1, -1]) is None  # a list: not hashable data
    assert key(q, k, k, alibi_slopes=torch.ones(2)) is None  # a tensor: never kept
    assert key(torch.nn.Parameter(q), k, k) is None  # a tensor subclass


def test_calls_holding_tensors_are_never_kept() -> None:
    q = torch.randn(6, 2, 8)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    fa_attn.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4)
    assert all(call_cache.tensor_free(call) for call, _ in interface._kept_routes.values())
