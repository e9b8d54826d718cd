"""Runs fa's kernels on the CPU emulator (tests/emu/emu.h): build, launch, and the binding's steps.

`build(unit, arch)` compiles one kernels/tiles.py unit as host C++ with the emulator force-included
(g++, about 2 s, cached by content). `forward` and `backward` then do what the binding (kernels/binding/
attention.h and launch.cpp) does around the kernels, through the launch steps the GPU kit shares
(tests/gpu/kernel_launch.py): fill FaParams from torch CPU tensors, allocate the outputs and
workspaces, launch every entry in the unit's order over its grid, and sum GQA groups of dk/dv. Every
buffer a kernel can touch sits between canaries (the emulator does not see a kernel's plain C++
stores), and a launch fails with the emulator's message on any out-of-bounds, race or hang.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import tiles
import torch

from buildtool.builder import cubin_fit

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tests" / "gpu") not in sys.path:  # the launch steps shared with the GPU kit
    sys.path.insert(0, str(REPO / "tests" / "gpu"))

import kernel_launch
from kernel_launch import CSRC, Call, FaParams  # Call and FaParams: the names the emulator tests use

EMU_H = Path(__file__).resolve().parent / "emu.h"

GUARD = 64  # canary elements on each side of every buffer
CANARY = {torch.float16: 0x7E5A, torch.bfloat16: 0x7E5A, torch.float32: 0x7FC0DEAD, torch.int32: 0x5A5A5A5A}
ACCESS_KINDS = ("ld.shared", "st.shared", "cp.async", "ldmatrix")  # emu.h AccessKind, in order


class EmulatorError(RuntimeError):
    """A launch the emulator refused (out of bounds, race, divergence, deadlock) or a canary hit."""


def cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def _cache_dir() -> Path:
    root = os.environ.get("FA_EMU_CACHE") or os.path.join(tempfile.gettempdir(), f"fa-emu-{os.getuid()}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _arch_number(arch: str) -> int:
    major, minor = arch.split(".")
    return int(major) * 100 + int(minor) * 10


def build(unit: tiles.KernelUnit, arch: str, csrc: Path = CSRC) -> Path:
    """The emulated library of `unit` for `arch` ("7.5", "8.0", ...), compiled once per content.
    `csrc` is the kernel source folder (tests compile altered copies of kernels/csrc)."""
    compiler = cxx()
    if compiler is None:
        raise EmulatorError("no C++ compiler (g++) to build the emulator with")
    flags = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wno-unknown-pragmas",
        "-Wl,-Bsymbolic",
        f"-I{csrc}",
        f"-I{EMU_H.parent}",
        "-include",
        "emu.h",
        f"-DEMU_ARCH={_arch_number(arch)}",
        *(f"-D{k}={v}" for k, v in sorted(unit.defines.items())),
    ]
    if os.environ.get("FA_EMU_UBSAN") == "1":  # undefined behaviour in the kernels' C++ aborts the run
        flags += ["-fsanitize=undefined", "-fno-sanitize-recover=all", "-g"]
    digest = hashlib.sha256()
    for part in [compiler, *flags]:
        digest.update(part.encode() + b"\0")
    for src in [*sorted(csrc.glob("*")), EMU_H]:
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    out = _cache_dir() / f"{unit.name}-sm{arch.replace('.', '')}-{digest.hexdigest()[:16]}.so"
    if out.is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [compiler, *flags, "-x", "c++", str(csrc / Path(unit.source).name), "-o", str(tmp)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EmulatorError(f"emulator build of {unit.name} failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


# ---- buffers between canaries -------------------------------------------------------------------------
@dataclass
class Arena:
    """Buffers a launch may touch, each with GUARD canary elements before and after."""

    lib: ctypes.CDLL
    guarded: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def add(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A canary-guarded copy of `t` (same shape and strides, contents copied), registered with the
        emulator for its checked accesses."""
        n = t.untyped_storage().nbytes() // t.element_size() if t.numel() else 0
        flat = torch.empty(n + 2 * GUARD, dtype=t.dtype)
        raw = flat.view(torch.int16 if t.element_size() == 2 else torch.int32)
        raw.fill_(_signed(CANARY[t.dtype], t.element_size()))
        inner = flat.as_strided(t.shape, t.stride(), GUARD) if n else flat[GUARD:GUARD]
        if t.numel():
            inner.copy_(t)
        self.guarded.append((name, flat, raw.clone()))
        self.lib.emu_register(ctypes.c_void_p(inner.data_ptr()), n * t.element_size(), name.encode())
        return inner

    def check(self) -> None:
        for name, flat, before in self.guarded:
            raw = flat.view(before.dtype)
            for side, sl in (("before", slice(0, GUARD)), ("after", slice(len(raw) - GUARD, len(raw)))):
                if not torch.equal(raw[sl], before[sl]):
                    raise EmulatorError(f"a kernel wrote {side} the buffer '{name}' (canary overwritten)")


def _signed(value: int, size: int) -> int:
    bits = 8 * size
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


