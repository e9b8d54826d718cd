"""Build the stable-ABI binding with MSVC on a Windows runner (the release workflow's `windows` job):
the same sources as the Linux stable form (buildtool/builder/binding.py `sources`), against the
headers and import library of the installed torch (its floor minor), into fa_attn_ops.dll.

Why MSVC: the stable C ABI carries C++ exceptions from the binding into torch's dispatcher, which only
torch's own C++ runtime and exception model can unwind (a MinGW or zig build loads, then aborts at its
first failed check). /EHs, not /EHsc: the exceptions cross `extern "C"` functions, which /EHsc assumes
never throw. Only torch_cpu.lib is linked: the C shim lives in torch_cpu.dll, as in libtorch_cpu.so.

Not run here (this project has no Windows machine): README says the Windows binding has not been built.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from buildtool.builder.binding import sources
from buildtool.core import binding_forms, kernels_src


def cl_command(kernels_root: Path, torch_dir: Path, floor: str, out: Path) -> list[str]:
    """The cl.exe command line that compiles and links the binding."""
    cpp = [p for p in sources(kernels_root, binding_forms.STABLE) if p.suffix == ".cpp"]
    include = (
        torch_dir / "include",
        torch_dir / "include" / "torch" / "csrc" / "api" / "include",
        kernels_root / "csrc",
        kernels_root / "binding",
    )
    return [
        "cl",
        "/nologo",
        "/std:c++20",
        "/O2",
        "/EHs",
        "/MD",
        "/LD",
        "/DNOMINMAX",
        f"/DTORCH_TARGET_VERSION={binding_forms.target_version(floor)}",
        *[f"/I{d}" for d in include],
        *map(str, cpp),
        f"/Fe{out}",
        "/link",
        f"/LIBPATH:{torch_dir / 'lib'}",
        "torch_cpu.lib",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--floor", required=True, help="matrix.yaml's stable_abi, e.g. 2.10 (the installed torch's minor)"
    )
    ap.add_argument("--out", type=Path, required=True, help="the DLL to write, e.g. fa_attn_ops.dll")
    args = ap.parse_args(argv)
    import torch  # the installed Windows torch of the floor minor: headers in include/, torch_cpu.lib in lib/

    torch_dir = Path(torch.__file__).parent
    command = cl_command(kernels_src.kernels_dir(), torch_dir, args.floor, args.out)
    print(" ".join(command), flush=True)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
