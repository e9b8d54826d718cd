"""Why a call does not run on fa's kernels, or a wheel does not fit a machine: a `Reason` with a stable
code, a message with the numbers involved, and one line a person can act on.

Every code is registered here, once, in the order reports list them (the platform first, then torch,
the driver, the GPU, the call); docs/reasons.md shows the same table (a test keeps the two equal).
Stdlib only: the runtime uses it, and buildtool loads this same file (buildtool/core/runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# Who gives a code: `fa doctor` before anything is installed (wheel fit, the stack beneath fa), or the
# decision shared by doctor and the runtime (the kernels' reach), or only a live call.
WHEEL = "wheel fit"
STACK = "stack"
KERNELS = "kernels"
CALL = "call time"

# code -> (who gives it, what it means). Adding a code: a line here, and the same line in docs/reasons.md.
CODES: dict[str, tuple[str, str]] = {
    "no-gpu": (STACK, "no NVIDIA driver or GPU: every call falls back"),
    "unsupported-platform": (WHEEL, "the wheel is for another OS or CPU"),
    "glibc-too-old": (WHEEL, "the wheel's manylinux tag needs a newer glibc than the system's"),
    "python-unsupported": (WHEEL, "the wheel's tags or Requires-Python exclude this Python"),
    "torch-missing": (WHEEL, "torch is not installed (fa-attn is a torch extension)"),
    "torch-not-cuda": (STACK, "torch is a CPU-only or ROCm build"),
    "torch-version-mismatch": (WHEEL, "the binding is built for another torch minor, or torch is older than fa supports"),
    "torch-below-floor": (WHEEL, "the binding is the stable-ABI form for torch >= its floor, and torch is older"),
    "torch-newer-than-tested": (WHEEL, "a warning, not a refusal: a stable-ABI wheel on a torch newer than any it was tested with"),
    "cxx11abi-mismatch": (WHEEL, "the binding's C++ ABI is not torch's"),
    "driver-too-old": (WHEEL, "the driver is older than the wheel's CUDA major needs"),
    "torch-driver-too-old": (STACK, "the driver is older than torch's own CUDA needs: torch cannot use the GPU"),
    "arch-unsupported": (KERNELS, "no kernel image runs on this GPU, or it needs more shared memory than the GPU has"),
    "ptx-driver-too-old": (KERNELS, "only PTX would run, and the driver is too old to JIT it"),
    "dtype-unsupported": (KERNELS, "no kernel for this dtype here (fp16 and bf16 only; bf16 from sm 8.0)"),
    "head-dim-unsupported": (KERNELS, "no kernel for this head dim (at most 256)"),
    "backward-unsupported": (KERNELS, "the forward is covered but the backward is not (KV-cache layouts: never)"),
    "arch-specific-unsupported": (KERNELS, "the arch-specific units (sm_90a) do not serve the call (its features, the backward, its head dim): the plain arch's run it"),
    "arch-specific-unchecked": (CALL, "the arch-specific units (sm_90a) have no passing check for this kind of call and none can run now (graph capture, torch.compile, FA_SELF_CHECK=off): the plain arch's run it"),
    "arch-specific-check-failed": (CALL, "the arch-specific units (sm_90a) failed their check on this GPU for this kind of call: the plain arch's run it"),
    "feature-unsupported": (CALL, "the call uses a feature the kernels do not implement (dropout, alibi, ...)"),
    "sinks-unsupported": (CALL, "the call passes attention sinks (gpt-oss s_aux), which the kernels do not compute"),
    "binding-unavailable": (CALL, "no binding (the universal wheel), or it failed to load"),
    "device-not-cuda": (CALL, "the tensors are not on an NVIDIA GPU"),
    "self-check-failed": (CALL, "the unit failed its check on this GPU (first use in this process, or a record of `fa check`)"),
    "not-verified": (CALL, "the unit has no passing check for this kind of call and none can run now: FA_SELF_CHECK=strict inside graph capture or torch.compile, or a transient error (out of memory) during its check"),
    "slower-than-sdpa": (CALL, "`fa check --bench` measured the unit slower than SDPA on this GPU at this length"),
}  # fmt: skip


@dataclass(frozen=True)
class Reason:
    code: str  # one of CODES
    message: str  # what is wrong, with the numbers that matter
    fix: str  # one line a person can act on

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"reason code {self.code!r} is not registered in fa_attn/reasons.py CODES")


_ORDER = {code: i for i, code in enumerate(CODES)}


def code_order(code: str) -> int:
    """Where a code sorts in a report (CODES' order)."""
    return _ORDER[code]
