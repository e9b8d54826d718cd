"""KV-cache layouts for the emulator tests: each sequence's keys written into a layout of
kernels/csrc/params.h (seqused_k, leftpad_k, kv_batch_idx, block_table) over a cache of other random
keys, and the check of a result against attention over each sequence's own keys (float64 reference,
FA2's rule against the same math in fp16). Used by test_kv_layouts.py and the mutation tests of
test_emulator_catches.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import emu_harness as H
import torch
from attn_reference import assert_fa2_close, attention_ref, visible_rows
from attn_runs import check_lse


def key_block(arch: str, direction: str, head_dim: int) -> int:
    unit = H.unit_for(arch, direction, "fp16", head_dim)
    return max(e.block_n for e in unit.entries.values())


@dataclass(frozen=True)
class Problem:
    """Each sequence's own q, k, v (float, before the layout) and the kernel call that holds them."""

    q: torch.Tensor  # (batch, seqlen_q, heads, d) fp16
    keys: list[torch.Tensor]  # per sequence (n_b, heads_k, d) fp16
    values: list[torch.Tensor]
    call: H.Call


def rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen).half()


def build(
    layout: str,
    block_n: int,
    seqlen_q: int,
    causal: bool,
    window: tuple[int, int],
    head_dim: int,
    seed: int,
    uniform: bool = False,
) -> Problem:
    """Three sequences in `layout`: one over several key blocks, one that ends mid-block, one with no
    key (leftpad: one whose first key is the cache's last row, so leftpad == the key count). uniform:
    every sequence holds the whole capacity (no seqused_k: the kernels take the count from seqlen_k)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    batch, heads, heads_k = 3, 4, 2
    capacity = 5 * block_n // 2 + 3  # crosses key-block edges
    lengths = [capacity] * batch if uniform else [capacity, rng.randint(2, block_n + block_n // 2), 0]
    first = [0] * batch
    if layout == "leftpad":  # every sequence ends at the capacity: leftpad_k alone
        first = [block_n // 2 + 5, 1, capacity]
        lengths = [capacity - f for f in first]
        uniform = True
    q = rand(gen, batch, seqlen_q, heads, head_dim)
    keys = [rand(gen, n, heads_k, head_dim) for n in lengths]
    values = [rand(gen, n, heads_k, head_dim) for n in lengths]
    used = (
        None
        if uniform
        else torch.tensor([f + n for f, n in zip(first, lengths, strict=False)], dtype=torch.int32)
    )
    opts = {"causal": causal, "window": window, "seqused_k": used}

    if layout.startswith("paged"):
        page = block_n * int(layout.split("-")[1])
        cols = -(-capacity // page) + 1  # a spare column: a page-index slip reads a real, wrong page
        pages = batch * cols + 2
        k_pages, v_pages = (
            rand(gen, pages, page, heads_k, head_dim),
            rand(gen, pages, page, heads_k, head_dim),
        )
        table = torch.randperm(pages, generator=gen)[: batch * cols].reshape(batch, cols).to(torch.int32)
        for b, n in enumerate(lengths):
            for t in range(n):
                p, r = int(table[b, t // page]), t % page
                k_pages[p, r], v_pages[p, r] = keys[b][t], values[b][t]
        call = H.Call(q, k_pages, v_pages, block_table=table, max_seqlen_k=capacity, **opts)
        return Problem(q, keys, values, call)

    rows = batch + 2 if layout == "batch_idx" else batch
    k_cache, v_cache = (
        rand(gen, rows, capacity, heads_k, head_dim),
        rand(gen, rows, capacity, heads_k, head_dim),
    )
    row_of = [3, 0, 4] if layout == "batch_idx" else list(range(batch))
    for b, n in enumerate(lengths):
        k_cache[row_of[b], first[b] : first[b] + n] = keys[b]
        v_cache[row_of[b], first[b] : first[b] + n] = values[b]
    call = H.Call(
        q,
        k_cache,
        v_cache,
        leftpad_k=torch.tensor(first, dtype=torch.int32) if layout == "leftpad" else None,
        kv_batch_idx=torch.tensor(row_of, dtype=torch.int32) if layout == "batch_idx" else None,
        **opts,
    )
    return Problem(q, keys, values, call)


def check(problem: Problem, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Every sequence against attention over its own keys: float64 reference, fp16 for the rule."""
    call = problem.call
    for b, (k, v) in enumerate(zip(problem.keys, problem.values, strict=False)):
        q = problem.q[b : b + 1]
        k, v = k.unsqueeze(0), v.unsqueeze(0)
        name = f"sequence {b} ({k.shape[1]} keys)"
        rows = visible_rows(q.shape[1], k.shape[1], call.causal, q.device, call.window)
        if not rows.any():
            assert (out[b] == 0).all(), f"{name}: a row that sees no key must give 0"
            assert torch.isposinf(lse[b]).all(), f"{name}: its lse must be +inf"
            continue
        ref, lse_ref = attention_ref(
            q.double(), k.double(), v.double(), call.causal, upcast=False, window=call.window
        )
        low, _ = attention_ref(q, k, v, call.causal, upcast=False, window=call.window)
        assert (out[b, ~rows] == 0).all(), name
        assert torch.isposinf(lse[b][:, ~rows]).all(), name
        assert_fa2_close(name, out[b : b + 1], ref, low)
        check_lse(lse[b : b + 1].double(), lse_ref, rows)
