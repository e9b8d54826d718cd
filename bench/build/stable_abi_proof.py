"""Proof on the CPU that one stable-ABI wheel serves several torch minors, x86_64 and aarch64.

    python bench/build/stable_abi_proof.py --torch 2.10.0 2.13.0 2.15.0 [--wheelhouse DIR] [--json out.json]

1. Builds the stable-ABI wheels once, with `fa build`, from a small matrix (the floor 2.10 and the
   minors under test, CUDA 12, one arch, one kernel unit): the binding is compiled once per CPU
   against torch 2.10's headers (x86_64 natively, aarch64 with the cross g++).
2. x86_64, per torch version: a fresh venv (no system site-packages) gets that torch from PyPI (or
   --wheelhouse / pip's find-links), fa's own dependencies and fa itself, then `fa install --wheels`
   installs the stable wheel into it. In that venv: the loader loads the binding, `fa_attn::fwd` and
   `fa_attn::bwd` have CUDA kernels (torch._C._dispatch_has_kernel_for_dispatch_key), the binding's
   undefined symbols that torch must provide are all C shim functions (aoti_torch_*, torch_*: no
   mangled ATen/c10 C++ name) and all exported by that torch's libtorch_cpu.so, and the release smoke
   test's checks (ci/release/smoke_test.py) pass.
3. aarch64, per torch version: the aarch64 libraries of PyPI's wheel are fetched by HTTP range; the
   symbol check as above; under qemu-user a small aarch64 program (built against that torch's own
   headers) loads libtorch_cpu.so and our binding, whose static registration then runs inside that
   torch's dispatcher, and asks the dispatcher whether both operators have a CUDA kernel. No aarch64
   Python runs here, so the smoke test is x86_64 only.

Prints one table row per (CPU, torch) and writes JSON. Not a test (it downloads gigabytes: PyPI's x86_64
torch wheels are CUDA builds with their nvidia-* dependencies); tests/runtime/test_stable_binding.py is
the CI check, with CI's own torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.builder import torch_headers
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import binding_forms, cache
from buildtool.core.cpus import AARCH64, TARGETS

FLOOR = binding_forms.STABLE_ABI_MIN
TOOL_DEPS = (
    "typer",
    "rich",
    "packaging",
    "pyyaml",
    "jinja2",
    "nvidia-ml-py",
    "platformdirs",
    "wheel",
    "pyelftools",
    "auditwheel",
)
SYSROOT = Path("/usr/aarch64-linux-gnu")


@dataclass
class Row:
    cpu: str
    torch: str
    install: str = "-"
    load: str = "-"
    ops: str = "-"
    symbols: str = "-"
    smoke: str = "-"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)


def minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


# -- the wheels ---------------------------------------------------------------------------------------


def build_wheels(torches: list[str], out: Path, platforms: list[str]) -> dict[str, Path]:
    minors = sorted({minor(t) for t in torches} | {FLOOR}, key=lambda m: tuple(map(int, m.split("."))))
    matrix = out / "proof-matrix.yaml"
    matrix.write_text(
        f'torch: {json.dumps(minors)}\ncuda: [12]\npython: ["3.11", "3.12"]\n'
        f'platforms: {json.dumps(platforms)}\narchs: {{"12": ["8.0"]}}\nptx: {{"12": null}}\n'
        f'stable_abi: "{FLOOR}"\nkernels: {{dtypes: [bf16], head_dims: [128], directions: [fwd]}}\n'
    )
    wheels = out / "wheels"
    done = sh(
        [
            str(Path(sys.executable).parent / "fa"),
            "build",
            "--matrix",
            str(matrix),
            "--out",
            str(wheels),
            "--jobs",
            "2",
            "--no-progress",
        ],
        cwd=REPO,
    )
    if done.returncode != 0:
        raise SystemExit(f"fa build failed:\n{done.stdout}\n{done.stderr}")
    found = {}
    for whl in wheels.glob("*.whl"):
        with zipfile.ZipFile(whl) as zf:
            man = json.loads(zf.read("fa_attn/manifest.json"))
        if man.get("binding_form") == "stable":
            found[man["platform"]] = whl
    return found


def binding_of(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        return Path(zf.extract("fa_attn/libfa_attn_ops.so", dest))


# -- symbols ------------------------------------------------------------------------------------------


def dynsyms(lib: Path) -> tuple[set[str], set[str]]:
    """(exported names, undefined non-weak names bound to no symbol version: what torch must provide)."""
    text = sh(["readelf", "--dyn-syms", "-W", str(lib)]).stdout
    defined, needed = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].rstrip(":").isdigit():
            continue
        if parts[6] != "UND":
            defined.add(parts[7].split("@")[0])
        elif parts[4] != "WEAK" and "@" not in parts[7]:
            needed.add(parts[7])
    return defined, needed


def symbol_check(binding: Path, torch_lib: Path) -> tuple[str, list[str]]:
    exports = dynsyms(torch_lib)[0]
    needed = dynsyms(binding)[1]
    mangled = sorted(s for s in needed if s.startswith("_Z"))
    not_shim = sorted(s for s in needed if not s.startswith(("aoti_torch_", "torch_")))
    missing = sorted(needed - exports)
    if mangled or not_shim or missing:
        return "FAIL", [f"C++: {mangled[:3]}", f"not shim: {not_shim[:3]}", f"missing: {missing[:3]}"]
    return f"ok ({len(needed)} C shim, 0 C++)", []


# -- x86_64: fresh venvs --------------------------------------------------------------------------------


CHECK = textwrap.dedent("""
    import json, sys, torch, fa_attn
    from fa_attn import loader
    problem = loader.load_binding()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    print(json.dumps({
        "torch": torch.__version__,
        "load": None if problem is None else f"{problem.code}: {problem.message}",
        "ops": {op: has(op, "CUDA") for op in ("fa_attn::fwd", "fa_attn::bwd")},
        "binding": str(loader.PACKAGE_DIR / "libfa_attn_ops.so"),
        "libtorch_cpu": str(__import__("pathlib").Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"),
    }))
""")


def load_check(row: Row, py: str, check: str, work: Path) -> dict | None:
    """Run `check` (a script printing a JSON line with "load" and "ops") in the venv of `py`, and fill
    row.load and row.ops from its answer; None, with the error noted, when it could not run."""
    done = sh([py, "-c", check], cwd=work, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if done.returncode != 0:
        row.load = "FAIL (import)"
        row.notes.append(done.stderr[-400:])
        return None
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    row.load = "ok" if facts["load"] is None else f"FAIL ({facts['load']})"
    row.ops = "fwd+bwd CUDA" if all(facts["ops"].values()) else f"FAIL {facts['ops']}"
    return facts


def x86_row(version: str, wheels_dir: Path, wheel: Path, work: Path, wheelhouse: list[Path]) -> Row:
    row = Row("x86_64", version)
    t0 = time.perf_counter()
    venv = work / f"venv-{version}"
    shutil.rmtree(venv, ignore_errors=True)
    py = str(venv / "bin" / "python")
    env = dict(os.environ, PIP_CONSTRAINT="/dev/null")  # pip's constraint file may cap torch below the newest
    links = [arg for folder in wheelhouse for arg in ("--find-links", str(folder))]
    # uv when it is on PATH: it installs torch's gigabytes by hard links from its cache, so a fresh venv
    # per torch costs seconds after the first; pip otherwise (the same packages, slower).
    uv = shutil.which("uv")
    pip = [uv, "pip", "install", "--python", py] if uv else [py, "-m", "pip", "install"]
    for cmd in (
        [uv, "venv", "-q", "--python", sys.executable, str(venv)]
        if uv
        else [sys.executable, "-m", "venv", str(venv)],
        [*pip, "-q", *links, f"torch=={version}", "hatchling", "editables", *TOOL_DEPS],
        [*pip, "-q", "--no-deps", "--no-build-isolation", "-e", str(REPO)],
    ):
        done = sh(cmd, env=env)
        if done.returncode != 0:
            row.install = "FAIL (venv)"
            row.notes.append(done.stderr[-400:])
            return row
    fa = str(venv / "bin" / "fa")
    done = sh([fa, "install", "--wheels", str(wheels_dir), "--json"], cwd=work)
    try:
        out = json.loads(done.stdout)
    except ValueError:
        out = {"ok": False, "message": done.stdout + done.stderr}
    if not out.get("ok") or out.get("selected") != wheel.name:
        row.install = "FAIL"
        row.notes.append(str(out.get("message"))[-300:])
        return row
    row.install = f"ok ({out['variant']})"
    facts = load_check(row, py, CHECK, work)
    if facts is None:
        return row
    row.torch = facts["torch"]
    row.symbols, notes = symbol_check(Path(facts["binding"]), Path(facts["libtorch_cpu"]))
    row.notes += notes
    smoke = sh(
        [py, str(REPO / "ci" / "release" / "smoke_test.py"), "--check-installed", str(wheel)], cwd=work
    )
    row.smoke = "ok" if smoke.returncode == 0 else "FAIL"
    if smoke.returncode != 0:
        row.notes.append((smoke.stdout + smoke.stderr)[-400:])
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


# -- aarch64: qemu-user -------------------------------------------------------------------------------

CHECKER = r"""
// Loads libtorch_cpu.so (this torch's) and then the binding, whose static initialiser registers its
// kernels in this torch's dispatcher; then asks the dispatcher as torch._C._dispatch_has_kernel_for_dispatch_key does.
#include <dlfcn.h>
#include <cstdio>
#include <ATen/core/dispatch/Dispatcher.h>
int main(int argc, char** argv) {
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) { printf("FAIL %s\n", dlerror()); return 1; }
  auto& d = c10::Dispatcher::singleton();
  for (const char* op : {"fa_attn::fwd", "fa_attn::bwd"}) {
    auto h = d.findOp(c10::OperatorName(op, ""));
    bool cuda = h.has_value() && h->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
    printf("%s %s\n", op, cuda ? "CUDA" : "none");
    if (!cuda) return 2;
  }
  return 0;
}
"""


def arm_torch(version: str) -> tuple[Path, torch_headers.Headers]:
    """The aarch64 wheel of torch `version` from PyPI, its libraries only (by HTTP range), and its headers."""
    src = fetch_torch_catalog().minors[minor(version)].builds[AARCH64].header_source  # the oldest patch
    if src.filename.split("-")[1] != version:
        raise ValueError(f"{src.filename} is the oldest {minor(version)} wheel; pass that version")
    final = cache.cache_dir() / "test-torch" / AARCH64 / f"{version}-all"
    if not final.is_dir():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent))

        def wanted(name: str) -> bool:
            return (
                name.startswith(("torch/lib/", "torch.libs/")) and ".so" in name
            ) or name == "torch/version.py"

        torch_headers.extract_members(src.url, src.size, tmp, wanted)
        os.replace(tmp, final)
    return final, torch_headers.headers_for(version, src)


def cuda_libs_for(torch_dir: Path, work: Path) -> list[Path]:
    """PyPI's aarch64 torch from 2.13 on is a CUDA build whose libtorch_cpu.so names libcudart and
    libcupti: their aarch64 libraries, from NVIDIA's wheels on PyPI (a few MB, loaded, never called)."""
    needed = sh(["readelf", "-d", str(torch_dir / "torch" / "lib" / "libtorch_cpu.so")]).stdout
    majors = sorted(
        {line.split(".so.")[1].rstrip("]") for line in needed.splitlines() if "libcudart.so." in line}
    )
    folders = []
    for major in majors:
        folder = cache.cache_dir() / "test-torch" / AARCH64 / f"cuda{major}-libs"
        if not folder.is_dir():
            wheels = work / f"cuda{major}-wheels"
            platforms = [
                a
                for p in ("manylinux2014", "manylinux_2_17", "manylinux_2_25", "manylinux_2_28")
                for a in ("--platform", f"{p}_aarch64")
            ]
            pkgs = [
                f"nvidia-cuda-runtime>={major},<{int(major) + 1}",
                f"nvidia-cuda-cupti>={major},<{int(major) + 1}",
            ]
            done = sh(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    *platforms,
                    "--python-version",
                    "3.12",
                    "-d",
                    str(wheels),
                    *pkgs,
                ]
            )
            if done.returncode != 0:
                raise RuntimeError(f"NVIDIA's aarch64 CUDA {major} runtime wheels: {done.stderr[-300:]}")
            tmp = Path(tempfile.mkdtemp(dir=work))
            for whl in wheels.glob("*.whl"):
                with zipfile.ZipFile(whl) as zf:
                    for name in zf.namelist():
                        if "/lib/" in name and ".so" in name:
                            (tmp / Path(name).name).write_bytes(zf.read(name))
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, folder)
        folders.append(folder)
    return folders


