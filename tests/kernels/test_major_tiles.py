"""kernels/tiles.py's tiles per CUDA major (issue 38): where NVRTC 11.8's ptxas spills on FA2's tile and
12.9's and 13.0's do not, the table gives CUDA 11 a spill-free tile of its own and CUDA 12 and 13 FA2's;
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
import kernel_model
import kernel_resources
import tiles

from buildtool.core.cuda_facts import TOOLKITS

# (arch, direction, head dim): the units whose tile depends on the CUDA major
PER_MAJOR = {
    ("8.0", "bwd", 96),
    ("8.0", "bwd", 192),
    ("9.0", "bwd", 256),
    ("8.6", "bwd", 192),
    ("8.9", "bwd", 192),
}


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
    assert tiles.default_tile("8.0", "bwd", 96, 11).label == "m64n128w8s2vp3h2"
    assert tiles.default_tile("9.0", "bwd", 256, 11).label == "m64n64w8s2p4h2"


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

    # the alternatives (smaller tiles for GPUs with less shared memory) are other families' defaults,
    # each major's: they differ only where the family they serve has a tile per major (sm 8.6's d192)
    def served(cuda: int) -> dict[tuple[str, str, int, tuple[str, ...]], str]:
        return {
            (u.direction, u.dtype, u.head_dim, u.serves): u.tile for u in tiles.alternative_units(arch, cuda)
        }

    alt11, alt12 = served(11), served(12)
    assert set(alt11) == set(alt12)
    for key in (k for k in alt11 if alt11[k] != alt12[k]):
        direction, _, d, serves = key
        assert {"8.8", "8.9"} & set(serves)  # the 99 KB GPUs of sm 8.6's family
        assert (direction, d) == ("bwd", 192)
        assert (alt11[key], alt12[key]) == tuple(
            tiles.default_tile("8.6", direction, d, c).label for c in (11, 12)
        )


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


def test_kernel_resources_compiles_the_tile_of_its_cuda_major():
    """The defect: kernel_resources.py --cuda 11 compiled the one table, so NVRTC 11.8's spills were
    measured on tiles no cu11 wheel ships (and 12's on tiles no cu12 wheel ships)."""
    for cuda in (11, 12, 13):
        jobs = kernel_resources.plan(["8.0", "9.0"], ("bwd",), ("bf16",), (96, 192, 256), cuda=cuda)
        got = {(j.arch, j.unit): j.tile for j in jobs}
        for (arch, unit), label in got.items():
            tile = tiles.default_tile(arch, "bwd", int(unit.rsplit("_d", 1)[1]), cuda)
            assert tile is not None
            assert label == tile.label, (cuda, arch, unit)
            (job,) = [j for j in jobs if (j.arch, j.unit) == (arch, unit)]
            assert f"-DFA_SMEM_BYTES={tile.smem_bytes(int(unit.rsplit('_d', 1)[1]))}" in job.options
        assert got["8.0", "bwd_bf16_d96"] == ("m64n128w8s2vp3h2" if cuda == 11 else "m64n128w8s2v")


def _model(unit: str, tile: str, cuda: int, ldsm: float) -> kernel_model.Model:
    return kernel_model.Model(
        rev="tree", unit=unit, tile=tile, arch="8.0", entry="fa_bwd", head_dim=96, registers=255, spills=0,
        blocks_per_sm=1, warps_per_sm=8, mma=160, ldsm_per_mma=ldsm, smem_per_mma=300.0, red=64,
        red_width=1, dq_sectors_per_mflop=97.7, cuda=cuda,
    )  # fmt: skip


def test_vs_fa2_says_which_majors_sass_each_row_is_and_counts_the_cu11_tiles_apart():
    """The defect: --vs-fa2 compiled one table with one NVRTC and did not say which wheels' SASS a row is;
    with tiles per CUDA major a row of CUDA 12's tile says nothing of what a cu11 wheel ships."""
    ours = _model("bwd_bf16_d96", "m64n128w8s2v", 12, 221.9)
    cu11 = _model("bwd_bf16_d96", "m64n128w8s1", 11, 247.5)
    text = kernel_model.vs_fa2_table([ours], [cu11])
    lines = text.splitlines()
    assert lines[0].split("|")[3].strip() == "SASS"
    (row12,) = [x for x in lines if "m64n128w8s2v" in x]
    (row11,) = [x for x in lines if "m64n128w8s1 " in x]
    assert row12.split("|")[3].strip() == "cu12"
    assert row11.split("|")[3].strip() == "cu11"
    assert "1 of 1 units at or better than FA2" in text  # the cu12 row only
    assert "as the cu12 wheels ship them" in text
    assert row11.endswith("| ldsm/mma +7% |")
    assert "Apart, not counted above" in text
    assert "as the cu11 wheels ship them: 0 of 1 at or better than FA2" in text
    assert lines.index(row12) < lines.index(row11)
    assert "Apart" not in kernel_model.vs_fa2_table([ours])


def test_the_model_asks_for_the_units_of_its_cuda_major():
    assert kernel_model.own_tile_units(tiles, "8.0", 11) == {
        f"bwd_{t}_d{d}" for t in ("fp16", "bf16") for d in (96, 192)
    }
    assert kernel_model.own_tile_units(tiles, "8.0", 12) == set()
    assert kernel_model.own_tile_units(tiles, "8.7", 11) == set()
    assert kernel_model.own_tile_units(tiles, "9.0", 11) == {"bwd_fp16_d256", "bwd_bf16_d256"}
    tile = {u.name: u.tile for u in kernel_model.major_units(tiles, "9.0", 11)}["bwd_bf16_d256"]
    assert tile == "m64n64w8s2p4h2"


def test_the_coverage_check_holds_each_majors_own_tiles():
    """The defect: buildtool/emucheck/coverage.py checked the problems of the default tiles only, so a
    CUDA 11 tile (its own block sizes) could lose the problem that crosses its block edges unseen."""
    from buildtool.emucheck import coverage

    rows = {name: t for name, _, t in coverage.unit_tiles("9.0")}
    assert (rows["bwd_fp16_d256"].block_m, rows["bwd_fp16_d256"].block_n) == (64, 64)
    # CUDA 11's d256 is its own tile (two stages, dQ in held-dS passes) on FA2's blocks, checked apart
    cu11 = rows["bwd_fp16_d256 (CUDA 11)"]
    assert (cu11.block_m, cu11.block_n) == (64, 64)
    assert not [n for n in rows if "CUDA 12" in n or "CUDA 13" in n]  # 12 and 13 are the defaults


@pytest.mark.slow
@pytest.mark.parametrize("cuda", [11, 12, 13])
def test_each_majors_tiles_compile_without_a_spill_and_reach_fa2(cuda):
    """Each per-major unit as its major's NVRTC compiles it (read from the SASS): no spill, and at or
    better than FA2 on every measure, CUDA 11's own tiles too (dQ's passes with dS held: before, they read
    6-29% more ldmatrix bytes per mma than FA2); sm 8.7 runs FA2's tiles under 11.8 too. But for sm 8.6's
    (and 8.9's) d192 under 11.8, which spills the default's K and V in registers with dS in two warp rows:
    its four warp rows read more than FA2 (247.5 B/mma against 230.4), less than the tile before (256.0)."""
    only = {(arch, f"bwd_bf16_d{d}") for arch, _, d in PER_MAJOR}
    if cuda == 11:
        only |= {("8.7", "bwd_bf16_d96"), ("8.7", "bwd_bf16_d192")}
    archs = sorted({arch for arch, _ in only})
    rows = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", archs, [96, 192, 256], cuda, ("bwd",), only
    )
    assert {(m.arch, m.unit) for m in rows} == only
    for m in rows:
        assert m.cuda == cuda
        assert m.tile == tiles.default_tile(m.arch, "bwd", m.head_dim, cuda).label
        assert m.spills == 0, (m.arch, m.unit, m.tile)
        fa2 = fa2_model.row("bwd", m.arch, m.head_dim)
        assert fa2 is not None
        if cuda == 11 and m.arch in ("8.6", "8.9"):
            assert [x.split(" ")[0] for x in kernel_model.misses(m, fa2)] == ["ldsm/mma"], m
            assert fa2.ldsm_per_mma < m.ldsm_per_mma < 256.0, m
            continue
        assert kernel_model.misses(m, fa2) == [], (m.arch, m.unit, m.tile)
