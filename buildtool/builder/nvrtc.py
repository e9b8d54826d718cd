"""NVRTC through ctypes: compile device-only CUDA C++ to a cubin (SASS) or PTX.

The library comes from NVIDIA's PyPI wheel unpacked in the cache (see toolkits.py); nothing here looks
for a system CUDA toolkit. Each (lib dir) is opened once per process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildtool.errors import FaError


class NvrtcError(FaError):
    """A compile that NVRTC refused; `log` holds the compiler's own words."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message + (f"\n{log}" if log else ""))
        self.log = log


def _libc_uselocale() -> Any:  # libc's uselocale (a ctypes function), or None
    try:
        fn = ctypes.CDLL(None).uselocale
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    return fn


_USELOCALE = _libc_uselocale()


@contextlib.contextmanager
def _keep_thread_locale() -> Iterator[None]:
    """NVRTC 11.8 switches the calling thread to the "C" locale (uselocale) and leaves it there, which
    turns Python's default text encoding into ASCII for the rest of the process. Put it back."""
    saved = _USELOCALE(None) if _USELOCALE else None
    try:
        yield
    finally:
        if _USELOCALE and saved is not None:
            _USELOCALE(saved)


@dataclass(frozen=True)
class Compiled:
    image: bytes  # cubin (ELF) for a real arch, PTX text (NUL-free) for a virtual one
    log: str
    kind: str  # "cubin" | "ptx"
    # With `with_ptx`, a cubin compile's PTX too: NVRTC makes it on the way to the cubin, the same bytes
    # as compiling for compute_XX (bench/build/ptx_with_cubin.py compares them for every program).
    ptx: bytes | None = None


@dataclass(frozen=True)
class ResourceUsage:
    kernel: str
    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    static_smem: int


class Nvrtc:
    def __init__(self, lib_dir: Path) -> None:
        lib_dir = Path(lib_dir)
        # libnvrtc dlopens its builtins by soname; loading it first (globally) makes that lookup hit.
        builtins = sorted(p for p in lib_dir.glob("libnvrtc-builtins.so.*") if ".alt." not in p.name)
        if not builtins:
            raise NvrtcError(f"no libnvrtc-builtins.so.* in {lib_dir}")
        ctypes.CDLL(str(builtins[0]), mode=ctypes.RTLD_GLOBAL)
        mains = sorted(p for p in lib_dir.glob("libnvrtc.so.*") if ".alt." not in p.name)
        if not mains:
            raise NvrtcError(f"no libnvrtc.so.* in {lib_dir}")
        self._lib = ctypes.CDLL(str(mains[0]))
        self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, code: int, what: str, log: str = "") -> None:
        if code != 0:
            msg = self._lib.nvrtcGetErrorString(code).decode()
            raise NvrtcError(f"{what} failed: {msg}", log)

    def compile(
        self,
        source: str,
        name: str,
        arch: str,
        options: list[str] | None = None,
        headers: dict[str, str] | None = None,
        with_ptx: bool = False,
    ) -> Compiled:
        """Compile `source` for `arch`: "sm_80" gives a cubin, "compute_90" gives PTX; `with_ptx` keeps
        a cubin compile's PTX as well (one compile instead of two when both are shipped)."""
        lib = self._lib
        headers = headers or {}
        prog = ctypes.c_void_p()
        hdr_src = (ctypes.c_char_p * len(headers))(*[v.encode() for v in headers.values()])
        hdr_names = (ctypes.c_char_p * len(headers))(*[k.encode() for k in headers])
        self._check(
            lib.nvrtcCreateProgram(
                ctypes.byref(prog), source.encode(), name.encode(), len(headers), hdr_src, hdr_names
            ),
            "nvrtcCreateProgram",
        )
        try:
            opts = [f"--gpu-architecture={arch}", *(options or [])]
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            with _keep_thread_locale():
                code = lib.nvrtcCompileProgram(prog, len(opts), arr)
            log = self._log(prog)
            self._check(code, f"compiling {name} for {arch}", log)
            if arch.startswith("sm_"):
                image = self._output(prog, "CUBIN")
                return Compiled(image, log, "cubin", self._output(prog, "PTX") if with_ptx else None)
            return Compiled(self._output(prog, "PTX"), log, "ptx")
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _output(self, prog: ctypes.c_void_p, what: str) -> bytes:
        """A compiled program's CUBIN (ELF bytes) or PTX (text, without its trailing NUL)."""
        size = ctypes.c_size_t()
        self._check(
            getattr(self._lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size)), f"nvrtcGet{what}Size"
        )
        buf = ctypes.create_string_buffer(size.value)
        self._check(getattr(self._lib, f"nvrtcGet{what}")(prog, buf), f"nvrtcGet{what}")
        return buf.raw[: size.value].rstrip(b"\0") if what == "PTX" else buf.raw[: size.value]

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        self._lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")

    def supported_archs(self) -> list[int]:
        """The real archs this NVRTC can target, e.g. [75, 80, 86, 89, 90, ...]."""
        n = ctypes.c_int()
        self._check(self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        arr = (ctypes.c_int * n.value)()
        self._check(self._lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
        return list(arr)


@functools.cache
def open_nvrtc(lib_dir: str) -> Nvrtc:
    return Nvrtc(Path(lib_dir))


_FN = re.compile(r"Compiling entry function '(\w+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resource_usage(log: str) -> list[ResourceUsage]:
    """Read ptxas's `-v` report (compile with `-Xptxas=-v`) into one record per kernel."""
    out: list[ResourceUsage] = []
    current: dict[str, int | str] | None = None
    for line in log.splitlines():
        if m := _FN.search(line):
            current = {"kernel": m.group(1), "stack": 0, "ss": 0, "sl": 0}
            continue
        if current is None:
            continue
        if m := _STACK.search(line):
            current["stack"], current["ss"], current["sl"] = (int(g) for g in m.groups())
        if m := _REGS.search(line):
            smem = _SMEM.search(line)
            out.append(
                ResourceUsage(
                    kernel=str(current["kernel"]),
                    registers=int(m.group(1)),
                    stack_bytes=int(current["stack"]),
                    spill_stores=int(current["ss"]),
                    spill_loads=int(current["sl"]),
                    static_smem=int(smem.group(1)) if smem else 0,
                )
            )
            current = None
    return out
