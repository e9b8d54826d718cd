"""tests/api: flash-attn 2.x's public API on fa_attn, against a float64 reference (reference.py).

On the CPU every call takes fa_attn's fallback; `emulated_kernels` (emulated.py) routes calls the kernels
serve onto the real kernels run by tests/emu's CPU emulator instead.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import fa_attn
import pytest
from fa_attn.standin import compat as flash_attn_compat

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "emu", HERE.parent / "gpu"):  # reference, emu_harness, attn_reference
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture
def clean_flash_attn() -> Iterator[None]:
    """No stand-in and no flash_attn modules before and after a test."""
    flash_attn_compat.uninstall_as_flash_attn()
    yield
    flash_attn_compat.uninstall_as_flash_attn()
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def stand_in(clean_flash_attn: None) -> None:  # noqa: ARG001 (its setup and teardown are the point)
    """The stand-in installed for one test, on a clean slate (clean_flash_attn)."""
    fa_attn.install_as_flash_attn()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fa_attn attention calls made, "varlen" or "padded" (proof a model ran on fa_attn, not on a
    fallback of the library's own)."""
    from fa_attn.runtime import interface

    seen: list[str] = []
    original = interface._attend

    def spy(call: object, *args: object, **kwargs: object) -> object:
        seen.append("varlen" if getattr(call, "varlen", None) is not None else "padded")
        return original(call, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(interface, "_attend", spy)
    return seen
