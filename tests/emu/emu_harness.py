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
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
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
RUNTIME = Path(__file__).resolve().parent / "emu_runtime.cpp"
BINDING = REPO / "kernels" / "binding"  # geometry.h: launch.cpp's launch geometry

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
    """__CUDA_ARCH__ of "9.0" or "9.0a" (900)."""
    major, minor = arch.removesuffix("a").split(".")
    return int(major) * 100 + int(minor) * 10


def _arch_defines(arch: str) -> list[str]:
    """What NVRTC defines for the arch: an arch-specific target ("9.0a") also has its feature macro."""
    return [f"-DEMU_ARCH={_arch_number(arch)}", *(["-DEMU_ARCH_SPECIFIC"] if arch.endswith("a") else [])]


# ---- the real sources, their inline PTX routed to the interpreter -------------------------------------
class RewriteError(EmulatorError):
    """Device source the mechanical rewrite cannot follow (an asm statement or a shared declaration)."""


_ASM = re.compile(r"\basm\s*(?:volatile\s*)?\(")
_OPERAND = re.compile(r'^"([=+]?)([hrlfdn])"\s*\((.*)\)$', re.DOTALL)
# Operand lists too long to write out (wgmma's up to 128 accumulators) are macros: an upper-case macro call
# in an operand section stands for its expansion, and a `#define NAME(x) "c"(x)` line whose body is one
# operand is rewritten like an operand (rewrite_operand_macros).
_OPERAND_MACRO = re.compile(r"^[A-Z_][A-Z0-9_]*\(.*\)$", re.DOTALL)
_OPERAND_DEFINE = re.compile(
    r'^(#define\s+[A-Z_][A-Z0-9_]*\(\w+\)\s+)("[=+]?[hrlfdn]"\s*\(.*\))\s*$', re.MULTILINE
)
_SMEM_DECL = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?unsigned\s+char\s+smem\[\]\s*;")


def _scan(text: str, start: int, stop: str) -> int:
    """Index of the first `stop` character at nesting depth 0 from `start`, skipping string literals."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0 and c in stop:
                return i
            depth -= 1
        elif depth == 0 and c in stop:
            return i
        i += 1
    return -1


def _split(text: str, sep: str) -> list[str]:
    parts, i = [], 0
    while True:
        j = _scan(text, i, sep)
        if j < 0:
            parts.append(text[i:].strip())
            return parts
        parts.append(text[i:j].strip())
        i = j + 1


def _operands(section: str, output: bool, where: str) -> str:
    calls = []
    for raw in _split(section, ",") if section.strip() else []:
        op = raw.replace("\\\n", " ").strip().removesuffix("\\").strip()  # inside a #define's body
        if _OPERAND_MACRO.match(
            op
        ):  # a list macro (hopper.cuh's FA_SM90_OPS<n>(d)), rewritten at its #define
            calls.append(op)
            continue
        m = _OPERAND.match(op)
        if m is None or bool(m.group(1)) != output:
            raise RewriteError(f"{where}: asm operand {op!r} is not one the emulator binds")
        mode, letter, expr = m.groups()
        calls.append(
            f"::emu::out_op('{mode}', '{letter}', {expr})"
            if output
            else f"::emu::in_op('{letter}', ({expr}))"
        )
    return "{" + ", ".join(calls) + "}"


def rewrite_asm(text: str, where: str) -> tuple[str, int]:
    """Every `asm [volatile] ("template" : outputs : inputs [: clobbers]);` of `text` as a call of the
    emulator's PTX interpreter, emu::ptx("template", {outputs}, {inputs}); and how many there were."""
    out, pos, count = [], 0, 0
    while (m := _ASM.search(text, pos)) is not None:
        close = _scan(text, m.end(), ")")
        if close < 0 or not text[close + 1 :].lstrip().startswith(";"):
            raise RewriteError(f"{where}: an asm statement at offset {m.start()} is not closed by ');'")
        parts = _split(text[m.end() : close], ":")
        template = parts[0].removesuffix("\\").rstrip()  # a line continuation inside a #define
        if not template.startswith('"') or len(parts) > 4:
            raise RewriteError(f"{where}: asm at offset {m.start()} is not 'template : out : in : clobbers'")
        outs = _operands(parts[1] if len(parts) > 1 else "", True, where)
        ins = _operands(parts[2] if len(parts) > 2 else "", False, where)
        out.append(text[pos : m.start()])
        out.append(f"::emu::ptx({template}, {outs}, {ins})")
        pos = close + 1
        count += 1
    out.append(text[pos:])
    return "".join(out), count


