"""bwd.cu's FA_K_IN_REGS (kernels/tiles.py BwdTile.k_in_regs, label suffix "k", issue 38): K's fragments of
S = Q K^T held in registers beside V's, so S reads only Q from shared memory. Table facts here; the SASS
facts (FA2's 230.4 ldmatrix bytes per mma on sm 8.6 d192, no spill) are tests/kernels/test_fa2_model.py's
and test_major_tiles.py's, the emulator's tests/emu/test_swizzled_tiles.py's. Not verified on a GPU."""

from __future__ import annotations

import dataclasses

import tiles


def test_the_label_and_the_define_say_k():
    held = tiles.BwdTile(64, 64, 8, 1, True, True, 6, s_rows=2, dq_hold_ds=2, rebase=True, k_in_regs=True)
    assert held.label == "m64n64w8s1vxp6r2h2ak"
    assert held.defines()["FA_K_IN_REGS"] == 1
    assert "FA_K_IN_REGS" not in dataclasses.replace(held, k_in_regs=False).defines()


def test_k_keeps_its_shared_tile_for_dq():
    """dQ = dS K still reads K from shared memory: holding S's fragments saves no shared memory."""
    tile = tiles.default_tile("8.6", "bwd", 192)
    assert isinstance(tile, tiles.BwdTile)
    assert tile.k_in_regs
    assert tile.smem_bytes(192) == dataclasses.replace(tile, k_in_regs=False).smem_bytes(192) == 98816


def test_sm86_d192_holds_k_in_every_major_and_cuda_11_splits_dq_over_four_warp_rows():
    """CUDA 12 and 13 (and so the cu13 wheels, which ship CUDA 12's cubin) hold dS in two warp rows
    through dQ's passes; NVRTC 11.8 spills that beside K's and V's fragments, so CUDA 11's own tile
    splits the passes over four (fewer held registers, more ldmatrix bytes: 247.5 against 230.4)."""
    for arch in ("8.6", "8.9"):
        default = tiles.default_tile(arch, "bwd", 192)
        cu11 = tiles.default_tile(arch, "bwd", 192, 11)
        assert isinstance(default, tiles.BwdTile)
        assert isinstance(cu11, tiles.BwdTile)
        assert default == tiles.default_tile(arch, "bwd", 192, 12) == tiles.default_tile(arch, "bwd", 192, 13)
        assert (default.dq_hold_ds, cu11.dq_hold_ds) == (2, 4)
        assert cu11 == dataclasses.replace(default, dq_hold_ds=4)
        assert cu11.valid(192)
    # sm 12.0 keeps its own d192 (S in FA2's four warp rows, no K in registers)
    sm120 = tiles.default_tile("12.0", "bwd", 192)
    assert isinstance(sm120, tiles.BwdTile)
    assert not sm120.k_in_regs