# ---- launching ------------------------------------------------------------------------------------------
def default_needs(unit: tiles.KernelUnit, arch: str) -> dict[str, cubin_fit.KernelNeeds]:
    """What each entry asks of a launch as far as tiles.py knows it without a cubin: the family's static
    shared memory; registers and launch bounds unknown (0, not checked)."""
    family = tiles.arch_family(arch)
    static = family.static_smem if family is not None else 0
    return {entry: cubin_fit.KernelNeeds(static, 0, 0) for entry in unit.entries}


class Emulated:
    """One unit's emulated library: a kernel_launch.Device that launches its entries on the emulator.
    Each launch is held to `needs` (per entry: static shared memory, registers, launch bounds; a cubin's
    cubin_fit.kernel_needs, or default_needs) and the arch's shared memory per block."""

    def __init__(
        self,
        unit: tiles.KernelUnit,
        arch: str,
        csrc: Path = CSRC,
        needs: Mapping[str, cubin_fit.KernelNeeds] | None = None,
    ):
        self.unit = unit
        self.arch = arch
        self.needs = dict(needs) if needs is not None else default_needs(unit, arch)
        self.launches = kernel_launch.UnitLaunch.of(unit)
        self.lib = ctypes.CDLL(str(build(unit, arch, csrc)))
        self.lib.emu_launch.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.POINTER(FaParams),
        ]
        self.lib.emu_set_limits.argtypes = [ctypes.c_int] * 4
        self.lib.emu_error.restype = ctypes.c_char_p
        self.lib.emu_register.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
        self.lib.emu_collectives.restype = ctypes.c_uint64
        self.lib.emu_bank_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        # entry -> access kind -> [instructions, wavefronts, conflict-free wavefronts], summed over launches
        self.banks: dict[str, dict[str, list[int]]] = {}
        self._arena: Arena | None = None
        size = self.lib.emu_sizeof_params()
        if size != ctypes.sizeof(FaParams):
            raise EmulatorError(f"FaParams is {size} bytes in C++ and {ctypes.sizeof(FaParams)} in ctypes")

    @contextmanager
    def arena(self) -> Iterator[Arena]:
        self.lib.emu_reset_allocations()
        a = Arena(self.lib)
        self._arena = a
        try:
            yield a
        finally:
            self._arena = None
        a.check()

    # kernel_launch.Device, inside `with self.arena()`
    def place(self, name: str, t: torch.Tensor) -> torch.Tensor:
        assert self._arena is not None, "place() outside `with arena()`"
        return self._arena.add(name, t)

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return self.place(name, _nan_like(shape, dtype))

    def launch(
        self, entry: str, launch: kernel_launch.EntryLaunch, grid: tuple[int, int, int], params: FaParams
    ) -> None:
        fn = ctypes.cast(getattr(self.lib, entry), ctypes.c_void_p).value
        need = self.needs.get(entry, cubin_fit.KernelNeeds(0, 0, 0))
        self.lib.emu_set_limits(
            need.max_threads, need.registers, need.static_smem, tiles.SMEM_LIMIT[self.arch]
        )
        rc = self.lib.emu_launch(fn, *grid, launch.threads, launch.smem_bytes, ctypes.byref(params))
        if rc != 0:
            raise EmulatorError(f"{self.unit.name} (sm {self.arch}) {entry}: {self.lib.emu_error().decode()}")
        stats = (ctypes.c_uint64 * (3 * len(ACCESS_KINDS)))()
        self.lib.emu_bank_stats(stats)
        per_kind = self.banks.setdefault(entry, {k: [0, 0, 0] for k in ACCESS_KINDS})
        for i, kind in enumerate(ACCESS_KINDS):
            for j in range(3):
                per_kind[kind][j] += stats[3 * i + j]


def _nan_like(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised-looking output: NaN everywhere, so an element a kernel never writes shows."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype)


def forward(em: Emulated, c: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """attention.h fwd: (out like q, lse fp32 (batch, heads, seqlen_q) or (heads, total_q))."""
    with em.arena():
        out, lse = kernel_launch.forward(em, em.launches, c)
        return out.clone(), lse.clone()


def forward_splitkv(em: Emulated, c: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV forward as the binding runs it: partials of num_splits shares of the keys, then the
    combine. Same outputs as `forward`."""
    with em.arena():
        out, lse = kernel_launch.forward_splitkv(em, em.launches, c, num_splits)
        return out.clone(), lse.clone()


def backward(
    em: Emulated, c: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention.h bwd: (dq, dk, dv) with GQA groups summed."""
    with em.arena():
        dq, dk, dv = kernel_launch.backward(em, em.launches, c, out, lse, dout)
        dq, dk, dv = dq.clone(), dk.clone(), dv.clone()
    dk, dv = kernel_launch.sum_groups(c, dk, dv)
    return dq, dk, dv


def build_all(pairs: list[tuple[tiles.KernelUnit, str]], jobs: int | None = None) -> None:
    """Compile many (unit, arch) libraries in parallel (each compile is one g++ process)."""
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(lambda pair: build(*pair), pairs))


def unit_for(arch: str, direction: str, dtype: str, head_dim: int) -> tiles.KernelUnit:
    """The unit serving `head_dim` (its bucket) on `arch`."""
    for u in tiles.units(arch):
        if u.direction == direction and u.dtype == dtype and head_dim in tiles.head_dims(u):
            return u
    raise LookupError(f"no {direction} {dtype} unit for head dim {head_dim} on sm {arch}")
