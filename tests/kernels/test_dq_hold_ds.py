"""bwd.cu's FA_DQ_HOLD_DS (kernels/tiles.py BwdTile.dq_hold_ds, label suffix "hN", issue 38): dQ in column
passes with this warp's dS fragments read once per step and held in registers through the passes, each
pass split over N warp rows. The single dQ pass spills on sm 8.0 at d256 and sm 12.0 at d192/d256, and
the passes without it re-read dS (more ldmatrix bytes per mma than FA2); held, they read what one pass
does. The SASS facts are read from ptxas and nvdisasm (bench/kernels/kernel_model.py); tests/emu runs
each tile on the emulator. Not verified on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench"), str(REPO / "kernels")]

import fa2_model
import kernel_model
import tiles

# The units whose tile holds dS: (arch, head dim) -> label, the same in every CUDA major that targets it.
HELD = {
    ("8.0", 256): "m64n64w8s1p4h2",
    ("8.7", 256): "m64n64w8s1p4h2",
    ("12.0", 192): "m64n64w8s1vxp6h2",
    ("12.0", 256): "m32n64w8s1vxp4h1",
}


def test_the_label_and_the_define_carry_the_warp_rows():
    held = tiles.BwdTile(32, 64, 8, 1, True, True, 4, dq_hold_ds=1)
    assert held.label == "m32n64w8s1vxp4h1"
    assert held.defines()["FA_DQ_HOLD_DS"] == 1
    assert "FA_DQ_HOLD_DS" not in tiles.BwdTile(32, 64, 8, 1, True, True, 4).defines()


def test_holding_ds_needs_passes_and_a_row_split_into_whole_mma_tiles():
    # one pass: nothing to hold dS through
    assert not tiles.BwdTile(64, 64, 8, 1, dq_hold_ds=2).valid(256)
    # four passes of 48 columns: two warp rows leave 12 columns per warp, not whole 8-column tiles
    assert not tiles.BwdTile(64, 64, 8, 1, True, True, 4, dq_hold_ds=2).valid(192)
    assert tiles.BwdTile(64, 64, 8, 1, True, True, 4, dq_hold_ds=4).valid(192)
    assert tiles.BwdTile(64, 64, 8, 1, True, True, 6, dq_hold_ds=2).valid(192)


@pytest.mark.parametrize(("arch", "head_dim"), sorted(HELD))
def test_the_units_that_spilled_in_one_pass_hold_ds(arch, head_dim):
    for cuda in (11, 12, 13, None):
        tile = tiles.default_tile(arch, "bwd", head_dim, cuda)
        assert tile is not None
        assert tile.label == HELD[arch, head_dim], cuda
        assert tile.smem_bytes(head_dim) <= tiles.arch_family(arch).dynamic_limit


@pytest.mark.slow
@pytest.mark.parametrize("cuda", [11, 12, 13])
def test_held_ds_compiles_without_a_spill_at_or_better_than_fa2(cuda):
    """Each held-dS unit as CUDA `cuda`'s NVRTC compiles it (11.8 does not target sm 12.0): no spill,
    and FA2's ldmatrix bytes per mma or fewer (12.0 d256: 281.6 against FA2's 64 x 32's 294.4, and half
    its dQ sectors per MFLOP). Before FA_DQ_HOLD_DS the three units read 4-7% more than FA2."""
    only = {(arch, f"bwd_bf16_d{d}") for arch, d in HELD if cuda != 11 or arch != "12.0"}
    archs = sorted({arch for arch, _ in only})
    rows = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", archs, [192, 256], cuda, ("bwd",), only
    )
    assert {(m.arch, m.unit) for m in rows} == only
    for m in rows:
        assert m.tile == HELD[m.arch, m.head_dim]
        assert m.spills == 0, (m.arch, m.unit, m.tile)
        fa2 = fa2_model.row("bwd", m.arch, m.head_dim)
        assert fa2 is not None
        assert kernel_model.misses(m, fa2) == [], (m.arch, m.unit, m.tile)
