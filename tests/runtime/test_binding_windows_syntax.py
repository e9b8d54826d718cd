"""The binding's shared sources (launch.cpp, cuda_driver.cpp over dynlib.h) compile against Windows'
headers: nvcuda.dll through LoadLibraryExA from System32, torch_cuda.dll's stream getter through
GetModuleHandleA. A syntax check with MinGW's headers only: the Windows binding ships built by MSVC
(MinGW cannot carry a C++ exception across torch's stable C ABI), which has not run here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BINDING = Path(__file__).resolve().parents[2] / "kernels" / "binding"
CROSS = shutil.which("x86_64-w64-mingw32-g++-posix") or shutil.which("x86_64-w64-mingw32-g++")


@pytest.mark.skipif(CROSS is None, reason="no MinGW cross compiler (apt-get install g++-mingw-w64-x86-64)")
@pytest.mark.parametrize("source", ["cuda_driver.cpp", "launch.cpp"])
def test_shared_sources_compile_against_windows_headers(source: str) -> None:
    assert CROSS is not None
    done = subprocess.run(
        [
            CROSS,
            "-std=c++20",
            "-fsyntax-only",
            "-Wall",
            "-Werror",
            f"-I{BINDING}",
            f"-I{BINDING.parent / 'csrc'}",
            str(BINDING / source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
