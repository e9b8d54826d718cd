"""The binding's launch steps around the kernels, in Python, for any device that holds tensors and
launches an entry: the CPU emulator (tests/emu/emu_harness.py) and the GPU kit's driver launcher
(tests/gpu/cuda_launch.py) both launch through here, so the two cannot drift apart.

What kernels/binding/launch.cpp (with attention.h) does around a launch: fill FaParams (strides in elements), allocate the
outputs and workspaces, launch every entry of the unit in order over its grid, and sum GQA groups of
dk/dv after the backward. FaParams is read from params.h itself, so the struct cannot drift from what
the kernels compile. Outputs and workspaces start as NaN, so an element a kernel never writes shows.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
SEQ_ROUND = 128  # launch.h kSeqRound: lse-shaped workspaces are rounded up to this many rows


class LaunchError(RuntimeError):
    """Launch data that the steps here cannot follow (an unknown grid kind, a struct we cannot map)."""


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


def params_fields(params_h: Path = CSRC / "params.h") -> list[tuple[str, Any]]:
    """FaParams' fields, in order, as ctypes types."""
    text = params_h.read_text()
    body = text[text.index("typedef struct FaParams {") : text.index("} FaParams;")]
    body = re.sub(r"//[^\n]*", "", body.split("{", 1)[1])
    fields: list[tuple[str, Any]] = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.match(r"((?:const )?\w+\*?) (.+)", decl)
        if m is None or m.group(1) not in _CTYPES:
            raise LaunchError(f"{params_h}: cannot map the declaration '{decl}' to ctypes (extend _CTYPES)")
        for name in m.group(2).split(","):
            fields.append((name.strip(), _CTYPES[m.group(1)]))
    return fields


class FaParams(ctypes.Structure):
    _fields_ = params_fields()


# ---- what to launch ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EntryLaunch:
    """One entry's launch numbers: tiles.Launch, or a manifest kernel's "entries" value."""

    threads: int
    block_m: int
    block_n: int
    smem_bytes: int
    grid: str  # "q_blocks" | "k_blocks" | "q_blocks_splits"


@dataclass(frozen=True)
class UnitLaunch:
    """What the steps need of a unit: its bucket (dq_accum's last dim) and its entries in launch order."""

    name: str
    head_dim: int
    entries: Mapping[str, EntryLaunch]

    @classmethod
    def of(cls, unit: Any) -> UnitLaunch:
        """From a tiles.KernelUnit, or from a manifest kernel (a dict, docs/contracts.md section 3)."""
        if isinstance(unit, Mapping):
            name, head_dim, entries = unit["unit"], unit["head_dim"], unit["entries"]
            keys = [f.name for f in dataclasses.fields(EntryLaunch)]  # a later schema may add others
            return cls(
                name, head_dim, {e: EntryLaunch(**{k: spec[k] for k in keys}) for e, spec in entries.items()}
            )
        return cls(
            unit.name,
            unit.head_dim,
            {
                e: EntryLaunch(lc.threads, lc.block_m, lc.block_n, lc.smem_bytes, lc.grid)
                for e, lc in unit.entries.items()
            },
        )


GRIDS = ("q_blocks", "k_blocks", "q_blocks_splits")  # fa_attn/runtime/decision.py GRID_CODES, in code order

# ---- the launch geometry: the binding's own (kernels/binding/geometry.h), compiled for ctypes ----------
BINDING = REPO / "kernels" / "binding"
GEOMETRY_SHIM = Path(__file__).resolve().parent / "geometry_shim.cpp"


def _header_constant(name: str, header: Path = BINDING / "geometry.h") -> int:
    found = re.search(rf"\bconstexpr\s+\w+\s+{name}\s*=\s*(\d+)\s*;", header.read_text())
    if found is None:
        raise LaunchError(f"{header}: no `constexpr ... {name} = N;` (the launch steps read it from there)")
    return int(found.group(1))


# geometry.h kGridYZLimit: the blocks a grid holds in y and in z. Module-level so the emulator tests can
# lower it and run a folded grid at small sizes (grid_of reads it at each call).
GRID_YZ_LIMIT = _header_constant("kGridYZLimit")


def binding_geometry() -> ctypes.CDLL:
    """geometry.h of BINDING (read at each call: a test points it at an altered copy) with
    tests/gpu/geometry_shim.cpp's C entry points, built by the host C++ compiler (CXX, else g++) once
    per content into the user's temporary folder, and loaded."""
    return _built_geometry(BINDING)


