"""The sweep step (kit.py's step_pytest with the gpu_progress plugin) goes on past a test that breaks
the CUDA context or kills pytest, and a later call resumes after what an earlier one finished. Shown
with a toy test file: on this machine any CUDA call fails, which is what a broken context looks like."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kit as kitmod

TESTS = """
import os
import pytest

def test_a():
    pass

def test_b_wrong():
    assert 1 == 2

def test_c_breaks_the_context():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")

def test_d():
    pass

def test_e_dies():
    os._exit(3)

def test_f():
    pass
"""


def _kit(tmp_path: Path) -> kitmod.Kit:
    logs = tmp_path / "logs"
    logs.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    k = kitmod.Kit(
        command="verify",
        out=out,
        scratch=tmp_path,
        deadline=time.monotonic() + 300,
        dry_run=False,
        py=sys.executable,
        printer=open(tmp_path / "kit.log", "w"),  # noqa: SIM115 - closed with the tmp dir
        logs=logs,
    )
    k.sites["h100"] = site
    return k


def test_the_sweep_goes_on_past_a_broken_context_and_a_dead_pytest(tmp_path: Path) -> None:
    tests = tmp_path / "test_toy.py"
    tests.write_text(TESTS)
    # pytest names a test relative to its rootdir, which without an ini file is the common ancestor of
    # the test and the working directory (the checkout): the ids would then depend on where the
    # checkout lies (a clone in /tmp gave "pytest-of-root/..."). An ini file beside the toy makes
    # its folder the rootdir wherever the checkout is.
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    k = _kit(tmp_path)
    summary = kitmod.step_pytest(k, "sweep", 200, [str(tests)], "h100", {}, None)
    runs = [r.name for r in k.records]
    assert runs == ["sweep", "sweep-2", "sweep-3"]  # restarted after test_c and after test_e
    assert summary[0] == "sweep: 1 died, 2 failed, 3 passed"
    assert any("test_c_breaks_the_context" in line and line.strip().startswith("failed") for line in summary)
    assert any("died" in line and "test_e_dies" in line for line in summary[1:])
    progress = (k.logs / "sweep.progress").read_text()
    assert [ln for ln in progress.splitlines() if ln.startswith("poisoned ")] == [
        "poisoned test_toy.py::test_c_breaks_the_context"
    ]

    # A later call with this progress as --resume runs nothing again.
    resume = tmp_path / "resume"
    resume.mkdir()
    (resume / "sweep.progress").write_text(progress)
    (tmp_path / "again").mkdir()
    k2 = _kit(tmp_path / "again")
    again = kitmod.step_pytest(k2, "sweep", 200, [str(tests)], "h100", {}, resume)
    assert [r.name for r in k2.records] == ["sweep"]
    assert again[0] == summary[0]
