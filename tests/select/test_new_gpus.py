"""fa doctor's answers for the GPUs and torch of late 2026, from JSON machine descriptions (tests/select/envs):
Jetson Thor (sm 11.0, CUDA 13, aarch64) runs the cu13 wheels' own 11.0 SASS; B300/GB300 (10.3) and DGX
Spark (12.1) run same-major SASS and the report says so; torch 2.15 beside a driver below 580 is told
that torch itself cannot use the GPU and which torch keeps the driver. Index: the release matrix's
(fixture_index.py), per-variant wheels and, for PyPI, the all-wheels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from buildtool.compat.choose import Request
from buildtool.compat.doctor import build_report, report_json
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import WheelIndex, entry_from_dict
from buildtool.core.cuda_facts import TOOLKITS, TORCH_LAST_MINOR
from tests.select.fixture_index import all_wheel_index, fixture_index

ENVS = Path(__file__).parent / "envs"
REPO = Path(__file__).resolve().parents[2]


def _report(case: str, index: dict) -> dict:
    env = env_from_json(json.loads((ENVS / f"{case}.json").read_text())["env"])
    entries = [entry_from_dict(e, "fixture") for e in index["wheels"] + index["all_wheels"]]
    return report_json(build_report(env, WheelIndex("fixture", tuple(entries)), Request()))


@pytest.fixture(scope="module")
def release() -> dict:
    return fixture_index()


def test_thor_gets_its_own_sass_from_the_cu13_wheel(release: dict) -> None:
    out = _report("jetson-thor-aarch64", release)
    gpu = out["gpus"][0]
    assert (out["verdict"], out["variant"], gpu["runtime"]["path"], gpu["runtime"]["arch"]) == (
        "ok",
        "cu13torch2.9",
        "sass",
        "11.0",
    )


def test_thor_from_pypi_runs_the_all_wheels_cuda_13_set() -> None:
    out = _report("jetson-thor-aarch64", all_wheel_index())
    assert (out["variant"], out["acts_as"]["cuda_major"], out["runtime"]["arch"]) == ("all", 13, "11.0")


@pytest.mark.parametrize(
    ("case", "sm", "runs"), [("gb300-sm103", "10.3", "10.0"), ("gb10-dgx-spark", "12.1", "12.0")]
)
def test_same_major_sass_is_explained(release: dict, case: str, sm: str, runs: str) -> None:
    gpu = _report(case, release)["gpus"][0]
    assert gpu["runtime"]["arch"] == runs
    assert gpu["explain"].startswith(f"sm {sm} runs sm {runs}'s SASS (same major, lower minor")


def test_the_gpus_own_sass_needs_no_explanation(release: dict) -> None:
    assert _report("jetson-thor-aarch64", release)["gpus"][0]["explain"] == ""


def test_torch_215_on_a_cuda_12_driver_is_told_torch_cannot_use_the_gpu(release: dict) -> None:
    out = _report("torch215-driver570", release)
    (stack,) = out["stack"]
    assert stack["code"] == "torch-driver-too-old"
    assert "torch cannot use the GPU at all" in stack["message"]
    assert "torch 2.15 has no CUDA 12 build (PyTorch's last is torch 2.14)" in stack["fix"]


def test_the_last_torch_per_cuda_major_is_what_matrix_yaml_excludes() -> None:
    """cuda_facts.TORCH_LAST_MINOR and matrix.yaml's excludes state one fact: a major's cells end after
    PyTorch's last build for it."""
    matrix = yaml.safe_load((REPO / "matrix.yaml").read_text())
    torch_only = [e for e in matrix["exclude"] if set(e) == {"torch", "cuda"}]
    for major, last in TORCH_LAST_MINOR.items():
        (entry,) = [e for e in torch_only if e["cuda"] == major]
        spec = SpecifierSet(entry["torch"])
        newer = [t for t in matrix["torch"] if t not in spec]
        assert max(newer, key=lambda t: tuple(map(int, t.split(".")))) == last, major


def test_thor_is_in_cuda_13s_archs_only_where_its_nvrtc_targets_it() -> None:
    matrix = yaml.safe_load((REPO / "matrix.yaml").read_text())
    with_thor = {int(m) for m, archs in matrix["archs"].items() if "11.0" in archs}
    assert with_thor == {m for m, t in TOOLKITS.items() if "11.0" in t.archs} == {13}
