"""Which path a live call takes (our kernels from SASS or PTX, or the SDPA fallback) and why.

The decision itself is decision.decide, the pure function `fa doctor` runs too; this module reads its
facts from the tensors and the GPU (`facts_for`), hands it the installed manifest (`decide`), and is
the only side effect: `report` records the last decision, warns once per reason code, and raises
instead when FA_STRICT=1.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .._env import switch
from ..reasons import Reason
from ..schema import Manifest
from . import all_wheel, decision
from .decision import Call, Device, Dispatch
from .inputs import AttnCall

__all__ = ["CallFacts", "Dispatch", "FaFallbackError", "FaFallbackWarning", "decide", "facts_for", "report"]


class FaFallbackWarning(UserWarning):
    """A call ran on torch SDPA instead of fa's kernels (warned once per reason code)."""


class FaFallbackError(RuntimeError):
    """FA_STRICT=1 and a call would have fallen back."""


@dataclass(frozen=True)
class CallFacts:
    """A live call, as the decision reads it."""

    device: Device
    call: Call


def features_of(call: AttnCall, backward: bool) -> frozenset[str]:
    """The kernel features a call needs; the names are those tiles.FEATURES lists."""
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
    used |= call.kv.features  # KV-cache layouts: paged_kv, seqused_k, leftpad_k, cache_batch_idx
    return frozenset(used)


def facts_for(
    device_type: str,
    device_index: int | None,
    dtype: str,
    head_dim: int,
    backward: bool,
    features: frozenset[str],
    page_size: int = 0,
) -> CallFacts:
    """The facts of a live call; the compute capability is read from its GPU (a range, compared later)."""
    kind = "rocm" if device_type == "cuda" and torch.version.hip else device_type
    sm, smem = None, None
    if kind == "cuda":
        device = torch.device("cuda") if device_index is None else torch.device("cuda", device_index)
        major, minor = torch.cuda.get_device_capability(device)
        sm = f"{major}.{minor}"
        smem = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    return CallFacts(Device(kind, sm, smem), Call(dtype, head_dim, backward, features, page_size))


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, read from the kernel module without NVML; None if unknown
    (e.g. WSL2, which has no /proc/driver/nvidia)."""
    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError:
            continue
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    return None


def decide(
    facts: CallFacts,
    manifest: Manifest,
    load_binding: Callable[[], Reason | None],
    driver: Callable[[], str | None] = driver_version,
    package_dir: Path = Path("."),
) -> Dispatch:
    """decision.decide for a live call with the installed manifest. The driver is read only when the
    wheel has PTX (only a JIT needs it); package_dir: where the manifest's kernel files are."""
    if manifest.info.all_wheel:
        return _decide_all_wheel(facts, manifest, load_binding, driver, package_dir)
    device = replace(facts.device, driver=driver() if manifest.info.ptx else None)
    return decision.decide(manifest.info, device, facts.call, manifest.kernels, package_dir, load_binding)


def _decide_all_wheel(
    facts: CallFacts,
    manifest: Manifest,
    load_binding: Callable[[], Reason | None],
    driver: Callable[[], str | None],
    package_dir: Path,
) -> Dispatch:
    """The all-wheel picks its kernel set per call by this GPU and driver (all_wheel.decide_call), so
    it always reads the driver; its binding is the one the running torch loads."""
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    binding = all_wheel.binding_for(manifest.info, torch.__version__, abi)
    cuda = torch.version.cuda
    torch_cuda = int(cuda.split(".")[0]) if cuda else None
    device = replace(facts.device, driver=driver())
    answer, _ = all_wheel.decide_call(
        manifest.info, binding, device, facts.call, torch_cuda, manifest.kernels, package_dir, load_binding
    )
    return answer


_report_lock = threading.Lock()
_warned: set[str] = set()
_last: list[Dispatch | None] = [None]  # the most recent decision, in a one-item box


strict = switch("FA_STRICT")


def report(dispatch: Dispatch, compiling: bool | None = None) -> None:
    """Records the decision for last_dispatch(); warns once per reason code, or raises under FA_STRICT.

    While torch.compile traces a call this runs at trace time only; the record and the warning are
    skipped there (they are side effects the compiled graph cannot replay), FA_STRICT still raises.
    compiling: torch.compiler.is_compiling() when the caller asked already (None: asked here).
    """
    if torch.compiler.is_compiling() if compiling is None else compiling:
        if strict() and dispatch.path == "fallback":
            raise FaFallbackError(_strict_message(dispatch))
        return
    _last[0] = dispatch  # one store: atomic without the lock
    if dispatch.path != "fallback":
        return
    if strict():
        raise FaFallbackError(_strict_message(dispatch))
    reasons = dispatch.reasons
    if len(reasons) == 1 and reasons[0].code in _warned:
        return  # the common case after a fallback's first call: its one reason is warned already
    for reason in reasons:
        with _report_lock:
            if reason.code in _warned:
                continue
            _warned.add(reason.code)
        warnings.warn(
            f"fa_attn falls back to torch SDPA [{reason.code}]: {reason.message}. Fix: {reason.fix}",
            FaFallbackWarning,
            stacklevel=5,
        )  # user -> flash_attn_* -> _attend -> route_for -> report


def _strict_message(dispatch: Dispatch) -> str:
    detail = "; ".join(f"{r.code}: {r.message} (fix: {r.fix})" for r in dispatch.reasons)
    return f"FA_STRICT=1 and this call would fall back to torch SDPA: {detail}"


def last_dispatch() -> Dispatch | None:
    """The decision of the most recent call in this process (None before the first call)."""
    return _last[0]
