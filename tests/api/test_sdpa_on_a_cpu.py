"""`torch.nn.attention.activate_flash_attention_impl("fa")` on a machine without CUDA (this one): fa's
implementations are registered for CUDA only, so SDPA's calls keep running torch's CPU kernels. That once
happened silently; activation now says it with a FaFallbackWarning, and SDPA still answers."""

from __future__ import annotations

import fa_attn
import pytest
import torch
from fa_attn.standin import sdpa

pytestmark = pytest.mark.skipif(
    not sdpa.supported() or torch.cuda.is_available(),
    reason="needs torch's flash-attention registry (>= 2.13) and no CUDA device",
)


def test_activating_fa_without_cuda_says_sdpa_keeps_torchs_kernels() -> None:
    q = torch.randn(1, 2, 8, 16)
    with pytest.warns(fa_attn.FaFallbackWarning, match="no CUDA device here"):
        torch.nn.attention.activate_flash_attention_impl(sdpa.NAME)
    try:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        expected = torch.softmax(q @ q.transpose(-1, -2) / 4, dim=-1) @ q
        torch.testing.assert_close(out, expected)
    finally:
        torch.nn.attention.restore_flash_attention_impl()
