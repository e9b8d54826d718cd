"""The forward's swizzled shared-memory tiles (kernels/csrc/tiles.cuh), counted on the emulator.

The padded rows they replace left the row-wise copies of the widths that are not a multiple of 64
elements 1.14 to 2 times the conflict-free wavefronts (a quarter-warp spanning two rows); swizzled,
every access kind of the forward is conflict-free at every head-dim bucket, the split-KV forward too.
"""

from __future__ import annotations

import dataclasses

import emu_harness as H
import pytest
import tiles
import torch
from attn_reference import assert_fa2_close, attention_ref


def _ratios(em: H.Emulated) -> dict[str, float]:
    out = {}
    for entry, kinds in em.banks.items():
        for kind, (n, wavefronts, ideal) in kinds.items():
            if n:
                out[f"{entry} {kind}"] = wavefronts / ideal
    return out


@pytest.mark.parametrize("bucket", [32, 96, 160])
def test_forward_copies_and_fragments_are_conflict_free(bucket: int) -> None:
    em = H.Emulated(H.unit_for("8.0", "fwd", "fp16", bucket), "8.0")
    gen = torch.Generator().manual_seed(bucket)
    q, k, v = (torch.randn(1, 200, 1, bucket, generator=gen).half() for _ in range(3))
    H.forward(em, H.Call(q, k, v))
    ratios = _ratios(em)
    assert {"fa_fwd cp.async", "fa_fwd ldmatrix", "fa_fwd st.shared"} <= set(ratios)
    assert ratios == dict.fromkeys(ratios, 1.0)


def _backward_ratios(unit: tiles.KernelUnit, arch: str) -> dict[str, float]:
    """fa_bwd's bank-conflict ratios over one backward of full blocks (two key and two query blocks)."""
    fwd = H.Emulated(H.unit_for(arch, "fwd", "fp16", unit.head_dim), arch)
    bwd = H.Emulated(unit, arch)
    launch = unit.entries["fa_bwd"]
    seqlen = 2 * max(launch.block_m, launch.block_n)
    gen = torch.Generator().manual_seed(unit.head_dim)
    q, k, v, dout = (torch.randn(1, seqlen, 1, unit.head_dim, generator=gen).half() for _ in range(4))
    call = H.Call(q, k, v)
    out, lse = H.forward(fwd, call)
    H.backward(bwd, call, out, lse, dout)
    return {key: r for key, r in _ratios(bwd).items() if key.startswith("fa_bwd ")}


@pytest.mark.parametrize(("bucket", "cuda"), [(96, None), (128, None), (192, None), (192, 11), (256, None)])
def test_swizzled_backward_is_conflict_free(bucket: int, cuda: int | None) -> None:
    """The 99 KB parts' backward tiles from d96 up are swizzled (tiles.py BwdTile.swizzled): every
    access kind of fa_bwd is conflict-free, the Q/dO/K/V copies at width 96 too, which padded took
    1.33 times the wavefronts (the same tile padded, counted the same way); d192's K fragments read
    into registers (k_in_regs) too, in CUDA 11's tile as in the default."""
    tile = tiles.default_tile("8.6", "bwd", bucket, cuda)
    assert isinstance(tile, tiles.BwdTile)
    assert tile.swizzled
    ratios = _backward_ratios(tiles.unit("8.6", "bwd", "fp16", bucket, tile), "8.6")
    assert {"fa_bwd cp.async", "fa_bwd ldmatrix", "fa_bwd st.shared"} <= set(ratios)
    assert ratios == dict.fromkeys(ratios, 1.0)
    if bucket == 96:
        padded = dataclasses.replace(tile, swizzled=False)
        before = _backward_ratios(tiles.unit("8.6", "bwd", "fp16", bucket, padded), "8.6")
        assert before["fa_bwd cp.async"] > 1.3


def _backward_matches_the_reference(unit: tiles.KernelUnit, arch: str) -> None:
    """Three query blocks against two key blocks, causal, GQA: `unit`'s gradients are the reference's,
    and every access kind of fa_bwd stays conflict-free."""
    d = unit.head_dim
    fwd = H.Emulated(H.unit_for(arch, "fwd", "fp16", d), arch)
    bwd = H.Emulated(unit, arch)
    gen = torch.Generator().manual_seed(d)
    q, dout = (torch.randn(1, 170, 2, d, generator=gen).half() for _ in range(2))
    k, v = (torch.randn(1, 200, 1, d, generator=gen).half() for _ in range(2))
    call = H.Call(q, k, v, causal=True)
    out, lse = H.forward(fwd, call)
    grads = H.backward(bwd, call, out, lse, dout)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    refs = torch.autograd.grad(attention_ref(qr, kr, vr, True)[0], (qr, kr, vr), dout)
    lows = torch.autograd.grad(attention_ref(qr, kr, vr, True, upcast=False)[0], (qr, kr, vr), dout)
    for name, ours, ref, low in zip(("dq", "dk", "dv"), grads, refs, lows, strict=True):
        assert_fa2_close(name, ours, ref, low)
    ratios = {key: r for key, r in _ratios(bwd).items() if key.startswith("fa_bwd ")}
    assert {"fa_bwd cp.async", "fa_bwd ldmatrix", "fa_bwd st.shared"} <= set(ratios)
    assert ratios == dict.fromkeys(ratios, 1.0)


def test_a_rebased_step_reads_the_same_tiles() -> None:
    """sm 8.6's d96 (FA2's 64 x 128, swizzled, one dQ pass) derives each step's shared-memory addresses
    from an opaque zero (FA_BWD_REBASE: primitives.cuh opaque_zero, run as its PTX) instead of registers
    held across the query loop, and adds dQ before dK and dV (FA_DQ_FIRST): three query blocks against
    two key blocks, causal, GQA, give the gradients of the reference, and every access stays
    conflict-free. (With opaque_zero returning 16 it fails.)"""
    tile = tiles.default_tile("8.6", "bwd", 96)
    assert isinstance(tile, tiles.BwdTile)
    unit = tiles.unit("8.6", "bwd", "fp16", 96, tile)
    assert (unit.defines["FA_BWD_REBASE"], unit.defines["FA_DQ_FIRST"]) == (1, 1)
    _backward_matches_the_reference(unit, "8.6")


@pytest.mark.parametrize("cuda", [None, 11])
def test_k_held_in_registers_scores_each_warps_keys(cuda: int | None) -> None:
    """sm 8.6's d192 (FA2's 64 x 64, swizzled, S in two warp rows) holds K's fragments of S = Q K^T in
    registers beside V's (FA_K_IN_REGS), read once per key block after the barrier that lands K: the
    default tile (dS held through six dQ passes in two warp rows) and CUDA 11's own (four warp rows)
    give the reference's gradients over two key blocks with every access conflict-free. (With every
    warp column reading the first column's keys, the mutant bwd-k-frags-keys, dQ is off by 1.08.)"""
    tile = tiles.default_tile("8.6", "bwd", 192, cuda)
    assert isinstance(tile, tiles.BwdTile)
    assert (tile.k_in_regs, tile.v_in_regs, tile.swizzled) == (True, True, True)
    _backward_matches_the_reference(tiles.unit("8.6", "bwd", "fp16", 192, tile), "8.6")
