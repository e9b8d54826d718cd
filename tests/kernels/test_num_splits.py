"""The split-KV heuristic (decision.num_splits): FlashAttention-2's rule, on decode-like shapes."""

from __future__ import annotations

import pytest

from buildtool.core import runtime

choice = runtime.decision  # as doctor loads it (stdlib only)


def splits(batch: int, heads: int, seqlen_q: int, seqlen_k: int, requested: int = 0, sms: int = 132) -> int:
    return choice.num_splits(batch, heads, seqlen_q, seqlen_k, 64, 128, sms, requested=requested)


def test_a_full_gpu_is_not_split():
    assert splits(32, 32, 1, 8192) == 1  # 1024 blocks on 264 slots
    assert splits(4, 16, 2048, 2048) == 1  # prefill


def test_small_batch_long_cache_splits():
    n = splits(1, 8, 1, 32768)  # 8 blocks on 132 SMs
    assert 8 < n <= choice.MAX_SPLITS
    assert n * 8 <= 132 * 2  # never more blocks than slots


def test_never_more_splits_than_key_blocks():
    assert splits(1, 1, 1, 300) == 3  # 3 key blocks of 128
    assert splits(1, 1, 1, 1) == 1


def test_the_caller_decides_when_asked():
    assert splits(1, 8, 1, 32768, requested=1) == 1
    assert splits(1, 8, 1, 32768, requested=7) == 7
    assert splits(1, 8, 1, 1000, requested=50) == 8  # capped at the key blocks
    with pytest.raises(ValueError, match="num_splits"):
        splits(1, 8, 1, 1000, requested=-1)


def test_the_chosen_count_fills_the_last_wave():
    """FA2's rule: the smallest count within 85% of the best last-wave fill."""
    batch_heads, sms = 6, 108
    n = splits(1, batch_heads, 1, 65536, sms=sms)
    waves = batch_heads * n / (2 * sms)
    assert waves / -(-waves // 1) >= 0.85 * 0.99