def rewrite_operand_macros(text: str, where: str) -> str:
    """Each `#define NAME(x) "c"(x)` of `text` (a macro standing for one asm operand) as the emulator's
    operand: an output for = and + constraints, else an input."""

    def one(m: re.Match[str]) -> str:
        output = m.group(2)[1] in "=+"
        return m.group(1) + _operands(m.group(2), output, where)[1:-1]

    return _OPERAND_DEFINE.sub(one, text)


PTX_HEADERS = ("primitives.cuh", "hopper.cuh")  # the only files with inline PTX


def emulator_sources(csrc: Path = CSRC) -> Path:
    """A copy of `csrc` the emulator compiles (cached by content): primitives.cuh with its inline PTX
    routed to the interpreter (rewrite_asm), and each kernel's `extern __shared__ ... smem[]` as the
    running block's shared memory (blocks run concurrently, each with its own)."""
    files = {p.name: p.read_text() for p in sorted(csrc.iterdir()) if p.is_file()}
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for name, text in files.items():
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    out = _cache_dir() / f"src-{digest.hexdigest()[:16]}"
    if out.is_dir():
        return out
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for name, text in files.items():
        if name in PTX_HEADERS:
            text, n = rewrite_asm(rewrite_operand_macros(text, str(csrc / name)), str(csrc / name))
            if n == 0:
                raise RewriteError(f"{csrc / name}: no asm statement to route to the interpreter")
        elif "asm" in name or _ASM.search(text):
            raise RewriteError(
                f"{csrc / name}: inline asm outside {' and '.join(PTX_HEADERS)} (move it there)"
            )
        text = _SMEM_DECL.sub("unsigned char* const smem = ::emu::block_smem();", text)
        if "__shared__" in text:
            raise RewriteError(f"{csrc / name}: a __shared__ declaration the emulator does not map")
        (tmp / name).write_text(text)
    try:
        os.rename(tmp, out)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _compile(cmd: list[str], out: Path, what: str) -> Path:
    if out.is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    done = subprocess.run([*cmd, "-o", str(tmp)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EmulatorError(f"emulator build of {what} failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return h.hexdigest()[:16]


def runtime_object(compiler: str, csrc: Path = CSRC, binding: Path = BINDING) -> Path:
    """emu_runtime.cpp, compiled once per content (without -fsanitize: its accesses are not hooked),
    with the binding's launch geometry (`binding`/geometry.h)."""
    flags = ["-std=c++17", "-O2", "-fPIC", "-Wall", "-U_FORTIFY_SOURCE", "-c", f"-I{binding}", f"-I{csrc}"]
    parts = [RUNTIME.read_bytes(), (csrc / "params.h").read_bytes(), (binding / "geometry.h").read_bytes()]
    tag = _digest(compiler, *flags, *parts)
    out = _cache_dir() / f"emu_runtime-{tag}.o"
    return _compile([compiler, *flags, "-x", "c++", str(RUNTIME)], out, "emu_runtime.cpp")


def build(unit: tiles.KernelUnit, arch: str, csrc: Path = CSRC, binding: Path = BINDING) -> Path:
    """The emulated library of `unit` for `arch` ("7.5", "8.0", ...), compiled once per content.
    `csrc` is the kernel source folder (tests compile altered copies of kernels/csrc, and of the
    binding's geometry.h with `binding`): the kernel
    translation unit is instrumented with -fsanitize=thread (its plain loads and stores call the
    runtime's hooks) and linked against emu_runtime.cpp, not libtsan."""
    compiler = cxx()
    if compiler is None:
        raise EmulatorError("no C++ compiler (g++) to build the emulator with")
    src = emulator_sources(csrc)
    flags = _kernel_flags(src, arch, unit.defines)
    link = ["-shared", "-Wl,-Bsymbolic"]
    if os.environ.get("FA_EMU_UBSAN") == "1":  # undefined behaviour in the kernels' C++ aborts the run
        ubsan = ["-fsanitize=undefined", "-fno-sanitize-recover=all", "-g"]
        flags += ubsan
        link += ubsan
    kernel = src / Path(unit.source).name
    tag = _digest(compiler, *flags, EMU_H.read_bytes(), src.name)
    obj = _compile(
        [compiler, *flags, "-c", "-x", "c++", str(kernel)], _cache_dir() / f"{unit.name}-{tag}.o", unit.name
    )
    runtime = runtime_object(compiler, csrc, binding)
    out = _cache_dir() / f"{unit.name}-sm{arch.replace('.', '')}-{_digest(obj.name, runtime.name, *link)}.so"
    return _compile([compiler, str(obj), str(runtime), *link], out, f"{unit.name} (link)")


def _kernel_flags(src: Path, arch: str, defines: Mapping[str, object]) -> list[str]:
    """g++ flags of a kernel translation unit over the emulator's copy of the sources `src`."""
    return [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-Wall",
        "-Wno-unknown-pragmas",
        "-fsanitize=thread",
        # one PTX call per call site, as on the GPU: g++ must not merge two calls of emu::ptx that end
        # alike into one (the .aligned rule tells call sites apart by their return address)
        "-fno-crossjumping",
        "-fno-tree-tail-merge",
        f"-I{src}",
        f"-I{EMU_H.parent}",
        "-include",
        "emu.h",
        *_arch_defines(arch),
        # hopper_fwd.cu __trap()s on a misaligned shared window: the emulator's process stops there
        *(["-D__trap()=__builtin_trap()"] if arch.endswith("a") else []),
        *(f"-D{k}={v}" for k, v in sorted(defines.items())),
    ]


def build_source(
    source: str, name: str, arch: str, defines: Mapping[str, object] | None = None, csrc: Path = CSRC
) -> Path:
    """An emulated library of one test kernel file's text `source` (which includes the headers of `csrc`,
    e.g. hopper.cuh, as a kernel does), compiled once per content. Its kernels take `const void* args`
    and run with EmulatedSource.launch."""
    compiler = cxx()
    if compiler is None:
        raise EmulatorError("no C++ compiler (g++) to build the emulator with")
    src = emulator_sources(csrc)
    flags = _kernel_flags(src, arch, defines or {})
    tag = _digest(compiler, *flags, EMU_H.read_bytes(), src.name, source)
    text = _cache_dir() / f"{name}-{tag}.cpp"
    if not text.exists():
        tmp = text.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_SMEM_DECL.sub("unsigned char* const smem = ::emu::block_smem();", source))
        os.replace(tmp, text)
    obj = _compile([compiler, *flags, "-c", "-x", "c++", str(text)], _cache_dir() / f"{name}-{tag}.o", name)
    runtime = runtime_object(compiler, csrc, BINDING)
    link = ["-shared", "-Wl,-Bsymbolic"]
    out = _cache_dir() / f"{name}-{_digest(obj.name, runtime.name, *link)}.so"
    return _compile([compiler, str(obj), str(runtime), *link], out, f"{name} (link)")


# ---- sm_90a tensor maps: kernels/binding/tensor_maps.h's arguments, encoded by the emulator -------------
ARCH_SPECIFIC = ("9.0a",)  # the arch-specific targets Emulated launches (FaParams + Q, K, V tensor maps)

# tensor_maps.h's hopper_maps, for ctypes: the binding's cuTensorMapEncodeTiled arguments of Q, K and V.
_MAPS_SOURCE = r"""
#include "tensor_maps.h"
extern "C" int emu_hopper_maps(const FaParams* p, int bf16, long long q_rows, long long q_batches,
                               long long k_rows, long long k_batches, int bucket, int block_m, int block_n,
                               fa_tensor_maps::Encode* out) {
  const fa_tensor_maps::Source src{bf16 != 0, q_rows, q_batches, k_rows, k_batches};
  fa_tensor_maps::Maps m{};
  const fa_tensor_maps::Status s = fa_tensor_maps::hopper_maps(*p, src, bucket, block_m, block_n, &m);
  out[0] = m.q;
  out[1] = m.k;
  out[2] = m.v;
  return static_cast<int>(s);
}
"""
_MAPS_STATUS = (
    "ok",
    "the paged KV cache's pages do not hold whole key blocks",
    "no such tile",
    "a base address not a multiple of 16 bytes",
    "a stride not a multiple of 16 bytes or >= 2^40",
    "an extent < 1 or > 2^32",
)  # tensor_maps.h Status, in order


class TensorMapArgs(ctypes.Structure):
    """fa_tensor_maps::Encode: one cuTensorMapEncodeTiled call's arguments, in its order (rank 4)."""

    _fields_ = [
        ("data_type", ctypes.c_int),
        ("rank", ctypes.c_uint),
        ("global_address", ctypes.c_void_p),
        ("global_dim", ctypes.c_uint64 * 4),
        ("global_strides", ctypes.c_uint64 * 3),
        ("box_dim", ctypes.c_uint32 * 4),
        ("element_strides", ctypes.c_uint32 * 4),
        ("interleave", ctypes.c_int),
        ("swizzle", ctypes.c_int),
        ("l2_promotion", ctypes.c_int),
        ("oob_fill", ctypes.c_int),
    ]


def maps_library(csrc: Path = CSRC, binding: Path = BINDING) -> ctypes.CDLL:
    """tensor_maps.h (with `csrc`'s params.h) compiled by the host compiler, once per content."""
    compiler = cxx()
    if compiler is None:
        raise EmulatorError("no C++ compiler (g++) to build the emulator with")
    flags = ["-std=c++17", "-O2", "-shared", "-fPIC", f"-I{binding}", f"-I{csrc}"]
    tag = _digest(compiler, *flags, _MAPS_SOURCE, (binding / "tensor_maps.h").read_bytes(),
                  (csrc / "params.h").read_bytes())  # fmt: skip
    text = _cache_dir() / f"tensor_maps-{tag}.cpp"
    if not text.exists():
        tmp = text.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_MAPS_SOURCE)
        os.replace(tmp, text)
    lib = ctypes.CDLL(str(_compile([compiler, *flags, str(text)], text.with_suffix(".so"), "tensor_maps.h")))
    lib.emu_hopper_maps.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_longlong] * 4,
                                    *[ctypes.c_int] * 3, ctypes.c_void_p]  # fmt: skip
    return lib


