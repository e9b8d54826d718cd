"""What the doctor/install tests share, once each: a typical machine (`machine()` as JSON, `env()` typed),
the fixture index of the repo's matrix.yaml (fixture_index.py) as data and as a directory, and a test venv
that runs this checkout's fa (`make_venv`, `run_fa`)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from buildtool.compat.env import Env, env_from_json
from tests.nested_venv import make_venv as nested_venv
from tests.select.fixture_index import fixture_index

REPO = Path(__file__).resolve().parents[2]

# An A100 node with PyPI's torch 2.5.1 (CUDA 12.4, old C++ ABI) and a 550 driver.
MACHINE: dict[str, Any] = {
    "os": "linux",
    "arch": "x86_64",
    "glibc": "2.35",
    "python": "3.11",
    "torch": {"version": "2.5.1+cu124", "cuda": "12.4", "hip": None, "cxx11abi": False},
    "driver": {"version": "550.54.15"},
    "gpus": [{"name": "NVIDIA A100", "sm": "8.0", "memory_mib": 81920}],
}


def machine(**change: Any) -> dict[str, Any]:
    """MACHINE as `fa probe --json` writes it, with some top-level fields changed."""
    return {**copy.deepcopy(MACHINE), **change}


def env(**change: Any) -> Env:
    """machine(**change), read as doctor reads an --env file."""
    return env_from_json(machine(**change))


@pytest.fixture(scope="session")
def index_data() -> dict[str, Any]:
    """The fixture index.json as data (copy it before changing it)."""
    return fixture_index()


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory, index_data: dict[str, Any]) -> Path:
    """A directory holding the fixture index.json (no wheels), for --wheels."""
    d = tmp_path_factory.mktemp("index")
    (d / "index.json").write_text(json.dumps(index_data))
    return d


def make_venv(where: Path) -> Path:
    """A venv at `where` that sees the running interpreter's packages (torch among them) and has no pip
    of its own (the outer pip, visible the same way, installs into it); its python."""
    return nested_venv(where, pip=False)


def this_checkout() -> dict[str, str]:
    """The environment that runs this checkout's fa in a test venv: the venv sees the running
    interpreter's site-packages (tests/nested_venv.py), which may hold another checkout's fa (an
    editable install) or none."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def run_fa(
    python: Path, *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`fa ARGS` run by a test venv's `python` as this checkout's fa (env: this_checkout())."""
    return subprocess.run(
        [str(python), "-m", "buildtool.cli", *args],
        env=this_checkout() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
