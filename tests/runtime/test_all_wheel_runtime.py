"""The all-wheel at run time (fa_attn/all_wheel.py through dispatch.decide): per call the kernel set of
this driver, files of that CUDA major, and Jetson Thor's sm 11.0 served by the CUDA 13 set that only
the newer NVRTC can make. The manifests are the build's own (buildtool/builder/all_wheel.py over the
fixture index's wheel specs); the GPU is described, this machine has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from fa_attn import all_wheel, dispatch
from fa_attn.decision import Call, Device

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
    from fa_attn import loader

    man = manifest()
    assert loader.misfits(man, "550.54.15") == []
    assert loader.misfits(man, "470.82.01") == []  # CUDA 11's floor is 450.80.02
    assert [r.code for r in loader.misfits(man, "440.33.01")] == ["driver-too-old"]
    assert loader.as_this_torch(man).info.binding == "bindings/libfa_attn_ops-torch2.10plus.so"
