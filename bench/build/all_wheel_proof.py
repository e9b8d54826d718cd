"""Proof on the CPU that one all-wheel per CPU serves every torch the matrix builds for, x86_64 and aarch64.

    python bench/build/all_wheel_proof.py --wheels DIR --torch 2.4.0 2.7.0 2.9.0 2.13.0 2.15.0 \
        [--cpu x86_64 aarch64] [--json /tmp/all-wheel-proof.json]

DIR holds the all-wheels `fa build --matrix matrix.yaml` wrote (fa_attn-<version>-py3-none-<tag>.whl,
variant "all"); the per-variant wheels beside them are ignored.

1. x86_64, per torch version: a fresh venv (no system site-packages) gets that torch from PyPI with its
   dependencies (PyPI's x86_64 torch is a CUDA build, which imports only with NVIDIA's libraries; uv
   when on PATH, which hard-links them from its cache), then the all-wheel with a plain
   `pip install --no-index --find-links <a folder holding only it> fa-attn`. In that venv:
   `import fa_attn`, the loader picks the binding for this torch (fa_attn/runtime/all_wheel.py) and loads it,
   and `fa_attn::fwd` / `fa_attn::bwd` have CUDA kernels in torch's dispatcher.
2. aarch64, per torch version: PyPI's aarch64 wheel's libraries (fetched by HTTP range), the binding
   the runtime would pick for that torch (all_wheel.binding_for, with the C++ ABI read from
   libc10.so's symbols), and under qemu-user the checker of bench/build/stable_abi_proof.py loads
   libtorch_cpu.so and the binding and asks the dispatcher for both operators' CUDA kernels.

PyPI publishes one C++ ABI per torch version (the old one up to 2.6, the C++11 one from 2.7, on both
CPUs), so each version tests the binding of that ABI. Prints a table and writes
JSON (default: a temporary folder, never the checkout). Not a test: it downloads gigabytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench" / "build"))

from stable_abi_proof import Row, arm_torch, dynsyms, load_check, qemu_check, sh

from buildtool.core.cpus import AARCH64
from buildtool.core.runtime import all_wheel, schema


@dataclass
class ProofRow(Row):
    binding: str = "-"  # the binding file the runtime picks for this torch


# What the x86_64 venv runs: the loader's own choice of binding, and the dispatcher's answer.
CHECK = textwrap.dedent("""
    import json, torch, fa_attn
    from fa_attn import loader
    chosen = loader.as_this_torch(loader.manifest())
    problem = loader.load_binding()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    print(json.dumps({
        "torch": torch.__version__,
        "cxx11abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "variant": loader.manifest().info.variant,
        "binding": chosen.info.binding,
        "load": None if problem is None else f"{problem.code}: {problem.message}",
        "ops": {op: has(op, "CUDA") for op in ("fa_attn::fwd", "fa_attn::bwd")},
    }))
