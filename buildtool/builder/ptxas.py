"""One NVRTC run per program, not per target: the standalone PTX assembler for the other targets.

Several SASS targets of one build often compile the same program: the same CUDA major, source,
headers and options, for sm_80 and sm_90, or sm_100 and sm_120. NVRTC's PTX for those differs only in
its `.target` line (the kernels branch on __CUDA_ARCH__ at 750 and 800 only), and most of an NVRTC
run (the C++ front end and NVVM, about 60% of its CPU) goes into that PTX. So the build runs NVRTC once
for the group's lowest target, keeping its PTX, and for each other target rewrites the `.target` line
and runs NVIDIA's standalone `ptxas` of the same release (the nvidia-cuda-nvcc wheel of NVRTC's pinned
version), with the options NVRTC's own ptxas uses (its default -O3: the kernels' options are all front-end ones).

bench/build/ptx_share.py compares every shared target of the release plan byte for byte: each cubin
with NVRTC's own for that target, each rewritten PTX with NVRTC's own compute_XX PTX (docs/figures.md,
"One NVRTC run per program"). Since they are the same bytes, an image keeps its NVRTC cache key
(compile.CompileTask.key): the route does not change what the key names.

Which targets share (share_groups, a pure function): plain targets (sm_NN; an arch-specific sm_90a or
a family sm_100f defines feature macros NVRTC alone knows), of one program, on the same side of every
number the program's text compares __CUDA_ARCH__ with (`__CUDA_ARCH__ >= 800`); a program that uses
__CUDA_ARCH__ any other way, or a CUDA major not in SHARED_MAJORS (CUDA 12: its cubins name the
assembler's build, see there) or without a pinned ptxas, shares nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from buildtool.builder import toolkits
from buildtool.core import cpus, fetch
from buildtool.core.cuda_facts import PinnedWheel
from buildtool.errors import FaError

Job = TypeVar("Job", bound=Hashable)


class Program(Protocol):
    """What share_groups reads of a compile.CompileTask (a protocol: compile.py imports this module)."""

    @property
    def cuda_major(self) -> int: ...
    @property
    def nvrtc_version(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def source_name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def options(self) -> tuple[str, ...]: ...


class PtxasError(FaError):
    """ptxas refused a PTX (its own words in the message) or could not be run."""


@dataclass(frozen=True)
class PtxasPin:
    package: str  # the PyPI distribution holding ptxas
    version: str  # the pinned NVRTC's version (toolkits.toolkit(major).version)
    wheels: Mapping[str, PinnedWheel]  # per host CPU


MEMBER = "nvidia/cuda_nvcc/bin/ptxas"  # ptxas's path inside every pinned wheel
# (major, PyPI project, version, host CPU, file, sha256): the hashes as PyPI's simple index lists them
_FILES = (
    (11, "nvidia-cuda-nvcc-cu11", "11.8.89", "x86_64", "nvidia_cuda_nvcc_cu11-11.8.89-py3-none-manylinux1_x86_64.whl",
     "3e25894debe6ce87e6dbb99b2311fba6f56c1b647daae2c4e5de537dc5d88876"),
    (11, "nvidia-cuda-nvcc-cu11", "11.8.89", "aarch64", "nvidia_cuda_nvcc_cu11-11.8.89-py3-none-manylinux2014_aarch64.whl",
     "8a33d735e6c374009dd8f965a26658956d4e98a4916e63fca4ac8df7a455c136"),
    (12, "nvidia-cuda-nvcc-cu12", "12.9.86", "x86_64",
     "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
     "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0"),
    (12, "nvidia-cuda-nvcc-cu12", "12.9.86", "aarch64",
     "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
     "44e1eca4d08926193a558d2434b1bf83d57b4d5743e0c431c0c83d51da1df62b"),
)  # fmt: skip
PINS: dict[int, PtxasPin] = {
    major: PtxasPin(
        package, version, {host: PinnedWheel(file, sha) for m, _, _, host, file, sha in _FILES if m == major}
    )
    for major, package, version, *_ in _FILES
}


# What NVRTC's own ptxas runs with for these kernels' options: ptxas's default level, said outright.
# (NVRTC 12's cubins record their assembler's options in .note.nv.tkinfo: `-arch sm_120` alone; a
# standalone run without -O3 writes a shorter note there, which moves every section after it.)
OPTIONS: tuple[str, ...] = ("-O3",)

# The majors whose targets share a program: those whose standalone ptxas gives NVRTC's cubin byte for
# byte (bench/build/ptx_share.py, docs/figures.md "ptx-share"). CUDA 11's cubins carry no note of the
# tool that made them. CUDA 12's carry .note.nv.tkinfo, whose build string differs between NVRTC's
# built-in ptxas ("Build system must define TOOLS_VERSION_EXTENDED") and the standalone one
# ("Build cuda_12.9.r12.9/compiler.36037853_0"): the same code, but not the same bytes, and a cubin's
# bytes must not depend on which route made it (a partly warm cache would take the other one).
SHARED_MAJORS = frozenset({11})


def _dir(pin: PtxasPin) -> Path:
    return toolkits.toolkits_root() / f"{pin.package}-{pin.version}"


def pinned(major: int) -> PtxasPin | None:
    """The ptxas pin for CUDA `major` on this machine's CPU, None when there is none."""
    pin = PINS.get(major)
    return pin if pin is not None and cpus.host() in pin.wheels else None


def is_unpacked(major: int) -> bool:
    pin = pinned(major)
    return pin is not None and (_dir(pin) / MEMBER).is_file()