def _declare_encoder(lib: ctypes.CDLL) -> None:
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    lib.emu_tensor_map_encode_tiled.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
        *[ctypes.c_int] * 4,
    ]  # fmt: skip
    lib.emu_error.restype = ctypes.c_char_p


def encode_maps(lib: ctypes.CDLL, args: list[TensorMapArgs]) -> bytes:
    """The 128-byte tensor maps the emulator's cuTensorMapEncodeTiled makes of `args`, in order."""
    raw = (ctypes.c_uint8 * (128 * len(args) + 64))()
    at = ctypes.addressof(raw) + (-ctypes.addressof(raw) % 64)  # a CUtensorMap is 64-byte aligned
    for i, e in enumerate(args):
        rc = lib.emu_tensor_map_encode_tiled(
            ctypes.c_void_p(at + 128 * i), e.data_type, e.rank, ctypes.c_void_p(e.global_address),
            e.global_dim, e.global_strides, e.box_dim, e.element_strides, e.interleave, e.swizzle,
            e.l2_promotion, e.oob_fill,
        )  # fmt: skip
        if rc != 0:
            raise EmulatorError(lib.emu_error().decode())
    return ctypes.string_at(at, 128 * len(args))


def hopper_maps(
    maps_lib: ctypes.CDLL, lib: ctypes.CDLL, unit: tiles.KernelUnit, launch: kernel_launch.EntryLaunch,
    params: FaParams, extents: Mapping[str, tuple[int, int]],
) -> bytes:  # fmt: skip
    """The Q, K, V tensor maps of an sm_90a launch, as the binding makes them: tensor_maps.h's arguments
    (from `params` and the (rows, batches) `extents` of q and k) through the emulator's encoder."""
    args = (TensorMapArgs * 3)()
    (qr, qb), (kr, kb) = extents["q"], extents["k"]
    status = maps_lib.emu_hopper_maps(
        ctypes.byref(params), unit.dtype == "bf16", qr, qb, kr, kb, unit.head_dim, launch.block_m,
        launch.block_n, args,
    )  # fmt: skip
    if status != 0:
        why = _MAPS_STATUS[status] if status < len(_MAPS_STATUS) else f"status {status}"
        raise kernel_launch.LaunchError(f"tensor_maps.h refuses the call: {why}")
    return encode_maps(lib, list(args))


