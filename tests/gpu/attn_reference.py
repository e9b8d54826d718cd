"""Test cases for the GPU tests and the sanitizer sweep; the fp32 reference and FA2's error rule are the
runtime's own (fa_attn/reference.py, which the self-check uses too), re-exported here for the tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from fa_attn.reference import (
    Fa2Error,
    assert_fa2_close,
    attention_ref,
    bottom_right_mask,
    eps,
    fa2_error,
    lse_error,
    out_lse_by_heads,
    visible_mask,
    visible_rows,
)

__all__ = [
    "Case",
    "Fa2Error",
    "assert_fa2_close",
    "attention_ref",
    "bottom_right_mask",
    "eps",
    "fa2_error",
    "lse_error",
    "out_lse_by_heads",
    "random_case_tensors",
    "random_cu_seqlens",
    "visible_mask",
    "visible_rows",
]


@dataclass(frozen=True)
class Case:
    """One random attention problem (padded batch, or varlen when `varlen` is set)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    head_dim: int
    causal: bool
    dtype: torch.dtype
    varlen: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        kind = "varlen" if self.varlen else "pad"
        dt = "bf16" if self.dtype == torch.bfloat16 else "fp16"
        c = "causal" if self.causal else "full"
        return (
            f"{kind}-b{self.batch}-q{self.seqlen_q}-k{self.seqlen_k}-h{self.heads}x{self.heads_k}"
            f"-d{self.head_dim}-{c}-{dt}"
        )


def random_case_tensors(case: Case, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout for a padded case, seeded from the case so a failure reproduces alone."""
    gen = torch.Generator(device=device).manual_seed(case.seed)
    shape_q = (case.batch, case.seqlen_q, case.heads, case.head_dim)
    shape_k = (case.batch, case.seqlen_k, case.heads_k, case.head_dim)

    def rand(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(case.dtype)

    return rand(shape_q), rand(shape_k), rand(shape_k), rand(shape_q)


def random_cu_seqlens(batch: int, max_len: int, rng: random.Random) -> list[int]:
    """Offsets of `batch` sequences of random length in 1..max_len (one of them exactly max_len)."""
    lens = [rng.randint(1, max_len) for _ in range(batch)]
    lens[rng.randrange(batch)] = max_len
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu
