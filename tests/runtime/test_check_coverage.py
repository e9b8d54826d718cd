"""The coverage table (buildtool/emucheck/coverage.py) holds the kernels to the check's problems: every
FaParams field and compile-time branch of kernels/csrc is claimed by a feature, every feature is
exercised by some problem of every unit of every arch, and docs/checking.md's table is the generated
one. A new branch without a problem (a field, a knob, a feature no problem reaches) is a gap."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from buildtool.emucheck import coverage


def test_the_kernels_have_no_branch_without_a_problem() -> None:
    assert coverage.gaps() == []


def _copy(tmp_path: Path) -> Path:
    csrc = tmp_path / "csrc"
    shutil.copytree(coverage.CSRC, csrc)
    return csrc


def test_a_new_field_the_kernels_branch_on_is_a_gap(tmp_path: Path) -> None:
    csrc = _copy(tmp_path)
    params = csrc / "params.h"
    params.write_text(
        params.read_text().replace("  float softcap;", "  float softcap;\n  const float* alibi_slopes;")
    )
    fwd = csrc / "fwd.cu"
    old = "  blk.softcap = p.softcap > 0.f;"
    fwd.write_text(
        fwd.read_text().replace(old, old + "\n  if (p.alibi_slopes != nullptr) blk.softcap = false;")
    )
    found = coverage.gaps(csrc, arches=("8.0",))
    assert len(found) == 1, found
    assert "FaParams field alibi_slopes" in found[0]
    assert "fa_attn/verify/check.py problems()" in found[0]


def test_a_new_compile_time_branch_is_a_gap(tmp_path: Path) -> None:
    csrc = _copy(tmp_path)
    fwd = csrc / "fwd.cu"
    fwd.write_text(fwd.read_text().replace("#if !FA_SPLITKV", "#if FA_ALIBI\n#endif\n#if !FA_SPLITKV"))
    found = coverage.gaps(csrc, arches=("8.0",))
    assert len(found) == 1, found
    assert "compile-time branch FA_ALIBI" in found[0]


def test_a_feature_no_problem_exercises_is_a_gap() -> None:
    """A feature whose problems were dropped (here: softcap's predicate finds none) names every unit."""
    softcap = next(f for f in coverage.FEATURES if f.name == "softcap")
    dropped = dataclasses.replace(softcap, covers=lambda p, _t: p.softcap > 100)
    features = tuple(dropped if f is softcap else f for f in coverage.FEATURES)
    found = coverage.gaps(arches=("8.0",), features=features)
    assert found
    assert all("no problem covers 'softcap'" in g for g in found)
    assert any("fwd_fp16_d64" in g for g in found)
    assert any("bwd_bf16_d256" in g for g in found)


def test_docs_checking_has_the_generated_table() -> None:
    assert coverage.recorded() == coverage.section_text(), (
        f"docs/checking.md's coverage table is stale: run `{coverage.COMMAND}`"
    )


def test_a_units_define_branched_on_with_if_constexpr_is_a_gap() -> None:
    """tiles.py's -D defines are switches even where no #if reads them (hopper_fwd.cu picks its pipeline
    with `if constexpr` on FA_CONSUMER_WGS): one no feature claims is a gap."""
    features = tuple(f for f in coverage.FEATURES if "FA_CONSUMER_WGS" not in f.knobs)
    found = coverage.gaps(arches=("9.0a",), features=features)
    assert len(found) == 1, found
    assert found[0].startswith("compile-time branch FA_CONSUMER_WGS (kernels/csrc): no feature claims it")


def test_the_paged_rows_follow_tiles_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sm_90a forward reads paged KV (tiles.features): its paged rows apply and its problems have
    them, as sm 9.0's do; an arch whose features lack paged_kv has neither (the rows are n/a for it)."""
    paged = [f for f in coverage.FEATURES if f.needs == "paged_kv"]
    assert len(paged) == 2

    def rows(arch: str, has: bool) -> None:
        for unit, direction, tile in coverage.unit_tiles(arch):
            if direction != "fwd":
                continue
            assert [coverage.applies(f, arch, direction) for f in paged] == [has, has], unit
            anything = dataclasses.replace(paged[0], covers=lambda _p, _t: True)
            everything = coverage.covering(anything, direction, tile, arch=arch)
            assert any(n.startswith("paged") for n in everything) == has, unit

    rows("9.0a", True)
    rows("9.0", True)
    features = coverage.tiles().features
    monkeypatch.setattr(coverage.tiles(), "features", lambda arch: features(arch) - {"paged_kv"})
    rows("9.0a", False)
