"""What is installed on this machine, read from files: torch's version, CUDA build and C++ ABI (never by
importing torch, which takes seconds and initialises CUDA libraries), and this Python's version.

Used by the build (`fa build --local`) and by the probe (`fa doctor`, `fa install`) alike.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from buildtool.core.runtime import versions


@dataclass(frozen=True)
class TorchInfo:
    version: str  # as torch reports it, e.g. "2.5.0a0+e000cf0ad9.nv24.10"
    cuda: str | None  # "12.4"; None for CPU-only and ROCm builds
    hip: str | None  # ROCm version for ROCm builds
    cxx11abi: bool | None  # None: unknown (non-Linux, or could not be read)

    @property
    def minor(self) -> str:
        """ "2.5.0a0+e000cf0ad9.nv24.10" -> "2.5": local and pre-release parts don't change the minor."""
        return versions.torch_minor(self.version)

    @property
    def cuda_major(self) -> int | None:
        return int(self.cuda.split(".")[0]) if self.cuda else None


def os_name() -> str:
    name = sys.platform
    return "windows" if name.startswith("win") else "darwin" if name == "darwin" else "linux"


def python_version() -> str:
    """ "3.11", or "3.13t" for a free-threaded build (by how it was built, not whether the GIL is on now)."""
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    return f"{sys.version_info.major}.{sys.version_info.minor}{'t' if free_threaded else ''}"


def find_torch() -> Path | None:
    """The installed torch package's directory, found without importing it."""
    # find_spec on a top-level name locates the package without executing it.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def probe_torch(torch_dir: Path, sources: dict[str, str] | None = None) -> TorchInfo | None:
    """torch's version, CUDA/HIP build and C++ ABI from its files (never `import torch` here)."""
    sources = {} if sources is None else sources
    values = _read_version_py(torch_dir / "version.py")
    version = values.get("__version__")
    if not isinstance(version, str):
        return None
    cuda, hip = values.get("cuda"), values.get("hip")
    abi, how = _cxx11abi(torch_dir)
    if how:
        sources["cxx11abi"] = how
    return TorchInfo(
        version=version,
        cuda=cuda if isinstance(cuda, str) else None,
        hip=hip if isinstance(hip, str) else None,
        cxx11abi=abi,
    )


def _read_version_py(path: Path) -> dict[str, object]:
    """The plain assignments of torch/version.py (`__version__ = '2.5.1+cu124'`, `cuda = '12.4'`)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):  # ValueError: NUL bytes in a damaged file
        return {}
    values: dict[str, object] = {}
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (node.target if isinstance(node, ast.AnnAssign) else None)
        )
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


# A c10 symbol carrying the [abi:cxx11] tag (e.g. c10::Device::str[abi:cxx11]()) exists only in a
# library built with _GLIBCXX_USE_CXX11_ABI=1.
_CXX11_TAGGED = re.compile(rb"_ZN[A-Za-z0-9_]*3c10[A-Za-z0-9_]*B5cxx11")


def _cxx11abi(torch_dir: Path) -> tuple[bool | None, str]:
    if os_name() != "linux":
        return None, ""  # the libstdc++ dual ABI exists only on Linux
    cmake = torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    try:  # older torch writes the flag into its CMake config
        match = re.search(r"_GLIBCXX_USE_CXX11_ABI=([01])", cmake.read_text())
        if match:
            return match.group(1) == "1", "TorchConfig.cmake"
    except OSError:
        pass
    try:
        data = (torch_dir / "lib" / "libc10.so").read_bytes()
        if b"_ZN3c10" in data:
            return _CXX11_TAGGED.search(data) is not None, "libc10.so symbols"
    except OSError:
        pass
    # Last resort: ask torch itself, in a child so this process never imports it.
    code = "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    out = done.stdout.strip()
    return (out == "1", "import torch (subprocess)") if out in ("0", "1") else (None, "")
