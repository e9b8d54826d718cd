"""bench/kernels/fa2_model.py (FA2's tile choices and arithmetic) and bench/kernels/kernel_model.py's --vs-fa2 table.

The FA2 figures are checked against numbers worked out by hand from FA2's launch templates (the
warp grid of each of the five backward GEMMs, per 16-deep k step: 512 B per A fragment, 256 B per
B n-tile), not against the code's own output.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench"), str(REPO / "kernels")]

import fa2_model
import kernel_model
import kernel_resources
import tiles

MODEL_ARCHS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
BAR_HEAD_DIMS = (64, 96, 128, 192, 256)


def test_backward_ldmatrix_bytes_per_mma_by_hand():
    # sm80 d128, 64 x 128 x 8 (2, 4, 2): S, dP and dQ (2 x 4 warps over 64 x 128): 2 A + 4 B n-tiles
    # -> (1024 + 1024) / 8 = 256; dV, dK (4 x 2 warps over 128 x 128): (1024 + 2048) / 16 = 192.
    assert fa2_model.row("bwd", "8.0", 128).ldsm_per_mma == round((3 * 256 + 2 * 192) / 5, 1) == 230.4
    # sm86 d256, 64 x 32 x 8 (4, 1, 2), V in registers: S (512 + 512) / 2 = 512; dP without V's reads
    # 512 / 2 = 256; dV, dK (1 x 8 warps over 32 x 256): (1024 + 1024) / 8 = 256; dQ 2 x 4 over 64 x
    # 256: (1024 + 2048) / 16 = 192.
    assert fa2_model.row("bwd", "8.6", 256).ldsm_per_mma == round((512 + 256 + 256 + 256 + 192) / 5, 1)


def test_forward_ldmatrix_bytes_per_mma_by_hand():
    # 128 x 64 x 4 at d128: a warp's 32 rows are 2 m-tiles; S reads 2 Q fragments and 8 K n-tiles per
    # 16 mmas (192 B/mma), P V only V's 16 n-tiles per 32 mmas (128 B/mma).
    assert fa2_model.row("fwd", "8.0", 128).ldsm_per_mma == 160.0
    assert fa2_model.row("fwd", "8.6", 128).tile == "m128n32w4"  # FA2's "2 CTAs per SM" choice


def test_fa2_dq_adds_cover_whole_sectors():
    """The defect: the model counted FA2's dQ as half-sector adds (twice its traffic)."""
    # 64 x 128 at d128: 64 * 128 * 4 / 32 sectors per 10 * 64 * 128 * 128 FLOPs.
    fa2 = fa2_model.row("bwd", "8.0", 128)
    assert fa2.dq_sectors_per_mflop == round(64 * 128 * 4 / 32 / (10 * 64 * 128 * 128) * 1e6, 1) == 97.7
    half = fa2_model.dq_sectors_per_mflop(64, 128, 128, whole_sectors=False)
    assert half == pytest.approx(2 * fa2_model.dq_sectors_per_mflop(64, 128, 128, whole_sectors=True))


@pytest.mark.parametrize("arch", MODEL_ARCHS)
def test_fa2_rows_on_every_arch_fit_the_device(arch: str):
    per_block, _ = fa2_model.device_limits(arch)
    for d in BAR_HEAD_DIMS:
        for direction in ("fwd", "bwd"):
            row = fa2_model.row(direction, arch, d)
            assert row is not None, (direction, arch, d)
            assert row.smem_bytes <= per_block, (direction, arch, d, row.smem_bytes)
            assert row.warps_per_sm >= 4


def test_fa2_switches_tiles_by_the_device_limit():
    # Backward d64: 128 x 128 needs 144 KB (A100, H100); the 99 KB parts get 64 x 128 with V in registers.
    assert fa2_model.row("bwd", "8.0", 64).tile == "m128n128w8"
    assert fa2_model.row("bwd", "8.6", 64).tile == "m64n128w8"
    # Forward d256: A100 (128 KB fits a block, 192 KB does not fit two) 128 x 64 x 8; H100 64 x 64 x 4.
    assert fa2_model.row("fwd", "8.0", 256).tile == "m128n64w8"
    assert fa2_model.row("fwd", "9.0", 256).tile == "m64n64w4"
    assert fa2_model.row("fwd", "9.0", 256).warps_per_sm == 8  # two 4-warp blocks in 228 KB


