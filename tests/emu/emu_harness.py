"""Runs fa's kernels on the CPU emulator (tests/emu/emu.h): build, launch, and the binding's steps.

`build(unit, arch)` compiles one kernels/tiles.py unit as host C++ with the emulator force-included
(g++, about 2 s, cached by content). `forward` and `backward` then do what the binding (kernels/binding/
attention.h and launch.cpp) does around the kernels: fill FaParams from torch CPU tensors, allocate the
outputs and workspaces, launch every entry in the unit's order over its grid, and sum GQA groups of
dk/dv. Every buffer a kernel can touch sits between canaries (the emulator does not see a kernel's plain
C++ stores), and a launch fails with the emulator's message on any out-of-bounds, race or hang.

FaParams is read from params.h itself, so the struct cannot drift from what the kernels compile.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import tiles
import torch

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
EMU_H = Path(__file__).resolve().parent / "emu.h"

GUARD = 64  # canary elements on each side of every buffer
CANARY = {torch.float16: 0x7E5A, torch.bfloat16: 0x7E5A, torch.float32: 0x7FC0DEAD, torch.int32: 0x5A5A5A5A}
SEQ_ROUND = 128  # launch.h kSeqRound
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


# ---- FaParams from params.h -------------------------------------------------------------------------
_CTYPES = {
    "const void*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
    "float*": ctypes.c_void_p,
    "const fa_i32*": ctypes.c_void_p,
    "fa_i64": ctypes.c_int64,
    "fa_i32": ctypes.c_int32,
    "float": ctypes.c_float,
}


def _params_fields() -> list[tuple[str, type]]:
    text = (CSRC / "params.h").read_text()
    body = text[text.index("typedef struct FaParams {") : text.index("} FaParams;")]
    body = re.sub(r"//[^\n]*", "", body.split("{", 1)[1])
    fields: list[tuple[str, type]] = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.match(r"((?:const )?\w+\*?) (.+)", decl)
        if m is None or m.group(1) not in _CTYPES:
            raise EmulatorError(f"params.h: cannot map the declaration '{decl}' to ctypes (extend _CTYPES)")
        for name in m.group(2).split(","):
            fields.append((name.strip(), _CTYPES[m.group(1)]))
    return fields


class FaParams(ctypes.Structure):
    _fields_ = _params_fields()


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
class Emulated:
    """One unit's emulated library: launch its entries."""

    def __init__(self, unit: tiles.KernelUnit, arch: str, csrc: Path = CSRC):
        self.unit = unit
        self.arch = arch
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
        self.lib.emu_error.restype = ctypes.c_char_p
        self.lib.emu_register.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
        self.lib.emu_collectives.restype = ctypes.c_uint64
        self.lib.emu_bank_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        # entry -> access kind -> [instructions, wavefronts, conflict-free wavefronts], summed over launches
        self.banks: dict[str, dict[str, list[int]]] = {}
        size = self.lib.emu_sizeof_params()
        if size != ctypes.sizeof(FaParams):
            raise EmulatorError(f"FaParams is {size} bytes in C++ and {ctypes.sizeof(FaParams)} in ctypes")

    @contextmanager
    def arena(self) -> Iterator[Arena]:
        self.lib.emu_reset_allocations()
        a = Arena(self.lib)
        yield a
        a.check()

    def launch_all(self, p: FaParams) -> None:
        """launch.cpp launch_all: every entry in order, grid (blocks over q or k rows [x splits], batch,
        heads)."""
        for name, e in self.unit.entries.items():
            by_keys = e.grid == "k_blocks"
            rows = p.seqlen_k if by_keys else p.seqlen_q
            block = e.block_n if by_keys else e.block_m
            grid_x = (rows + block - 1) // block
            if e.grid == "q_blocks_splits":
                grid_x *= p.num_splits
            if grid_x == 0 or p.batch == 0 or p.heads == 0:
                continue
            fn = ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value
            rc = self.lib.emu_launch(fn, grid_x, p.batch, p.heads, e.threads, e.smem_bytes, ctypes.byref(p))
            if rc != 0:
                raise EmulatorError(
                    f"{self.unit.name} (sm {self.arch}) {name}: {self.lib.emu_error().decode()}"
                )
            stats = (ctypes.c_uint64 * (3 * len(ACCESS_KINDS)))()
            self.lib.emu_bank_stats(stats)
            per_kind = self.banks.setdefault(name, {k: [0, 0, 0] for k in ACCESS_KINDS})
            for i, kind in enumerate(ACCESS_KINDS):
                for j in range(3):
                    per_kind[kind][j] += stats[3 * i + j]


