"""tests/api: flash-attn 2.x's public API on fa_attn, against a float64 reference (reference.py).

On the CPU every call takes fa_attn's fallback; `emulated_kernels` (emulated.py) routes calls the kernels
serve onto the real kernels run by tests/emu's CPU emulator instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "emu", HERE.parent / "gpu"):  # reference, emu_harness, attn_reference
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