@pytest.mark.parametrize("arch", ["8.6", "8.9", "12.0"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_99kb_parts_hold_two_forward_blocks_like_fa2(arch: str, head_dim: int):
    """The padded tiles took 52-55 KB here (one 4-warp block per SM, FA2 two); unpadded they fit two
    blocks with the driver's 1 KB each and sm120's 1 KiB of static shared memory, wherever FA2 has two.
    FA2's d128 on sm120 is its 64 KB 128 x 64 x 4 (the two-block 128 x 32 is for sm 8.x only), one block
    per SM: ours is that tile too."""
    family, tile = tiles.arch_family(arch), tiles.default_tile(arch, "fwd", head_dim)
    assert family is not None
    assert tile is not None
    per_block = tile.smem_bytes(head_dim) + family.static_smem
    warps = kernel_resources.blocks_per_sm(arch, 32 * tile.warps, 255, per_block) * tile.warps
    assert warps >= fa2_model.row("fwd", arch, head_dim).warps_per_sm
    assert warps >= (4 if (arch, head_dim) == ("12.0", 128) else 8)


def _model(**changes: object) -> kernel_model.Model:
    base = kernel_model.Model(
        rev="tree",
        unit="bwd_bf16_d128",
        tile="m64n128w8s2",
        arch="8.0",
        entry="fa_bwd",
        head_dim=128,
        registers=240,
        spills=0,
        blocks_per_sm=1,
        warps_per_sm=8,
        mma=160,
        ldsm_per_mma=230.4,
        smem_per_mma=300.0,
        red=64,
        red_width=1,
        dq_sectors_per_mflop=97.7,
    )
    return dataclasses.replace(base, **changes)


def test_misses_name_every_measure_where_ours_is_worse():
    fa2 = fa2_model.row("bwd", "8.0", 128)
    assert kernel_model.misses(_model(), fa2) == []
    worse = kernel_model.misses(
        _model(spills=32, ldsm_per_mma=307.2, warps_per_sm=4, dq_sectors_per_mflop=195.3), fa2
    )
    assert worse == ["32 B spilled", "ldsm/mma +33%", "warps/SM 4 < 8", "dQ sectors x2.0"]


@pytest.mark.slow
def test_vs_fa2_table_from_real_sass(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """One arch and head dim through NVRTC and nvdisasm: the table has our unit beside FA2's."""
    json_out = tmp_path / "rows.json"
    assert kernel_model.main(["--vs-fa2", "--arch", "8.0", "--head-dim", "128", "--json", str(json_out)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 8.0 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["fwd_bf16_d128", "bwd_bf16_d128"]
    assert " / m128n64w4 |" in rows[0]
    assert " / m64n128w8 |" in rows[1]
    assert "of 2 units at or better than FA2" in out
    assert tiles.default_tile("8.0", "bwd", 128).label.split("s")[0] in rows[1]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "cuda"), [("8.0", 12), ("9.0", 12), ("10.0", 12), ("10.0", 13)])
def test_backward_at_fa2s_tiles_from_real_sass(arch: str, cuda: int):
    """The defect: the backward's key blocks were half of FA2's at d64, d96 and d128 (ldsm/mma +22% to
    +44%, dQ sectors x2 at d96 and d128), and sm100's d128 stayed there after sm80's and sm90's moved
    (FA2's 64 x 128 spilled 28 B with its ptxas). Compiled by NVRTC 12 (and 13 for sm100) and read from
    the SASS: d64 and d128 are at or better than FA2 on each measure, and so is the d96 of sm90 and sm100
    (V in registers, as FA2); sm80's d96 (V in registers spills 48 B there) has FA2's tile, dQ sectors
    and warps, without a spill."""
    rows = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", [arch], [64, 96, 128], cuda, ("bwd",)
    )
    assert [m.head_dim for m in rows] == [64, 96, 128]
    for m in rows:
        fa2 = fa2_model.row("bwd", arch, m.head_dim)
        assert fa2 is not None
        if m.head_dim == 96 and arch == "8.0":
            assert m.tile.startswith(fa2.tile), (m.tile, fa2.tile)
            assert m.spills == 0
            assert m.dq_sectors_per_mflop <= fa2.dq_sectors_per_mflop
            assert m.warps_per_sm >= fa2.warps_per_sm
        else:
            assert kernel_model.misses(m, fa2) == [], (m.unit, m.tile, fa2.tile)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["8.0", "12.0"])
def test_forward_at_fa2s_tiles_from_real_sass(arch: str):
    """The defect: the forward's key blocks were half of FA2's at d64, d96 and d128 (ldsm/mma +11% and
    +20%), and sm120's d128 ran 8 warps of 16 rows (+80%). Compiled by NVRTC 12 and read from the SASS,
    each is at or better than FA2 on every measure, without a spill."""
    units = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", [arch], [64, 96, 128], 12, ("fwd",)
    )
    beside = {m.head_dim: (m, fa2_model.row("fwd", arch, m.head_dim)) for m in units}
    assert sorted(beside) == [64, 96, 128]
    assert {d: kernel_model.misses(m, fa2) if fa2 else ["no FA2 row"] for d, (m, fa2) in beside.items()} == {
        64: [],
        96: [],
        128: [],
    }


