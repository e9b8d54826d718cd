"""Docs quote no size or count of a built artifact typed by hand (issue 37: the all-wheel was "9 MB" in
README, 8.6 MiB in using.md and matrix.md, 8.63 MiB and 511 files in build.md; measured 9.23 MiB and
525 files). Sizes are measured by bench/build/all_wheel_size.py into docs/figures.md (section wheel-sizes)
and linked from there; every other size in docs is a limit fa enforces, in binary units as fa prints
sizes (MiB, KiB, GiB; never MB or KB)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.child import run_child
from tests.select.fixture_index import all_wheel_index
from tests.select.tiny_wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
GENERATED = REPO / "docs" / "figures.md"  # its sections are written by the scripts that measure

# (what is wrong, the pattern): a decimal unit; a measured-looking size (a fraction of a MiB or KiB, or
# "about N MiB"); a count of files. A product name like "A100-SXM4-80GB" is not a size.
HAND_TYPED = (
    ("a decimal unit (fa prints MiB)", re.compile(r"(?<![\w.-])\d[\d,.]*\s?(?:kB|KB|MB|GB)\b")),
    ("a measured size", re.compile(r"(?<![\w.-])\d+\.\d+\s?(?:MiB|KiB)\b")),
    ("a measured size", re.compile(r"(?:about|~)\s*\d[\d,.]*\s?(?:MiB|KiB|GiB)\b")),
    ("a count of files", re.compile(r"(?<![\w.-])\d[\d,]* files\b")),
)


def hand_typed(text: str) -> list[str]:
    return [f"{what}: {m[0]!r}" for what, pattern in HAND_TYPED for m in pattern.finditer(text)]


@pytest.mark.parametrize("page", [p for p in PAGES if p != GENERATED], ids=lambda p: p.name)
def test_no_size_or_count_typed_by_hand(page: Path) -> None:
    found = hand_typed(page.read_text(encoding="utf-8"))
    assert found == [], (
        f"{page.relative_to(REPO)}: {found}; link docs/figures.md#wheel-sizes (bench/build/all_wheel_size.py "
        "--record) instead, and write limits in MiB"
    )


@pytest.mark.parametrize(
    ("text", "caught"),
    [
        ('the all-wheel is "9 MB"', True),
        ("8.63 MiB (9,052,383 bytes)", True),
        ("about 3.3 MiB", True),
        ("511 files", True),
        ("index.json at most 16 MiB", False),
        ('{"name": "NVIDIA A100-SXM4-80GB"}', False),
        ("shared memory per block (99 KiB sm86)", False),
    ],
)
def test_the_patterns_catch_what_issue_37_found(text: str, caught: bool) -> None:
    assert bool(hand_typed(text)) is caught


def test_the_wheel_sizes_section_is_generated() -> None:
    text = GENERATED.read_text(encoding="utf-8")
    section = re.search(r"<!-- begin wheel-sizes -->\n(.*?)\n<!-- end wheel-sizes -->", text, re.DOTALL)
    assert section, "docs/figures.md has no wheel-sizes section"
    assert section[1].startswith("Measured "), section[1][:200]
    assert "bench/build/all_wheel_size.py" in section[1].splitlines()[0]
    assert " MB" not in section[1]


def test_the_wheel_sizes_command_records(tmp_path: Path) -> None:
    """The command docs/build.md and the section's stamp give, `python bench/build/all_wheel_size.py
    --wheels DIR --record`, records: it stopped with `No module named 'figures'` (bench/figures.py is one
    folder up from bench/build/, and nothing put bench/ on the path). Run on a copy of the two scripts,
    so the figures.md it writes is this test's, from a folder outside the checkout."""
    checkout = tmp_path / "checkout"
    (checkout / "bench" / "build").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "figures.py", checkout / "bench")
    shutil.copy(REPO / "bench" / "build" / "all_wheel_size.py", checkout / "bench" / "build")
    (checkout / "docs").mkdir()
    figures = checkout / "docs" / "figures.md"
    figures.write_text("<!-- begin wheel-sizes -->\nnot measured yet\n<!-- end wheel-sizes -->\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whl = build_wheel(wheels, next(e for e in all_wheel_index()["all_wheels"] if e["platform"] == "x86_64"))
    with zipfile.ZipFile(whl, "a") as zf:  # the parts the table sums: a binding, a CUDA major's SASS
        zf.writestr("fa_attn/bindings/libfa_attn_ops-torch2.10plus.so", b"\0" * 4096)
        zf.writestr("fa_attn/kernels/cu12/sm_80/fwd_fp16_d64.cubin", b"\0" * 4096)
        # Hopper's arch-specific forward (sm_90a) beside sm_90 and sm_100: the release's all-wheel has it
        zf.writestr("fa_attn/kernels/cu12/sm_90a/fwd_fp16_d64.cubin", b"\0" * 4096)
        zf.writestr("fa_attn/kernels/cu12/sm_90/fwd_fp16_d64.cubin", b"\0" * 4096)
        zf.writestr("fa_attn/kernels/cu12/sm_100/fwd_fp16_d64.cubin", b"\0" * 4096)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}
    script = checkout / "bench" / "build" / "all_wheel_size.py"
    done = run_child(
        [sys.executable, str(script), "--wheels", str(wheels), "--record"], cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    section = figures.read_text()
    assert "not measured yet" not in section
    assert "| the all-wheel, x86_64 |" in section, section
    # A row per folder of the wheel, named as the folder: kernels/cu12/ holds only what CUDA 11 cannot
    # compile, while CUDA 12's set also runs kernels/cu11/'s cubins ("CUDA 12 SASS (8.0 ...)" read as if
    # CUDA 12 had no sm 7.5 kernels).
    assert "| all-wheel: kernels/cu12/ SASS (8.0 9.0 9.0a 10.0) |" in section, section
    assert "| all-wheel: 1 bindings | 0.00 MiB | 0.00 MiB each |" in section, section  # not "0.00 to 0.00"