def extent(t: torch.Tensor) -> tuple[int, int]:
    """(rows, batches) of a padded (batch, seq, heads, d) or a packed (total, heads, d) tensor."""
    return (t.shape[0], 1) if t.dim() == 3 else (t.shape[1], t.shape[0])


class EmulatedSource:
    """A test kernel library (build_source): launches of `void entry(const void* args)` and the driver's
    cuTensorMapEncodeTiled as the emulator encodes it."""

    def __init__(self, lib_path: Path, arch: str, seed: int = 1, window: int = 8, registers: int = 0):
        self.lib = ctypes.CDLL(str(lib_path))
        self.lib.emu_set_arch(_arch_number(arch))
        self.lib.emu_set_arch_specific(int(arch.endswith("a")))
        self.lib.emu_set_schedule.argtypes = [ctypes.c_uint64, ctypes.c_int]
        self.lib.emu_set_schedule(seed, window)
        self.lib.emu_set_limits.argtypes = [ctypes.c_int] * 4
        self.lib.emu_set_limits(0, registers, 0, 0)
        self.lib.emu_error.restype = ctypes.c_char_p
        self.lib.emu_register.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
        self.lib.emu_launch_raw.argtypes = [
            ctypes.c_void_p,
            *[ctypes.c_uint] * 4,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        _declare_encoder(self.lib)

    def register(self, name: str, t: torch.Tensor) -> None:
        """A global buffer kernels may read and write (bounds- and race-checked)."""
        self.lib.emu_register(ctypes.c_void_p(t.data_ptr()), t.untyped_storage().nbytes(), name.encode())

    def encode_tiled(
        self,
        out: ctypes.Array[ctypes.c_uint64],
        dtype: int,
        t: torch.Tensor,
        dims: list[int],
        strides: list[int],
        box: list[int],
        swizzle: int,
    ) -> None:
        """cuTensorMapEncodeTiled(out, dtype, rank, t's data, dims, strides (bytes, dims 1..), box, element
        strides 1, interleave none, swizzle, L2 promotion none, OOB fill none) on the emulator."""
        rank = len(dims)
        rc = self.lib.emu_tensor_map_encode_tiled(
            ctypes.cast(out, ctypes.c_void_p),
            dtype,
            rank,
            ctypes.c_void_p(t.data_ptr()),
            (ctypes.c_uint64 * rank)(*dims),
            (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
            (ctypes.c_uint32 * rank)(*box),
            (ctypes.c_uint32 * rank)(*[1] * rank),
            0,
            swizzle,
            0,
            0,
        )
        if rc != 0:
            raise EmulatorError(self.lib.emu_error().decode())

    def launch_maps(
        self, entry: str, grid: tuple[int, int, int], threads: int, smem: int, params: FaParams, maps: bytes
    ) -> None:
        """An sm_90a entry `void entry(FaParams, CUtensorMap x n)`: `maps` holds the n 128-byte maps in order."""
        fn = ctypes.cast(getattr(self.lib, entry), ctypes.c_void_p).value
        self.lib.emu_launch_maps.argtypes = [
            ctypes.c_void_p,
            *[ctypes.c_uint] * 4,
            ctypes.c_int,
            ctypes.POINTER(FaParams),
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        rc = self.lib.emu_launch_maps(fn, *grid, threads, smem, ctypes.byref(params), maps, len(maps) // 128)
        if rc != 0:
            raise EmulatorError(f"{entry}: {self.lib.emu_error().decode()}")

    def launch(
        self, entry: str, grid: tuple[int, int, int], threads: int, smem: int, args: ctypes.Array
    ) -> None:
        fn = ctypes.cast(getattr(self.lib, entry), ctypes.c_void_p).value
        if self.lib.emu_launch_raw(fn, *grid, threads, smem, ctypes.cast(args, ctypes.c_void_p)) != 0:
            raise EmulatorError(f"{entry}: {self.lib.emu_error().decode()}")


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
        self.lib.emu_register_guarded(
            ctypes.c_void_p(inner.data_ptr()), n * t.element_size(), GUARD * t.element_size(), name.encode()
        )
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
        seeds: tuple[int, ...] | None = None,
        window: int | None = None,
        binding: Path = BINDING,
    ):
        self.unit = unit
        self.arch = arch
        self.needs = dict(needs) if needs is not None else default_needs(unit, arch)
        self.launches = kernel_launch.UnitLaunch.of(unit)
        self.seeds = seeds if seeds is not None else default_seeds()
        self.window = window if window is not None else int(os.environ.get("FA_EMU_WINDOW", "8"))
        self.lib = ctypes.CDLL(str(build(unit, arch, csrc, binding)))
        self.lib.emu_set_schedule.argtypes = [ctypes.c_uint64, ctypes.c_int]
        self.lib.emu_entry_launch.argtypes = [
            *[ctypes.c_int] * 5,
            ctypes.POINTER(FaParams),
            ctypes.c_int64,
            ctypes.POINTER(ctypes.c_int64),
        ]
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
        self.lib.emu_register_guarded.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_char_p,
        ]
        self.lib.emu_set_arch(_arch_number(arch))
        self.lib.emu_set_arch_specific(int(arch.endswith("a")))
        self.lib.emu_set_schedule(self.seeds[0], self.window)  # launches made outside forward/backward
        self.lib.emu_collectives.restype = ctypes.c_uint64
        self.lib.emu_bank_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        # entry -> access kind -> [instructions, wavefronts, conflict-free wavefronts], summed over launches
        self.banks: dict[str, dict[str, list[int]]] = {}
        self._arena: Arena | None = None
        # an arch-specific unit (sm_90a) takes Q, K, V tensor maps after FaParams, made from q's and k's extents
        self.maps_lib = maps_library(csrc, binding) if unit.arch_specific else None
        self.extents: dict[str, tuple[int, int]] = {}
        if unit.arch_specific:
            _declare_encoder(self.lib)
            self.lib.emu_launch_maps.argtypes = [
                ctypes.c_void_p, *[ctypes.c_uint] * 4, ctypes.c_int, ctypes.POINTER(FaParams), ctypes.c_char_p,
                ctypes.c_int,
            ]  # fmt: skip
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
        if name in ("q", "k"):
            self.extents[name] = extent(t)
        return self._arena.add(name, t)

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return self.place(name, _nan_like(shape, dtype))

    def geometry(
        self, entry: str, launch: kernel_launch.EntryLaunch, p: FaParams, limit: int
    ) -> tuple[int, int, int, int, int] | None:
        """launch.cpp's launch of `entry` (the binding's geometry.h, compiled into the library): grid x,
        y, z, threads and dynamic shared memory; None when there is nothing to launch."""
        out = (ctypes.c_int64 * 5)()
        code = kernel_launch.GRIDS.index(launch.grid) if launch.grid in kernel_launch.GRIDS else -1
        status = self.lib.emu_entry_launch(
            launch.threads,
            launch.block_m,
            launch.block_n,
            launch.smem_bytes,
            code,
            ctypes.byref(p),
            limit,
            out,
        )
        if status == 1:
            return None
        if status != 0:
            why = {
                2: "no block size",
                3: "no (batch, head) pair",
                4: f"(batch, head) pairs exceed {limit} x {limit}",
            }
            raise kernel_launch.LaunchError(f"entry {entry}: {why.get(status, f'status {status}')}")
        gx, gy, gz, threads, smem = out
        return gx, gy, gz, threads, smem

    def launch(
        self, entry: str, launch: kernel_launch.EntryLaunch, grid: tuple[int, int, int], params: FaParams
    ) -> None:
        fn = ctypes.cast(getattr(self.lib, entry), ctypes.c_void_p).value
        need = self.needs.get(entry, cubin_fit.KernelNeeds(0, 0, 0))
        self.lib.emu_set_limits(
            need.max_threads, need.registers, need.static_smem, tiles.SMEM_LIMIT[self.arch]
        )
        geo = self.geometry(entry, launch, params, kernel_launch.GRID_YZ_LIMIT)
        if geo is None or geo[:3] != tuple(grid):
            raise EmulatorError(
                f"{entry}: launched on grid {grid}, which launch.cpp's geometry gives as {geo}"
            )
        if self.maps_lib is None:
            rc = self.lib.emu_launch(fn, *grid, geo[3], geo[4], ctypes.byref(params))
        else:
            maps = hopper_maps(self.maps_lib, self.lib, self.unit, launch, params, self.extents)
            rc = self.lib.emu_launch_maps(
                fn, *grid, geo[3], geo[4], ctypes.byref(params), maps, len(maps) // 128
            )
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


def default_seeds() -> tuple[int, ...]:
    """FA_EMU_SEEDS: the scheduler seeds every emulated call runs under, "1,2,3" or a count ("3": seeds
    1 to 3); default one seed."""
    text = os.environ.get("FA_EMU_SEEDS", "1").strip()
    try:
        seeds = (
            tuple(int(x) for x in text.split(",") if x.strip())
            if "," in text
            else tuple(range(1, int(text) + 1))
        )
    except ValueError:
        raise EmulatorError(f"FA_EMU_SEEDS={text!r}: give seeds as '1,2,3' or a count such as '3'") from None
    if not seeds:
        raise EmulatorError(f"FA_EMU_SEEDS={text!r}: give at least one seed")
    return seeds


def _per_seed(
    em: Emulated, run: Callable[[], tuple[torch.Tensor, ...]], names: tuple[str, ...]
) -> tuple[torch.Tensor, ...]:
    """`run` (inside an arena) once per scheduler seed of `em`. Every order must give the same results;
    only "dq", which blocks accumulate with red.add in an order that may differ, is compared with the
    tolerance of one step of its dtype (an fp32 sum in another order can round to the neighbouring
    element: 2 of 36,000 bf16 elements did, sm90 d128, sq 150, sk 270). Returns the first seed's results."""
    first: tuple[torch.Tensor, ...] | None = None
    for seed in em.seeds:
        em.lib.emu_set_schedule(seed, em.window)
        with em.arena():
            got = tuple(t.clone() for t in run())
        if first is None:
            first = got
            continue
        for name, a, b in zip(names, first, got, strict=True):
            same = (
                torch.allclose(
                    a.float(),
                    b.float(),
                    rtol=2**-7 if a.dtype == torch.bfloat16 else 2e-3,
                    atol=1e-5,
                    equal_nan=True,
                )
                if name == "dq"
                else torch.equal(a.nan_to_num(), b.nan_to_num())
            )
            if not same:
                raise EmulatorError(
                    f"{em.unit.name} (sm {em.arch}): '{name}' differs between scheduler seeds {em.seeds[0]} and "
                    f"{seed}: the result depends on the order blocks and warps run in"
                )
    assert first is not None
    return first


def forward(em: Emulated, c: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """attention.h fwd: (out like q, lse fp32 (batch, heads, seqlen_q) or (heads, total_q))."""
    out, lse = _per_seed(em, lambda: kernel_launch.forward(em, em.launches, c), ("out", "lse"))
    return out, lse


def forward_splitkv(em: Emulated, c: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV forward as the binding runs it: partials of num_splits shares of the keys, then the
    combine. Same outputs as `forward`."""
    out, lse = _per_seed(
        em, lambda: kernel_launch.forward_splitkv(em, em.launches, c, num_splits), ("out", "lse")
    )
    return out, lse


def backward(
    em: Emulated, c: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention.h bwd: (dq, dk, dv) with GQA groups summed."""
    dq, dk, dv = _per_seed(
        em, lambda: kernel_launch.backward(em, em.launches, c, out, lse, dout), ("dq", "dk", "dv")
    )
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
