"""What the kit runs on the GPU machine imports only what that machine has: it cannot install anything.
The lent machines' Python holds torch, numpy, packaging, pytest, matplotlib and more (the device tool's
KINDS.md, read 2026-11-17) but not every dependency of the toolchain: these modules, imported with those
packages blocked, must still load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The toolchain's dependencies (pyproject.toml) that the lent machines' image lacks.
NOT_ON_DEVICE = ("platformdirs", "elftools", "auditwheel", "cibuildwheel")
# Everything the three kit commands start there, and what those import lazily.
DEVICE_MODULES = (
    "kit",
    "smoke",
    "workers",
    "unit_check",
    "cuda_launch",
    "kernel_launch",
    "wheel_check",
    "explain_check",
    "profile_units",
    "attn_reference",
    "attn_runs",
    "sweep",
    "sanitize_sweep",
    "autotune",
    "tile_compile",
    "tile_patch",
    "attention",
    "buildtool.core.kernels_src",
    "buildtool.core.runtime",
    "buildtool.builder.nvrtc",
)

PROBE = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_ON_DEVICE!r}:
            raise ImportError(f"{{name}} is not on the GPU machine")
sys.meta_path.insert(0, Block())
sys.path[:0] = [{str(REPO)!r}, {str(REPO / "kernels")!r}, {str(REPO / "tests" / "gpu")!r}, {str(REPO / "bench" / "kernels")!r}, {str(REPO / "bench")!r}]
for name in {DEVICE_MODULES!r}:
    importlib.import_module(name)
print("ok")
"""


def test_the_device_side_imports_only_what_the_device_has() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok", done.stderr[-3000:]