def qemu_check(
    row: Row,
    lib: Path,
    torch_dir: Path,
    headers: torch_headers.Headers,
    work: Path,
    version: str,
    cxx11abi: bool | None = None,
) -> None:
    """Under qemu-user, a small aarch64 program built against this torch's headers loads its
    libtorch_cpu.so and the binding `lib`, and asks the dispatcher for both ops' CUDA kernels: fills
    row.load, row.ops and row.notes. cxx11abi: the C++ ABI to build the checker with (None: the
    compiler's default, the C++11 one)."""
    qemu = shutil.which(TARGETS[AARCH64].qemu)
    if qemu is None or not SYSROOT.is_dir():
        row.load = "not run (no qemu-user)"
        return
    checker = work / f"checker-{version}"
    (work / "checker.cpp").write_text(CHECKER)
    gxx = TARGETS[AARCH64].triple + "-g++"
    inc = [f"-I{d}" for d in headers.include_dirs]
    lib_dir = torch_dir / "torch" / "lib"
    done = sh(
        [
            gxx,
            "-std=c++20",
            *([] if cxx11abi is None else [f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11abi)}"]),
            "-O1",
            *inc,
            str(work / "checker.cpp"),
            "-o",
            str(checker),
            f"-L{lib_dir}",
            "-Wl,--no-as-needed",
            "-ltorch_cpu",
            "-lc10",
            "-Wl,--as-needed",
            "-ldl",
            "-Wl,--allow-shlib-undefined",
            "-Wl,--unresolved-symbols=ignore-in-shared-libs",
        ]
    )
    if done.returncode != 0:
        row.load = "FAIL (checker build)"
        row.notes.append(done.stderr[-400:])
        return
    # A real aarch64 system has zlib; the cross sysroot does not, and torch's bundled libraries may
    # name it: an empty library of that soname stands in (no zlib symbol is bound at load).
    stub = work / "stub"
    stub.mkdir(exist_ok=True)
    sh(
        [
            TARGETS[AARCH64].triple + "-gcc",
            "-shared",
            "-x",
            "c",
            "/dev/null",
            "-Wl,-soname,libz.so.1",
            "-o",
            str(stub / "libz.so.1"),
        ]
    )
    try:
        cuda_libs = cuda_libs_for(torch_dir, work)
    except RuntimeError as e:
        row.load = "FAIL (CUDA runtime libraries)"
        row.notes.append(str(e))
        return
    if cuda_libs:
        row.notes.append(
            "libtorch_cpu.so of this CUDA build needs libcudart/libcupti: NVIDIA's aarch64 wheels'"
        )
    paths = [lib_dir, torch_dir / "torch.libs", stub, *cuda_libs]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(str(p) for p in paths))
    run = sh([qemu, "-L", str(SYSROOT), str(checker), str(lib)], env=env, timeout=1200)
    row.load = "ok (qemu-user)" if run.returncode in (0, 2) and not run.stdout.startswith("FAIL") else "FAIL"
    row.ops = "fwd+bwd CUDA" if run.returncode == 0 else "FAIL"
    if run.returncode != 0:
        row.notes.append((run.stdout + run.stderr)[-600:])