@pytest.mark.slow
def test_backward_step_has_fa2s_three_barriers():
    """The defect: dQ staged through shared memory cost two barriers more per step (5, FA2 3). Added from
    the fragments into the permuted dq_accum, the step keeps three (after lse and D, after P and dS,
    after the step); fa_bwd's SASS has no other."""
    (m,) = kernel_model.model_units(tiles, REPO / "kernels" / "csrc", "tree", ["8.0"], [64], 12, ("bwd",))
    assert m.barriers == 3
    assert m.red_width == 1
    assert m.dq_sectors_per_mflop == fa2_model.row("bwd", "8.0", 64).dq_sectors_per_mflop


# nvdisasm's layout: a label line, then "/*offset*/ [predicate] OPCODE operands ;".
_LISTING = """.text.fa_bwd:
        /*0000*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0010*/                   LDSM.16.M88.4 R8, [R2+0x20] ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*0030*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0050*/                   LDSM.16.M88.2 R12, [R2] ;
        /*0060*/                   HMMA.16816.F32 R16, R4, R12, R16 ;
        /*0070*/                   HMMA.16816.F32 R20, R8, R12, R20 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/              @!P1 BRA `(.L_x_2) ;
        /*00a0*/                   EXIT ;
//--------------------- .text.next --------------------------
"""


def test_counts_are_per_pass_of_the_main_loop():
    """The defect: the per-mma figures counted the whole entry, so fragments read once per block before
    the loop (V kept in registers for the whole key block) weighed as much as one step's reads, and a
    unit that reads V once looked no better than one that reads it every step. The loop holding the most
    mmas is the steady state: here 256 B of ldmatrix for 2 mmas and 1 barrier, not 1280 B and 2."""
    c = kernel_model._sass_counts(_LISTING, "fa_bwd")
    assert (c["mma"], c["ldsm"], c["bar"]) == (2.0, 256.0, 1.0)
    lines = _LISTING.split(".text.fa_bwd:", 1)[1].splitlines()
    assert kernel_model.main_loop(lines)[0] == ".L_x_2:"
    # No loop holds an mma (a straight-line kernel): every line counts.
    straight = _LISTING.replace("`(.L_x_2)", "`(.L_x_3)")
    c = kernel_model._sass_counts(straight, "fa_bwd")
    assert (c["mma"], c["ldsm"], c["bar"]) == (2.0, 1280.0, 2.0)


@pytest.mark.slow
def test_99kb_backward_keeps_v_in_registers_like_fa2():
    """The defect: on sm 12.0 the backward read V from shared memory for every step's dP (ldsm/mma +10%
    at d64, +20% at d128), and at d96 P and dS beside V left room for 64 x 64 blocks only (+44%, dQ
    sectors x2). With V's fragments in registers and P, dS, lse and D in V's shared memory
    (FA_V_IN_REGS), FA2's 99 KB choice, d64, d96 and d128 are at or better than FA2 on every measure,
    spill-free (NVRTC 12, read from the SASS); the step keeps FA2's three barriers."""
    rows = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", ["12.0"], [64, 96, 128], 12, ("bwd",)
    )
    assert [m.head_dim for m in rows] == [64, 96, 128]
    for m in rows:
        fa2 = fa2_model.row("bwd", "12.0", m.head_dim)
        assert fa2 is not None
        assert m.tile.endswith("v"), m.tile
        assert kernel_model.misses(m, fa2) == [], (m.unit, m.tile, fa2.tile)
        assert m.barriers == 3


