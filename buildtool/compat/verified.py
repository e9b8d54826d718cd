"""`fa doctor`'s answer to "was this wheel verified on this GPU?": the newest verification record
(fa_attn/verify/record.py, written by `fa check`) that matches this machine, and the file it came from.

A record counts only when it is evidence for this machine: read under record.py's rules (this user's or
root's, writable by no one else, well-formed), for this GPU (name and compute capability, and its UUID
when both sides know it), and for the installed wheel (its manifest's sha256), the driver and the torch
version. A record of this GPU that differs in any of those is ignored, and the line says how many were
and why, so a stale or planted verdict is never shown as this machine's.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Machine:
    """What a record must match: the GPU, the installed wheel, the driver and torch ("" unknown)."""

    gpu: str
    sm: str
    wheel: str
    driver: str = ""
    torch: str = ""
    uuid: str = ""


def machine(env: Any, gpu: Any) -> Machine:
    """The machine doctor describes (compat.env.Env and one of its GPUs), with the installed wheel."""
    torch = env.torch.version if env.torch is not None else ""
    return Machine(gpu.name, gpu.sm, installed_wheel(), env.driver or "", torch, gpu.uuid)


def mismatch(key: Any, machine: Machine) -> str:
    """Why a record of this GPU's model is not this machine's ("" when it is)."""
    if machine.uuid and key.uuid and _records().normal_uuid(key.uuid) != _records().normal_uuid(machine.uuid):
        return "another GPU of this model"
    for field, theirs, ours in (
        ("wheel", key.wheel, machine.wheel),
        ("driver", key.driver, machine.driver),
        ("torch", key.torch, machine.torch),
    ):
        if theirs != ours:
            return f"another {field}"
    return ""


def newest(machine: Machine) -> tuple[Path | None, Any, dict[str, int]]:
    """(its file, the newest record matching the machine, {why: count} of this GPU's records ignored)."""
    ignored: dict[str, int] = {}
    for path, found in _records().all_records():
        if found.key.gpu != machine.gpu or found.key.sm != machine.sm:
            continue
        why = mismatch(found.key, machine)
        if not why:
            return path, found, ignored
        ignored[why] = ignored.get(why, 0) + 1
    return None, None, ignored


def summary(machine: Machine) -> dict[str, Any]:
    """{"verified": bool, "when", "by", "units", "failed": [unit, ...], "record": its file or None,
    "ignored": {why: count}} for doctor --json."""
    path, found, ignored = newest(machine)
    if found is None:
        return {
            "verified": False, "when": None, "by": None, "units": 0, "failed": [], "record": None,
            "ignored": ignored,
        }  # fmt: skip
    failed = sorted(name for name, u in found.units.items() if not u.passed)
    return {
        "verified": True,
        "when": found.written,
        "by": found.by,
        "units": len(found.units),
        "failed": failed,
        "record": str(path),
        "ignored": ignored,
    }


def line(machine: Machine) -> str:
    """The lines for people: the verdict, where it came from, and what was ignored."""
    s = summary(machine)
    ignored = "; ".join(f"{n} for {why}" for why, n in sorted(s["ignored"].items()))
    note = f"\n  ignored records not for this machine: {ignored}" if ignored else ""
    if not s["verified"]:
        return f"  not verified on this GPU yet: run `fa check`{note}"
    source = f"\n  from {s['record']}"
    if not s["failed"]:
        return f"  verified {s['when']} ({s['by']}): {s['units']} units pass{source}{note}"
    names = ", ".join(s["failed"][:3]) + (", ..." if len(s["failed"]) > 3 else "")
    head = f"  verified {s['when']}: {len(s['failed'])}/{s['units']} units FAILED ({names}); they fall back"
    return head + source + note
