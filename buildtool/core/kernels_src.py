"""Where the kernels/ tree is: the repo checkout (editable install) or the copy packed into the tool's
own wheel (buildtool/_kernels). Also loads the pure-Python modules that the build and doctor share with
the runtime (kernels/tiles.py, kernels/fa_attn/kernel_choice.py and binding_fit.py) by path, so there is
one copy."""

from __future__ import annotations

import functools
import importlib
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


# The runtime's stdlib-only modules, imported as submodules of a stand-in package (so binding_fit's
# `from .kernel_choice import Reason` finds the same kernel_choice) without running fa_attn/__init__.py,
# which imports torch.
_RUNTIME = "_fa_runtime_pure"


def _runtime_module(name: str) -> ModuleType:
    if _RUNTIME not in sys.modules:
        package = ModuleType(_RUNTIME)
        package.__path__ = [str(kernels_dir() / "fa_attn")]
        sys.modules[_RUNTIME] = package
    return importlib.import_module(f"{_RUNTIME}.{name}")


def kernel_choice() -> ModuleType:
    return _runtime_module("kernel_choice")


def binding_fit() -> ModuleType:
    return _runtime_module("binding_fit")
