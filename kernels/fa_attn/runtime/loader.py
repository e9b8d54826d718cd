"""The wheel's manifest and its host binding (libfa_attn_ops.so), loaded lazily on the first CUDA call.

A source checkout has no manifest.json: it then behaves as the universal wheel (no kernels, every call
goes to the SDPA fallback). A binding of the ATen form is C++ compiled against one torch minor and C++
ABI; loading it into another torch can die with `undefined symbol`. One of the stable form serves every
torch from its floor on. Either way the running torch is checked against the manifest
(decision.binding_problems), and so is the driver against the floor of the wheel's CUDA major
(decision.driver_too_old), *before* `torch.ops.load_library`, and any failure becomes a Reason instead of
an exception; a torch newer than any the stable binding was tested with loads, with a one-time
FaUntestedTorchWarning.

Whatever installed it (pip and uv choose among same-tagged wheels by their local version label, not by
the torch here), a wheel that does not fit imports: `warn_misfit` says once, at import, which wheel this
is, what it was built for, what is here and how to get the right one, and every call falls back to
torch SDPA with the reason.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from pathlib import Path

import torch

from .. import ownfiles
from .._version import __version__
from ..reasons import Reason
from ..schema import BINDING_FILE, MANIFEST_MAX_BYTES, Manifest, WheelInfo, universal_info
from . import all_wheel
from .decision import binding_problems, driver_too_old, untested_torch


class FaUntestedTorchWarning(UserWarning):
    """The stable-ABI binding loaded into a torch minor newer than any it was tested with."""


class FaWheelMisfitWarning(UserWarning):
    """The installed fa-attn wheel is built for another torch, C++ ABI or driver: calls fall back."""


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # fa_attn/: the manifest, binding and kernels
MANIFEST_FILE = PACKAGE_DIR / "manifest.json"
# What only a wheel with kernels holds beside its manifest (the all-wheel: bindings/).
_KERNEL_PARTS = ("kernels", "bindings", BINDING_FILE)

# What a wheel without kernels says about itself; a source checkout behaves as one.
UNIVERSAL_MANIFEST = Manifest(info=universal_info(__version__), kernels=())

_lock = threading.Lock()
_binding_result: Reason | bool | None = False  # False: not tried yet; None: loaded; Reason: failed


def manifest() -> Manifest:
    """The manifest shipped next to this file, or the universal one in a source checkout. Read once at
    import (a small file), so torch.compile never traces file I/O when it traces a call."""
    return _MANIFEST


def read_manifest(path: Path) -> tuple[Manifest, str | None]:
    """The manifest at `path`, or the universal one and why it could not be read (None: no problem).
    Read as one of fa's own files (ownfiles: never through a link, a regular file of at most
    MANIFEST_MAX_BYTES, not deeper than 64), in a folder of whoever installed it (a shared environment's
    owner). No manifest is the universal wheel's state, unless kernels or a binding are beside it: then
    it is a damaged install, and said so."""
    try:
        data = ownfiles.read_json(path, limit=MANIFEST_MAX_BYTES, any_owner=True)
    except FileNotFoundError:
        held = [n for n in _KERNEL_PARTS if (path.parent / n).exists()]
        if not held:
            return UNIVERSAL_MANIFEST, None
        return UNIVERSAL_MANIFEST, (
            f"{path} is missing, but this fa-attn holds {' and '.join(held)}: a damaged install, not the "
            "universal wheel"
        )
    except ownfiles.Refused as err:
        return UNIVERSAL_MANIFEST, f"{err.path}: {err.problem}"
    except OSError as err:
        return UNIVERSAL_MANIFEST, f"{path}: {err.strerror or err}"
    try:
        return Manifest.from_json(data), None
    except ValueError as err:  # SchemaError is a ValueError
        # A damaged install must not break `import fa_attn`; calls fall back and say why.
        return UNIVERSAL_MANIFEST, f"{path}: {err}"


_MANIFEST, _MANIFEST_PROBLEM = read_manifest(MANIFEST_FILE)


def static_binding_problem(man: Manifest, unreadable: str | None = None) -> Reason | None:
    """Why the binding of this manifest cannot serve the running torch, decided without loading it.
    unreadable: why the installed manifest could not be read (read_manifest's second value)."""
    if unreadable:
        return Reason("binding-unavailable", f"manifest unreadable: {unreadable}", "reinstall fa-attn")
    if not man.info.binding or man.info.universal:
        return Reason(
            "binding-unavailable",
            "this fa-attn is the universal wheel (no kernels, no binding)",
            "install the fa-attn wheel for your torch and CUDA major (`fa install`)",
        )
    problems = binding_problems(man.info, torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return problems[0] if problems else None


def load_binding() -> Reason | None:
    """Loads the binding once (thread-safe). None when its CUDA kernels are registered, else why not."""
    global _binding_result
    with _lock:
        if _binding_result is False:
            _binding_result = _load(manifest(), _MANIFEST_PROBLEM)
        return _binding_result  # type: ignore[return-value]


def as_this_torch(man: Manifest) -> Manifest:
    """The all-wheel read as the per-variant wheel whose binding serves the running torch
    (all_wheel.binding_for: the same rule as the per-variant wheels'); any other manifest as it is."""
    if not man.info.all_wheel:
        return man
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    binding = all_wheel.binding_for(man.info, torch.__version__, abi)
    # the driver floor that matters before any call: its oldest CUDA major's (a call picks its own)
    kernels = all_wheel.lowest_driver_set(man.info)
    return dataclasses.replace(man, info=all_wheel.view(man.info, binding, kernels))


def misfits(man: Manifest, driver: str | None) -> list[Reason]:
    """Why this wheel does not fit the running torch and driver (empty: it fits, or it is the universal
    wheel, which fits everywhere by falling back)."""
    man = as_this_torch(man)
    if man.info.universal:
        return []
    problems = binding_problems(man.info, torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    too_old = driver_too_old(man.info, driver)
    return [*problems, *([too_old] if too_old else [])]


def built_for(info: WheelInfo) -> str:
    """What a wheel serves, for a person: the all-wheel's every binding and CUDA major, or a per-variant
    wheel's one."""
    if info.all_wheel:
        return all_wheel.built_for(info)
    built = f"torch {info.torch}" + (" and later (stable ABI)" if info.binding_form == "stable" else "")
    if info.cxx11abi is not None and info.binding_form != "stable":
        built += f", cxx11abi={str(info.cxx11abi).lower()}"
    return built + f", CUDA {info.cuda_major} (driver >= {info.min_driver})"


def warn_misfit(man: Manifest, driver: str | None) -> None:
    """One warning at import when the installed wheel does not fit: the wheel, what it was built for
    (all of it: the all-wheel's every binding, not the one nearest this torch), what is here, and the
    fix."""
    found = misfits(man, driver)
    if not found:
        return
    info = man.info
    built = built_for(info)
    here = (
        f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}, "
        f"cxx11abi={str(bool(torch._C._GLIBCXX_USE_CXX11_ABI)).lower()}), driver {driver or 'none found'}"
    )
    codes = ", ".join(r.code for r in found)
    warnings.warn(
        f"fa-attn {info.version} is built for {built}; this machine has {here} [{codes}]: every call "
        "falls back to torch SDPA. Fix: `fa install` installs the wheel that fits (`fa doctor` prints "
        "the pip and uv lines for this machine); " + found[0].fix,
        FaWheelMisfitWarning,
        stacklevel=3,
    )


def _load(man: Manifest, unreadable: str | None = None) -> Reason | None:
    man = as_this_torch(man)
    problem = static_binding_problem(man, unreadable)
    if problem is not None:
        return problem
    from .dispatch import driver_version  # dispatch imports the runtime; this runs at the first call

    too_old = driver_too_old(man.info, driver_version())
    if too_old is not None:
        return too_old
    assert man.info.binding is not None  # static_binding_problem said so
    path = PACKAGE_DIR / man.info.binding
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as err:
        return Reason(
            "binding-unavailable",
            f"loading {path.name} failed: {err}",
            "reinstall the fa-attn wheel that `fa doctor` selects for this machine",
        )
    if not torch._C._dispatch_has_kernel_for_dispatch_key("fa_attn::fwd", "CUDA"):
        return Reason(
            "binding-unavailable",
            f"{path.name} loaded but registered no CUDA kernel for fa_attn::fwd",
            "reinstall fa-attn (the binding does not match this runtime)",
        )
    untested = untested_torch(man.info, torch.__version__)
    if untested is not None:
        warnings.warn(f"[{untested.code}] {untested.message}", FaUntestedTorchWarning, stacklevel=2)
    return None
