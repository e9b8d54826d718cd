"""Which path a live call takes (our kernels from SASS or PTX, or the SDPA fallback) and why.

`decide` is a pure function of the call's facts and the wheel's manifest (the binding loader and the
driver probe are passed in), so every rule is testable on a CPU. `facts_of` reads the facts from the
tensors. `report` is the only side effect: it records the last decision, warns once per reason code,
and raises instead when FA_STRICT=1.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import kernel_choice
from .inputs import AttnCall
from .kernel_choice import Reason
from .ops import KernelLaunch
from .schema import Manifest


class FaFallbackWarning(UserWarning):
    """A call ran on torch SDPA instead of fa's kernels (warned once per reason code)."""


class FaFallbackError(RuntimeError):
    """FA_STRICT=1 and a call would have fallen back."""


@dataclass(frozen=True)
class Dispatch:
    path: str  # "sass" | "ptx" | "fallback"
    arch: str | None  # arch of the image that runs; None on fallback
    reasons: tuple[Reason, ...]  # why fallback (empty otherwise)
    head_dim: int | None = None  # head dim the kernels run with (padded to a multiple of 8)
    fwd: KernelLaunch | None = field(default=None, repr=False)  # what the ops launch
    bwd: KernelLaunch | None = field(default=None, repr=False)  # None: no backward will run


@dataclass(frozen=True)
class CallFacts:
    device_type: str  # "cuda", "cpu", "mps", ...
    rocm: bool  # torch built for ROCm: "cuda" tensors live on an AMD GPU
    sm: str | None  # compute capability of the tensors' GPU, "8.6"
    dtype: str  # "fp16" | "bf16" | "fp32" | "fp64"
    head_dim: int
    backward: bool  # autograd will need the backward
    features: frozenset[str]  # kernel features the call uses (names of tiles.FEATURES)
    smem_per_block: int | None = None  # the GPU's opt-in shared memory per block, bytes (None: unknown)


def features_of(call: AttnCall, backward: bool) -> frozenset[str]:
    """The kernel features a call needs; the names are those K1 lists in tiles.FEATURES."""
    used = set()
    if call.causal:
        used.add("causal")
    if call.heads != call.heads_k:
        used.add("gqa")
    if call.varlen is not None:
        used.add("varlen")
    if call.has_window:
        used.add("window")
    if call.softcap > 0:
        used.add("softcap")
    if call.alibi_slopes is not None:
        used.add("alibi")
    if call.dropout_p > 0:
        used.add("dropout")
    if call.deterministic and backward:
        used.add("deterministic")
    used |= call.kv_features  # key/value layouts: paged_kv, seqused_k, leftpad_k, cache_batch_idx
    return frozenset(used)


