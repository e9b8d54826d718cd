"""Each command imports what it needs and no more: `fa probe` loads neither typer nor rich, and doctor
and install never load the build pipeline (bench/install/probe_time.py measures what that buys: `fa probe
--json` went from about 0.65 s of CPU to under 0.1 s). Checked by what is imported, not by timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOADED = """
import json, sys
sys.argv = ["fa", *sys.argv[1:]]
from buildtool import cli
try:
    cli.main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _modules_after(*args: str, cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [("probe", "--json"), ("probe",)])
def test_probe_loads_no_cli_framework(args, tmp_path):
    loaded = _modules_after(*args, cwd=tmp_path)
    assert "buildtool.compat.probe" in loaded
    heavy = {m for m in loaded if m.split(".")[0] in ("typer", "rich", "click", "yaml", "jinja2")}
    assert heavy == set(), heavy
    assert not {m for m in loaded if m.startswith(("buildtool.builder", "buildtool.commands._app"))}


def test_doctor_loads_no_build_pipeline(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"schema": 1, "wheels": []}))
    loaded = _modules_after("doctor", "--wheels", str(tmp_path), "--json", cwd=tmp_path)
    assert "buildtool.compat.doctor" in loaded
    assert not {m for m in loaded if m.startswith("buildtool.builder")}


@pytest.mark.parametrize("args", [("--help",), ()])
def test_top_level_help_loads_nothing_heavy(args, tmp_path):
    """`fa --help` (and a bare `fa`, which shows it) imports neither rich (typer's panels pulled it and
    markdown-it in: 0.55 s of CPU where the target is 0.3 s) nor yaml, torch or packaging."""
    loaded = _modules_after(*args, cwd=tmp_path)
    assert "buildtool.commands._app" in loaded  # the help came from the CLI, not an early exit
    heavy = {m.split(".")[0] for m in loaded} & {"rich", "markdown_it", "yaml", "torch", "packaging"}
    assert heavy == set(), heavy
    assert not {
        m for m in loaded if m.startswith(("buildtool.builder", "buildtool.compat", "buildtool.core.cuda"))
    }
