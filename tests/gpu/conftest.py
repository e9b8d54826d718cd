"""What every GPU test here (test_attention.py, test_turing.py, test_kvcache_layouts.py) runs under."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def strict_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """FA_STRICT=1: a call that would fall back to torch SDPA raises, so a silent fallback fails the
    test instead of passing with PyTorch's numbers. The CUDA cache is emptied so each test starts from
    the same free memory."""
    monkeypatch.setenv("FA_STRICT", "1")
    torch.cuda.empty_cache()
