"""The Turing (sm75) code path: fp16, mma m16n8k8, register-staged loads, 64 KB shared memory.

Runs when FA_GPU_TURING=1, against a wheel whose only kernels are the 7.5 image: on a Turing GPU its
SASS, on any newer GPU its compute_75 PTX, which the driver JIT-compiles (tests/gpu/README.md shows how
to build that wheel). The runtime has no switch to force an arch inside a full wheel, so the wheel is
the switch; these tests check that the 7.5 image really ran (last_dispatch().arch == "7.5").
"""

from __future__ import annotations

import os

import pytest
import torch
from attn_reference import Case
from attn_runs import run_padded, run_varlen
from sweep import padded_cases, varlen_cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("FA_GPU_TURING") != "1",
        reason="needs FA_GPU_TURING=1 and a wheel with only the 7.5 image (tests/gpu/README.md)",
    ),
]

# Turing builds fp16 only; its backward goes up to head dim 192 (kernels/tiles.py), forward to 256.
TURING_BWD_MAX_HEAD_DIM = 192
PADDED = [c for c in padded_cases() if c.dtype == torch.float16]
VARLEN = [c for c in varlen_cases() if c.dtype == torch.float16 and c.head_dim <= TURING_BWD_MAX_HEAD_DIM]


@pytest.mark.parametrize("case", PADDED, ids=[c.id for c in PADDED])
def test_turing_flash_attn_func(case: Case) -> None:
    run_padded(case, backward=case.head_dim <= TURING_BWD_MAX_HEAD_DIM, expect_arch="7.5")


@pytest.mark.parametrize("case", VARLEN, ids=[c.id for c in VARLEN])
def test_turing_flash_attn_varlen_func(case: Case) -> None:
    run_varlen(case, expect_arch="7.5")


def test_turing_backward_beyond_192_falls_back() -> None:
    """Head dim 256 backward is not built for Turing: strict mode must refuse it, naming the reason."""
    from fa_attn import FaFallbackError, flash_attn_func

    q, k, v = (
        torch.randn(1, 64, 2, 256, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3)
    )
    with pytest.raises(FaFallbackError, match="backward-unsupported"):
        flash_attn_func(q, k, v)