def _strides(t: torch.Tensor, packed: bool) -> tuple[int, int, int]:
    return (0, t.stride(0), t.stride(1)) if packed else (t.stride(0), t.stride(1), t.stride(2))


def _set_strides(p: FaParams, prefix: str, t: torch.Tensor, packed: bool) -> None:
    b, r, h = _strides(t, packed)
    setattr(p, f"{prefix}_batch_stride", b)
    setattr(p, f"{prefix}_row_stride", r)
    setattr(p, f"{prefix}_head_stride", h)


@dataclass(frozen=True)
class Call:
    """One attention call's arguments, as the binding's operators take them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    softmax_scale: float | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0  # varlen, and a padded call's keys per sequence with block_table
    # The KV-cache layout (params.h), int32: (batch,) each, block_table (batch, pages per sequence) with
    # k/v then (pages, page_block_size, heads_k, dim).
    seqused_k: torch.Tensor | None = None
    leftpad_k: torch.Tensor | None = None
    kv_batch_idx: torch.Tensor | None = None
    block_table: torch.Tensor | None = None

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def paged(self) -> bool:
        return self.block_table is not None


def _base_params(c: Call, arena: Arena) -> tuple[FaParams, dict[str, torch.Tensor]]:
    """launch.cpp input_params, with the inputs placed in the arena."""
    t = {name: arena.add(name, getattr(c, name)) for name in ("q", "k", "v")}
    p = FaParams()
    p.q, p.k, p.v = (t[n].data_ptr() for n in ("q", "k", "v"))
    packed = c.varlen
    if packed:
        assert c.cu_seqlens_q is not None
        assert c.cu_seqlens_k is not None
        t["cu_q"] = arena.add("cu_seqlens_q", c.cu_seqlens_q)
        t["cu_k"] = arena.add("cu_seqlens_k", c.cu_seqlens_k)
        p.cu_seqlens_q, p.cu_seqlens_k = t["cu_q"].data_ptr(), t["cu_k"].data_ptr()
        p.batch = c.cu_seqlens_q.numel() - 1
        p.seqlen_q, p.seqlen_k = c.max_seqlen_q, c.max_seqlen_k
    else:
        p.batch = c.q.shape[0]
        p.seqlen_q, p.seqlen_k = c.q.shape[1], c.max_seqlen_k if c.paged else c.k.shape[1]
    for name in ("seqused_k", "leftpad_k", "kv_batch_idx", "block_table"):
        index = getattr(c, name)
        if index is not None:
            t[name] = arena.add(name, index)
            setattr(p, name, t[name].data_ptr())
    if c.block_table is not None:
        p.block_table_batch_stride = t["block_table"].stride(0)
        p.page_block_size = c.k.shape[1]
    _set_strides(p, "q", t["q"], packed)
    for name in ("k", "v"):  # pages are (pages, page_block_size, heads_k, dim) for packed q too
        _set_strides(p, name, t[name], packed and not c.paged)
    p.heads, p.heads_k, p.head_dim = c.q.shape[-2], c.k.shape[-2], c.q.shape[-1]
    p.seqlen_q_rounded = -(-p.seqlen_q // SEQ_ROUND) * SEQ_ROUND
    p.seqlen_k_rounded = -(-p.seqlen_k // SEQ_ROUND) * SEQ_ROUND
    p.is_causal = int(c.causal)
    p.window_left = c.window[0]
    p.window_right = 0 if c.causal else c.window[1]
    scale = c.softmax_scale if c.softmax_scale is not None else 1.0 / math.sqrt(c.q.shape[-1])
    p.scale_softmax = scale
    p.scale_softmax_log2 = scale * math.log2(math.e)
    p.softcap = c.softcap
    return p, t


def _nan_like(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised-looking output: NaN everywhere, so an element a kernel never writes shows."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype)


def forward(em: Emulated, c: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """attention.h fwd: (out like q, lse fp32 (batch, heads, seqlen_q) or (heads, total_q))."""
    with em.arena() as arena:
        p, _ = _base_params(c, arena)
        total_q = c.q.shape[0]
        lse_shape = [p.heads, total_q] if c.varlen else [p.batch, p.heads, p.seqlen_q]
        out = arena.add("out", _nan_like(c.q.shape, c.q.dtype))
        lse = arena.add("lse", _nan_like(lse_shape, torch.float32))
        p.o, p.lse = out.data_ptr(), lse.data_ptr()
        _set_strides(p, "o", out, c.varlen)
        em.launch_all(p)
        return out.clone(), lse.clone()


def forward_splitkv(em: Emulated, c: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV forward as the binding runs it: partials of num_splits shares of the keys, then the
    combine. Same outputs as `forward`."""
    with em.arena() as arena:
        p, _ = _base_params(c, arena)
        total_q = c.q.shape[0]
        lse_shape = [p.heads, total_q] if c.varlen else [p.batch, p.heads, p.seqlen_q]
        out = arena.add("out", _nan_like(c.q.shape, c.q.dtype))
        lse = arena.add("lse", _nan_like(lse_shape, torch.float32))
        o_accum = arena.add("o_accum", _nan_like([num_splits, *lse_shape, em.unit.head_dim], torch.float32))
        lse_accum = arena.add("lse_accum", _nan_like([num_splits, *lse_shape], torch.float32))
        p.o, p.lse = out.data_ptr(), lse.data_ptr()
        p.o_accum, p.lse_accum = o_accum.data_ptr(), lse_accum.data_ptr()
        p.num_splits = num_splits
        _set_strides(p, "o", out, c.varlen)
        em.launch_all(p)
        return out.clone(), lse.clone()


