"""kernels/tiles.py's tiles per CUDA major (issue 38): where NVRTC 11.8's ptxas spills on FA2's tile and
12.9's and 13.0's do not, the table gives CUDA 11 the spill-free tile it had and CUDA 12 and 13 FA2's;
and sm 8.7 (Jetson Orin) has a row of its own beside sm 8.0's. These are table facts; that each tile
is spill-free with its major's NVRTC is bench/kernels/kernel_resources.py's (--cuda 11/12/13), and
tests/emu runs each tile on the emulator. Not verified on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench"), str(REPO / "kernels")]

import fa2_model
import tiles

from buildtool.core.cuda_facts import TOOLKITS

# (arch, direction, head dim): the units whose tile depends on the CUDA major
PER_MAJOR = {("8.0", "bwd", 96), ("8.0", "bwd", 192), ("9.0", "bwd", 256)}


def _tiles(arch: str, cuda: int | None) -> dict[str, str]:
    return {u.name: u.tile for u in tiles.units(arch, cuda)}


@pytest.mark.parametrize(("arch", "head_dim"), [("8.0", 96), ("8.0", 192), ("9.0", 256)])
def test_cuda_12_and_13_run_fa2s_blocks_where_cuda_11_keeps_its_spill_free_tile(arch, head_dim):
    fa2 = fa2_model.tile_for("bwd", arch, head_dim)
    assert fa2 is not None
    for cuda in (12, 13, None):
        new = tiles.default_tile(arch, "bwd", head_dim, cuda)
        assert (new.block_m, new.block_n, new.warps) == (fa2.block_m, fa2.block_n, fa2.warps), cuda
    old = tiles.default_tile(arch, "bwd", head_dim, 11)
    assert old is not None
    assert old != tiles.default_tile(arch, "bwd", head_dim, 12)
    # the unit keeps its name: a cu11 and a cu12 wheel ship the same unit, each with its major's tile
    (u11,) = [u for u in tiles.units(arch, 11) if u.name == f"bwd_bf16_d{head_dim}"]
    (u12,) = [u for u in tiles.units(arch, 12) if u.name == f"bwd_bf16_d{head_dim}"]
    assert (u11.tile, u12.tile) == (old.label, tiles.default_tile(arch, "bwd", head_dim, 12).label)
    assert u11.defines != u12.defines


def test_the_80_d96_backward_is_fa2s_64_by_128_with_v_in_registers_under_12_and_13():
    assert tiles.default_tile("8.0", "bwd", 96, 12).label == "m64n128w8s2v"
    assert tiles.default_tile("8.0", "bwd", 96, 13).label == "m64n128w8s2v"
    assert tiles.default_tile("8.0", "bwd", 96, 11).label == "m64n128w8s1"
    assert tiles.default_tile("9.0", "bwd", 256, 11).label == "m64n32w8s2"


@pytest.mark.parametrize("arch", sorted({a for tk in TOOLKITS.values() for a in tk.archs}))
def test_the_majors_differ_exactly_where_the_table_says(arch):
    default = _tiles(arch, None)
    for cuda, tk in TOOLKITS.items():
        if arch not in tk.archs:
            continue
        mine = _tiles(arch, cuda)
        assert set(mine) == set(default), (arch, cuda)  # the same units, by name
        differ = {name for name in mine if mine[name] != default[name]}
        listed = {
            name
            for name in mine
            if cuda == 11 and (arch, name.split("_")[0], int(name.rsplit("_d", 1)[1])) in PER_MAJOR
        }
        assert differ == listed, (arch, cuda)
    assert _tiles(arch, 12) == _tiles(arch, 13) == default  # CUDA 12 and 13 share one table
    # the alternatives (smaller tiles for GPUs with less shared memory) are other families' defaults
    alternatives = {u.name: u.tile for u in tiles.alternative_units(arch, 11)}
    assert alternatives == {u.name: u.tile for u in tiles.alternative_units(arch, 12)}


def test_sm87_has_its_own_row_and_80s_shared_memory():
    orin, a100 = tiles.arch_family("8.7"), tiles.arch_family("8.0")
    assert orin is not None
    assert a100 is not None
    assert orin.name == "sm87"
    assert a100.name == "sm80"
    assert tiles.SMEM_LIMIT["8.7"] == tiles.SMEM_LIMIT["8.0"] == 163 * 1024
    # sm_87's ptxas fits FA2's d96 and d192 tiles with NVRTC 11.8 too: Orin runs them in every major
    for cuda in (11, 12, 13):
        for d in (96, 192):
            assert tiles.default_tile("8.7", "bwd", d, cuda) == tiles.default_tile("8.0", "bwd", d, 12)
    assert _tiles("8.7", 11) == _tiles("8.7", 12) == _tiles("8.0", 12)
    assert _tiles("8.7", 11) != _tiles("8.0", 11)


def test_a_major_the_table_names_no_tiles_for_compiles_the_default():
    assert _tiles("8.0", 14) == _tiles("8.0", None)
