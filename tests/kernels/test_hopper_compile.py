"""The sm_90a forward (kernels/csrc/hopper_fwd.cu) through the project's pinned NVRTC 12.9 and 13 for every
unit of tiles.py's 9.0a family: no spills, and the SASS (bench/kernels/kernel_model.py's pinned nvdisasm) holds what
the design rests on: one HGMMA per k16 step of S = Q K^T (N = the key block) and of O += P V (N = the head
dim), TMA loads (UTMALDG.4D), mbarrier waits, the register reallocation (USETMAXREG) and the named
barriers of the ping-pong. A branch between the wgmmas makes ptxas serialise them (its C7520 note): none.
Compiles only; not verified on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench")]

import kernel_model

from buildtool.builder import toolkits
from buildtool.builder.nvrtc import open_nvrtc, parse_resource_usage
from buildtool.core import kernels_src

tiles = kernels_src.tiles()
ENTRY = "fa_fwd_sm90a"
UNITS = {u.name: u for u in tiles.units("9.0a")}


CSRC = kernels_src.kernels_dir() / "csrc"


def compile_unit(cuda: int, unit, csrc: Path = CSRC):
    headers = {p.name: p.read_text() for p in csrc.iterdir() if p.suffix in (".h", ".cuh")}
    options = [*tiles.nvrtc_options("9.0a"), *(f"-D{k}={v}" for k, v in unit.defines.items()), "-Xptxas=-v"]
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(cuda)))
    return nvrtc.compile((csrc / Path(unit.source).name).read_text(), unit.source, "sm_90a", options, headers)


def test_the_family_builds_every_head_dim_in_both_dtypes() -> None:
    assert sorted(UNITS) == sorted(f"fwd_{t}_d{d}" for t in ("fp16", "bf16") for d in (64, 96, 128, 192, 256))


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("cuda", [12, 13])
@pytest.mark.parametrize("name", sorted(UNITS))
def test_sm90a_unit_compiles_to_hgmma_and_tma_without_spills(cuda: int, name: str) -> None:
    unit = UNITS[name]
    out = compile_unit(cuda, unit)
    (usage,) = parse_resource_usage(out.log)
    assert usage.kernel == ENTRY
    assert (usage.spill_stores, usage.spill_loads) == (0, 0), out.log
    assert "C7520" not in out.log, out.log  # wgmma serialised by ptxas

    ops = kernel_model.opcodes(kernel_model.disassemble(out.image), ENTRY)
    d, n = unit.head_dim, unit.defines["FA_BLOCK_N"]
    kind = ".F32.BF16" if unit.dtype == "bf16" else ".F32"
    scores, pv = f"HGMMA.64x{n}x16{kind}", f"HGMMA.64x{d}x16{kind}"
    hgmma = {op: c for op, c in ops.items() if op.startswith("HGMMA")}
    # the bodies are fully unrolled: one HGMMA per k16 step of each GEMM where it is issued, at one place
    # each, or, with two consumers (the intra-warpgroup overlap), at two (the loop and its prologue or
    # epilogue)
    places = 2 if unit.defines["FA_CONSUMER_WGS"] == 2 else 1
    expected = {scores: places * d // 16}
    expected[pv] = expected.get(pv, 0) + places * n // 16
    assert hgmma == expected, ops
    assert ops.get("UTMALDG.4D", 0) >= 3, ops  # Q, K and V, one copy per swizzle panel
    assert ops.get("SYNCS.PHASECHK.TRANS64.TRYWAIT", 0) >= 1, ops
    assert ops.get("USETMAXREG.DEALLOC.CTAPOOL", 0) == 1, ops
    assert ops.get("BAR.ARV", 0) >= 1, ops  # the ping-pong: pass the turn, wait for it
    assert ops.get("BAR.SYNC", 0) + ops.get("BAR.SYNC.DEFER_BLOCKING", 0) >= 1, ops


@pytest.mark.slow
@pytest.mark.network
def test_a_branch_between_the_wgmmas_is_caught(tmp_path: Path) -> None:
    """The fault the C7520 assertion is there for: fwd.cu's skip of the k steps past a run-time head dim,
    put back into compute_scores, makes ptxas serialise every wgmma of the kernel."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for p in CSRC.iterdir():
        (csrc / p.name).write_text(p.read_text())
    src = csrc / "hopper_fwd.cu"
    old = "  for (int k0 = 0; k0 < kHeadDim; k0 += 16) {\n"
    assert src.read_text().count(old) == 1
    src.write_text(src.read_text().replace(old, old + "    if (k0 >= head_dim) break;\n"))
    src.write_text(
        src.read_text()
        .replace("KVTile k, int wg_row0) {", "KVTile k, int wg_row0, int head_dim) {")
        .replace("sm.sk(slot.stage), wg_row0);", "sm.sk(slot.stage), wg_row0, blk.softcap ? 112 : kHeadDim);")
    )
    out = compile_unit(12, UNITS["fwd_bf16_d128"], csrc)
    assert "C7520" in out.log, out.log
