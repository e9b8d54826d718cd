"""The shapes the GPU tests run: a seeded random sweep that covers every axis at least once by default
(a few minutes on an H100), and every combination with FA_GPU_SWEEP=full.

Every case carries its own seed, so `pytest -k <case id>` reproduces one failure alone.
"""

from __future__ import annotations

import itertools
import os
import random

import torch
from attn_reference import Case

HEAD_DIMS = tuple(range(8, 257, 8))
GQA_RATIOS = (1, 2, 4, 8)
DTYPES = (torch.float16, torch.bfloat16)
# Odd, unequal, tile-straddling and extreme lengths; (q, k).
SEQLEN_PAIRS = (
    (1, 1),
    (1, 4096),
    (4096, 1),
    (7, 13),
    (113, 203),
    (128, 128),
    (129, 257),
    (255, 97),
    (512, 1023),
    (1000, 1000),
    (2048, 4096),
    (4096, 4096),
)
# Keep the reference's (b, h, sq, sk) fp32 score tensors (several live at once under autograd) small.
MAX_SCORE_ELEMENTS = 1 << 27


def full_sweep() -> bool:
    return os.environ.get("FA_GPU_SWEEP", "").lower() == "full"


def _fit_batch(rng: random.Random, heads: int, sq: int, sk: int) -> int:
    batch = rng.randint(1, 8)
    while batch > 1 and batch * heads * sq * sk > MAX_SCORE_ELEMENTS:
        batch -= 1
    return batch


def _heads(rng: random.Random, ratio: int, sq: int, sk: int) -> tuple[int, int]:
    heads_k = rng.choice((1, 2)) if sq * sk > (1 << 22) else rng.choice((1, 2, 3))
    return heads_k * ratio, heads_k


def padded_cases(seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    if full_sweep():
        combos = itertools.product(HEAD_DIMS, GQA_RATIOS, (False, True), DTYPES, SEQLEN_PAIRS)
        for i, (d, ratio, causal, dtype, (sq, sk)) in enumerate(combos):
            heads, heads_k = _heads(rng, ratio, sq, sk)
            cases.append(
                Case(_fit_batch(rng, heads, sq, sk), sq, sk, heads, heads_k, d, causal, dtype, seed=i)
            )
        return cases
    # Default: every head dim once with random other axes, then every seqlen pair once at common head
    # dims, both dtypes, both causal settings; every GQA ratio appears through the random draws.
    for i, d in enumerate(HEAD_DIMS):
        sq, sk = rng.choice(SEQLEN_PAIRS[:10])
        heads, heads_k = _heads(rng, GQA_RATIOS[i % 4], sq, sk)
        cases.append(
            Case(_fit_batch(rng, heads, sq, sk), sq, sk, heads, heads_k, d, i % 3 == 0, DTYPES[i % 2], seed=i)
        )
    for j, (sq, sk) in enumerate(SEQLEN_PAIRS):
        for causal in (False, True):
            d = rng.choice((64, 128, 256))
            heads, heads_k = _heads(rng, rng.choice(GQA_RATIOS), sq, sk)
            dtype = DTYPES[(j + causal) % 2]
            seed = 1000 + 2 * j + causal
            cases.append(
                Case(_fit_batch(rng, heads, sq, sk), sq, sk, heads, heads_k, d, causal, dtype, seed=seed)
            )
    return cases


def varlen_cases(seed: int = 1) -> list[Case]:
    """Varlen cases: seqlen_q / seqlen_k are the max lengths; the lengths themselves come from the seed."""
    rng = random.Random(seed)
    n = 64 if full_sweep() else 12
    cases = []
    for i in range(n):
        sq = rng.choice((1, 17, 128, 300, 1024, 2047))
        sk = rng.choice((sq, rng.choice((1, 33, 128, 513, 2048))))
        ratio = GQA_RATIOS[i % 4]
        heads, heads_k = _heads(rng, ratio, sq, sk)
        d = rng.choice(HEAD_DIMS) if i % 2 else rng.choice((64, 128, 256))
        cases.append(
            Case(
                rng.randint(1, 8),
                sq,
                sk,
                heads,
                heads_k,
                d,
                rng.random() < 0.5,
                DTYPES[i % 2],
                True,
                2000 + i,
            )
        )
    return cases
