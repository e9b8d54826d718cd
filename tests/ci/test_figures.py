"""docs/figures.md is in step: every section opens with its stamp (the date, the machine, the command),
its command names a script in the tree, every script that writes a section (`--record`) has its
section and is named in that section's stamp, and the figures cheap to compute again are what the tree
gives today: the release plan's counts (offline, with the fixture catalog)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from buildtool.builder.pypi import catalog_from_simple_json
from tests.ci import offline_catalog

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "bench" / "build")]

import figures  # bench/figures.py
import plan_size  # bench/build/plan_size.py

SECTIONS = {s.name: s for s in figures.sections(figures.FIGURES.read_text())}
NOT_YET = re.compile(r"^Not recorded yet: `(?P<command>[^`]+)`")
SCRIPT = re.compile(r"(?:bench(?:/\w+)?|tests/gpu)/\w+\.py|\.ci/run")


def _stamp_paragraph(section: figures.Section) -> str:
    return section.body.split("\n\n", 1)[0]


@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_section_says_when_where_and_how(name: str) -> None:
    section = SECTIONS[name]
    stamp = section.stamp or NOT_YET.match(section.body)
    assert stamp, f"docs/figures.md section {name}: no stamp (Measured DATE on MACHINE: `COMMAND`)"
    scripts = SCRIPT.findall(_stamp_paragraph(section))
    assert scripts, f"section {name}: its stamp names no script that refreshes it"
    assert all((REPO / s).is_file() for s in scripts), f"section {name}: {scripts}"


def _recorders() -> dict[str, str]:
    """Section name -> the bench script that writes it with --record."""
    out = {}
    for script in (REPO / "bench").rglob("*.py"):
        for name in re.findall(r'\b(?:record|report)\(\s*"([\w-]+)"', script.read_text()):
            out[name] = script.relative_to(REPO).as_posix()
    return out


@pytest.mark.parametrize(("name", "script"), sorted(_recorders().items()))
def test_a_recording_script_has_its_section_and_is_named_there(name: str, script: str) -> None:
    assert name in SECTIONS, f"{script} records section {name}, which docs/figures.md lacks"
    assert script in _stamp_paragraph(SECTIONS[name]), f"section {name}'s stamp does not name {script}"


def test_the_plan_figures_are_in_step_with_the_tree() -> None:
    """The kernel programs and bindings depend on the tree and matrix.yaml, not on the day's PyPI; cells
    and wheels depend on which Pythons PyPI has torch for, so they are not compared."""
    catalog = catalog_from_simple_json(offline_catalog.simple_json())
    live = plan_size.plans(catalog)
    per_major = plan_size.plans(catalog, per_major=True)
    rows = {
        cells[0]: cells
        for line in SECTIONS["plan"].body.splitlines()
        if line.startswith("| ") and not line.startswith("| CPUs")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    header = [c.strip() for c in plan_size.table({}).splitlines()[0].strip("|").split("|")]
    for label, plan in live.items():
        recorded = dict(zip(header, rows[label], strict=True))
        assert int(recorded["kernel programs"]) == len(plan.compile_jobs), (
            f"docs/figures.md's plan is stale for {label}: run python bench/build/plan_size.py --record"
        )
        assert int(recorded["bindings"]) == len(plan.binding_jobs), label
        assert int(recorded["per-major SASS"]) == len(per_major[label].compile_jobs), label


def test_record_rewrites_one_section_with_its_stamp(tmp_path: Path) -> None:
    page = tmp_path / "figures.md"
    page.write_text(
        "# F\n\n<!-- begin a -->\nold\n<!-- end a -->\n\n<!-- begin b -->\nkept\n<!-- end b -->\n"
    )
    figures.record("a", "| x | 1 |", command="python bench/x.py --record", figures=page)
    got = {s.name: s for s in figures.sections(page.read_text())}
    assert got["b"].body == "kept"
    stamp = got["a"].stamp
    assert stamp is not None
    assert stamp["command"] == "python bench/x.py --record"
    assert got["a"].body.endswith("| x | 1 |")
