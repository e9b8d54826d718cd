"""bench/kernels/kernel_model.py's warpgroup-MMA arithmetic (the sm_90a forward beside FlashAttention-3), by hand
on the tiles whose numbers are easy to state, and the recorded docs/figures.md section against the tiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench")]

import kernel_model

from buildtool.core import kernels_src


def test_register_pv_reads_only_v_from_shared_memory() -> None:
    m = kernel_model.wgmma_model("ours", 128, 128, 128, 2, True)
    # S: 8 HGMMAs reading Q (64 x 16 x 2 B) and K (128 x 16 x 2 B); P V: 8 reading V (16 x 128 x 2 B)
    assert m.hgmma == 16
    assert m.smem_per_hgmma == (8 * (2048 + 4096) + 8 * 4096) / 16
    assert m.smem_per_kflop == round(1000 * (8 * 6144 + 8 * 4096) / (2 * 64 * 128 * 128 * 2), 2)
    assert (m.tma_kv_bytes, m.tma_q_bytes) == (2 * 128 * 128 * 2, 128 * 128 * 2)
    assert m.regs == "24 / 240"
    assert m.acc_regs == 64 + 64 + 32  # S, O, P packed
    assert m.smem_bytes == (128 + 4 * 128) * 128 * 2 + 8 * 9


def test_shared_memory_pv_pays_for_p() -> None:
    rs = kernel_model.wgmma_model("x", 64, 192, 192, 2, True)
    ss = kernel_model.wgmma_model("x", 64, 192, 192, 2, False)
    assert ss.smem_per_hgmma - rs.smem_per_hgmma == pytest.approx(2048 * 12 / 16)  # A of 12 P V HGMMAs
    assert ss.smem_bytes - rs.smem_bytes == 192 * 192 * 2  # P's tile
    assert ss.consumers == 3
    assert ss.regs == "32 / 160"


def test_fa3_rows_cover_the_sm90a_head_dims() -> None:
    tiles = kernels_src.tiles()
    assert set(kernel_model.FA3_FWD_SM90) == set(tiles.HOPPER_HEAD_DIMS)


def test_recorded_section_lists_every_sm90a_tile() -> None:
    tiles = kernels_src.tiles()
    text = (REPO / "docs" / "figures.md").read_text()
    section = text.split("<!-- begin kernel-sm90a -->", 1)[1].split("<!-- end kernel-sm90a -->", 1)[0]
    for u in (u for u in tiles.units("9.0a") if u.dtype == "bf16"):
        tile = f"{u.defines['FA_BLOCK_M']}x{u.defines['FA_BLOCK_N']}"
        assert f"| {u.head_dim} | ours | {tile} |" in section, (
            u.name,
            "rerun bench/kernels/kernel_model.py --sm90a --record",
        )
