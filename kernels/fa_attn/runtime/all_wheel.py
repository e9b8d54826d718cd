"""The all-wheel (variant "all"): every binding and every CUDA major's kernels of a platform in one wheel,
and the two choices it adds to a per-variant wheel's: which binding serves the running torch, and which
CUDA major's kernels serve this GPU and driver.

Neither choice has rules of its own. A binding serves a torch exactly when a per-variant wheel with that
binding would (decision.binding_problems: the stable form from its floor on, the aten form for its
minor and C++ ABI). A kernel set is read as the per-variant wheel of its CUDA major (`view`), and a
call is decided by decision.decide on that view, among the sets whose SASS this driver runs, preferring
what `fa install` prefers among per-variant wheels: the best path (SASS, then PTX, then the fallback),
then the installed torch's CUDA major, then the highest. So the runtime, `fa doctor` and `fa install`
give the same answers and the same reasons with the all-wheel as with the per-variant wheels.

Stdlib only, like decision.py: buildtool loads this same file (buildtool/core/runtime.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from ..reasons import Reason
from ..schema import BindingFile, KernelFile, KernelSet, WheelInfo
from ..versions import driver_at_least, parse_driver, torch_minor, torch_version
from .decision import STABLE, Call, Device, Dispatch, binding_problems, decide, driver_too_old, fallback

VARIANT = "all"  # WheelInfo.variant of the all-wheel; its version has no local label
# Best first: what `fa install` prefers among wheels (buildtool/compat/choose.py) and a kernel set here.
PATH_RANK = {"sass": 0, "ptx": 1, "fallback": 2}


def view(info: WheelInfo, binding: BindingFile, kernels: KernelSet) -> WheelInfo:
    """The all-wheel read as the per-variant wheel of one binding and one CUDA major's kernels."""
    return dataclasses.replace(
        info,
        cuda_major=kernels.cuda_major,
        toolkit=kernels.toolkit,
        min_driver=kernels.min_driver,
        ptx_min_driver=kernels.ptx_min_driver,
        sass=kernels.sass,
        ptx=kernels.ptx,
        torch=binding.torch,
        cxx11abi=binding.cxx11abi,
        binding=binding.file,
        binding_form=binding.binding_form,
        torch_tested=binding.torch_tested,
        coverage=kernels.coverage,
        arch_specific=kernels.arch_specific,
        arch_specific_features=kernels.arch_specific_features,
        bindings=(),
        kernel_sets=(),
    )


def _problems(
    info: WheelInfo, binding: BindingFile, torch: str, cxx11abi: bool | None, assumed: bool
) -> list[Reason]:
    return binding_problems(view(info, binding, info.kernel_sets[0]), torch, cxx11abi, assumed)


def binding_for(info: WheelInfo, torch: str, cxx11abi: bool | None, abi_assumed: bool = False) -> BindingFile:
    """The binding for this torch: one that serves it, else the nearest: the fewest problems, then one
    built for the torch's own minor, then the aten form (its problems name the torch to install)."""

    def nearness(b: BindingFile) -> tuple[int, bool, bool]:
        problems = _problems(info, b, torch, cxx11abi, abi_assumed)
        return len(problems), b.torch != torch_minor(torch), b.binding_form == STABLE

    return min(info.bindings, key=nearness)


def binding_reasons(
    info: WheelInfo, torch: str, cxx11abi: bool | None, abi_assumed: bool = False
) -> list[Reason]:
    """Why no binding of the all-wheel serves this torch ([] when one does): the nearest one's problems."""
    return _problems(info, binding_for(info, torch, cxx11abi, abi_assumed), torch, cxx11abi, abi_assumed)


def kernel_sets_for(info: WheelInfo, driver: str | None, torch_cuda: int | None) -> list[KernelSet]:
    """The kernel sets whose SASS this driver runs, the installed torch's CUDA major first, then the
    highest. An unknown driver runs the sets up to torch's CUDA major (torch runs, so the driver serves
    its major; any set when torch's major is unknown too)."""
    if driver is not None:
        usable = [k for k in info.kernel_sets if driver_at_least(driver, k.min_driver)]
    else:
        usable = [k for k in info.kernel_sets if torch_cuda is None or k.cuda_major <= torch_cuda]
    return sorted(usable, key=lambda k: (k.cuda_major != torch_cuda, -k.cuda_major))


def built_for(info: WheelInfo) -> str:
    """What the all-wheel serves, for a person: every binding's torch and every kernel set's CUDA major
    ("torch 2.5 (cxx11abi=false), 2.7 (cxx11abi=true) or 2.10 and later (stable ABI); CUDA 12 (driver
    >= 525.60.13) or 13 (driver >= 580.65.06)"), not the one binding nearest the running torch."""

    def binding(b: BindingFile) -> str:
        if b.binding_form == STABLE:
            return f"{b.torch} and later (stable ABI)"
        return b.torch + ("" if b.cxx11abi is None else f" (cxx11abi={str(b.cxx11abi).lower()})")

    def kernels(k: KernelSet) -> str:
        return f"{k.cuda_major} (driver >= {k.min_driver})"

    bindings = sorted(info.bindings, key=lambda b: (torch_version(b.torch), b.binding_form == STABLE))
    sets = sorted(info.kernel_sets, key=lambda k: k.cuda_major)
    return f"torch {_or_list([binding(b) for b in bindings])}; CUDA {_or_list([kernels(k) for k in sets])}"


def _or_list(items: list[str]) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def lowest_driver_set(info: WheelInfo) -> KernelSet:
    """The set with the oldest driver floor: the one a too-old driver is told about."""
    return min(info.kernel_sets, key=lambda k: parse_driver(k.min_driver))


def decide_call(
    info: WheelInfo,
    binding: BindingFile,
    device: Device,
    call: Call,
    torch_cuda: int | None,
    kernels: Sequence[KernelFile] | None = None,
    package_dir: Path = Path("."),
    load_binding: Callable[[], Reason | None] | None = None,
) -> tuple[Dispatch, WheelInfo]:
    """decision.decide for the all-wheel: the best answer over the kernel sets this driver runs, with
    the view (the per-variant reading) that gives it. A driver below every set's floor falls back with
    driver-too-old. load_binding is called last, only when the kernels would run."""
    sets = kernel_sets_for(info, device.driver, torch_cuda)
    if not sets:
        oldest = view(info, binding, lowest_driver_set(info))
        too_old = driver_too_old(oldest, device.driver)
        assert too_old is not None  # no set runs, so the driver is known and below every floor
        return fallback(too_old), oldest
    best: tuple[Dispatch, WheelInfo] | None = None
    for kernel_set in sets:
        chosen = view(info, binding, kernel_set)
        files = None if kernels is None else [k for k in kernels if k.cuda_major == kernel_set.cuda_major]
        answer = decide(chosen, device, call, files, package_dir)
        if best is None or PATH_RANK[answer.path] < PATH_RANK[best[0].path]:
            best = answer, chosen
    assert best is not None  # sets is not empty
    answer, chosen = best
    problem = load_binding() if load_binding is not None and answer.path != "fallback" else None
    return (fallback(problem), chosen) if problem is not None else (answer, chosen)
