"""flash_attn_with_kvcache and paged flash_attn_varlen_func on the kernels, every KV-cache layout.

The cases of tests/api/kvcache_cases.py (ragged cache lengths, cache_leftpad, cache_batch_idx, pages of
64, 128 and 256 keys; rotary interleaved or not; decode and a few query rows; num_splits 0, 1, n), at
head dims 64 and 128 with a cache of 2000 keys, in fp16 and bf16, against the float64 reference under
FA2's rule. FA_STRICT=1: a fallback fails the test. Pages of 64 keys run the forward (its key blocks
are at most 64 at these head dims) and skip split-KV (128-key blocks); every other case may split.
The emulator runs the same cases at d32 in CI (tests/api/test_emulated.py); this is their first run
on hardware.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))  # kvcache_cases, its references

from attn_runs import assert_ran_our_kernel
from kvcache_cases import KV_CASES, check_kvcache, kvcache_case, reference_of

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("name", list(KV_CASES))
def test_kvcache_layouts(name: str, head_dim: int, dtype: torch.dtype) -> None:
    from fa_attn import flash_attn_with_kvcache

    args = kvcache_case(name, head_dim=head_dim, capacity=2000, dtype=dtype, device="cuda", heads_scale=2)
    reference = reference_of(args)
    out, lse = flash_attn_with_kvcache(**args, return_softmax_lse=True)
    assert_ran_our_kernel()
    check_kvcache(args, reference, out, lse)


def test_varlen_over_pages() -> None:
    """Packed queries over a paged cache of 256-key pages, forward; each sequence against attention
    over its own keys gathered from its pages."""
    from attn_reference import assert_fa2_close, attention_ref
    from fa_attn import flash_attn_varlen_func

    gen = torch.Generator().manual_seed(3)
    lens_q, lens_k, page, hk = [5, 1, 64], [1000, 33, 512], 256, 2
    q = torch.randn(sum(lens_q), 8, 128, generator=gen).bfloat16().cuda()
    k_pages, v_pages = (torch.randn(13, page, hk, 128, generator=gen).bfloat16().cuda() for _ in range(2))
    table = torch.randperm(13, generator=gen)[:12].reshape(3, 4).int().cuda()
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()
    out = flash_attn_varlen_func(
        q, k_pages, v_pages, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal=True, block_table=table
    )
    assert_ran_our_kernel()
    start = 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k, strict=False)):
        keys = torch.cat([k_pages[p] for p in table[b].tolist()])[:nk].unsqueeze(0)
        values = torch.cat([v_pages[p] for p in table[b].tolist()])[:nk].unsqueeze(0)
        qb = q[start : start + nq].unsqueeze(0)
        ref, _ = attention_ref(qb, keys, values, True)
        low, _ = attention_ref(qb, keys, values, True, upcast=False)
        assert_fa2_close(f"sequence {b}", out[start : start + nq].unsqueeze(0), ref, low)
        start += nq
