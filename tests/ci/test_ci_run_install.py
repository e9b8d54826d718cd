""".ci/run's first step installs fa and the test extra into the environment it runs in: with pip where
the environment has pip (a `python -m venv`), with uv where it has none (a `uv venv`, which CONTRIBUTING's
reader may well use: `python3 -m pip` failed there with "No module named pip" before any test ran).

The step's own function, taken from .ci/run, runs in bash inside each kind of venv and installs a
wheel made here from a local folder (--no-index: no network); the venv's python must then import it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.nested_venv import uv_binary

REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^ci_install\(\) \{\n.*?^\}\n", re.DOTALL | re.MULTILINE)


def _wheel(folder: Path) -> None:
    info = "fa_ci_probe-1.0.dist-info"
    files = {
        "fa_ci_probe.py": "HERE = True\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: fa-ci-probe\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir()
    with zipfile.ZipFile(folder / "fa_ci_probe-1.0-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


@pytest.mark.parametrize("tool", ["venv", "uv"])
def test_the_install_step_works_in_a_venv_with_pip_and_in_a_uv_venv_without(
    tmp_path: Path, tool: str
) -> None:
    match = STEP.search((REPO / ".ci" / "run").read_text())
    assert match, ".ci/run: its install step is the function ci_install"
    venv = tmp_path / "venv"
    if tool == "uv":
        subprocess.run([uv_binary(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    has_pip = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "--version"], capture_output=True, check=False
    ).returncode
    assert (has_pip == 0) == (tool == "venv")
    _wheel(tmp_path / "wheels")
    script = match.group(0) + f'ci_install --no-index --find-links "{tmp_path / "wheels"}" fa-ci-probe\n'
    # As an activated venv: its bin first on PATH, VIRTUAL_ENV set; uv found on PATH as a user has it.
    path = f"{venv / 'bin'}:{Path(uv_binary()).parent}:/usr/bin:/bin"
    env = {"PATH": path, "VIRTUAL_ENV": str(venv), "HOME": os.environ.get("HOME", str(tmp_path))}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    imported = subprocess.run(
        [venv / "bin" / "python", "-c", "import fa_ci_probe"], capture_output=True, text=True, check=False
    )
    assert imported.returncode == 0, imported.stderr


def test_the_test_extra_brings_pip_which_a_uv_venv_lacks() -> None:
    """Tests run the environment's own pip (`sys.executable -m pip`: the release backend's `pip wheel`,
    pip download against the index, the printed pip lines); a uv venv has no pip unless the test extra
    installs it. The check reads which tests call it, so it goes when they stop."""
    call = 'sys.executable, "-m", "pip"'
    callers = [p for p in (REPO / "tests").rglob("*.py") if p != Path(__file__) and call in p.read_text()]
    extra = re.search(
        r"^test = \[\n(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.DOTALL | re.MULTILINE
    )
    assert extra, "pyproject.toml: the test extra"
    names = {m.lower() for m in re.findall(r'^\s*"([A-Za-z0-9_.-]+)', extra.group(1), re.MULTILINE)}
    assert "pytest" in names
    assert not callers or "pip" in names, [str(p.relative_to(REPO)) for p in callers]
