"""A wrong wheel is harmless: pip and uv pick among same-tagged wheels by local version label, not by the
torch here, so fa_attn must import with any wheel, say once which wheel it is, what it was built for,
what is here and the fix, and send every call to the fallback with the reason; and without torch it
says what to install instead of a bare traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from fa_attn.runtime import loader

from tests.select.fixture_index import kernel_manifest

RUNTIME = Path(__file__).resolve().parents[2] / "kernels" / "fa_attn"


def _other_minor() -> str:
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return f"{major}.{minor - 1}"


def _run(code: str, package_parent: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_torch_the_import_says_what_to_install() -> None:
    proc = _run("import sys; sys.modules['torch'] = None; import fa_attn", RUNTIME.parent)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fa_attn is a torch extension and torch is not installed")
    assert "fa install" in last
    assert "ModuleNotFoundError" not in proc.stderr  # the cause is not shown as a second traceback


def test_a_wheel_for_another_torch_imports_warns_once_and_falls_back(tmp_path: Path) -> None:
    package = tmp_path / "fa_attn"
    shutil.copytree(RUNTIME, package, ignore=shutil.ignore_patterns("__pycache__", "manifest.json"))
    other = _other_minor()
    man = kernel_manifest(12, other, True)
    (package / "manifest.json").write_text(json.dumps(man.to_json()))
    proc = _run(
        "import fa_attn\nfrom fa_attn import loader\nprint(loader.load_binding().code)",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch-version-mismatch"  # calls fall back with it, nothing loaded
    misfit = [line for line in proc.stderr.splitlines() if "FaWheelMisfitWarning" in line]
    assert len(misfit) == 1
    assert f"fa-attn {man.info.version} is built for torch {other}" in misfit[0]
    assert f"this machine has torch {torch.__version__}" in misfit[0]
    assert "[torch-version-mismatch]" in misfit[0]
    assert "`fa install`" in misfit[0]


def test_a_driver_below_the_wheels_floor_is_a_misfit() -> None:
    man = kernel_manifest(13, "2.10", None)  # the stable-ABI cu13 wheel: driver >= 580
    assert man.info.min_driver is not None
    found = loader.misfits(man, "550.54.15")
    assert [r.code for r in found] == ["driver-too-old"]
    assert man.info.min_driver in found[0].message
    assert loader.misfits(man, "590.10") == []
    assert loader.misfits(man, None) == []  # no driver: the stack's no-gpu, not this wheel's fault


def test_the_warning_names_both_sides_and_the_fix() -> None:
    man = kernel_manifest(13, "2.10", None)
    with pytest.warns(loader.FaWheelMisfitWarning) as caught:
        loader.warn_misfit(man, "550.54.15")
    text = str(caught[0].message)
    assert "torch 2.10 and later (stable ABI)" in text
    assert "CUDA 13 (driver >= " in text
    assert "driver 550.54.15" in text
    assert "update the NVIDIA driver" in text


def test_the_universal_wheel_and_a_fitting_wheel_are_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.warn_misfit(loader.UNIVERSAL_MANIFEST, None)
        loader.warn_misfit(kernel_manifest(12, "2.10", None), "575.51.03")
