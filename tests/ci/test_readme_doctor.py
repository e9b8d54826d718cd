"""README shows what its first command prints on a machine without a GPU (issue 37), and the sample is
what doctor prints now: `bench/install/readme_doctor.py --record` wrote it from a real run on a release build's
wheels and kept that machine's probe; here doctor answers again for the same machine, the real CLI on
the index fixture shaped like the release's, and the README section must be the same text."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from buildtool.core import install_lines
from buildtool.core.runtime import schema
from tests.select.fixture_index import fixture_index

REPO = Path(__file__).resolve().parents[2]


def _script():  # bench/install/readme_doctor.py, whose answer() and section() made README's text
    spec = importlib.util.spec_from_file_location(
        "readme_doctor", REPO / "bench" / "install" / "readme_doctor.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded(script) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- begin {script.SECTION} -->\n(.*?)\n<!-- end {script.SECTION} -->", text, re.DOTALL
    )
    assert found, f"README.md has no section {script.SECTION}: run bench/install/readme_doctor.py --record"
    stamp, _, body = found[1].partition("\n\n")
    assert stamp.startswith("Measured "), stamp
    assert "bench/install/readme_doctor.py" in stamp, stamp
    return body


def _release_shaped_folder(tmp_path: Path) -> Path:
    """The fixture's index.json and the simple pages `fa index` would write beside it (doctor says when
    the one its pip line names is missing)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    data = fixture_index()
    (folder / "index.json").write_text(json.dumps(data))
    entries = schema.read_index(data)
    for name in (None, *install_lines.index_names(entries)):
        page = folder / install_lines.index_path(name) / "fa-attn" / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<!DOCTYPE html>\n")
    return folder


def test_readmes_sample_is_what_doctor_prints_for_that_machine(tmp_path: Path) -> None:
    script = _script()
    wheels = _release_shaped_folder(tmp_path)
    env = {**os.environ, "COLUMNS": "80"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "kernels")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "buildtool.cli",
            "doctor",
            "--env",
            str(script.MACHINE),
            "--wheels",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    now = script.section(script.answer(done.stdout, wheels), done.returncode)
    assert _recorded(script) == now, (
        "README's doctor sample is stale: run bench/install/readme_doctor.py --record"
    )


def test_the_sample_is_for_a_machine_without_a_gpu() -> None:
    machine = json.loads(_script().MACHINE.read_text())
    assert machine["gpus"] == []
    assert machine["driver"] is None
