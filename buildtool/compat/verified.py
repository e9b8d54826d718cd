"""`fa doctor`'s answer to "was this wheel verified on this GPU?": the newest verification record
(fa_attn/verify/record.py, written by `fa check`) for the GPU's name and compute capability, and for the
installed wheel when one is installed (its manifest's sha256)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from buildtool.core import kernels_src


def _records() -> Any:
    return kernels_src.runtime_module("verify.record")


def installed_wheel() -> str:
    """sha256 of the installed fa-attn's manifest ("" when none is installed), without importing it."""
    spec = importlib.util.find_spec("fa_attn")
    if spec is None or spec.origin is None:
        return ""
    return str(_records().wheel_identity(Path(spec.origin).parent / "manifest.json"))


def newest(gpu: str, sm: str, wheel: str) -> Any:
    """The newest record for this GPU (and wheel, when known), or None."""
    for found in _records().all_records():
        if found.key.gpu == gpu and found.key.sm == sm and (not wheel or found.key.wheel == wheel):
            return found
    return None


def summary(gpu: str, sm: str, wheel: str) -> dict[str, Any]:
    """{"verified": bool, "when", "by", "units", "failed": [unit, ...]} for doctor --json."""
    found = newest(gpu, sm, wheel)
    if found is None:
        return {"verified": False, "when": None, "by": None, "units": 0, "failed": []}
    failed = sorted(name for name, u in found.units.items() if not u.passed)
    return {
        "verified": True,
        "when": found.written,
        "by": found.by,
        "units": len(found.units),
        "failed": failed,
    }


def line(gpu: str, sm: str, wheel: str) -> str:
    """One line for people (under 80 columns when few units failed)."""
    s = summary(gpu, sm, wheel)
    if not s["verified"]:
        return "  not verified on this GPU yet: run `fa check`"
    if not s["failed"]:
        return f"  verified {s['when']} ({s['by']}): {s['units']} units pass"
    names = ", ".join(s["failed"][:3]) + (", ..." if len(s["failed"]) > 3 else "")
    return f"  verified {s['when']}: {len(s['failed'])}/{s['units']} units FAILED ({names}); they fall back"