def ptxas_path(major: int, progress: fetch.ProgressHook | None = None) -> Path:
    """CUDA `major`'s ptxas, fetched (hash-checked against the pin) and unpacked on first use; only the
    one binary is kept. Raises toolkits.ToolkitError when there is no pin or the wheel is refused."""
    pin = pinned(major)
    if pin is None:
        raise toolkits.ToolkitError(f"no pinned ptxas for CUDA {major} on {cpus.host()}")
    final = _dir(pin)
    exe = final / MEMBER
    if not exe.is_file():
        what = f"ptxas for CUDA {major} ({pin.package}=={pin.version})"
        wheel = pin.wheels[cpus.host()]
        toolkits.unpack(
            final,
            lambda: toolkits.fetch_pinned(pin.package, wheel, what, progress),
            MEMBER,
            is_dir=False,
            executable=True,
        )
    return exe


_TARGET = re.compile(rb"^\.target[ \t]+sm_\d+[a-z]?(?=[ \t,]|$)", re.MULTILINE)


def retarget(ptx: bytes, target: str) -> bytes:
    """`ptx` with its `.target` line naming `target` ("sm_90"), the rest unchanged (options after a
    comma, e.g. `, debug`, kept). Raises PtxasError unless there is exactly one such line."""
    found = _TARGET.findall(ptx)
    if len(found) != 1:
        raise PtxasError(f"expected one .target line in the PTX, found {len(found)}")
    return _TARGET.sub(b".target " + target.encode(), ptx, count=1)


def assemble(exe: Path, ptx: bytes, target: str) -> bytes:
    """The cubin ptxas `exe` makes of `ptx` for `target` ("sm_90")."""
    with tempfile.TemporaryDirectory(prefix="fa-ptxas-") as tmp:
        src, out = Path(tmp, "in.ptx"), Path(tmp, "out.cubin")
        src.write_bytes(ptx)
        try:
            run = subprocess.run(
                [str(exe), f"-arch={target}", *OPTIONS, str(src), "-o", str(out)],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "LC_ALL": "C"},
            )
        except OSError as e:
            raise PtxasError(f"cannot run {exe}: {e}") from e
        if run.returncode != 0 or not out.is_file():
            raise PtxasError(f"{exe} -arch={target} exited {run.returncode}: {run.stderr.strip()[-2000:]}")
        return out.read_bytes()


_ARCH_USE = re.compile(r"__CUDA_ARCH__")
_OPS = {
    ">=": int.__ge__,
    "<=": int.__le__,
    "==": int.__eq__,
    "!=": int.__ne__,
    ">": int.__gt__,
    "<": int.__lt__,
}
_FLIP = {">=": "<=", "<=": ">=", ">": "<", "<": ">", "==": "==", "!=": "!="}
_OP = r"(>=|<=|==|!=|>|<)"
_ARCH_CMP = re.compile(rf"__CUDA_ARCH__\s*{_OP}\s*(\d+)|(\d+)\s*{_OP}\s*__CUDA_ARCH__")
_DEFINED = re.compile(r"defined\s*\(?\s*__CUDA_ARCH__\s*\)?")

Comparison = tuple[str, int]  # __CUDA_ARCH__ <op> <number>


def arch_comparisons(texts: list[str]) -> tuple[Comparison, ...] | None:
    """Every comparison of __CUDA_ARCH__ with a number in the texts, as (op, number) with
    __CUDA_ARCH__ on the left; None if one of them uses it any other way (in arithmetic, as a value,
    in a comment): then no two targets are known to preprocess alike."""
    found: set[Comparison] = set()
    for text in texts:
        text = _DEFINED.sub("", text)
        compared = _ARCH_CMP.findall(text)
        if len(compared) != len(_ARCH_USE.findall(text)):
            return None
        for op, n, m, flipped in compared:
            found.add((op, int(n)) if op else (_FLIP[flipped], int(m)))
    return tuple(sorted(found))


def _side(number: int, comparisons: tuple[Comparison, ...]) -> tuple[bool, ...]:
    """How each comparison comes out for __CUDA_ARCH__ == number."""
    return tuple(_OPS[op](number, n) for op, n in comparisons)


def _arch_number(target: str) -> int | None:
    """sm_90 -> 900; None for a target that is not a plain sm_NN (sm_90a, sm_100f, compute_90)."""
    m = re.fullmatch(r"sm_(\d+)", target)
    return int(m.group(1)) * 10 if m else None


def share_groups(
    tasks: Mapping[Job, Program], majors: Collection[int] = SHARED_MAJORS
) -> dict[Job, tuple[Job, ...]]:
    """The cubin jobs whose program one NVRTC run can serve: the group's leader (its lowest target) ->
    the others (its followers, highest last). Only groups of two or more, only `majors` with a ptxas
    pin, by the rule in the module's docstring (the bench passes every pinned major)."""
    groups: dict[tuple[object, ...], list[tuple[int, Job]]] = defaultdict(list)
    comparisons: dict[tuple[object, ...], tuple[Comparison, ...] | None] = {}
    for job, t in tasks.items():
        number = _arch_number(t.target)
        if number is None or t.cuda_major not in majors or t.cuda_major not in PINS:
            continue
        text = (t.source_name, t.source, t.headers)
        if text not in comparisons:
            comparisons[text] = arch_comparisons([t.source, *(h for _, h in t.headers)])
        cmp = comparisons[text]
        if cmp is None:
            continue
        side = _side(number, cmp)
        key = (t.cuda_major, t.nvrtc_version, t.source_name, t.source, t.headers, t.options, side)
        groups[key].append((number, job))
    out = {}
    for members in groups.values():
        if len(members) > 1:
            members.sort(key=lambda m: m[0])
            out[members[0][1]] = tuple(job for _, job in members[1:])
    return out
