"""fa doctor and a live call decide with the same code (fa_attn/decision.py): asked about the same
wheel, GPU and call, they give the same path, arch, head dim and reason codes. The runtime here is
fa_attn.dispatch.decide as a live call runs it, on the manifest the build writes for the wheel, with the
GPU's facts a CUDA device would report (its shared memory: the kernel table's figure for its arch)."""

from __future__ import annotations

import itertools

import pytest
from fa_attn import dispatch
from fa_attn.decision import Call, Device
from fa_attn.dispatch import CallFacts

from buildtool.compat.choose import Request, select
from buildtool.compat.env import Env, Gpu
from buildtool.compat.wheel_index import entry_from_dict
from buildtool.core import kernels_src
from buildtool.core.installed import TorchInfo
from tests.select.fixture_index import kernel_entry, kernel_manifest

SMEM = kernels_src.tiles().SMEM_LIMIT

# (a name, the wheel's SASS archs and PTX): a release wheel, and the sm80-only build.
WHEELS = {"cu12": {}, "sm80-only": {"sass": ("8.0",), "ptx": None}}
GPUS = ("7.5", "8.0", "8.6", "8.9", "9.0", "12.0", "13.0")
CALLS = [
    Request(dtype, head_dim, backward)
    for dtype, head_dim, backward in itertools.product(
        ("fp16", "bf16", "fp32"), (64, 100, 192, 256, 512), (False, True)
    )
]


def env_with(sm: str, driver: str = "580.65.06") -> Env:
    torch = TorchInfo(version="2.8.0+cu128", cuda="12.8", hip=None, cxx11abi=True)
    gpu = Gpu(name=f"sm {sm}", sm=sm, memory_mib=None)
    return Env(
        os="linux", arch="x86_64", glibc="2.35", python="3.11", torch=torch, driver=driver, gpus=(gpu,)
    )


def doctor_answer(wheel: str, sm: str, request: Request) -> tuple:
    entry = entry_from_dict(kernel_entry(12, "2.8", True, **WHEELS[wheel]), wheel)
    selection = select([entry], env_with(sm), request)
    assert selection.selected == entry  # it fits: only the call and the GPU decide
    (gpu,) = selection.gpus
    answer = gpu.runtime
    return answer.path, answer.arch, answer.head_dim, [r.code for r in answer.reasons]


def runtime_answer(wheel: str, sm: str, request: Request) -> tuple:
    manifest = kernel_manifest(12, "2.8", True, **WHEELS[wheel])
    facts = CallFacts(
        Device("cuda", sm, SMEM.get(sm)), Call(request.dtype, request.head_dim, request.backward)
    )
    answer = dispatch.decide(facts, manifest, load_binding=lambda: None, driver=lambda: "580.65.06")
    return answer.path, answer.arch, answer.head_dim, [r.code for r in answer.reasons]


@pytest.mark.parametrize("wheel", WHEELS)
@pytest.mark.parametrize("sm", GPUS)
def test_doctor_says_what_the_runtime_does(wheel: str, sm: str) -> None:
    for request in CALLS:
        assert doctor_answer(wheel, sm, request) == runtime_answer(wheel, sm, request), request


def test_head_dim_256_on_sm86_with_an_sm80_only_wheel_falls_back_in_both() -> None:
    """The sm80 kernel of head dim 256 asks for more shared memory than an sm86 part has."""
    request = Request("bf16", 256, False)
    doctor = doctor_answer("sm80-only", "8.6", request)
    assert doctor == runtime_answer("sm80-only", "8.6", request)
    assert doctor[0] == "fallback" and doctor[3] == ["arch-unsupported"]
    assert doctor_answer("sm80-only", "8.6", Request("bf16", 128, False))[:2] == ("sass", "8.0")
