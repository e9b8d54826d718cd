"""The host binding builds with plain g++ against the installed torch's headers, links only libc10 and
libtorch_cpu (through stubs), and loads into this CPU-only torch with its CUDA kernels registered."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from binding_checks import (
    KERNELS,
    assert_every_argument_reaches_the_checks,
    assert_loads_with_cuda_kernels_only,
    run,
)

FLAGS = ["-O2", "-fPIC", "-fvisibility=hidden"]  # + -shared at link time; -std as fa build picks it

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The binding as `fa build` lays it out ("cuda"), and the same sources with the kernels registered
    under the CPU key ("cpu"), so CPU tensors reach the operators' code."""
    import torch
    import torch.utils.cpp_extension as cpp

    out = tmp_path_factory.mktemp("binding")
    stubs = out / "stub"
    stubs.mkdir()
    for soname in ("libc10.so", "libtorch_cpu.so"):
        run(["gcc", "-shared", f"-Wl,-soname,{soname}", "-o", str(stubs / soname), "-x", "c", "/dev/null"])
    includes = [f"-I{d}" for d in (*cpp.include_paths(), KERNELS / "csrc", KERNELS / "binding")]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    shared = sorted((KERNELS / "binding").glob("*.cpp"))
    form = KERNELS / "binding" / "forms" / "aten.cpp"
    # The standards `fa build` compiles them in: the form's by this torch's headers (C++17 before 2.15),
    # the shared objects' C++20, linked together.
    from buildtool.builder.binding import OBJECT_STD, cxx_std

    form_std = cxx_std(torch.__version__)
    objects = {src.stem: ([OBJECT_STD], src) for src in shared}
    objects |= {"aten": ([form_std], form), "aten_cpu": ([form_std, "-DFA_BINDING_DISPATCH_KEY=CPU"], form)}
    # One compiler per source in parallel (CI has 2 cores), then link.
    jobs = {
        name: subprocess.Popen(
            ["g++", *FLAGS, abi, *extra, *includes, "-c", str(src), "-o", str(out / f"{name}.o")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (extra, src) in objects.items()
    }
    for name, job in jobs.items():
        _, err = job.communicate()
        assert job.returncode == 0, f"compiling {name} failed:\n{err[-4000:]}"
    libs = {}
    for key, form_object in (("cuda", "aten"), ("cpu", "aten_cpu")):
        lib = out / key / "libfa_attn_ops.so"
        lib.parent.mkdir()
        run(
            [
                "g++",
                "-shared",
                *(str(out / f"{name}.o") for name in (*(s.stem for s in shared), form_object)),
                "-o",
                str(lib),
                f"-L{stubs}",
                "-Wl,--no-as-needed",
                "-l:libc10.so",
                "-l:libtorch_cpu.so",
                "-Wl,--as-needed",
                "-ldl",
            ]
        )
        libs[key] = lib
    return libs


@pytest.fixture(scope="module")
def binding(built: dict[str, Path]) -> Path:
    return built["cuda"]


def test_links_no_cuda_and_no_python(binding: Path) -> None:
    needed = run(["readelf", "-d", str(binding)]).stdout
    names = {line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line}
    assert {"libc10.so", "libtorch_cpu.so"} <= names
    assert not any("cuda" in n or "python" in n for n in names), names
    undefined = run(["nm", "-D", "--undefined-only", str(binding)]).stdout
    assert not [s for s in undefined.split() if s.startswith("Py")], (
        "the binding must not use the Python C API"
    )


def test_loads_on_cpu_torch_and_registers_cuda_kernels(binding: Path) -> None:
    assert_loads_with_cuda_kernels_only(binding)


def test_every_argument_is_read_and_the_checks_run(built: dict[str, Path]) -> None:
    """The kernels are boxed: each reads its schema's arguments off the stack by position, which only a
    call exercises. All three operators, called with CPU tensors, get to fa_attn's input checks."""
    assert_every_argument_reaches_the_checks(built["cpu"])


def test_installed_layout_loads_through_the_loader(binding: Path, tmp_path: Path) -> None:
    """fa_attn/ + manifest.json + libfa_attn_ops.so as a wheel lays them out: the loader's checks pass
    and the binding loads lazily, on first use, with its CUDA kernels registered."""
    import json

    import torch

    pkg = tmp_path / "fa_attn"
    shutil.copytree(KERNELS / "fa_attn", pkg, ignore=shutil.ignore_patterns("__pycache__", "manifest.json"))
    shutil.copy(binding, pkg / "libfa_attn_ops.so")
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    manifest = {
        "schema": 1,
        "version": "0.1.0+cu12",
        "cuda_major": 12,
        "torch": minor,
        "cxx11abi": torch._C._GLIBCXX_USE_CXX11_ABI,
        "binding": "libfa_attn_ops.so",
        "features": [],
        "kernels": [],
        "coverage": [],
    }
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    script = textwrap.dedent("""
        import torch, fa_attn
        from fa_attn import loader
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("fa_attn::fwd", "CUDA")  # lazy
        assert loader.load_binding() is None, loader.load_binding()
        assert torch._C._dispatch_has_kernel_for_dispatch_key("fa_attn::bwd", "CUDA")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    assert run([sys.executable, "-c", script], env=env, cwd=tmp_path).stdout.strip() == "ok"
