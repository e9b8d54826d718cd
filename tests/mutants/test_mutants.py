"""The mutant gate: each of the project's one-line faults (tests/mutants/mutants.py), applied to a copy of
kernels/csrc, fails its `fa check --emulate` selection (one unit, one problem), and the unaltered
sources pass every selection the gate uses. Each fault's text must occur exactly once in its file, so
a rewrite of the kernels that removes it fails here rather than silently testing nothing.

The libraries of every altered copy are compiled up front, in parallel (one g++ each); each test then
runs one problem on the emulator."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from buildtool.core import cuda_facts
from buildtool.emucheck.harness import emulator
from buildtool.emucheck.run import check_emulated, emulated_jobs, problem_names
from tests.mutants.mutants import MUTANTS, Mutant

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
BY_NAME = {m.name: m for m in MUTANTS}

pytestmark = [
    pytest.mark.slow,  # compiles 31 altered units (in parallel)
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "g++")) is None, reason="the kernel emulator needs g++"
    ),
]


def altered(m: Mutant, root: Path) -> Path:
    """A copy of kernels/csrc with the fault applied."""
    dst = root / m.name
    if not dst.exists():
        shutil.copytree(CSRC, dst)
        text = (dst / m.file).read_text()
        assert text.count(m.old) == 1, f"{m.name}: its line occurs {text.count(m.old)} times in {m.file}"
        (dst / m.file).write_text(text.replace(m.old, m.new))
    return dst


def _unit(m: Mutant) -> tuple[Any, Any]:
    (pair,) = [(j, u) for j, u in emulated_jobs(m.arch, (m.unit,)) if j.unit.endswith("/" + m.unit)]
    return pair


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every altered copy, its unit's library built (in parallel: the tests then only emulate)."""
    harness = emulator()
    root = tmp_path_factory.mktemp("mutants")
    copies = {m.name: altered(m, root) for m in MUTANTS}

    def build(m: Mutant) -> None:
        _, unit = _unit(m)
        try:
            harness.build(unit, m.arch, copies[m.name])
        except harness.EmulatorError:
            pass  # a fault that does not compile: its test sees the same error as a failed unit

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(build, MUTANTS))
    return copies


def test_the_set_is_large_and_every_selection_exists() -> None:
    assert len(MUTANTS) >= 20
    assert len(BY_NAME) == len(MUTANTS), "mutant names are unique"
    assert len({m.category for m in MUTANTS}) >= 12
    for m in MUTANTS:
        text = (CSRC / m.file).read_text()
        assert text.count(m.old) == 1, f"{m.name}: its line occurs {text.count(m.old)} times in {m.file}"
        assert m.new != m.old
        job, _ = _unit(m)
        assert m.problem in problem_names(job), f"{m.name}: {m.unit} has no problem {m.problem}"


def test_the_docs_count_the_set_as_it_is() -> None:
    """README and docs/checking.md quote the set's size."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"the project's {len(MUTANTS)} one-line faults in kernels/csrc" in readme, (
        "README: update the count"
    )
    checking = " ".join((REPO / "docs" / "checking.md").read_text().split())
    assert f"one-line faults in kernels/csrc ({len(MUTANTS)}:" in checking


def test_the_unaltered_sources_pass_every_selection() -> None:
    """The baseline: each (unit, problem) the gate uses passes on the real kernels, so a failure below is
    the fault's."""
    selections: dict[tuple[str, str], set[str]] = {}
    for m in MUTANTS:
        selections.setdefault((m.arch, m.unit), set()).add(m.problem)
    for (arch, unit), names in sorted(selections.items()):
        report = check_emulated(arch, (unit,), None, lambda *_: None, tuple(sorted(names)))
        assert [u.unit.split("/")[1] for u in report.units] == [unit]
        (u,) = report.units
        assert (u.verdict, u.problems) == ("pass", len(names)), u.error


@pytest.mark.parametrize("name", [m.name for m in MUTANTS])
def test_the_fault_fails_its_selection(name: str, sources: dict[str, Path]) -> None:
    m = BY_NAME[name]
    report = check_emulated(m.arch, (m.unit,), sources[name], lambda *_: None, (m.problem,))
    (u,) = report.units
    assert u.unit == f"{cuda_facts.sm_name(m.arch)}/{m.unit}", u.unit  # the report's line names the unit
    assert u.verdict == "fail", f"{name} escaped `{m.command(str(sources[name]))}`"
    assert report.exit_code == 1
    assert f"[{m.problem}]" in u.error or "Error" in u.error, u.error  # the failing problem is named