def arm_row(version: str, wheel: Path, work: Path) -> Row:
    row = Row("aarch64", version)
    t0 = time.perf_counter()
    try:
        torch_dir, headers = arm_torch(version)
    except (OSError, ValueError, KeyError, RuntimeError) as e:  # a download failure is a row that says so
        row.install = f"FAIL ({e})"
        return row
    row.torch = headers.torch_version
    row.install = "libraries from PyPI's aarch64 wheel (no aarch64 Python: fa install not run)"
    lib = binding_of(wheel, work / f"arm-{version}")
    row.symbols, notes = symbol_check(lib, torch_dir / "torch" / "lib" / "libtorch_cpu.so")
    row.notes += notes
    qemu_check(row, lib, torch_dir, headers, work, version)
    row.smoke = "not run (no aarch64 Python)"
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch", nargs="+", default=["2.10.0", "2.13.0", "2.15.0"], help="torch versions")
    ap.add_argument(
        "--wheelhouse",
        type=Path,
        nargs="*",
        default=[],
        help="folders of pre-downloaded wheels (--find-links)",
    )
    ap.add_argument("--cpu", nargs="+", default=["x86_64", AARCH64], help="x86_64 and/or aarch64")
    # Outside the checkout by default: a run must leave no untracked file in the tree.
    ap.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "fa-stable-abi-proof.json")
    ap.add_argument("--keep", action="store_true", help="keep the venvs and wheels")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fa-stable-proof-"))
    console = Console()
    try:
        t0 = time.perf_counter()
        wheels = build_wheels(args.torch, work, args.cpu)
        console.print(
            f"built {', '.join(p.name for p in wheels.values())} in {time.perf_counter() - t0:.0f} s"
        )
        rows = []
        for version in args.torch:
            if "x86_64" in args.cpu:
                rows.append(x86_row(version, work / "wheels", wheels["x86_64"], work, args.wheelhouse))
                console.print(rows[-1])
            if AARCH64 in args.cpu:
                rows.append(arm_row(version, wheels[AARCH64], work))
                console.print(rows[-1])
        table = Table(title=f"one stable-ABI wheel (built against torch {FLOOR}'s headers) per CPU")
        for col in ("CPU", "torch", "install", "load", "op registrations", "symbol check", "smoke", "s"):
            table.add_column(col)
        for r in rows:
            table.add_row(r.cpu, r.torch, r.install, r.load, r.ops, r.symbols, r.smoke, str(r.seconds))
        console.print(table)
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
        ok = all("FAIL" not in f"{r.install} {r.load} {r.ops} {r.symbols} {r.smoke}" for r in rows)
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
