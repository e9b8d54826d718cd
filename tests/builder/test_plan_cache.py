"""Plans kept in the cache (builder/plan_cache.py): the same inputs read the plan back, any other input
plans again, and a plan file that is damaged or that others may write is never trusted (issue 37: the
release's matrix took a tenth of a no-op rebuild's CPU to expand again)."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import packaging
import pytest

from buildtool.builder.matrix import parse_matrix
from buildtool.builder.plan import make_plan
from buildtool.builder.plan_cache import cached_plan, plan_path
from buildtool.builder.pypi import TorchCatalog, catalog_from_simple_json
from buildtool.core import kernels_src
from tests.builder.test_plan import DATA

MATRIX = 'torch: ["2.8", "2.9"]\ncuda: [12]\npython: ["3.12"]\narchs: {"12": ["8.0"]}\n'


@pytest.fixture(scope="module")
def catalog() -> TorchCatalog:
    return catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))


def _plan(catalog: TorchCatalog, text: str = MATRIX, platform: str | None = "x86_64"):
    m = parse_matrix(text, "m.yaml")
    return cached_plan(m, catalog, None, platform=platform, kernels_root=kernels_src.kernels_dir())


def _path(catalog: TorchCatalog, text: str = MATRIX, platform: str | None = "x86_64") -> Path:
    return plan_path(parse_matrix(text, "m.yaml"), catalog, None, platform, kernels_src.kernels_dir())


@pytest.mark.usefixtures("fresh_cache")
def test_the_same_inputs_read_the_plan_back_and_others_plan_again(catalog: TorchCatalog) -> None:
    first = _plan(catalog)
    assert first == make_plan(parse_matrix(MATRIX, "m.yaml"), catalog, platform="x86_64")
    path = _path(catalog)
    assert pickle.loads(path.read_bytes()) == first
    # What the file holds is what comes back (here another matrix's plan put there by the test)
    other = make_plan(parse_matrix(MATRIX.replace('"3.12"', '"3.13"'), "m.yaml"), catalog, platform="x86_64")
    path.write_bytes(pickle.dumps(other))
    assert _plan(catalog) == other != first
    # Another matrix, CPU or catalog is another plan file
    assert _path(catalog, MATRIX.replace('"3.12"', '"3.13"')) != path
    assert _path(catalog, platform=None) != path
    fewer = TorchCatalog({k: v for k, v in catalog.minors.items() if k != "2.4"})
    assert _path(fewer) != path


@pytest.mark.usefixtures("fresh_cache")
def test_another_packaging_or_python_is_another_plan_file(
    catalog: TorchCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _path(catalog)
    monkeypatch.setattr(packaging, "__version__", "99.0")  # its specifier rules decide excluded cells
    assert _path(catalog) != path
    monkeypatch.undo()
    monkeypatch.setattr(sys, "version", "3.99.0 (another Python)")
    assert _path(catalog) != path


@pytest.mark.usefixtures("fresh_cache")
@pytest.mark.parametrize("damage", [b"", b"not a pickle", pickle.dumps({"not": "a plan"})])
def test_a_damaged_plan_file_is_planned_again_and_rewritten(catalog: TorchCatalog, damage: bytes) -> None:
    right = _plan(catalog)
    path = _path(catalog)
    path.write_bytes(damage)
    assert _plan(catalog) == right
    assert pickle.loads(path.read_bytes()) == right


@pytest.mark.usefixtures("fresh_cache")
def test_a_plan_file_others_may_write_is_not_loaded(catalog: TorchCatalog) -> None:
    right = _plan(catalog)
    path = _path(catalog)
    other = make_plan(parse_matrix(MATRIX.replace('"3.12"', '"3.13"'), "m.yaml"), catalog, platform="x86_64")
    path.write_bytes(pickle.dumps(other))
    os.chmod(path, 0o666)
    assert _plan(catalog) == right