""")


def all_wheels(folder: Path) -> dict[str, Path]:
    """The all-wheels of `folder` by CPU."""
    found = {}
    for whl in folder.glob("fa_attn-*.whl"):
        with zipfile.ZipFile(whl) as zf:
            info = schema.Manifest.from_json(json.loads(zf.read(schema.MANIFEST_PATH))).info
        if info.all_wheel and info.platform:
            found[info.platform] = whl
    return found


def x86_row(version: str, wheel: Path, work: Path) -> ProofRow:
    row = ProofRow("x86_64", version)
    t0 = time.perf_counter()
    venv = work / f"venv-{version}"
    py = str(venv / "bin" / "python")
    uv = shutil.which("uv")
    pip = [uv, "pip", "install", "--python", py] if uv else [py, "-m", "pip", "install"]
    only = work / "only-the-all-wheel"
    only.mkdir(exist_ok=True)
    shutil.copy2(wheel, only / wheel.name)
    env = dict(os.environ, PIP_CONSTRAINT="/dev/null")
    for cmd in (
        [uv, "venv", "-q", "--python", sys.executable, str(venv)]
        if uv
        else [sys.executable, "-m", "venv", str(venv)],
        [*pip, "-q", f"torch=={version}"],
        [*pip, "-q", "--no-index", "--find-links", str(only), "fa-attn"],
    ):
        done = sh(cmd, env=env)
        if done.returncode != 0:
            row.install = "FAIL"
            row.notes.append(done.stderr[-400:])
            return row
    row.install = "ok (--find-links, no flags)"
    facts = load_check(row, py, CHECK, work)
    if facts is None:
        return row
    row.torch = f"{facts['torch']} cxx11abi={str(facts['cxx11abi']).lower()}"
    row.binding = Path(str(facts["binding"])).name
    row.seconds = round(time.perf_counter() - t0, 1)
    shutil.rmtree(venv, ignore_errors=True)  # gigabytes each
    return row


def arm_row(version: str, wheel: Path, work: Path) -> ProofRow:
    row = ProofRow(AARCH64, version)
    t0 = time.perf_counter()
    try:
        torch_dir, headers = arm_torch(version)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        row.install = f"FAIL ({e})"
        return row
    lib_dir = torch_dir / "torch" / "lib"
    # c10's own std::string overload says the ABI (libtorch_cpu.so bundles code of either ABI)
    assert_fail = "_ZN3c106detail23torchInternalAssertFail"
    cxx11abi = any(n.startswith(assert_fail) and "__cxx11" in n for n in dynsyms(lib_dir / "libc10.so")[0])
    row.torch = f"{headers.torch_version} cxx11abi={str(cxx11abi).lower()}"
    with zipfile.ZipFile(wheel) as zf:
        info = schema.Manifest.from_json(json.loads(zf.read(schema.MANIFEST_PATH))).info
        binding = all_wheel.binding_for(info, headers.torch_version, cxx11abi)
        problems = all_wheel.binding_reasons(info, headers.torch_version, cxx11abi)
        lib = Path(zf.extract(f"{schema.DIST}/{binding.file}", work / f"arm-{version}"))
    row.binding = Path(binding.file).name
    if problems:
        row.load = f"FAIL (no binding: {problems[0].code})"
        return row
    row.install = "libraries from PyPI's aarch64 wheel (no aarch64 Python)"
    qemu_check(row, lib, torch_dir, headers, work, version, cxx11abi)
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True, help="fa build's output folder(s) merged")
    ap.add_argument("--torch", nargs="+", default=["2.4.0", "2.7.0", "2.9.0", "2.13.0", "2.15.0"])
    ap.add_argument("--cpu", nargs="+", default=["x86_64", AARCH64])
    ap.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "all-wheel-proof.json")
    args = ap.parse_args()
    wheels = all_wheels(args.wheels)
    missing = [cpu for cpu in args.cpu if cpu not in wheels]
    if missing:
        print(f"error: --wheels {args.wheels}: no all-wheel for {', '.join(missing)}", file=sys.stderr)
        print("  fix: build it with matrix.yaml's all_wheel: true (fa build --platform CPU)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fa-all-wheel-proof-"))
    console = Console()
    rows: list[ProofRow] = []
    try:
        for version in args.torch:
            if "x86_64" in args.cpu:
                rows.append(x86_row(version, wheels["x86_64"], work))
                console.print(rows[-1])
            if AARCH64 in args.cpu:
                rows.append(arm_row(version, wheels[AARCH64], work))
                console.print(rows[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = Table(title="one all-wheel per CPU, every torch")
    for col in ("CPU", "torch", "install", "load", "op registrations", "binding", "s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.cpu, r.torch, r.install, r.load, r.ops, r.binding, str(r.seconds))
    console.print(table)
    args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    console.print(f"JSON: {args.json}")
    return 0 if all("FAIL" not in f"{r.install} {r.load} {r.ops}" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
