"""The KV-cache layouts of the forward and split-KV kernels on the CPU emulator, against a float64 reference.

Each layout (kernels/csrc/params.h) puts every sequence's keys somewhere else: per-sequence key counts
(seqused_k), a first key per sequence (leftpad_k), a cache row per sequence (kv_batch_idx), pages
through a page table (block_table, pages of one key block and of several). The test writes each
sequence's keys into that layout over a cache full of other random keys (so a wrong address reads
plausible numbers, not zeros), runs the kernels, and compares every sequence with attention over its
own keys: the float64 reference (tests/gpu/attn_reference.py run in float64) under FA2's rule against
the same math in fp16. Sequences with no key must give out 0 and lse +inf.

sm80's units (cp.async pipeline, split-KV key blocks twice the forward's) and sm75's (register-staged
loads) run every layout at head dim 64; decode (one query row, split many ways) and a few query rows.
FA_EMU_SWEEP=full adds sm86/sm90 (sm80's tiles at d64, other arch code) and head dims 32 and 128.
"""

from __future__ import annotations

import os
import zlib

import emu_harness as H
import pytest
import tiles
import torch
from kv_layouts import Problem, build, check, key_block, rand

FULL = os.environ.get("FA_EMU_SWEEP") == "full"
ARCHS = ("8.0", "7.5", "8.6", "9.0") if FULL else ("8.0", "7.5")
HEAD_DIMS = (64, 32, 128) if FULL else (64,)
DIRECTIONS = ("fwd", "splitkv")
LAYOUTS = ("ragged", "leftpad", "batch_idx", "paged-1", "paged-3")

_LIBS: dict[tuple[str, str, int], H.Emulated] = {}


def emulated(arch: str, direction: str, head_dim: int) -> H.Emulated:
    key = (arch, direction, head_dim)
    if key not in _LIBS:
        _LIBS[key] = H.Emulated(H.unit_for(arch, direction, "fp16", head_dim), arch)
    return _LIBS[key]


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    """Compile this module's libraries at once, in parallel."""
    H.build_all([(H.unit_for(a, d, "fp16", hd), a) for a in ARCHS for d in DIRECTIONS for hd in HEAD_DIMS])


MASKS = {"full": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (70, 3))}


def _cases() -> list[pytest.param]:
    """Each layout on each arch, unit and head dim; masks, query rows and splits vary across them."""
    out = []
    for arch in ARCHS:
        for direction in DIRECTIONS:
            for head_dim in HEAD_DIMS:
                for i, layout in enumerate(LAYOUTS):
                    mask = list(MASKS)[(i + len(direction)) % len(MASKS)]
                    cid = f"sm{arch.replace('.', '')}-{direction}-d{head_dim}-{layout}-{mask}"
                    out.append(pytest.param(arch, direction, head_dim, layout, mask, id=cid))
    return out


@pytest.mark.parametrize(("arch", "direction", "head_dim", "layout", "mask"), _cases())
def test_layout(arch: str, direction: str, head_dim: int, layout: str, mask: str) -> None:
    """Decode (one query row) and a few query rows; split-KV with one split and several (more than
    the shortest sequence's key blocks: its empty splits must weigh nothing)."""
    em = emulated(arch, direction, head_dim)
    block_n = key_block(arch, direction, head_dim)
    causal, window = MASKS[mask]
    seed = zlib.crc32(f"{arch}-{direction}-{head_dim}-{layout}-{mask}".encode())
    for seqlen_q, splits in ((1, 3), (5, 1)):
        problem = build(layout, block_n, seqlen_q, causal, window, head_dim, seed + seqlen_q)
        if direction == "splitkv":
            out, lse = H.forward_splitkv(em, problem.call, splits)
        else:
            out, lse = H.forward(em, problem.call)
        check(problem, out, lse)


def test_paged_without_seqused_k() -> None:
    """A page table alone: every sequence has max_seqlen_k keys (flash_attn_with_kvcache with one
    cache length for all)."""
    em = emulated("8.0", "fwd", 64)
    problem = build("paged-1", key_block("8.0", "fwd", 64), 3, True, (-1, -1), 64, seed=11, uniform=True)
    assert problem.call.seqused_k is None
    check(problem, *H.forward(em, problem.call))


def test_varlen_queries_over_pages() -> None:
    """flash_attn_varlen_func(block_table=...): packed queries, each sequence's keys in its pages
    (cu_seqlens_k gives the counts, from key 0 of the pages)."""
    block_n = key_block("8.0", "splitkv", 64)
    problem = build("paged-1", block_n, 1, True, (-1, -1), 64, seed=12)
    gen = torch.Generator().manual_seed(13)
    lens_q = [4, 1, 3]
    lens_k = [len(k) for k in problem.keys]
    q = rand(gen, sum(lens_q), 4, 64)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    call = H.Call(
        q,
        problem.call.k,
        problem.call.v,
        causal=True,
        cu_seqlens_q=cu(lens_q),
        cu_seqlens_k=cu(lens_k),
        max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k),
        block_table=problem.call.block_table,
    )
    for em, run in (
        (emulated("8.0", "fwd", 64), lambda em: H.forward(em, call)),
        (emulated("8.0", "splitkv", 64), lambda em: H.forward_splitkv(em, call, 2)),
    ):
        out, lse = run(em)
        start = 0
        for b, n in enumerate(lens_q):
            rows = slice(start, start + n)
            start += n
            seq = Problem(q[rows].unsqueeze(0), [problem.keys[b]], [problem.values[b]], call)
            check(seq, out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0))


def test_every_unit_reads_pages_of_256() -> None:
    """flash-attn's own page rule (a multiple of 256) suits every forward and split-KV unit we build:
    their key blocks divide 256, so no flash-attn caller's cache falls back for its page size."""
    for arch in ("7.5", "8.0", "8.6", "9.0"):
        for unit in tiles.units(arch):
            if unit.direction in DIRECTIONS:
                assert all(256 % e.block_n == 0 for e in unit.entries.values() if e.block_n), unit.name
