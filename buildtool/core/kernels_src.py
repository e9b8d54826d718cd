"""Where the kernels/ tree is: the repo checkout (editable install) or the copy packed into the tool's
own wheel (buildtool/_kernels). Also loads, by path, the pure-Python modules the build and doctor share
with the runtime, so each exists once: kernels/tiles.py (the kernel table) and the stdlib-only modules
of the runtime package (fa_attn/schema.py, ...), which are read without running fa_attn/__init__.py
(that imports torch). Also hashes the sources a wheel is built from (the manifest's source_sha256)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from types import ModuleType

# The runtime's stdlib-only modules load as submodules of this stand-in package, so their relative
# imports (`from .versions import ...`) resolve among themselves.
RUNTIME_PACKAGE = "_fa_attn_pure"


def _own_kernels_dir() -> Path:
    package = Path(__file__).resolve().parents[1]  # buildtool/
    for cand in (package / "_kernels", package.parent / "kernels"):
        if (cand / "csrc").is_dir():
            return cand
    raise FileNotFoundError("kernels/ sources not found next to buildtool (reinstall fa-toolchain)")


@functools.lru_cache(maxsize=1)
def kernels_dir() -> Path:
    """The kernels/ tree to build."""
    # FA_KERNELS_DIR: build another kernels/ tree (a fork's, or a tiny one in tests).
    if override := os.environ.get("FA_KERNELS_DIR"):
        return Path(override).resolve()
    return _own_kernels_dir()


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec
    assert spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses need the module registered while it executes
    spec.loader.exec_module(mod)
    return mod


def tiles() -> ModuleType:
    return _load("_fa_tiles", kernels_dir() / "tiles.py")


def runtime_module(name: str) -> ModuleType:
    """fa_attn/<name>.py of this tool's own runtime (never FA_KERNELS_DIR's: these are the contracts
    this tool writes and reads), loaded without importing torch."""
    if RUNTIME_PACKAGE not in sys.modules:
        package = types.ModuleType(RUNTIME_PACKAGE)
        package.__path__ = [str(_own_kernels_dir() / "fa_attn")]
        sys.modules[RUNTIME_PACKAGE] = package
    return importlib.import_module(f"{RUNTIME_PACKAGE}.{name}")


# What a kernel image is compiled from, and what a kernel wheel is built from (the images, the host
# binding and the runtime package): the manifest records the hash of the second, the autotuner's cubin
# index that of the first.
IMAGE_SOURCES = ("csrc", "tiles.py")
WHEEL_SOURCES = (*IMAGE_SOURCES, "binding", "fa_attn")


def source_hash(root: Path | None = None, parts: tuple[str, ...] = WHEEL_SOURCES) -> str:
    """sha256 over the files of `parts` (folders and files of a kernels/ tree), each as its path, length
    and bytes; caches and a development manifest.json are left out. The packager records the
    WHEEL_SOURCES hash in the manifest (source_sha256); the GPU kit (tests/gpu/wheel_check.py) refuses a
    prebuilt wheel whose value is not the checkout's."""
    root = Path(root) if root is not None else kernels_dir()
    files: list[Path] = []
    for part in parts:
        path = root / part
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts or path.suffix == ".pyc" or rel == "fa_attn/manifest.json":
            continue
        data = path.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
