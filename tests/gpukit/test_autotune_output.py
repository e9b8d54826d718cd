"""What the autotuner concludes from its measurements (winners, the per-family table) and the patch to
kernels/tiles.py it writes: pure functions over recorded results, no GPU and no emulator."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import autotune
import pytest
import tile_patch
import tiles

REPO = Path(__file__).resolve().parents[2]


def _row(key: str, label: str, default: bool, ms: list[float], verdict: str = "ok") -> dict:
    direction, dtype, d = key.split("_")
    arch = "9.0"
    fields = dict(
        zip(
            ("block_m", "block_n", "warps"),
            (int(x) for x in label[1:].replace("n", " ").replace("w", " ").split()),
            strict=False,
        )
    )
    return {
        "id": f"{key}-{label}",
        "key": key,
        "arch": arch,
        "dtype": dtype,
        "head_dim": int(d[1:]),
        "direction": direction,
        "label": label,
        "fields": fields,
        "default": default,
        "verdict": verdict,
        "timings": [
            {
                "batch": 1,
                "seqlen_q": 1024 * i + 1,
                "seqlen_k": 1024 * (i + 1),
                "heads": 16,
                "causal": False,
                "ms": m,
            }
            for i, m in enumerate(ms)
        ],
    }


def test_a_winner_must_beat_the_default_by_the_margin() -> None:
    rows = [
        _row("fwd_bf16_d128", "m128n128w8", True, [1.0, 2.0]),
        _row("fwd_bf16_d128", "m64n128w4", False, [0.99, 1.98]),  # 1% faster: not enough
        _row("fwd_bf16_d128", "m128n64w8", False, [0.5, 1.0], verdict="wrong"),  # fast but wrong
        _row("fwd_fp16_d128", "m128n128w8", True, [1.0, 2.0]),
        _row("fwd_fp16_d128", "m64n128w4", False, [0.8, 1.6]),
    ]
    by_key = {w["key"]: w for w in autotune.winners(rows)}
    assert by_key["fwd_bf16_d128"]["best"] == "m64n128w4"
    assert by_key["fwd_bf16_d128"]["choice"] == "m128n128w8"
    assert by_key["fwd_fp16_d128"]["choice"] == "m64n128w4"
    assert by_key["fwd_fp16_d128"]["speedup"] == 1.25
    assert by_key["fwd_bf16_d128"]["verdicts"] == {"ok": 2, "wrong": 1}


def test_the_table_takes_the_best_mean_over_dtypes_and_says_when_they_disagree() -> None:
    rows = [
        _row("fwd_bf16_d128", "m128n128w8", True, [1.0]),
        _row("fwd_bf16_d128", "m64n128w4", False, [0.9]),
        _row("fwd_bf16_d128", "m128n64w8", False, [0.8]),
        _row("fwd_fp16_d128", "m128n128w8", True, [1.0]),
        _row("fwd_fp16_d128", "m64n128w4", False, [0.7]),
        _row("fwd_fp16_d128", "m128n64w8", False, [0.95]),
    ]
    changes, table = autotune.table_changes(rows, lambda arch: tiles.arch_family(arch).name)
    (row,) = table
    assert row["choice"] == "m64n128w4"  # mean 0.79 beats m128n64w8's 0.87
    assert "dtypes disagree" in row["note"]
    assert changes == {("sm90", "fwd"): {128: tiles.FwdTile(64, 128, 4)}}


def test_a_key_whose_default_was_not_timed_has_no_winner() -> None:
    rows = [
        _row("fwd_bf16_d64", "m128n128w8", True, [], verdict="hang"),
        _row("fwd_bf16_d64", "m64n64w4", False, [1.0]),
    ]
    (w,) = autotune.winners(rows)
    assert w["best"] is None
    assert w["choice"] == "m128n128w8"


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_the_patch_applies_and_changes_exactly_the_winners(tmp_path: Path) -> None:
    changes = {
        ("sm90", "fwd"): {128: tiles.FwdTile(64, 128, 4)},
        ("sm90", "bwd"): {64: tiles.BwdTile(64, 64, 8, 1)},  # sm90's backward table is sm80's: it splits
    }
    diff = tile_patch.make_patch(changes)
    assert diff.startswith("--- a/kernels/tiles.py\n+++ b/kernels/tiles.py\n")
    (tmp_path / "kernels").mkdir()
    shutil.copy(REPO / "kernels" / "tiles.py", tmp_path / "kernels" / "tiles.py")
    (tmp_path / "tiles.patch").write_text(diff)
    subprocess.run(["patch", "-p1", "-s", "-i", "tiles.patch"], cwd=tmp_path, check=True)
    patched = tile_patch._load(tmp_path / "kernels" / "tiles.py")
    fam = {name: f for name, f in patched.FAMILIES.items()}
    assert fam["sm90"].fwd[128] == patched.FwdTile(64, 128, 4)
    assert fam["sm90"].bwd[64] == patched.BwdTile(64, 64, 8, 1)
    assert fam["sm80"].bwd[64].label == tiles.FAMILIES["sm80"].bwd[64].label  # the other user keeps its tile
    assert tile_patch.make_patch({}) == ""


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_a_winner_in_a_table_others_are_built_from_changes_only_its_family(tmp_path: Path) -> None:
    """sm80's forward table is the base of sm86's, sm90's and so on (`{**_FWD_SM80, ...}`): sm80 gets
    its own literal with the winner, the tables built from the base keep their tiles."""
    winner = tiles.FwdTile(64, 128, 4)
    assert tiles.FAMILIES["sm80"].fwd[128] != winner
    diff = tile_patch.make_patch({("sm80", "fwd"): {128: winner}})
    (tmp_path / "kernels").mkdir()
    shutil.copy(REPO / "kernels" / "tiles.py", tmp_path / "kernels" / "tiles.py")
    (tmp_path / "tiles.patch").write_text(diff)
    subprocess.run(["patch", "-p1", "-s", "-i", "tiles.patch"], cwd=tmp_path, check=True)
    patched = tile_patch._load(tmp_path / "kernels" / "tiles.py")
    assert patched.FAMILIES["sm80"].fwd[128].label == winner.label
    for name in ("sm86", "sm90", "sm100", "sm120"):
        assert patched.FAMILIES[name].fwd[128].label == tiles.FAMILIES[name].fwd[128].label, name


def test_a_table_the_writer_cannot_find_is_reported() -> None:
    with pytest.raises(tile_patch.PatchError, match="no FAMILIES\\['sm99'\\]"):
        tile_patch.make_patch({("sm99", "fwd"): {128: tiles.FwdTile(64, 128, 4)}})
