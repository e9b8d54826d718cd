"""Where the kernels/ tree is: the repo checkout (editable install) or the copy packed into the tool's
own wheel (buildtool/_kernels). Also loads the two pure-Python modules that the build and doctor share
with the runtime (kernels/tiles.py, kernels/fa_attn/kernel_choice.py) by path, so there is one copy,
and hashes the sources the kernel images are compiled from (the manifest's kernel_source_sha256)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


@functools.lru_cache(maxsize=1)
def kernels_dir() -> Path:
    # FA_KERNELS_DIR: build another kernels/ tree (a fork's, or a tiny one in tests).
    if override := os.environ.get("FA_KERNELS_DIR"):
        return Path(override).resolve()
    package = Path(__file__).resolve().parents[1]  # buildtool/
    for cand in (package / "_kernels", package.parent / "kernels"):
        if (cand / "csrc").is_dir():
            return cand
    raise FileNotFoundError("kernels/ sources not found next to buildtool (reinstall fa-toolchain)")


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses need the module registered while it executes
    spec.loader.exec_module(mod)
    return mod


def tiles() -> ModuleType:
    return _load("_fa_tiles", kernels_dir() / "tiles.py")


def kernel_choice() -> ModuleType:
    return _load("_fa_kernel_choice", kernels_dir() / "fa_attn" / "kernel_choice.py")


def source_hash(root: Path | None = None) -> str:
    """sha256 of what decides the kernel images: every file under csrc/ and the tile table tiles.py of a
    kernels/ tree, each as its path, length and bytes. The packager records it in the manifest; the GPU
    kit (tests/gpu/wheel_check.py) refuses a prebuilt wheel whose value differs from the checkout's."""
    root = Path(root) if root is not None else kernels_dir()
    files = [root / "tiles.py", *(p for p in (root / "csrc").rglob("*") if p.is_file())]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
