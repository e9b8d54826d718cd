"""The all-wheel at run time (fa_attn/runtime/all_wheel.py through dispatch.decide): per call the kernel set of
this driver, files of that CUDA major, and Jetson Thor's sm 11.0 served by the CUDA 13 set that only
the newer NVRTC can make. The manifests are the build's own (buildtool/builder/all_wheel.py over the
fixture index's wheel specs); the GPU is described, this machine has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from fa_attn.runtime import all_wheel, dispatch
from fa_attn.runtime.decision import Call, Device

from buildtool.builder import all_wheel as builder
from buildtool.core import kernels_src
from tests.select.fixture_index import kernel_spec

RELEASE_SASS = ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")


def manifest(thor: bool = False):
    sass13 = (*RELEASE_SASS[:-1], "11.0", "12.0") if thor else RELEASE_SASS
    specs = [
        kernel_spec(11, "2.7", True),
        kernel_spec(12, "2.7", True),
        kernel_spec(12, "2.10", None, tested=("2.10", "2.13")),
        kernel_spec(13, "2.10", None, sass=sass13, tested=("2.10", "2.13")),
    ]
    (spec,) = builder.all_wheel_specs(specs, "0.1.0")
    return builder.manifest(spec, kernels_src.tiles())


def test_the_plan_keeps_cuda_11_and_12_and_of_13_only_what_12_cannot_target():
    sets = {k.cuda_major: (k.sass, k.ptx) for k in manifest().info.kernel_sets}
    assert sets == {11: (RELEASE_SASS[:4], None), 12: (RELEASE_SASS, "12.0")}
    thor = {k.cuda_major: (k.sass, k.ptx) for k in manifest(thor=True).info.kernel_sets}
    assert thor[13] == (("11.0",), None)  # CUDA 12 cannot target Thor; its 12.0 PTX is CUDA 12's


@pytest.mark.parametrize(
    ("driver", "major"),
    [("550.54.15", 12), ("520.61.05", 11)],  # CUDA 12 needs 525.60.13; CPU torch: no CUDA of its own
)
def test_dispatch_picks_the_kernel_set_this_driver_runs(driver: str, major: int):
    man = manifest()
    facts = dispatch.CallFacts(Device("cuda", "8.0", 101376), Call("bf16", 128))
    answer = dispatch.decide(facts, man, lambda: None, driver=lambda: driver, package_dir=Path("/pkg"))
    assert (answer.path, answer.arch, answer.reasons) == ("sass", "8.0", ())
    assert answer.fwd is not None
    assert answer.fwd.module.startswith(f"/pkg/kernels/cu{major}/sm_80/fwd_bf16_d128")


def test_thor_runs_cuda_13s_sass_from_driver_580_and_falls_back_below():
    man = manifest(thor=True)
    binding = all_wheel.binding_for(man.info, "2.13.0", True)
    call = Call("bf16", 128)
    answer, view = all_wheel.decide_call(
        man.info, binding, Device("cuda", "11.0", None, "580.65.06"), call, 13
    )
    assert (answer.path, answer.arch, view.cuda_major) == ("sass", "11.0", 13)
    older, view = all_wheel.decide_call(
        man.info, binding, Device("cuda", "11.0", None, "575.51.03"), call, 12
    )
    assert older.path == "fallback"  # CUDA 12 has no sm 11.0 SASS; its 12.0 PTX is newer than the GPU
    assert [r.code for r in older.reasons] == ["arch-unsupported"]


def test_import_time_check_reads_it_as_the_wheel_for_this_torch():
    """loader.misfits (the wrong-wheel warning at import): the all-wheel fits this torch (2.13, its
    stable-ABI binding) on any driver its oldest CUDA major runs, and says driver-too-old below that."""
    from fa_attn.runtime import loader

    man = manifest()
    assert loader.misfits(man, "550.54.15") == []
    assert loader.misfits(man, "470.82.01") == []  # CUDA 11's floor is 450.80.02
    assert [r.code for r in loader.misfits(man, "440.33.01")] == ["driver-too-old"]
    assert loader.as_this_torch(man).info.binding == "bindings/libfa_attn_ops-torch2.10plus.so"


@pytest.mark.parametrize("torch_here", ["2.6.0", "2.9.1"])
def test_the_misfit_warning_names_every_torch_the_all_wheel_serves(monkeypatch, torch_here: str):
    """Round three: under torch 2.6 or 2.9 the all-wheel warned "built for torch 2.5" (the binding
    nearest the running torch), although it serves 2.5, 2.7 and 2.10 on."""
    import warnings

    import torch
    from fa_attn.runtime import loader

    monkeypatch.setattr(torch, "__version__", torch_here)  # this machine has one torch: describe another
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.warn_misfit(manifest(), "550.54.15")
    (said,) = [str(w.message) for w in caught if w.category is loader.FaWheelMisfitWarning]
    assert "built for torch 2.7 (cxx11abi=true) or 2.10 and later (stable ABI); CUDA 11" in said
    assert f"torch {torch_here}" in said
    assert "[torch-version-mismatch" in said or "[torch-below-floor" in said


def test_a_missing_manifest_beside_kernels_is_a_damaged_install_not_the_universal_wheel(tmp_path: Path):
    """Round three: an all-wheel without its manifest read "this fa-attn is the universal wheel"."""
    from fa_attn.runtime import loader

    (tmp_path / "bindings").mkdir()
    man, problem = loader.read_manifest(tmp_path / "manifest.json")
    assert man == loader.UNIVERSAL_MANIFEST
    assert problem is not None
    assert "manifest.json is missing, but this fa-attn holds bindings: a damaged install" in problem
    reason = loader.static_binding_problem(man, problem)
    assert reason is not None
    assert "universal wheel" not in reason.message.replace("not the universal wheel", "")
    assert reason.fix == "reinstall fa-attn"
    (tmp_path / "bindings").rmdir()
    assert loader.read_manifest(tmp_path / "manifest.json") == (loader.UNIVERSAL_MANIFEST, None)


@pytest.mark.parametrize("hazard", ["symlink", "fifo", "dev_zero", "deep", "folder"])
def test_the_manifest_is_read_only_as_fas_own_file(tmp_path: Path, hazard: str):
    from fa_attn.runtime import loader

    from tests.hostile import plant

    path = tmp_path / "manifest.json"
    intact = plant(path, hazard)
    man, problem = loader.read_manifest(path)  # a FIFO would hang the import; /dev/zero: MemoryError
    assert man == loader.UNIVERSAL_MANIFEST
    assert problem is not None
    assert problem.startswith(f"{path}: ")
    intact()


def test_a_manifest_in_another_users_environment_is_read(tmp_path: Path):
    """A shared environment installed by another user: its manifest is as trusted as its code."""
    import json
    import os

    from fa_attn.runtime import loader

    from tests.hostile import OTHER_UID

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    package = tmp_path / "fa_attn"
    package.mkdir()
    data = manifest().to_json()
    (package / "manifest.json").write_text(json.dumps(data))
    for path in (package / "manifest.json", package):
        os.chown(path, OTHER_UID, OTHER_UID)
    assert loader.read_manifest(package / "manifest.json") == (loader.Manifest.from_json(data), None)