# A main loop (.L_x_2) around a rolled loop holding mma (.L_x_3), as bwd.cu's dQ passes compile.
_NESTED = """.text.fa_bwd:
.L_x_2:
        /*0000*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0010*/                   HMMA.16816.F32 R16, R4, R12, R16 ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_3:
        /*0030*/                   LDSM.16.M88.2 R12, [R2] ;
        /*0040*/                   HMMA.16816.F32 R20, R8, R12, R20 ;
        /*0050*/                   RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R6.64], R20 ;
        /*0060*/               @P0 BRA `(.L_x_3) ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @!P1 BRA `(.L_x_2) ;
        /*0090*/                   EXIT ;
//--------------------- .text.next --------------------------
"""


def test_a_rolled_loop_inside_the_main_loop_counts_each_pass():
    """The defect: bwd.cu's dQ passes (FA_DQ_PASSES) are a rolled loop, whose SASS holds one pass, so the
    step's dQ mmas, ldmatrix reads and adds counted once for every FA_DQ_PASSES the step runs, and the
    per-mma figures leaned on the other products. Its lines count once per pass; the rest of the step
    once; without passes the count is as before."""
    once = kernel_model._sass_counts(_NESTED, "fa_bwd")
    assert (once["mma"], once["ldsm"], once["red"], once["bar"]) == (2.0, 768.0, 1.0, 2.0)
    three = kernel_model._sass_counts(_NESTED, "fa_bwd", inner_trips=3)
    assert (three["mma"], three["ldsm"], three["red"], three["bar"]) == (4.0, 512.0 + 3 * 256.0, 3.0, 2.0)


@pytest.mark.slow
def test_99kb_backward_at_fa2s_tiles_on_sm86():
    """The defect: sm 8.6's (and so 8.9's) backward ran half of FA2's key block at d96 (64 x 64: ldsm/mma
    332.8 against 230.4, dQ sectors x2) and half its query block at d192 and d256 (32 x 64, 32 x 32:
    349.9 and 460.8 against 230.4 and 294.4), and read V from shared memory at d128 (307.2 against
    256): FA2's V-in-registers tiles spilled there or, padded, did not fit 99 KB. With the swizzled
    layout (d192, d256 fit in 98,816 B) and dQ in column passes (fewer live accumulators beside V's
    fragments), each is FA2's block, warps per SM and dQ sectors, spill-free (NVRTC 12, read from the
    SASS), with the step's three barriers and every pass's mmas: 5 products of block_m x block_n x d
    per step, in m16n8k16 steps over the warps; and at or below FA2's ldmatrix bytes per mma (d192 read
    256.0 against 230.4 until S took K from registers)."""
    rows = kernel_model.model_units(
        tiles, REPO / "kernels" / "csrc", "tree", ["8.6"], [96, 128, 192, 256], 12, ("bwd",)
    )
    assert [m.head_dim for m in rows] == [96, 128, 192, 256]
    for m in rows:
        fa2 = fa2_model.row("bwd", "8.6", m.head_dim)
        assert fa2 is not None
        tile = tiles.default_tile("8.6", "bwd", m.head_dim)
        assert m.tile.startswith(fa2.tile), (m.tile, fa2.tile)
        assert "v" in m.tile, m.tile
        assert m.spills == 0, m
        assert m.warps_per_sm >= fa2.warps_per_sm
        assert m.dq_sectors_per_mflop <= fa2.dq_sectors_per_mflop
        assert m.barriers == 3
        assert m.mma == 5 * tile.block_m * tile.block_n * m.head_dim / (16 * 8 * 16) / tile.warps
        before = {96: 332.8, 128: 307.2, 192: 349.9, 256: 460.8}[m.head_dim]
        assert m.ldsm_per_mma < before, m
        # d96: one dQ pass (rebase, dq_first); d256: passes over dS held in registers (dq_hold_ds); d192:
        # those and K's fragments of S in registers (k_in_regs: 256.0 without, FA2's 230.4 with)
        assert m.ldsm_per_mma <= fa2.ldsm_per_mma, m
