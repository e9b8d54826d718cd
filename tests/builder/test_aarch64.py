"""aarch64 wheels built on this x86_64 machine: the binding is cross-compiled (Debian's
g++-aarch64-linux-gnu) against the aarch64 torch wheel's headers, the cubins are the x86_64 build's.

Checked against PyPI's aarch64 torch wheels of the oldest minor (2.4, old C++ ABI) and a recent one
(2.13, C++11 ABI): the binary is an aarch64 ELF; its wheel is tagged for aarch64 from the binary
itself; its undefined symbols resolve against that torch's libc10.so + libtorch_cpu.so exports exactly
when its C++ ABI is the one those libraries use; and, where Debian's qemu-user is installed, an aarch64
program really loads torch 2.4's libtorch_cpu.so (CPU-only, so no CUDA library is needed) and then our
binding, which runs its TORCH_LIBRARY registration, under emulation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from packaging.utils import parse_wheel_filename

from buildtool.builder import torch_headers
from buildtool.builder.compile import KernelTree
from buildtool.builder.matrix import parse_matrix
from buildtool.builder.pipeline import execute
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import cache
from buildtool.core.cpus import AARCH64, TARGETS, has_cxx
from buildtool.core.installed import probe_torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(
        not has_cxx(AARCH64),
        reason=f"no aarch64 cross compiler (apt-get install {TARGETS[AARCH64].cross_package})",
    ),
]

QEMU_TORCH = "2.4"  # PyPI's aarch64 torch 2.4 is CPU-only: its libraries load with no CUDA library present
TORCHES = (QEMU_TORCH, "2.13")
MATRIX = f"""
torch: {json.dumps(list(TORCHES))}
cuda: [12]
python: ["3.12"]
platforms: ["x86_64", "aarch64"]
archs: {{"12": ["8.0"]}}
ptx: {{"12": null}}
kernels: {{dtypes: ["fp16"], head_dims: [64], directions: ["fwd"]}}
"""
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's libc6-arm64-cross, pulled in by the cross g++


@pytest.fixture(scope="module")
def built(build_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: ARG001 (its FA_CACHE)
    out = tmp_path_factory.mktemp("wheels")
    plan = make_plan(parse_matrix(MATRIX, "test matrix"), fetch_torch_catalog())
    summary = execute(plan, out, workers=2, tree=KernelTree(), show_progress=False)
    return {"out": out, "summary": summary, "plan": plan}


def arm_torch(minor: str, everything: bool) -> Path:
    """The aarch64 torch wheel of `minor` (its oldest patch), unpacked in part: version.py, libc10.so and
    libtorch_cpu.so, or with `everything` every library it ships (to load them under qemu)."""
    build = fetch_torch_catalog().minors[minor].builds[AARCH64]
    final = cache.cache_dir() / "test-torch" / AARCH64 / f"{build.oldest}{'-all' if everything else ''}"
    # Under the cache's lock: two test processes (pytest -n 2) unpacking it at once would both rename
    # onto the same folder, and the second rename fail.
    with cache.locked(final):
        if not final.is_dir():
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=final.parent))
            src = build.header_source

            def wanted(name: str) -> bool:
                if name in ("torch/version.py", "torch/lib/libc10.so", "torch/lib/libtorch_cpu.so"):
                    return True
                return everything and name.startswith(("torch/lib/", "torch.libs/")) and ".so" in name

            torch_headers.extract_members(src.url, src.size, tmp, wanted)
            os.replace(tmp, final)
    return final


def _binding(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        return Path(zf.extract("fa_attn/libfa_attn_ops.so", dest))


def _arm_wheels(out: Path, minor: str | None = None) -> dict[tuple[str, bool], Path]:
    """The aarch64 wheels (of torch `minor`, or all) by (torch minor, C++ ABI)."""
    found = {}
    for whl in out.glob("*_aarch64.whl"):
        with zipfile.ZipFile(whl) as zf:
            manifest = json.loads(zf.read("fa_attn/manifest.json"))
        if minor in (None, manifest["torch"]):
            found[manifest["torch"], manifest["cxx11abi"]] = whl
    return found


def _dynsyms(lib: Path) -> tuple[set[str], set[str]]:
    """(defined, needed): exported names, and the undefined, non-weak names bound to no symbol
    version. Versioned ones (GLIBC_*, GLIBCXX_*, ...) come from the system's libraries; the
    unversioned ones must come from torch's, which version nothing."""
    text = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    defined, needed = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].rstrip(":").isdigit():
            continue
        bind, ndx, name = parts[4], parts[6], parts[7]
        if ndx != "UND":
            defined.add(name.split("@")[0])
        elif bind != "WEAK" and "@" not in name:
            needed.add(name)
    return defined, needed


