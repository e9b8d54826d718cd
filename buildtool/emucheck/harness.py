"""The CPU emulator of a source checkout (tests/emu/emu_harness.py, emu.h and tests/gpu's launch steps),
imported for `fa check --emulate`. One definition: tests import the same files."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from buildtool.errors import UsageError

CHECKOUT = Path(__file__).resolve().parents[2]


def emulator() -> ModuleType:
    """emu_harness, with kernels/ (tiles.py), tests/emu and tests/gpu on sys.path."""
    needed = (CHECKOUT / "kernels" / "tiles.py", CHECKOUT / "tests" / "emu" / "emu_harness.py")
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise UsageError(
            f"--emulate needs a source checkout of fa (missing {', '.join(missing)}); "
            "run it from a clone: pip install -e . there"
        )
    for folder in (CHECKOUT / "kernels", CHECKOUT / "tests" / "emu", CHECKOUT / "tests" / "gpu"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    harness = importlib.import_module("emu_harness")
    if harness.cxx() is None:
        raise UsageError("--emulate needs a host C++ compiler (g++ on PATH, or CXX=...)")
    return harness
