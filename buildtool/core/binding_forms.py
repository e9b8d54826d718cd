"""The two forms of the host binding (kernels/binding/forms/), and the facts that decide between them.

- `aten`: TORCH_LIBRARY_IMPL against ATen's C++ API. Its binary uses C++ symbols of libc10 and
  libtorch_cpu, which change between torch minors and with the C++ ABI: one build per (torch minor,
  C++ ABI, CPU), good for exactly that torch.
- `stable`: STABLE_TORCH_LIBRARY_IMPL over torch's C shim only (extern "C" functions, versioned by
  TORCH_TARGET_VERSION). Built once per CPU against the headers of its floor, it loads into that torch
  and every later one, whatever their C++ ABI (torch's promise for the stable ABI; fa tests the minors
  its matrix lists).

Read by the matrix (the `stable_abi` key), the plan, the binding build and the selection.
"""

from __future__ import annotations

from buildtool.core.runtime import versions

ATEN = "aten"
STABLE = "stable"
FORMS = (ATEN, STABLE)

# The oldest floor the stable form can have: the op schemas' `str` and `int[]` arguments box as
# std::string / std::vector only from TORCH_VERSION_2_10_0 (torch/csrc/stable/stableivalue_conversions.h),
# and torch::stable::empty/new_empty/view/sum, which the operators allocate and reduce with, are 2.10's.
STABLE_ABI_MIN = "2.10"


def target_version(floor: str) -> str:
    """TORCH_TARGET_VERSION for a floor minor, as torch/csrc/stable/version.h encodes it (major in
    bits 56-63, minor in 48-55): "2.10" -> "0x020a000000000000"."""
    major, minor = versions.torch_version(floor)
    return f"0x{(major << 56) | (minor << 48):016x}"


def stable_label(cuda_major: int, floor: str) -> str:
    """The variant of a stable-ABI wheel: "cu12torch2.10plus", read "CUDA 12, torch 2.10 and newer".
    A PEP 440 local label takes only letters, digits and dots (no "+" or ">="), and the per-minor labels
    are "cu12torch2.7": "plus" keeps their shape and says what a person needs to know."""
    return f"cu{cuda_major}torch{floor}plus"
