"""One compiled unit on the GPU through the CUDA driver API, from Python: no binding, no wheel.

The same driver calls as kernels/binding/cuda_driver.cpp and launch.cpp (cuModuleLoadDataEx,
cuModuleGetFunction, cuFuncSetAttribute above 48 KiB of dynamic shared memory, cuLaunchKernel with one
FaParams by value) on torch's current stream in the device's primary context, which is torch's own.
Buffers are torch CUDA tensors; the launch steps around the kernels are tests/gpu/kernel_launch.py's,
shared with the CPU emulator. So the kit can run a cubin the moment NVRTC made it (bench/kernels/autotune.py)
or straight out of a wheel (tests/gpu/smoke.py), whatever torch's version.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from kernel_launch import (
    Call,
    EntryLaunch,
    FaParams,
    UnitLaunch,
    backward,
    forward,
    forward_splitkv,
    sum_groups,
)

_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in (launch.cpp kDefaultSmemLimit)
_ATTR_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_ATTR_LOCAL_SIZE_BYTES = 3  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: per-thread local memory (spills, stack)
_ATTR_NUM_REGS = 4  # CU_FUNC_ATTRIBUTE_NUM_REGS
_JIT_ERROR_LOG_BUFFER = 5  # CU_JIT_ERROR_LOG_BUFFER
_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6  # CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES

# Errors after which the context is unusable, so every later call in the process fails too and the
# caller must start a new one (cuda.h: ILLEGAL_ADDRESS 700, LAUNCH_TIMEOUT 702, ASSERT 710,
# HARDWARE_STACK_ERROR 714, ILLEGAL_INSTRUCTION 715, MISALIGNED_ADDRESS 716, INVALID_ADDRESS_SPACE 717,
# INVALID_PC 718, LAUNCH_FAILED 719).
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})


class CudaError(RuntimeError):
    """A driver call that failed; `code` is the CUresult, `sticky` says the context is lost."""

    def __init__(self, what: str, code: int, text: str) -> None:
        super().__init__(f"{what} failed: CUDA error {code} ({text})")
        self.code = code
        self.sticky = code in STICKY_ERRORS


class CudaDriver:
    """libcuda.so.1's few entry points, with checked results."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = lib if lib is not None else ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,
            *[ctypes.c_uint] * 7,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self.check(self.lib.cuInit(0), "cuInit")

    def check(self, code: int, what: str) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise CudaError(what, code, (text.value or b"unknown error").decode())

    def use_primary_context(self, device: int) -> None:
        """Make the device's primary context (torch's) current on this thread, as the binding does
        (retained once per device and process)."""
        ctx = self._contexts.get(device)
        if ctx is None:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self._contexts[device] = ctx
        current = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != ctx.value:
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")


_driver: CudaDriver | None = None


def driver() -> CudaDriver:
    """The process's driver handle, opened on first use."""
    global _driver
    if _driver is None:
        _driver = CudaDriver()
    return _driver


class CudaModule:
    """One loaded image (cubin, or PTX the driver JIT-compiles) and its functions."""

    def __init__(self, image: bytes, name: str, drv: CudaDriver | None = None, device: int = 0) -> None:
        self.drv = drv or driver()
        self.name = name
        self.drv.use_primary_context(device)  # a module loads into the current context: torch's
        self.handle = ctypes.c_void_p()
        log = ctypes.create_string_buffer(8192)
        opts = (ctypes.c_int * 2)(_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        data = ctypes.create_string_buffer(image + b"\0")  # PTX must end in NUL; a cubin ignores it
        code = self.drv.lib.cuModuleLoadDataEx(ctypes.byref(self.handle), data, 2, opts, vals)
        if code != 0:
            jit = log.value.decode(errors="replace").strip()
            self.drv.check(code, f"loading {name}" + (f" (JIT log: {jit})" if jit else ""))
        self._functions: dict[str, ctypes.c_void_p] = {}

    def function(self, entry: str, smem_bytes: int) -> ctypes.c_void_p:
        fn = self._functions.get(entry)
        if fn is None:
            fn = ctypes.c_void_p()
            self.drv.check(
                self.drv.lib.cuModuleGetFunction(ctypes.byref(fn), self.handle, entry.encode()),
                f"cuModuleGetFunction({entry}) in {self.name}",
            )
            if smem_bytes > _DEFAULT_SMEM_LIMIT:
                self.drv.check(
                    self.drv.lib.cuFuncSetAttribute(fn, _ATTR_MAX_DYNAMIC_SMEM, smem_bytes),
                    f"cuFuncSetAttribute({entry}, max dynamic smem {smem_bytes})",
                )
            self._functions[entry] = fn
        return fn

    def attributes(self, entry: str) -> dict[str, int]:
        """What the loaded code uses per thread: registers, and local memory (spills or a stack)."""
        fn = self.function(entry, 0)
        out = {}
        for key, attr in (("registers", _ATTR_NUM_REGS), ("local_bytes", _ATTR_LOCAL_SIZE_BYTES)):
            value = ctypes.c_int()
            self.drv.check(
                self.drv.lib.cuFuncGetAttribute(ctypes.byref(value), attr, fn), "cuFuncGetAttribute"
            )
            out[key] = value.value
        return out

    def unload(self) -> None:
        if self.handle.value:
            self.drv.check(self.drv.lib.cuModuleUnload(self.handle), f"cuModuleUnload({self.name})")
            self.handle = ctypes.c_void_p()


class CudaDevice:
    """A kernel_launch.Device on one GPU (torch's numbering) for one loaded module, launching on torch's
    current stream of that GPU (`stream` returns the CUstream as an int; tests pass their own)."""

    def __init__(self, module: CudaModule, device: int = 0, stream: Callable[[], int] | None = None) -> None:
        self.module = module
        self.device = device
        self.stream = stream or (lambda: torch.cuda.current_stream(device).cuda_stream)

    def place(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_cuda else t.to(f"cuda:{self.device}")

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=f"cuda:{self.device}")

    def launch(self, entry: str, launch: EntryLaunch, grid: tuple[int, int, int], params: FaParams) -> None:
        fn = self.module.function(entry, launch.smem_bytes)
        arg = FaParams.from_buffer_copy(params)  # cuLaunchKernel copies the bytes at the call
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), ctypes.c_void_p))
        stream = ctypes.c_void_p(self.stream())
        self.module.drv.check(
            self.module.drv.lib.cuLaunchKernel(
                fn, *grid, launch.threads, 1, 1, launch.smem_bytes, stream, args, None
            ),
            f"launching {entry} of {self.module.name}",
        )


def load(path: Path | str, drv: CudaDriver | None = None) -> CudaModule:
    """A cubin or PTX file, loaded."""
    path = Path(path)
    return CudaModule(path.read_bytes(), path.name, drv)


def run_forward(dev: CudaDevice, unit: UnitLaunch, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = forward(dev, unit, call)
    dev.module.drv.synchronize()  # a launch's own error surfaces here, named
    return out, lse


def run_forward_splitkv(
    dev: CudaDevice, unit: UnitLaunch, call: Call, num_splits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = forward_splitkv(dev, unit, call, num_splits)
    dev.module.drv.synchronize()
    return out, lse


def run_backward(
    dev: CudaDevice,
    unit: UnitLaunch,
    call: Call,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = backward(dev, unit, call, out, lse, dout)
    dev.module.drv.synchronize()
    dk, dv = sum_groups(call, dk, dv)
    return dq, dk, dv
