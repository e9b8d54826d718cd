"""Nested environments for tests that install into a venv of their own.

A test venv must see the packages the running tests see (torch, typer, pip) and no others. The
obvious `python -m venv --system-site-packages` does not give that when the tests themselves run in a
venv: a venv made from inside a venv is based on the *base* interpreter, so "system site-packages"
means the base interpreter's, where torch and typer may well be absent (`No module named 'torch'`).

So the nested venv is made without system site-packages, and a .pth file in its own site-packages
adds the running interpreter's site directories (site.getsitepackages(): its environment's own, plus
the base's only if that environment was itself made with system site-packages; and the user site when
this interpreter reads it). site.addsitedir processes those directories' .pth files too, so editable
installs resolve as they do outside. The venv's own site-packages stays first: what a test installs
into it wins over the outer copy, as with --system-site-packages.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

PTH_NAME = "_fa_tests_outer_site.pth"


def outer_site_dirs() -> list[str]:
    """The site directories this interpreter imports installed packages from, in its order."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:  # False inside a venv and under -s / PYTHONNOUSERSITE
        dirs.append(site.getusersitepackages())
    seen: list[str] = []
    for d in dirs:
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def uv_binary() -> str:
    """uv as the test extra installs it (next to this interpreter), else from PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise RuntimeError("uv is not installed (pyproject.toml's test extra installs it)")
    return found


def make_venv(where: Path, *, pip: bool = True, tool: str = "venv") -> Path:
    """A venv at `where`, made by `tool` ("venv": python -m venv, with pip unless pip=False; "uv": uv
    venv, no pip of its own) from this interpreter, that sees this interpreter's installed packages
    (module doc); its python. Without pip of its own, the outer pip, visible the same way, installs
    into it."""
    if tool == "uv":
        cmd = [uv_binary(), "venv", "-q", "--python", sys.executable, str(where)]
    elif tool == "venv":
        cmd = [sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(where)]
    else:
        raise ValueError(f"tool must be 'venv' or 'uv', not {tool!r}")
    subprocess.run(cmd, check=True, capture_output=True)
    python = where / "bin" / "python"
    lines = [f"import site; site.addsitedir({d!r})" for d in outer_site_dirs()]
    (site_packages(python) / PTH_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return python


def site_packages(python: Path) -> Path:
    """The site-packages folder `python` installs pure-Python packages into."""
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(purelib)