def backward(
    em: Emulated, c: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention.h bwd: (dq, dk, dv) with GQA groups summed."""
    with em.arena() as arena:
        p, _ = _base_params(c, arena)
        heads, heads_k = c.q.shape[-2], c.k.shape[-2]
        dim_rounded = em.unit.head_dim
        sq_rounded = p.seqlen_q_rounded
        ws_rows = c.q.shape[0] + SEQ_ROUND * p.batch if c.varlen else sq_rounded
        acc_shape = [ws_rows, heads, dim_rounded] if c.varlen else [p.batch, ws_rows, heads, dim_rounded]
        dsum_shape = [heads, ws_rows] if c.varlen else [p.batch, heads, ws_rows]
        o = arena.add("out", out)
        lse_in = arena.add("lse", lse)
        do = arena.add("dout", dout)
        dq_accum = arena.add("dq_accum", _nan_like(acc_shape, torch.float32))
        dsum = arena.add("dsoftmax_sum", _nan_like(dsum_shape, torch.float32))
        dq = arena.add("dq", _nan_like(c.q.shape, c.q.dtype))
        grouped = heads != heads_k
        kv_shape = list(c.k.shape)
        if grouped:
            kv_shape[-2] = heads
        dk = arena.add("dk", _nan_like(kv_shape, c.k.dtype))
        dv = arena.add("dv", _nan_like(kv_shape, c.v.dtype))
        p.o, p.lse, p.dout = o.data_ptr(), lse_in.data_ptr(), do.data_ptr()
        p.dq, p.dk, p.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        p.dq_accum, p.dsoftmax_sum = dq_accum.data_ptr(), dsum.data_ptr()
        for prefix, t in (("o", o), ("do", do), ("dq", dq), ("dk", dk), ("dv", dv)):
            _set_strides(p, prefix, t, c.varlen)
        em.launch_all(p)
        dq, dk, dv = dq.clone(), dk.clone(), dv.clone()
    if grouped:
        group = heads // heads_k
        split = [*c.k.shape[:-1], group, c.k.shape[-1]]
        split[-3] = heads_k
        dk = dk.view(split).float().sum(-2).to(c.k.dtype)
        dv = dv.view(split).float().sum(-2).to(c.v.dtype)
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
