"""The GPU kit's CI tests: its pieces, and each script's dry run (the CPU emulator or CPU stand-ins in
place of the GPU), so the flow a GPU window follows is proved on every push. Needs g++ for the
emulator (the dry runs are skipped without one, like tests/emu)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO / "tests" / "gpu", REPO / "tests" / "emu", REPO / "bench" / "kernels", REPO / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
