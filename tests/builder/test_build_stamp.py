"""The whole-build stamp (builder/build_stamp.py): a second identical `fa build` finds nothing to do,
and anything changed since - a wheel edited or deleted, a file added, a kernel source edited, the
matrix changed, an input edited in the cache - or a stamp fa cannot read runs the whole build again
(issue 37: a no-op rebuild at most 1 s of CPU, never a stale answer)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from buildtool.builder import build_stamp
from buildtool.builder.matrix import parse_matrix
from buildtool.builder.plan import _assemble, universal_wheel
from buildtool.core import cache
from tests.builder.test_build_cli import TINY
from tests.builder.test_noop_rebuild import folder_states, local_build

ROWS = [{"file": "fa_attn-0.1.0-py3-none-any.whl", "size": 3}]


@pytest.fixture
def stamped(fresh_cache: Path, tmp_path: Path) -> tuple[str, Path, Path]:  # noqa: ARG001 (its FA_CACHE)
    """(key, out folder, an input file) of a build stamped just now: a wheel, an index, a log folder."""
    out = tmp_path / "wheels"
    (out / "logs").mkdir(parents=True)
    (out / "fa_attn-0.1.0-py3-none-any.whl").write_bytes(b"whl")
    (out / "index.json").write_text("{}")
    (out / "logs" / "build.json").write_text("{}")
    image = tmp_path / "image.cubin"
    image.write_bytes(b"cubin")
    m = parse_matrix('torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\n', "test matrix")
    plan = _assemble(m, [universal_wheel(m)], [])
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "tiles.py").write_text("MIN_ARCH = '7.5'\n")
    key = build_stamp.key(plan, out, tmp_path / "kernels")
    build_stamp.record(key, out, [image], ROWS)
    return key, out, image


def test_a_folder_as_stamped_has_nothing_to_do(stamped: tuple[str, Path, Path]) -> None:
    key, out, _ = stamped
    assert build_stamp.unchanged(key, out) == ROWS


@pytest.mark.parametrize(
    "change",
    [
        "edit a wheel",
        "touch a wheel (same bytes, new mtime)",
        "delete a wheel",
        "add a file",
        "add a folder",
        "delete the index",
        "edit a log",
        "replace the log by a link",
        "edit an input",
        "delete an input",
    ],
)
def test_anything_changed_since_the_stamp_builds_again(stamped: tuple[str, Path, Path], change: str) -> None:
    key, out, image = stamped
    wheel = out / "fa_attn-0.1.0-py3-none-any.whl"
    if change == "edit a wheel":
        wheel.write_bytes(b"WHL")  # the same size
    elif change.startswith("touch"):
        os.utime(wheel, ns=(1, 1))
    elif change == "delete a wheel":
        wheel.unlink()
    elif change == "add a file":
        (out / "fa_attn-0.2.0-py3-none-any.whl").write_bytes(b"other")
    elif change == "add a folder":
        (out / "simple").mkdir()
    elif change == "delete the index":
        (out / "index.json").unlink()
    elif change == "edit a log":
        (out / "logs" / "build.json").write_text("[]")
    elif change.startswith("replace the log"):
        (out / "logs" / "build.json").unlink()
        (out / "logs" / "build.json").symlink_to(out / "index.json")
    elif change == "edit an input":
        image.write_bytes(b"CUBIN")
    else:
        image.unlink()
    assert build_stamp.unchanged(key, out) is None


@pytest.mark.parametrize(
    "corrupt",
    [
        b"{not json",
        b"[]",
        b'{"inputs": [], "folder": {}, "rows": []}',
        b'{"inputs": {}, "folder": {}, "rows": [1]}',
    ],
)
def test_a_stamp_fa_cannot_read_is_not_trusted(stamped: tuple[str, Path, Path], corrupt: bytes) -> None:
    key, out, _ = stamped
    (stamp,) = (cache.cache_dir() / "stamps" / "build").rglob("*.json")
    stamp.write_bytes(corrupt)
    assert build_stamp.unchanged(key, out) is None


def test_another_plan_folder_tree_or_python_has_another_key(
    stamped: tuple[str, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, out, _ = stamped
    m = parse_matrix('torch: ["2.9"]\ncuda: [12]\npython: ["3.13"]\n', "test matrix")
    plan = _assemble(m, [universal_wheel(m)], [])
    assert build_stamp.key(plan, out, tmp_path / "kernels") != key
    m = parse_matrix('torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\n', "test matrix")
    same = _assemble(m, [universal_wheel(m)], [])
    assert build_stamp.key(same, out, tmp_path / "kernels") == key
    assert build_stamp.key(same, tmp_path / "elsewhere", tmp_path / "kernels") != key
    monkeypatch.setattr(sys, "version", "3.99.0 (another Python)")  # logs/build.json names it
    assert build_stamp.key(same, out, tmp_path / "kernels") != key
    monkeypatch.undo()
    (tmp_path / "kernels" / "tiles.py").write_text("MIN_ARCH = '8.0'\n")  # the kernel table edited
    assert build_stamp.key(same, out, tmp_path / "kernels") != key


@pytest.mark.slow
@pytest.mark.network  # the CUDA 12 NVRTC wheel, once per machine
def test_a_second_identical_build_has_nothing_to_do_and_every_change_builds_again(
    fresh_cache: Path, fixture_tree: Path, tmp_path: Path
) -> None:
    """The real command, child processes: the second build answers from the stamp (the same summary a
    whole no-op build gives, nothing written); an edited wheel, a deleted wheel, an edited kernel
    source, another matrix and a corrupt stamp each run the whole build, which stamps again."""
    kernels = tmp_path / "kernels"  # a tree of this test's own: it edits a kernel source
    shutil.copytree(fixture_tree, kernels)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    out = tmp_path / "wheels"

    def fa_build() -> dict:
        return local_build(out, tmp_path, kernels)

    def figures(summary: dict) -> dict:
        return {k: v for k, v in summary.items() if k not in ("seconds", "up_to_date")}

    first = fa_build()
    assert not first["up_to_date"]
    (wheel,) = out.glob("fa_attn-*.whl")
    good, states = wheel.read_bytes(), folder_states(out)
    again = fa_build()
    assert again["up_to_date"]
    assert again["nvrtc_compiles"] == again["cxx_compiles"] == 0
    assert folder_states(out) == states  # nothing written

    (stamp,) = (fresh_cache / "stamps" / "build").rglob("*.json")
    stamp.write_bytes(b"{not json")  # ignored: the whole build runs, finds everything as made ...
    whole = fa_build()
    assert not whole["up_to_date"]
    assert figures(whole) == figures(again)  # ... and reports what the stamp's answer said
    assert json.loads(stamp.read_bytes())["rows"]  # and the stamp is written again, whole
    assert fa_build()["up_to_date"]

    with wheel.open("ab") as f:
        f.write(b"edited")
    assert not fa_build()["up_to_date"]
    assert wheel.read_bytes() == good  # set aside and written again, as before

    wheel.unlink()
    assert not fa_build()["up_to_date"]
    assert wheel.read_bytes() == good
    assert fa_build()["up_to_date"]

    tiny = kernels / "csrc" / "tiny.cu"
    tiny.write_text(tiny.read_text() + "\n// edited\n")
    edited = fa_build()
    assert not edited["up_to_date"]
    assert edited["nvrtc_compiles"] >= 1

    matrix.write_text(TINY.format(archs='["8.0"]', dtypes="[fp16, bf16]"))
    wider = fa_build()
    assert not wider["up_to_date"]
    assert wider["nvrtc_compiles"] >= 1  # the bf16 unit
    assert fa_build()["up_to_date"]


def test_the_summary_is_taken_from_stamp_rows_of_the_plans_shape_only() -> None:
    """pipeline._stamped_rows: one row per wheel of the plan, each with WheelReport's fields and types;
    rows of another number, fields or types (a stamp edited by hand, or of another fa) mean: build."""
    from buildtool.builder.pipeline import WheelReport, _stamped_rows

    m = parse_matrix('torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\n', "test matrix")
    plan = _assemble(m, [universal_wheel(m)], [])
    row = dataclasses.asdict(
        WheelReport("fa_attn-0.1.0-py3-none-any.whl", "", None, 9, "any", "pure", 0, 0.0, 0, 0)
    )
    assert _stamped_rows(plan, [row]) == [WheelReport(**row)]
    assert _stamped_rows(plan, [row, row]) is None
    assert _stamped_rows(plan, [{**row, "size": "9"}]) is None
    assert _stamped_rows(plan, [{**row, "extra": 1}]) is None
    assert _stamped_rows(plan, [{k: v for k, v in row.items() if k != "size"}]) is None
    assert _stamped_rows(plan, None) is None
