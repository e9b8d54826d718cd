"""fa doctor and a live call decide with the same code (fa_attn/runtime/decision.py): asked about the same
wheel, GPU and call, they give the same path, arch, head dim and reason codes. The runtime here is
fa_attn.dispatch.decide as a live call runs it, on the manifest the build writes for the wheel, with the
GPU's facts a CUDA device would report (its shared memory: the kernel table's figure for its arch)."""

from __future__ import annotations

import itertools

import pytest
from fa_attn.runtime import dispatch
from fa_attn.runtime.decision import Call, Device, Dispatch
from fa_attn.runtime.dispatch import CallFacts

from buildtool.compat.choose import Request, select
from buildtool.compat.env import Env
from buildtool.compat.wheel_index import entry_from_dict
from buildtool.core import kernels_src
from tests.select.conftest import env
from tests.select.fixture_index import kernel_entry, kernel_manifest

SMEM = kernels_src.tiles().SMEM_LIMIT

# (a name, the wheel's SASS archs and PTX): a release wheel, and a build for sm 8.0 only.
WHEELS = {"cu12": {}, "sm80-only": {"sass": ("8.0",), "ptx": None}}
GPUS = ("7.5", "8.0", "8.6", "8.9", "9.0", "12.0", "13.0")
CALLS = [
    Request(dtype, head_dim, backward)
    for dtype, head_dim, backward in itertools.product(
        ("fp16", "bf16", "fp32"), (64, 100, 192, 256, 512), (False, True)
    )
]


def env_with(sm: str, smem: int | None = None) -> Env:
    """The shared test machine with torch 2.8 (the wheels' minor), a 580 driver and one GPU of `sm`
    (reporting `smem` bytes of opt-in shared memory per block; None: the description does not say)."""
    torch = {"version": "2.8.0+cu128", "cuda": "12.8", "hip": None, "cxx11abi": True}
    gpu = {"name": f"sm {sm}", "sm": sm, "memory_mib": None}
    gpus = [gpu if smem is None else {**gpu, "smem_per_block": smem}]
    return env(torch=torch, driver={"version": "580.65.06"}, gpus=gpus)


def doctor_dispatch(wheel: str, sm: str, request: Request, smem: int | None = None) -> Dispatch:
    entry = entry_from_dict(kernel_entry(12, "2.8", True, **WHEELS[wheel]), wheel)
    selection = select([entry], env_with(sm, smem), request)
    assert selection.selected == entry  # it fits: only the call and the GPU decide
    (gpu,) = selection.gpus
    return gpu.runtime


def runtime_dispatch(wheel: str, sm: str, request: Request, smem: int | None = None) -> Dispatch:
    manifest = kernel_manifest(12, "2.8", True, **WHEELS[wheel])
    limit = SMEM.get(sm) if smem is None else smem
    facts = CallFacts(Device("cuda", sm, limit), Call(request.dtype, request.head_dim, request.backward))
    return dispatch.decide(facts, manifest, load_binding=lambda: None, driver=lambda: "580.65.06")


def answer(d: Dispatch) -> tuple:
    return d.path, d.arch, d.head_dim, [r.code for r in d.reasons], d.tiles, [r.code for r in d.notes]


def doctor_answer(wheel: str, sm: str, request: Request, smem: int | None = None) -> tuple:
    return answer(doctor_dispatch(wheel, sm, request, smem))


def runtime_answer(wheel: str, sm: str, request: Request, smem: int | None = None) -> tuple:
    return answer(runtime_dispatch(wheel, sm, request, smem))


@pytest.mark.parametrize("wheel", WHEELS)
@pytest.mark.parametrize("sm", GPUS)
def test_doctor_says_what_the_runtime_does(wheel: str, sm: str) -> None:
    for request in CALLS:
        assert doctor_answer(wheel, sm, request) == runtime_answer(wheel, sm, request), request


def test_head_dim_256_on_sm86_with_an_sm80_only_wheel_runs_a_smaller_tile_in_both() -> None:
    """The sm80 kernels of head dim 256 ask for more shared memory than an sm86 part has; the wheel
    carries the 99 KB parts' tiles beside them (tiles.alternative_units), and both sides pick those.
    main fell back here (arch-unsupported)."""
    request = Request("bf16", 256, True)
    doctor = doctor_answer("sm80-only", "8.6", request)
    assert doctor == runtime_answer("sm80-only", "8.6", request)
    assert doctor[:4] == ("sass", "8.0", 256, [])
    tiles = kernels_src.tiles()
    chosen = dict(doctor[4])
    assert chosen["fwd"] == tiles.default_tile("8.6", "fwd", 256).label
    assert chosen["bwd"] == tiles.default_tile("8.6", "bwd", 256).label
    on_a100 = dict(doctor_answer("sm80-only", "8.0", request)[4])
    assert on_a100["fwd"] == tiles.default_tile("8.0", "fwd", 256).label


def _alternative_needs() -> list[tuple[Request, str, int]]:
    """(a call, the direction that limits it, the least shared memory it runs in) for every bf16 head
    dim bucket where the sm80-only wheel carries an alternative tile, forward-only and with backward,
    from the manifest the packager writes: the call runs in the largest of its directions' least needs."""
    coverage = kernel_manifest(12, "2.8", True, **WHEELS["sm80-only"]).info.coverage
    rows = [r for r in coverage if r.dtype == "bf16" and r.direction in ("fwd", "bwd")]
    out = []
    for d in sorted({max(r.head_dims) for r in rows}):
        serving = {k: [r for r in rows if r.direction == k and max(r.head_dims) == d] for k in ("fwd", "bwd")}
        if all(len(tiles) < 2 for tiles in serving.values()):
            continue
        for backward in (False, True):
            least = {k: min(r.smem_needed or 0 for r in tiles) for k, tiles in serving.items() if tiles}
            if not backward:
                least.pop("bwd", None)
            direction = max(least, key=lambda k: least[k])
            out.append((Request("bf16", d, backward), direction, least[direction]))
    return out


def test_the_sm80_only_wheel_carries_alternatives() -> None:
    assert {(r.head_dim, r.backward) for r, _, _ in _alternative_needs()} >= {
        (256, False),
        (256, True),
        (128, True),
    }


@pytest.mark.parametrize(("request_", "direction", "need"), _alternative_needs())
def test_limits_just_above_and_below_each_alternative(request_: Request, direction: str, need: int) -> None:
    """A GPU reporting exactly the alternative's need runs it, in doctor and at run time; one byte less
    falls back in both, the reason naming the need and the GPU's limit."""
    at = doctor_answer("sm80-only", "8.6", request_, need)
    assert at == runtime_answer("sm80-only", "8.6", request_, need)
    assert at[0] == "sass"
    below = doctor_dispatch("sm80-only", "8.6", request_, need - 1)
    assert answer(below) == runtime_answer("sm80-only", "8.6", request_, need - 1)
    assert below.path == "fallback"
    message = below.reasons[-1].message
    assert f"{direction} kernels" in message
    assert str(need) in message
    assert f"offers {need - 1}" in message
