"""Whether a wheel's host binding serves a torch build (docs/contracts.md section 3, `binding_form`).

Pure and stdlib only, like kernel_choice.py: the runtime (loader.py) asks it about the running torch and
`fa doctor` (buildtool/compat/fit.py loads this file by path) about a described machine, so the two can
never disagree. Works on the WheelInfo that a manifest and an index.json entry share (schema.py).

- `aten` form (or a manifest from before `binding_form`): built against one torch minor's C++ API, it
  serves that minor with that C++ ABI only.
- `stable` form: built on torch's stable C ABI for the floor `torch`, it serves that minor and every later
  one, nightlies, NGC and local builds included, whatever their C++ ABI. A minor newer than the newest
  in `torch_tested` is served with a warning, not refused: the stable ABI promises it, fa has not run it.
"""

from __future__ import annotations

import re

from .kernel_choice import Reason
from .schema import WheelInfo

ATEN = "aten"
STABLE = "stable"

_MINOR = re.compile(r"^(\d+)\.(\d+)")


def minor_of(version: str) -> tuple[int, int] | None:
    """ "2.16.0.dev20261101+cu130" -> (2, 16), "2.8.0a0+5228986c39.nv25.05" -> (2, 8); None if unreadable."""
    m = _MINOR.match(version.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def is_stable(info: WheelInfo) -> bool:
    return info.binding_form == STABLE


def torch_problems(info: WheelInfo, torch_version: str, cxx11abi: bool | None) -> list[Reason]:
    """Every reason the binding of `info` cannot serve torch `torch_version` (with C++ ABI `cxx11abi`,
    None: unknown); [] when it can. The universal wheel (no binding) has none here."""
    built = info.torch
    running = minor_of(torch_version)
    if built is None or running is None:
        return []
    floor = minor_of(built)
    if is_stable(info):
        if floor is not None and running < floor:
            return [
                Reason(
                    "torch-below-floor",
                    f"the binding uses torch's stable ABI from torch {built} on; this is torch {torch_version}",
                    f"upgrade torch to {built} or newer, or install a wheel built for torch "
                    f"{_text(running)} (fa install picks it; fa install --build builds it)",
                )
            ]
        return []
    problems = []
    if floor != running:
        problems.append(
            Reason(
                "torch-version-mismatch",
                f"the binding is built for torch {built}; this is torch {torch_version}",
                f"install the wheel built for torch {_text(running)} (fa install picks it; "
                "fa install --build builds it when there is none)",
            )
        )
    abi = info.cxx11abi
    if abi is not None and cxx11abi is not None and bool(abi) != cxx11abi:
        problems.append(
            Reason(
                "cxx11abi-mismatch",
                f"the binding uses cxx11abi={str(bool(abi)).lower()}; this torch uses "
                f"cxx11abi={str(cxx11abi).lower()}",
                f"install the wheel with cxx11abi{str(cxx11abi).lower()} (fa install picks it)",
            )
        )
    return problems


def untested_torch(info: WheelInfo, torch_version: str) -> Reason | None:
    """A warning, not a refusal: a stable-ABI binding on a torch minor newer than any it was tested with."""
    if not is_stable(info):
        return None
    running = minor_of(torch_version)
    tested = sorted(m for m in (minor_of(t) for t in info.torch_tested) if m is not None)
    if running is None or not tested or running <= tested[-1]:
        return None
    names = ", ".join(_text(m) for m in tested)
    return Reason(
        "torch-newer-than-tested",
        f"torch {torch_version} is newer than every torch this stable-ABI binding was tested with "
        f"({names}); torch's stable ABI promises it loads and runs, fa has not checked",
        "nothing to do if it works; a newer fa-attn release tests this torch",
    )
