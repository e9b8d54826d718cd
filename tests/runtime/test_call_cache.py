"""Validated calls kept by their metadata (fa_attn/call_cache.py): a repeated call is validated once,
and anything validation reads still decides (a different dtype still raises, options still count)."""

from __future__ import annotations

import os

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


def test_a_repeated_kvcache_call_is_validated_once() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4)
    options = (None, None, 4, None, None, None, None, False, 0.0, True, None, 0)
    key = call_cache.key("kvcache", q, cache, cache, options, (-1, -1), (None, None))
    kept = call_cache.known(key)
    assert kept is not None
    assert kept.uniform == 4
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4)
    assert call_cache.known(key) is kept


def test_a_kvcache_call_that_validation_refuses_still_raises_after_a_good_one() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4)
    # Equal to 4 as a dict key, but not an integer to validation: the types are part of the key.
    with pytest.raises(ValueError, match="cache_seqlens"):
        fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4.0)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=7)  # more than the cache holds


def test_kvcache_calls_with_index_tensors_are_not_keyed() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    lengths = torch.tensor([3, 5], dtype=torch.int32)
    options = (None, None, lengths, None, None, None, None, False, 0.0, True, None, 0)
    assert call_cache.key("kvcache", q, cache, cache, options, (-1, -1), (None, None)) is None


def test_the_environment_is_read_at_each_call(monkeypatch) -> None:
    from fa_attn import _env

    read = _env.reader("FA_TEST_SWITCH")
    monkeypatch.delenv("FA_TEST_SWITCH", raising=False)
    assert read() == ""
    monkeypatch.setenv("FA_TEST_SWITCH", "1")
    assert read() == "1"
    os.environ["FA_TEST_SWITCH"] = "0"
    assert read() == "0"
    monkeypatch.setattr(os, "environ", {"FA_TEST_SWITCH": "replaced"})  # another mapping: asked directly
    assert read() == "replaced"
