"""Validated calls kept by their metadata (fa_attn/runtime/call_cache.py): a repeated call is validated once,
and anything validation reads still decides (a different dtype still raises, options still count)."""

from __future__ import annotations

import gc
import os
import weakref

import fa_attn
import pytest
import torch
from fa_attn.runtime import call_cache, interface

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


def kvcache_key(q, cache, cache_seqlens=None, cache_batch_idx=None, block_table=None):
    """flash_attn_with_kvcache's key: options in one tuple without index tensors; a lengths tensor alone
    (a decode step) beside k, v; else every index tensor keyed apart."""
    if cache_batch_idx is None and block_table is None and not isinstance(cache_seqlens, torch.Tensor):
        options = (None, cache_seqlens, None, False, 0.0, True, None, 0)  # rotary_sin, cache_seqlens, ...
        return call_cache.key("kvcache", q, cache, cache, options, (-1, -1), (None, None))
    if cache_batch_idx is None and block_table is None:
        options = (None, None, False, 0.0, True, None, 0)  # rotary_sin, softmax_scale, causal, ...
        return call_cache.key(
            "kvcache-lengths", q, cache, cache, options, (-1, -1), (None, None), (cache_seqlens,)
        )
    options = (None, False, 0.0, True, None, 0)  # softmax_scale, causal, softcap, rotary_interleaved, ...
    indices = (cache_seqlens, cache_batch_idx, None, block_table)
    return call_cache.key("kvcache-index", q, cache, cache, options, (-1, -1), (None,) * 4, indices)


def test_a_repeated_kvcache_call_is_validated_once() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4)
    key = kvcache_key(q, cache, 4)
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


def test_kvcache_index_tensors_are_keyed_by_metadata_and_never_kept() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    lengths = torch.tensor([3, 5], dtype=torch.int32)
    key = kvcache_key(q, cache, lengths)
    assert key == kvcache_key(q, cache, torch.tensor([6, 1], dtype=torch.int32))  # values: not in the key
    assert key != kvcache_key(q, cache, lengths.long())
    assert key != kvcache_key(q, cache, 3)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths)
    template = call_cache.known(key)
    assert template is not None
    assert template.index_args is None  # a template: no tensor
    assert template.cache_seqlens is None
    assert template.attn.kv.features == {"seqused_k"}  # which tensors each call passes beside it
    alive = weakref.ref(lengths)
    del lengths
    gc.collect()
    assert alive() is None  # nothing kept a reference to the caller's tensor


def test_each_kvcache_call_attends_with_its_own_lengths() -> None:
    gen = torch.Generator().manual_seed(0)
    q, cache = torch.randn(2, 1, 2, 8, generator=gen), torch.randn(2, 6, 2, 8, generator=gen)
    for values in ([3, 5], [6, 1], [2, 2]):
        lengths = torch.tensor(values, dtype=torch.int32)
        got = fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths)
        for b, n in enumerate(values):  # each sequence on its own, with an int count
            want = fa_attn.flash_attn_with_kvcache(
                q[b : b + 1], cache[b : b + 1], cache[b : b + 1], cache_seqlens=n
            )
            torch.testing.assert_close(got[b : b + 1], want)


def test_a_bad_index_value_after_good_ones_still_raises() -> None:
    q, cache = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=torch.tensor([3, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens"):  # CPU values are read: more than the cache holds
        fa_attn.flash_attn_with_kvcache(
            q, cache, cache, cache_seqlens=torch.tensor([3, 7], dtype=torch.int32)
        )
    rows = torch.tensor([0, 1], dtype=torch.int32)
    fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=4, cache_batch_idx=rows)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        fa_attn.flash_attn_with_kvcache(
            q, cache, cache, cache_seqlens=4, cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)
        )


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