@functools.cache
def _built_geometry(binding: Path) -> ctypes.CDLL:
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if compiler is None:
        raise LaunchError(
            f"the launch geometry is {binding / 'geometry.h'}, built with a host C++ compiler: none found "
            "(set CXX, or install g++)"
        )
    flags = ["-std=c++17", "-O1", "-shared", "-fPIC", f"-I{binding}", f"-I{CSRC}"]
    digest = hashlib.sha256("\0".join([compiler, *flags]).encode())
    for part in (GEOMETRY_SHIM, binding / "geometry.h", CSRC / "params.h"):
        digest.update(part.read_bytes() + b"\0")
    folder = Path(tempfile.gettempdir()) / f"fa-geometry-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.getuid():  # a shared /tmp: load only our own
        raise LaunchError(f"{folder}: not a folder of this user's; move it away, then re-run")
    out = folder / f"geometry-{digest.hexdigest()[:16]}.so"
    if not out.is_file():
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        done = subprocess.run(
            [compiler, *flags, str(GEOMETRY_SHIM), "-o", str(tmp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise LaunchError(
                f"building the launch geometry ({binding / 'geometry.h'}) failed:\n{done.stderr[-3000:]}"
            )
        os.replace(tmp, out)  # atomic: another process may build the same at once
    lib = ctypes.CDLL(str(out))
    i64 = ctypes.c_int64
    lib.fa_geometry_entry.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(FaParams), i64, ctypes.POINTER(i64)]
    lib.fa_geometry_fold.argtypes = [i64, i64, i64, ctypes.POINTER(i64)]
    return lib


# geometry.h Status, in order.
_OK, _EMPTY, _NO_BLOCK, _BAD_PAIRS, _TOO_MANY_PAIRS = range(5)


def _pairs_error(batch: int, heads: int, limit: int, status: int) -> LaunchError:
    if status == _TOO_MANY_PAIRS:
        return LaunchError(
            f"batch {batch} x heads {heads} = {batch * heads} (batch, head) pairs exceed {limit} x {limit}"
        )
    return LaunchError(f"batch {batch}, heads {heads}: no (batch, head) pair to fold (limit {limit})")


def fold_batch_heads(batch: int, heads: int, limit: int) -> tuple[int, int]:
    """geometry.h fold_batch_heads: (batch, heads) when both fit in `limit`, else the batch x heads
    pairs folded over y and z (the kernels' locate_block unfolds them)."""
    out = (ctypes.c_int64 * 2)()
    status = binding_geometry().fa_geometry_fold(batch, heads, limit, out)
    if status != _OK:
        raise _pairs_error(batch, heads, limit, status)
    return out[0], out[1]


def grid_of(entry: str, launch: EntryLaunch, p: FaParams, dev: Any = None) -> tuple[int, int, int] | None:
    """launch.cpp launch_all's grid: geometry.h entry_launch (blocks over query or key rows [times
    num_splits], then the (batch, head) pairs over y and z, folded past GRID_YZ_LIMIT); None when empty
    (a zero grid is a launch error, so the binding skips it). A device with a `geometry` method (the CPU
    emulator, whose library compiles the same header) answers it; else the header built for ctypes
    (binding_geometry) does, for the GPU kit's driver launcher."""
    geometry = getattr(dev, "geometry", None)
    if geometry is not None:
        geo = geometry(entry, launch, p, GRID_YZ_LIMIT)
        return None if geo is None else (geo[0], geo[1], geo[2])
    if launch.grid not in GRIDS:
        raise LaunchError(f"entry {entry}: grid {launch.grid!r} is not one the binding launches")
    out = (ctypes.c_int64 * 3)()
    code = GRIDS.index(launch.grid)
    status = binding_geometry().fa_geometry_entry(
        launch.threads, launch.block_m, launch.block_n, code, ctypes.byref(p), GRID_YZ_LIMIT, out
    )
    if status == _EMPTY:
        return None
    if status == _NO_BLOCK:
        block = launch.block_n if launch.grid == "k_blocks" else launch.block_m
        raise LaunchError(f"entry {entry}: no block size (block {block}, threads {launch.threads})")
    if status != _OK:
        raise _pairs_error(p.batch, p.heads, GRID_YZ_LIMIT, status)
    return out[0], out[1], out[2]


class Device(Protocol):
    """Where tensors live and entries run: the emulator's arena, or a GPU through the driver API."""

    def place(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t` where the kernels can read it (same shape and strides)."""

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        """A new buffer the kernels write, filled with NaN."""

    def launch(self, entry: str, launch: EntryLaunch, grid: tuple[int, int, int], params: FaParams) -> None:
        """Run one entry over `grid` with `launch.threads` threads and `launch.smem_bytes` of dynamic
        shared memory; raise on any launch error."""


def launch_all(dev: Device, unit: UnitLaunch, p: FaParams) -> None:
    """Every entry of the unit in order (the backward's preprocess, main and dq conversion)."""
    for name, e in unit.entries.items():
        grid = grid_of(name, e, p, dev)
        if grid is not None:
            dev.launch(name, e, grid, p)


# ---- one call's arguments and FaParams ------------------------------------------------------------------
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


def _set_strides(p: FaParams, prefix: str, t: torch.Tensor, packed: bool) -> None:
    b, r, h = (0, t.stride(0), t.stride(1)) if packed else (t.stride(0), t.stride(1), t.stride(2))
    setattr(p, f"{prefix}_batch_stride", b)
    setattr(p, f"{prefix}_row_stride", r)
    setattr(p, f"{prefix}_head_stride", h)


def _base_params(dev: Device, c: Call, keep: dict[str, torch.Tensor]) -> FaParams:
    """launch.cpp input_params, with the inputs placed on the device (kept alive in `keep`)."""
    for name in ("q", "k", "v"):
        keep[name] = dev.place(name, getattr(c, name))
    p = FaParams()
    p.q, p.k, p.v = (keep[n].data_ptr() for n in ("q", "k", "v"))
    packed = c.varlen
    if packed:
        assert c.cu_seqlens_q is not None
        assert c.cu_seqlens_k is not None
        keep["cu_seqlens_q"] = dev.place("cu_seqlens_q", c.cu_seqlens_q)
        keep["cu_seqlens_k"] = dev.place("cu_seqlens_k", c.cu_seqlens_k)
        p.cu_seqlens_q, p.cu_seqlens_k = keep["cu_seqlens_q"].data_ptr(), keep["cu_seqlens_k"].data_ptr()
        p.batch = c.cu_seqlens_q.numel() - 1
        p.seqlen_q, p.seqlen_k = c.max_seqlen_q, c.max_seqlen_k
    else:
        p.batch = c.q.shape[0]
        p.seqlen_q, p.seqlen_k = c.q.shape[1], c.max_seqlen_k if c.paged else c.k.shape[1]
    for name in ("seqused_k", "leftpad_k", "kv_batch_idx", "block_table"):
        index = getattr(c, name)
        if index is not None:
            keep[name] = dev.place(name, index)
            setattr(p, name, keep[name].data_ptr())
    if c.block_table is not None:
        p.block_table_batch_stride = keep["block_table"].stride(0)
        p.page_block_size = c.k.shape[1]
    _set_strides(p, "q", keep["q"], packed)
    for name in ("k", "v"):  # pages are (pages, page_block_size, heads_k, dim) for packed q too
        _set_strides(p, name, keep[name], packed and not c.paged)
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
    return p


@dataclass
class Prepared:
    """A call's FaParams with every buffer it points at; launch_all(dev, unit, prepared.params) may run
    it any number of times (the autotuner times it so)."""

    params: FaParams
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def prepare_forward(dev: Device, c: Call) -> Prepared:
    """launch.cpp forward_params and attention.h fwd up to the launch: out like q, lse fp32 (batch, heads, seqlen_q) or (heads, total_q)."""
    keep: dict[str, torch.Tensor] = {}
    p = _base_params(dev, c, keep)
    total_q = c.q.shape[0]
    lse_shape = [p.heads, total_q] if c.varlen else [p.batch, p.heads, p.seqlen_q]
    keep["out"] = dev.output("out", list(c.q.shape), c.q.dtype)
    keep["lse"] = dev.output("lse", lse_shape, torch.float32)
    p.o, p.lse = keep["out"].data_ptr(), keep["lse"].data_ptr()
    _set_strides(p, "o", keep["out"], c.varlen)
    return Prepared(p, keep)


def prepare_forward_splitkv(dev: Device, unit: UnitLaunch, c: Call, num_splits: int) -> Prepared:
    """launch.cpp split_kv_params up to the launch: the forward's buffers and the fp32 partials of each
    of num_splits shares of the keys, (num_splits, <lse's shape>[, head-dim bucket])."""
    prep = prepare_forward(dev, c)
    lse_shape = list(prep.tensors["lse"].shape)
    prep.tensors["o_accum"] = dev.output("o_accum", [num_splits, *lse_shape, unit.head_dim], torch.float32)
    prep.tensors["lse_accum"] = dev.output("lse_accum", [num_splits, *lse_shape], torch.float32)
    prep.params.o_accum = prep.tensors["o_accum"].data_ptr()
    prep.params.lse_accum = prep.tensors["lse_accum"].data_ptr()
    prep.params.num_splits = num_splits
    return prep


def prepare_backward(
    dev: Device, unit: UnitLaunch, c: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> Prepared:
    """launch.cpp backward_params and attention.h bwd up to the launch: the workspaces, and dq, dk, dv (dk/dv per query head with GQA)."""
    keep: dict[str, torch.Tensor] = {}
    p = _base_params(dev, c, keep)
    heads = c.q.shape[-2]
    ws_rows = c.q.shape[0] + SEQ_ROUND * p.batch if c.varlen else p.seqlen_q_rounded
    acc_shape = [ws_rows, heads, unit.head_dim] if c.varlen else [p.batch, ws_rows, heads, unit.head_dim]
    dsum_shape = [heads, ws_rows] if c.varlen else [p.batch, heads, ws_rows]
    keep["out"] = dev.place("out", out)
    keep["lse"] = dev.place("lse", lse)
    keep["dout"] = dev.place("dout", dout)
    keep["dq_accum"] = dev.output("dq_accum", acc_shape, torch.float32)
    keep["dsoftmax_sum"] = dev.output("dsoftmax_sum", dsum_shape, torch.float32)
    keep["dq"] = dev.output("dq", list(c.q.shape), c.q.dtype)
    kv_shape = list(c.k.shape)
    kv_shape[-2] = heads
    keep["dk"] = dev.output("dk", kv_shape, c.k.dtype)
    keep["dv"] = dev.output("dv", kv_shape, c.v.dtype)
    p.o, p.lse, p.dout = keep["out"].data_ptr(), keep["lse"].data_ptr(), keep["dout"].data_ptr()
    p.dq, p.dk, p.dv = keep["dq"].data_ptr(), keep["dk"].data_ptr(), keep["dv"].data_ptr()
    p.dq_accum, p.dsoftmax_sum = keep["dq_accum"].data_ptr(), keep["dsoftmax_sum"].data_ptr()
    for prefix, name in (("o", "out"), ("do", "dout"), ("dq", "dq"), ("dk", "dk"), ("dv", "dv")):
        _set_strides(p, prefix, keep[name], c.varlen)
    return Prepared(p, keep)


def sum_groups(c: Call, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attention.h bwd's last step: with GQA the kernels write dk/dv per query head; sum each group."""
    heads, heads_k = c.q.shape[-2], c.k.shape[-2]
    if heads == heads_k:
        return dk, dv
    split = [*c.k.shape[:-1], heads // heads_k, c.k.shape[-1]]
    return (
        dk.view(split).float().sum(-2).to(c.k.dtype),
        dv.view(split).float().sum(-2).to(c.v.dtype),
    )


def forward(dev: Device, unit: UnitLaunch, c: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as the device holds them."""
    prep = prepare_forward(dev, c)
    launch_all(dev, unit, prep.params)
    return prep.tensors["out"], prep.tensors["lse"]


def forward_splitkv(
    dev: Device, unit: UnitLaunch, c: Call, num_splits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV forward (partials, then the combine): the same (out, lse) as `forward`."""
    prep = prepare_forward_splitkv(dev, unit, c, num_splits)
    launch_all(dev, unit, prep.params)
    return prep.tensors["out"], prep.tensors["lse"]


def backward(
    dev: Device, unit: UnitLaunch, c: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) as the device holds them, dk/dv still per query head with GQA (see sum_groups)."""
    prep = prepare_backward(dev, unit, c, out, lse, dout)
    launch_all(dev, unit, prep.params)
    return prep.tensors["dq"], prep.tensors["dk"], prep.tensors["dv"]