def facts_for(
    device_type: str,
    device_index: int | None,
    dtype: str,
    head_dim: int,
    backward: bool,
    features: frozenset[str],
) -> CallFacts:
    """The facts of a live call; the compute capability is read from its GPU (a range, compared later)."""
    rocm = bool(torch.version.hip)
    sm, smem = None, None
    if device_type == "cuda" and not rocm:
        device = torch.device("cuda") if device_index is None else torch.device("cuda", device_index)
        major, minor = torch.cuda.get_device_capability(device)
        sm = f"{major}.{minor}"
        smem = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    return CallFacts(device_type, rocm, sm, dtype, head_dim, backward, features, smem)


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version without NVML (compat-facts.md); None if unknown (e.g. WSL2)."""
    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError:
            continue
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    return None


def _fallback(*reasons: Reason) -> Dispatch:
    return Dispatch("fallback", None, tuple(reasons))


def decide(
    facts: CallFacts,
    manifest: Manifest,
    load_binding: Callable[[], Reason | None],
    driver: Callable[[], str | None] = driver_version,
    package_dir: Path = Path("."),
) -> Dispatch:
    """package_dir: where the manifest's kernel `file`s are (the installed fa_attn/ directory)."""
    if facts.device_type != "cuda" or facts.rocm:
        where = "ROCm (AMD GPU)" if facts.rocm else facts.device_type
        return _fallback(
            Reason(
                "device-not-cuda",
                f"the tensors are on {where}; fa's kernels are NVIDIA-only",
                "move q, k, v to an NVIDIA GPU (.cuda()) to use fa's kernels",
            )
        )
    reasons = []
    if facts.dtype == "fp64":  # kernel_choice knows fp16/bf16/fp32; fp64 is a runtime-only case
        reasons.append(
            Reason(
                "dtype-unsupported",
                "fp64 attention has no kernel (fp16 and bf16 only)",
                "cast q, k, v to torch.bfloat16 or torch.float16",
            )
        )
    info = manifest.info
    supported = frozenset(info.features)
    for feature in sorted(facts.features - supported):
        reasons.append(
            Reason(
                "feature-unsupported",
                f"{feature} is not supported by fa's kernels (they support: "
                f"{', '.join(sorted(supported)) or 'none listed in the manifest'})",
                f"call without {feature} to use the kernels",
            )
        )
    dtype = "fp32" if facts.dtype == "fp64" else facts.dtype
    choice = kernel_choice.choose(
        info, facts.sm, dtype, facts.head_dim, facts.backward, driver() if info.ptx else None
    )
    codes = {reason.code for reason in reasons}  # e.g. fp64 already has its dtype-unsupported
    reasons.extend(reason for reason in choice.reasons if reason.code not in codes)
    if reasons:
        return _fallback(*reasons)
    fwd = kernel_choice.kernel_entry(manifest.kernels, choice, dtype, "fwd")
    bwd = kernel_choice.kernel_entry(manifest.kernels, choice, dtype, "bwd") if facts.backward else None
    if fwd is None or (facts.backward and bwd is None):
        return _fallback(
            Reason(
                "binding-unavailable",
                f"the manifest covers {dtype} head dim {choice.head_dim} on {choice.arch} "
                "but lists no kernel file for it",
                "reinstall fa-attn (damaged manifest)",
            )
        )
    # SASS of X.Y also runs on X.Z (Z > Y), but its tiles were sized for X.Y's shared memory: an 8.0
    # cubin (up to 163 KB) on an 8.6 part (99 KB) would fail at launch. Fall back instead.
    need = max(kernel.smem_bytes for kernel in (fwd, bwd) if kernel)
    if facts.smem_per_block is not None and need > facts.smem_per_block:
        return _fallback(
            Reason(
                "arch-unsupported",
                f"the {choice.arch} kernels for {dtype} head dim {choice.head_dim} need {need} bytes of shared "
                f"memory per block; this GPU (sm {facts.sm}) offers {facts.smem_per_block}",
                f"use a wheel with SASS for sm {facts.sm} (fa build with archs including {facts.sm})",
            )
        )
    problem = load_binding()
    if problem is not None:
        return _fallback(problem)
    return Dispatch(
        choice.path,
        choice.arch,
        (),
        choice.head_dim,
        KernelLaunch.from_manifest(fwd, package_dir),
        KernelLaunch.from_manifest(bwd, package_dir) if bwd else None,
    )


_report_lock = threading.Lock()
_warned: set[str] = set()
_last: list[Dispatch] = []


def strict() -> bool:
    return os.environ.get("FA_STRICT", "") not in ("", "0")


def report(dispatch: Dispatch) -> None:
    """Records the decision for last_dispatch(); warns once per reason code, or raises under FA_STRICT.

    While torch.compile traces a call this runs at trace time only; the record and the warning are
    skipped there (they are side effects the compiled graph cannot replay), FA_STRICT still raises.
    """
    if torch.compiler.is_compiling():
        if strict() and dispatch.path == "fallback":
            raise FaFallbackError(_strict_message(dispatch))
        return
    with _report_lock:
        _last[:] = [dispatch]
    if dispatch.path != "fallback":
        return
    if strict():
        raise FaFallbackError(_strict_message(dispatch))
    for reason in dispatch.reasons:
        with _report_lock:
            if reason.code in _warned:
                continue
            _warned.add(reason.code)
        warnings.warn(
            f"fa_attn falls back to torch SDPA [{reason.code}]: {reason.message}. Fix: {reason.fix}",
            FaFallbackWarning,
            stacklevel=4,
        )  # user -> flash_attn_* -> _attend -> report


def _strict_message(dispatch: Dispatch) -> str:
    detail = "; ".join(f"{r.code}: {r.message} (fix: {r.fix})" for r in dispatch.reasons)
    return f"FA_STRICT=1 and this call would fall back to torch SDPA: {detail}"


def last_dispatch() -> Dispatch | None:
    """The decision of the most recent call in this process (None before the first call)."""
    with _report_lock:
        return _last[0] if _last else None
