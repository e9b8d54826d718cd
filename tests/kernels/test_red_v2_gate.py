"""primitives.cuh's FA_HAS_RED_V2: the vector red (red.global.add.v2.f32) only where NVRTC's PTX ISA
has it. The PTX ISA release notes add vector types to atom/red in PTX ISA 8.1 = CUDA 12.1, so CUDA
12.0 (PTX ISA 8.0) and 11.x take two scalar reds; sm < 90 never has it. Checked with the host
preprocessor on the gate itself (NVRTC 12.0 is not one of the pinned toolkits)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRIMITIVES = Path(__file__).resolve().parents[2] / "kernels" / "csrc" / "primitives.cuh"


def gate(arch: int, major: int, minor: int) -> int:
    defines = [
        "-D__CUDACC_RTC__",
        f"-D__CUDA_ARCH__={arch}",
        f"-D__CUDACC_VER_MAJOR__={major}",
        f"-D__CUDACC_VER_MINOR__={minor}",
    ]
    cmd = ["g++", "-x", "c++", "-E", "-dM", *defines, f"-I{PRIMITIVES.parent}", str(PRIMITIVES)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("#define FA_HAS_RED_V2 ")]
    return int(line.split()[-1])


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize(
    ("arch", "major", "minor", "expected"),
    [
        (900, 11, 8, 0),
        (900, 12, 0, 0),
        (900, 12, 1, 1),
        (900, 12, 9, 1),
        (900, 13, 0, 1),
        (1200, 13, 0, 1),
        (890, 13, 0, 0),
    ],
)
def test_vector_red_from_cuda_12_1_on_sm90(arch: int, major: int, minor: int, expected: int) -> None:
    assert gate(arch, major, minor) == expected
