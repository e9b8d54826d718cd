"""Keys and values read through a page table (paged KV cache), in plain torch, for the fallback.

A paged cache is (num_blocks, page_block_size, heads_k, head_dim); sequence b's key t lives in page
block_table[b, t // page_block_size] at row t % page_block_size. The kernels do not read pages yet
(feature "paged_kv"), so the fallback gathers each sequence's keys into the packed (total, heads_k,
head_dim) layout the varlen fallback takes: a copy, which is what a fallback may cost.
"""

from __future__ import annotations

import torch

from . import fallback
from .inputs import AttnCall


def gather(
    cache: torch.Tensor, block_table: torch.Tensor, starts: list[int], ends: list[int]
) -> torch.Tensor:
    """Rows [starts[b], ends[b]) of every sequence b, packed: (sum of lengths, heads_k, head_dim)."""
    page = cache.shape[1]
    pages, rows = [], []
    for b, (start, end) in enumerate(zip(starts, ends)):
        pos = torch.arange(start, end, device=cache.device)
        pages.append(block_table[b].to(torch.long)[pos // page])
        rows.append(pos % page)
    if not pages:
        return cache.new_empty((0, *cache.shape[2:]))
    return cache[torch.cat(pages), torch.cat(rows)]


def varlen_fallback(block_table: torch.Tensor):
    """The varlen fallback for keys behind a page table: gather them packed, then attend as usual."""

    def run(call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, want_lse: bool):
        assert call.varlen is not None
        lengths = list(call.varlen.seqlens_k)
        starts = [0] * len(lengths)
        k_rows = gather(k, block_table, starts, lengths)
        v_rows = gather(v, block_table, starts, lengths)
        return fallback.varlen_attention(call, q, k_rows, v_rows, want_lse)

    return run
