"""`fa install --build` honours --arch and --cuda or refuses them with the reason (compat/build_here.py),
and the wheel it builds carries a local label, never the release wheel's (builder/plan.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.builder.matrix import MatrixError
from buildtool.compat import build_here
from buildtool.compat.env import Env
from buildtool.compat.probe import probe
from tests.select.conftest import env
from tests.select.tiny_wheels import build_wheelhouse

H100 = [{"name": "NVIDIA H100", "sm": "9.0", "memory_mib": 81920}]
L4 = [{"name": "NVIDIA L4", "sm": "8.9", "memory_mib": 23034}]
TORCH_213 = {"version": "2.13.0+cu130", "cuda": "13.0", "hip": None, "cxx11abi": True}
NO_GPU = env(gpus=[], driver=None, torch={**TORCH_213, "version": "2.13.0+cpu", "cuda": None})


def _target(machine: Env, arch: str | None, cuda: int | None) -> build_here.LocalTarget:
    return build_here.target(machine, arch, cuda, None)


def test_arch_and_cuda_are_what_gets_built() -> None:
    t = _target(env(gpus=L4, torch=TORCH_213, driver={"version": "580.65.06"}), "8.6", 12)
    (wheel,) = build_here.plan_for(t, None).wheels
    assert (wheel.cuda_major, wheel.sass, wheel.ptx) == (12, ("8.6",), None)


def test_the_wheel_built_for_one_gpu_carries_a_local_label() -> None:
    t = _target(env(gpus=H100, torch=TORCH_213, driver={"version": "580.65.06"}), None, None)
    (wheel,) = build_here.plan_for(t, None).wheels
    assert wheel.version.endswith("+cu13torch2.10plus.local.sm90")


def test_without_a_gpu_any_arch_is_built_as_asked() -> None:
    assert _target(NO_GPU, "12.0", 13).arch == "12.0"


@pytest.mark.parametrize(("arch", "gpus"), [("8.0", H100), ("9.0", L4), ("8.9", [{**L4[0], "sm": "8.6"}])])
def test_an_arch_whose_sass_cannot_run_on_gpu_0_is_refused(arch: str, gpus: list) -> None:
    machine = env(gpus=gpus, torch=TORCH_213, driver={"version": "580.65.06"})
    with pytest.raises(MatrixError) as err:
        _target(machine, arch, None)
    assert (err.value.field, f"pass --arch {gpus[0]['sm']}" in err.value.fix) == ("--arch", True)


def test_a_cuda_major_this_driver_cannot_run_is_refused_naming_one_it_can() -> None:
    machine = env(gpus=H100, torch=TORCH_213, driver={"version": "550.54.15"})
    with pytest.raises(MatrixError) as err:
        _target(machine, None, 13)
    assert (err.value.field, err.value.fix.startswith("pass --cuda 12")) == ("--cuda", True)


def test_a_cuda_major_without_a_toolkit_is_refused() -> None:
    with pytest.raises(MatrixError, match="CUDA 14 has no pinned toolkit"):
        _target(NO_GPU, "9.0", 14)


def test_a_bad_arch_is_refused() -> None:
    with pytest.raises(MatrixError, match="'sm_90' is not a compute capability"):
        _target(NO_GPU, "sm_90", 12)


REPO = Path(__file__).resolve().parents[2]


def _fa(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "buildtool.cli", *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_the_cli_refuses_with_exit_2_and_the_reason(tmp_path: Path) -> None:
    done = _fa("install", "--build", "--cuda", "14", "--arch", "8.0", cwd=tmp_path)
    assert (done.returncode, "--cuda" in done.stderr, "fix:" in done.stderr) == (2, True, True), done.stderr


def test_with_arch_or_cuda_a_fitting_wheel_in_the_index_is_not_taken_instead(tmp_path: Path) -> None:
    """The issue's case: a wheel in the index fits, and --build --arch/--cuda used to install it,
    ignoring both; now the build they describe runs (here: --dry-run says so, and builds nothing)."""
    torch = probe().torch
    assert torch is not None
    house = build_wheelhouse(tmp_path / "wheels", torch.minor, bool(torch.cxx11abi))
    args = ("install", "--wheels", str(house), "--dry-run", "--json")
    plain = json.loads(_fa(*args, cwd=tmp_path).stdout)
    asked = json.loads(_fa(*args, "--build", "--cuda", "12", "--arch", "8.0", cwd=tmp_path).stdout)
    assert plain["message"].startswith("dry run: nothing installed")
    assert asked["message"].startswith("dry run: nothing built or installed")


def _dry(house: Path, *extra: str, cwd: Path) -> dict:
    done = _fa("install", "--wheels", str(house), "--dry-run", "--json", *extra, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_wheel_that_fits_and_holds_what_arch_and_cuda_ask_for_is_installed_not_rebuilt(
    tmp_path: Path,
) -> None:
    """Issue 37: --build built and replaced although the index's wheel fits; it builds only when
    nothing fits (here the chosen cu13 wheel holds SASS for 8.0), and --rebuild builds anyway."""
    torch = probe().torch
    assert torch is not None
    house = build_wheelhouse(tmp_path / "wheels", torch.minor, bool(torch.cxx11abi))
    chosen = _dry(house, cwd=tmp_path)
    assert chosen["variant"].startswith("cu13")
    kept = _dry(house, "--build", "--cuda", "13", "--arch", "8.0", cwd=tmp_path)
    assert kept["selected"] == chosen["selected"]
    assert kept["message"].startswith("dry run: nothing installed")
    for extra in (("--rebuild",), ("--rebuild", "--cuda", "13", "--arch", "8.0")):
        forced = _dry(house, *extra, cwd=tmp_path)
        assert forced["message"].startswith("dry run: nothing built or installed"), extra
