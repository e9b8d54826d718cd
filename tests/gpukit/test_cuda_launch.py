"""The driver launcher (tests/gpu/cuda_launch.py) against a recording stand-in for libcuda: the calls
the binding makes, in its order, with its numbers (no GPU here, so the calls themselves are what is
checked; the GPU window runs them for real)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from typing import Any

import cuda_launch
import kernel_launch as kl
import pytest
import torch


class FakeLibcuda:
    """Each cuXxx records its call and answers like the driver; pointer arguments are written through."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail or {}
        for name in (
            "cuInit",
            "cuDeviceGet",
            "cuDevicePrimaryCtxRetain",
            "cuCtxGetCurrent",
            "cuCtxSetCurrent",
            "cuModuleLoadDataEx",
            "cuModuleGetFunction",
            "cuFuncSetAttribute",
            "cuFuncGetAttribute",
            "cuLaunchKernel",
            "cuCtxSynchronize",
            "cuModuleUnload",
        ):
            setattr(self, name, self._recorder(name))

        def error_string(code: int, out: Any) -> int:
            texts = {700: b"an illegal memory access was encountered", 218: b"a PTX JIT compilation failed"}
            out._obj.value = texts.get(code, b"?")
            return 0

        self.cuGetErrorString: Any = error_string

    def _recorder(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append((name, args))
            if name == "cuDevicePrimaryCtxRetain":
                args[0]._obj.value = 0xC0
            elif name == "cuModuleLoadDataEx":
                args[0]._obj.value = 0x30
                if name in self.fail:
                    ctypes.memmove(args[4][0], b"ptxas fatal: bad image\0", 23)
            elif name == "cuModuleGetFunction":
                args[0]._obj.value = 0x100 + len(self.calls)
            elif name == "cuFuncGetAttribute":
                args[0]._obj.value = {4: 168, 3: 0}[args[1]]
            elif name == "cuLaunchKernel":
                params = ctypes.cast(args[9][0], ctypes.POINTER(kl.FaParams)).contents
                self.calls[-1] = (
                    name,
                    (args[1:7], args[7], args[8].value, kl.FaParams.from_buffer_copy(params)),
                )
            return self.fail.get(name, 0)

        call.argtypes = None  # cuda_launch sets these on the real library's functions
        return call

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


class CpuDevice(cuda_launch.CudaDevice):
    """The launcher's calls with the tensors left on the CPU (their addresses are all the fake needs)."""

    def place(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.full(tuple(shape), float("nan"), dtype=dtype)


def _unit(smem: int) -> kl.UnitLaunch:
    return kl.UnitLaunch("fwd_bf16_d128", 128, {"fa_fwd": kl.EntryLaunch(256, 128, 64, smem, "q_blocks")})


def _call() -> kl.Call:
    q = torch.randn(2, 300, 8, 128).bfloat16()
    k = torch.randn(2, 500, 2, 128).bfloat16()
    return kl.Call(q, k, k.clone(), causal=True)


def test_a_forward_launch_is_the_bindings() -> None:
    lib = FakeLibcuda()
    drv = cuda_launch.CudaDriver(lib)
    module = cuda_launch.CudaModule(b"\x7fELF...", "fwd.cubin", drv)
    dev = CpuDevice(module, stream=lambda: 0x5EED)
    kl.forward(dev, _unit(smem=98304), _call())
    assert lib.names() == [
        "cuInit",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",  # the primary context was not current yet
        "cuModuleLoadDataEx",
        "cuModuleGetFunction",
        "cuFuncSetAttribute",  # 96 KiB > 48 KiB: opt in, as launch.cpp function_for does
        "cuLaunchKernel",
    ]
    _, (dims, smem, stream, params) = lib.calls[-1]
    assert dims == (3, 2, 8, 256, 1, 1)  # ceil(300 / 128) query blocks, batch, heads; 8 warps
    assert (smem, stream) == (98304, 0x5EED)
    assert (params.seqlen_q, params.seqlen_k, params.heads, params.heads_k) == (300, 500, 8, 2)
    assert (params.is_causal, params.window_right, params.seqlen_q_rounded) == (1, 0, 384)
    assert params.q_row_stride == 8 * 128
    assert params.k_batch_stride == 500 * 2 * 128


def test_small_shared_memory_needs_no_opt_in_and_functions_are_cached() -> None:
    lib = FakeLibcuda()
    module = cuda_launch.CudaModule(b"img", "x.cubin", cuda_launch.CudaDriver(lib))
    dev = CpuDevice(module, stream=lambda: 0)
    for _ in range(2):
        kl.forward(dev, _unit(smem=40000), _call())
    assert "cuFuncSetAttribute" not in lib.names()
    assert lib.names().count("cuModuleGetFunction") == 1
    assert lib.names().count("cuLaunchKernel") == 2
    assert module.attributes("fa_fwd") == {"registers": 168, "local_bytes": 0}


def test_errors_name_the_call_and_say_whether_the_context_is_lost() -> None:
    lib = FakeLibcuda(fail={"cuLaunchKernel": 700})
    module = cuda_launch.CudaModule(b"img", "x.cubin", cuda_launch.CudaDriver(lib))
    with pytest.raises(
        cuda_launch.CudaError, match=r"launching fa_fwd of x.cubin failed: CUDA error 700"
    ) as e:
        kl.forward(CpuDevice(module, stream=lambda: 0), _unit(smem=0), _call())
    assert e.value.sticky


def test_a_refused_image_carries_the_jit_log() -> None:
    lib = FakeLibcuda(fail={"cuModuleLoadDataEx": 218})
    with pytest.raises(
        cuda_launch.CudaError, match=r"loading bwd.ptx \(JIT log: ptxas fatal: bad image\)"
    ) as e:
        cuda_launch.CudaModule(b".version 8.0", "bwd.ptx", cuda_launch.CudaDriver(lib))
    assert not e.value.sticky


def test_grids_follow_the_entries_and_empty_ones_are_skipped() -> None:
    p = kl.FaParams()
    p.seqlen_q, p.seqlen_k, p.batch, p.heads = 100, 257, 3, 4
    assert kl.grid_of("e", kl.EntryLaunch(128, 64, 32, 0, "k_blocks"), p) == (9, 3, 4)
    assert kl.grid_of("e", kl.EntryLaunch(128, 64, 0, 0, "q_blocks"), p) == (2, 3, 4)
    p.seqlen_q = 0
    assert kl.grid_of("e", kl.EntryLaunch(128, 64, 0, 0, "q_blocks"), p) is None
    with pytest.raises(kl.LaunchError, match="grid 'splits'"):
        kl.grid_of("e", kl.EntryLaunch(128, 64, 0, 0, "splits"), p)


def test_the_grid_is_geometry_hs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit keeps no copy of the launch geometry: grid_of asks kernels/binding/geometry.h, so an
    altered header (query blocks rounded down, the (batch, head) limit lowered) changes the kit's grids."""
    p = kl.FaParams()
    p.seqlen_q, p.seqlen_k, p.batch, p.heads = 100, 257, 3, 4
    entry = kl.EntryLaunch(128, 64, 32, 0, "q_blocks")
    assert kl.grid_of("e", entry, p) == (2, 3, 4)
    altered = tmp_path / "binding"
    shutil.copytree(kl.BINDING, altered)
    header = altered / "geometry.h"
    text = header.read_text()
    rounded_up = "(rows + block - 1) / block"
    assert rounded_up in text
    header.write_text(text.replace(rounded_up, "rows / block"))
    monkeypatch.setattr(kl, "BINDING", altered)
    assert kl.grid_of("e", entry, p) == (1, 3, 4)
    monkeypatch.setattr(kl, "GRID_YZ_LIMIT", 3)
    p.batch = 2
    assert kl.grid_of("e", entry, p) == (1, 3, 3)  # 2 x 4 pairs folded past 3: 3 rows of 3


def test_the_yz_limit_is_read_from_the_header() -> None:
    assert kl.GRID_YZ_LIMIT == 65535
    assert kl.fold_batch_heads(2, 4, 3) == (3, 3)
    with pytest.raises(kl.LaunchError, match="pairs exceed 3 x 3"):
        kl.fold_batch_heads(4, 4, 3)
    assert "constexpr int64_t kGridYZLimit = 65535;" in (kl.BINDING / "geometry.h").read_text()
