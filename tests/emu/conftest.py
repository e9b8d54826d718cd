"""The emulator tests need a host C++ compiler (g++) and the fp32 reference of the GPU tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # attn_reference, attn_runs

import emu_harness


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if emu_harness.cxx() is not None:
        return
    skip = pytest.mark.skip(reason="the kernel emulator needs a host C++ compiler (g++)")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
