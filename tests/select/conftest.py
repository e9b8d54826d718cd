"""What the doctor/install tests share, once each: a typical machine (`machine()` as JSON, `env()` typed),
and the fixture index of the repo's matrix.yaml (fixture_index.py) as data and as a directory."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from buildtool.compat.env import Env, env_from_json
from tests.select.fixture_index import fixture_index

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
