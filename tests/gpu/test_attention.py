"""Our kernels against an fp32 reference, through the public API, forward and backward.

Runs only on a machine with an NVIDIA GPU (every test is marked `gpu`; tests/conftest.py skips them
elsewhere). FA_STRICT=1 is set for every test so a silent fallback to SDPA fails the test instead of
passing it with PyTorch's numbers, and fa_attn.last_dispatch() must name our kernels. The default
sweep takes a few minutes on an H100; FA_GPU_SWEEP=full runs every combination (sweep.py).
"""

from __future__ import annotations

import pytest
import torch
from attn_reference import Case, random_case_tensors
from attn_runs import run_padded, run_varlen
from sweep import padded_cases, varlen_cases

pytestmark = pytest.mark.gpu

PADDED = padded_cases()
VARLEN = varlen_cases()


@pytest.mark.parametrize("case", PADDED, ids=[c.id for c in PADDED])
def test_flash_attn_func(case: Case) -> None:
    run_padded(case)


@pytest.mark.parametrize("case", VARLEN, ids=[c.id for c in VARLEN])
def test_flash_attn_varlen_func(case: Case) -> None:
    run_varlen(case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_is_deterministic(dtype: torch.dtype) -> None:
    """The forward has no atomics: two runs must agree bit for bit (catches races and stale smem)."""
    from fa_attn import flash_attn_func

    case = Case(2, 777, 1029, 8, 2, 128, True, dtype, seed=7)
    q, k, v, _ = random_case_tensors(case, torch.device("cuda"))
    a = flash_attn_func(q, k, v, causal=True)
    b = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("head_dim", [24, 72, 136, 200], ids=lambda d: f"d{d}")
def test_head_dim_below_bucket(head_dim: int) -> None:
    """A head dim strictly inside a bucket runs the bucket's kernel on zero-filled columns."""
    run_padded(Case(2, 300, 517, 4, 2, head_dim, True, torch.bfloat16, seed=head_dim))


# (window_size, softcap, causal, seqlen_q, seqlen_k, head_dim): sliding windows on either side, both
# sides, with causal, windows wider than the sequence; softcap alone and with a window.
BANDS = [
    ((64, -1), 0.0, False, 300, 300, 64),
    ((-1, 17), 0.0, False, 257, 129, 128),
    ((100, 30), 0.0, False, 513, 700, 96),
    ((33, 0), 0.0, True, 400, 401, 128),
    ((5000, 5000), 0.0, False, 200, 300, 32),
    ((-1, -1), 30.0, False, 333, 444, 128),
    ((-1, -1), 5.0, True, 129, 1000, 256),
    ((48, 48), 20.0, False, 600, 600, 64),
]


@pytest.mark.parametrize(
    ("window", "softcap", "causal", "sq", "sk", "d"),
    BANDS,
    ids=[
        f"w{w[0]}_{w[1]}-cap{c:g}-{'causal' if ca else 'full'}-q{q}-k{k}-d{d}" for w, c, ca, q, k, d in BANDS
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_window_and_softcap(
    window: tuple[int, int], softcap: float, causal: bool, sq: int, sk: int, d: int, dtype: torch.dtype
) -> None:
    case = Case(2, sq, sk, 4, 2, d, causal, dtype, seed=sq * 7 + sk)
    run_padded(case, window=window, softcap=softcap)
