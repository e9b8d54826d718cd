"""The tests' nested venvs (tests/nested_venv.py) see the packages of the environment the tests run in,
never the base interpreter's: the case of a developer who runs the suite inside a venv of their own
(CONTRIBUTING's setup), where `venv --system-site-packages` made torch and typer vanish.

The outer environment here is a venv without system site-packages holding one module of its own (a
stand-in for the developer's torch); the test runs tests/nested_venv.py from inside it, as pytest
would, and asks the nested venv what it can import. Made by `python -m venv` and by `uv venv`, on
both levels. .ci/run also runs this file from a clone under an odd path as a user who is not root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nested_venv import make_venv, outer_site_dirs, site_packages, uv_binary

REPO = Path(__file__).resolve().parents[2]

# Run by the outer venv's python: make the nested venv the given way, then report what it imports.
PROBE = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from tests.nested_venv import make_venv
how, where, tool = sys.argv[2], sys.argv[3], sys.argv[4]
if how == "helper":
    py = str(make_venv(__import__("pathlib").Path(where), pip=False, tool=tool))
else:  # what the tests did before: system site-packages of the interpreter the venv is based on
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", where], check=True)
    py = where + "/bin/python"
ask = (
    "import importlib.util as u, json, sys;"
    "print(json.dumps({m: u.find_spec(m) is not None for m in ('outer_only', 'torch', 'json')}"
    " | {'prefix': sys.prefix}))"
)
print(subprocess.run([py, "-c", ask], check=True, capture_output=True, text=True).stdout)
"""


def _outer(where: Path, tool: str) -> Path:
    """A venv without system site-packages holding the module outer_only; its python."""
    if tool == "uv":
        subprocess.run([uv_binary(), "venv", "-q", "--python", sys.executable, str(where)], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    (site_packages(python) / "outer_only.py").write_text("HERE = True\n")
    return python


def _nested(outer: Path, how: str, where: Path, tool: str, cwd: Path) -> dict:
    done = subprocess.run(
        [str(outer), "-c", PROBE, str(REPO), how, str(where), tool],
        cwd=cwd,
        # No PYTHONPATH: what the nested venv sees comes from the venvs. uv on PATH for tool="uv".
        env={"PATH": f"{Path(uv_binary()).parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("outer_tool", ["venv", "uv"])
@pytest.mark.parametrize("inner_tool", ["venv", "uv"])
def test_a_nested_venv_sees_the_outer_venvs_packages_not_the_base_interpreters(
    tmp_path: Path, outer_tool: str, inner_tool: str
) -> None:
    outer = _outer(tmp_path / "outer", outer_tool)
    elsewhere = tmp_path / "elsewhere"  # any folder: not the checkout
    elsewhere.mkdir()
    old = _nested(outer, "system-site", tmp_path / "old", "venv", elsewhere)
    # The fault, reproduced: the old way sees the base interpreter's packages, not the outer venv's.
    assert old["outer_only"] is False
    seen = _nested(outer, "helper", tmp_path / "new", inner_tool, elsewhere)
    assert seen["prefix"] == str(tmp_path / "new")
    assert seen["outer_only"] is True
    assert seen["torch"] is False  # the base interpreter's torch stays out of sight
    assert seen["json"] is True


def test_packages_installed_into_the_nested_venv_come_first(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "v", pip=False)
    site = site_packages(python)
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    where = subprocess.run(
        [str(python), "-c", "import torch, typer; print(torch.__file__); print(typer.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert where[0] == str(site / "torch" / "__init__.py")  # the venv's own copy wins
    # typer: the running environment's, through the .pth
    assert any(Path(where[1]).is_relative_to(d) for d in outer_site_dirs())