def test_aarch64_wheels_carry_an_aarch64_binding_and_the_same_cubins(built, tmp_path):
    out, summary, plan = built["out"], built["summary"], built["plan"]
    # One kernel program for both CPUs: compiled (or found) once, never per platform.
    assert len(plan.compile_jobs) == 1
    assert summary.nvrtc_compiles + summary.nvrtc_cached == 1
    arm = _arm_wheels(out)
    assert set(arm) == {("2.4", False), ("2.4", True), ("2.13", True)}  # both C++ ABIs below torch 2.7
    for (minor, abi), whl in arm.items():
        (tag,) = parse_wheel_filename(whl.name)[3]
        assert tag.platform.startswith("manylinux_"), tag
        assert tag.platform.endswith("_aarch64"), tag
        with open(_binding(whl, tmp_path / f"{minor}-{abi}"), "rb") as f:
            elf = ELFFile(f)
            assert elf["e_machine"] == "EM_AARCH64"
            assert elf.elfclass == 64
        x86 = next(out.glob(whl.name.replace(tag.platform, "*_x86_64")))
        with zipfile.ZipFile(whl) as a, zipfile.ZipFile(x86) as b:
            cubins = [n for n in a.namelist() if n.endswith(".cubin")]
            assert cubins
            assert all(a.read(n) == b.read(n) for n in cubins)
            assert json.loads(a.read("fa_attn/manifest.json"))["platform"] == AARCH64
    index = json.loads((out / "index.json").read_text())
    assert {w["platform"] for w in index["wheels"]} == {None, "x86_64", AARCH64}


@pytest.mark.parametrize("minor", TORCHES)
def test_undefined_symbols_resolve_against_aarch64_torch_exactly_for_its_abi(built, minor, tmp_path):
    torch = arm_torch(minor, everything=minor == QEMU_TORCH)
    info = probe_torch(torch / "torch")
    assert info is not None
    assert info.cxx11abi == (minor != "2.4")
    exports = set()
    for lib in ("libc10.so", "libtorch_cpu.so"):
        exports |= _dynsyms(torch / "torch" / "lib" / lib)[0]
    wheels = _arm_wheels(built["out"], minor)
    assert (minor, info.cxx11abi) in wheels
    for (_, abi), whl in wheels.items():
        missing = _dynsyms(_binding(whl, tmp_path / str(abi)))[1] - exports
        if abi == info.cxx11abi:
            assert not missing, f"{whl.name}: unresolved against torch {minor} aarch64: {sorted(missing)[:5]}"
        else:  # the other ABI's std::string symbols do not exist there: the check can fail
            assert any("__cxx11" in s or "Ss" in s for s in missing), whl.name


LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL)) { printf("FAIL %s\n", dlerror()); return 1; }
    printf("loaded %s\n", argv[i]);
  }
  return 0;
}
"""


@pytest.mark.skipif(
    shutil.which(TARGETS[AARCH64].qemu) is None or not SYSROOT.is_dir(),
    reason="no qemu-user (apt-get install qemu-user) to run aarch64 code here",
)
def test_binding_loads_into_aarch64_torch_under_qemu(built, tmp_path):
    torch = arm_torch(QEMU_TORCH, everything=True)
    info = probe_torch(torch / "torch")
    assert info is not None
    gcc = TARGETS[AARCH64].triple + "-gcc"
    (tmp_path / "loader.c").write_text(LOADER)
    subprocess.run(
        [gcc, "-O2", str(tmp_path / "loader.c"), "-o", str(tmp_path / "loader"), "-ldl"], check=True
    )
    # torch 2.4's bundled libgfortran lists libz.so.1 as needed but binds no zlib symbol; a real
    # aarch64 system has zlib, this sysroot does not: an empty library of that name stands in.
    subprocess.run(
        [gcc, "-shared", "-x", "c", "/dev/null", "-Wl,-soname,libz.so.1", "-o", str(tmp_path / "libz.so.1")],
        check=True,
    )
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": ":".join([str(torch / "torch" / "lib"), str(torch / "torch.libs"), str(tmp_path)]),
    }
    results = {}
    for (_, abi), whl in _arm_wheels(built["out"], QEMU_TORCH).items():
        lib = _binding(whl, tmp_path / str(abi))
        run = subprocess.run(
            [
                TARGETS[AARCH64].qemu,
                "-L",
                str(SYSROOT),
                str(tmp_path / "loader"),
                "libtorch_cpu.so",
                str(lib),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        results[abi] = run
    good, bad = results[info.cxx11abi], results[not info.cxx11abi]
    assert good.returncode == 0, good.stdout + good.stderr
    assert "loaded" in good.stdout.splitlines()[-1], good.stdout + good.stderr
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "undefined symbol" in bad.stdout, bad.stdout + bad.stderr


@pytest.mark.usefixtures("build_cache")
def test_stable_abi_binding_needs_only_the_c_shim_of_a_later_aarch64_torch():
    """The aarch64 stable-ABI binding, cross-built once against torch 2.10's aarch64 headers: every
    symbol it needs from torch is a C shim function, and torch 2.13's aarch64 libtorch_cpu.so exports
    each of them (bench/build/stable_abi_proof.py also loads it there under qemu-user)."""
    from buildtool.builder import binding
    from buildtool.core import binding_forms

    floor = binding_forms.STABLE_ABI_MIN
    build = fetch_torch_catalog().minors[floor].builds[AARCH64]
    headers = torch_headers.headers_for(build.oldest, build.header_source)
    lib = binding.build_binding(headers, True, KernelTree().root, AARCH64, stable_floor=floor).path
    with open(lib, "rb") as f:
        assert ELFFile(f)["e_machine"] == "EM_AARCH64"
    needed = _dynsyms(lib)[1]
    assert needed, sorted(needed)[:5]
    assert all(s.startswith(("aoti_torch_", "torch_")) for s in needed), sorted(needed)[:5]
    later = arm_torch("2.13", everything=False) / "torch" / "lib" / "libtorch_cpu.so"
    assert not needed - _dynsyms(later)[0]
