"""The stable-ABI binding, built once against the floor's headers (torch 2.10 from PyPI, by HTTP range) as
`fa build` builds it, loads into the torch installed here (a later minor), registers the CUDA kernels of
both operators, and references nothing of torch but its C shim. bench/build/stable_abi_proof.py does the same
across fresh venvs of several torch minors, and for aarch64 under qemu-user."""

from __future__ import annotations

import json
import os
import shutil
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

from buildtool.builder import binding, torch_headers
from buildtool.builder.pypi import fetch_torch_catalog
from buildtool.core import binding_forms, cpus
from buildtool.core.runtime import versions

FLOOR = binding_forms.STABLE_ABI_MIN

pytestmark = [pytest.mark.slow, pytest.mark.network]


@pytest.fixture(scope="module")
def floor_headers() -> torch_headers.Headers:
    build = fetch_torch_catalog().minors[FLOOR].builds[cpus.host()]
    return torch_headers.headers_for(build.oldest, build.header_source)


@pytest.fixture(scope="module")
def stable_lib(floor_headers: torch_headers.Headers) -> Path:
    return binding.build_binding(floor_headers, True, KERNELS, stable_floor=FLOOR).path


@pytest.fixture(scope="module")
def cpu_key_lib(floor_headers: torch_headers.Headers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same sources registered under the CPU key, so CPU tensors reach the operators' code."""
    out = tmp_path_factory.mktemp("cpu-key") / "libfa_attn_ops.so"
    stubs = binding.stub_dir()
    sources = [str(p) for p in binding.sources(KERNELS, binding_forms.STABLE) if p.suffix == ".cpp"]
    flags = binding.flags(floor_headers, True, KERNELS, FLOOR)
    run(
        [
            *binding.compiler(),
            *flags,
            "-DFA_BINDING_DISPATCH_KEY=CPU",
            *sources,
            "-o",
            str(out),
            f"-L{stubs}",
            "-Wl,--no-as-needed",
            "-l:libtorch_cpu.so",
            "-Wl,--as-needed",
            "-ldl",
        ]
    )
    return out


def undefined_from_torch(lib: Path) -> set[str]:
    """Undefined, non-weak dynamic symbols bound to no symbol version: the ones torch's libraries (which
    version nothing) must provide. GLIBC_/GLIBCXX_/CXXABI_ ones come from the system."""
    text = run(["readelf", "--dyn-syms", "-W", str(lib)]).stdout
    names = set()
    for line in text.splitlines():
        parts = line.split()
        symbol = len(parts) >= 8 and parts[0].rstrip(":").isdigit()
        if symbol and parts[6] == "UND" and parts[4] != "WEAK" and "@" not in parts[7]:
            names.add(parts[7])
    return names


def test_links_only_torchs_c_shim(stable_lib: Path) -> None:
    needed = run(["readelf", "-d", str(stable_lib)]).stdout
    names = {line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line}
    assert "libtorch_cpu.so" in names
    assert "libc10.so" not in names
    assert not any("cuda" in n or "python" in n for n in names), names
    from_torch = undefined_from_torch(stable_lib)
    mangled = sorted(s for s in from_torch if s.startswith("_Z"))
    assert not mangled, f"C++ symbols of torch (ATen/c10) referenced: {mangled[:5]}"
    assert from_torch, sorted(from_torch)
    assert all(s.startswith(("aoti_torch_", "torch_")) for s in from_torch), sorted(from_torch)
    assert "torch_library_impl" in from_torch  # the 2.10 registration entry point (TORCH_TARGET_VERSION)


def test_loads_into_this_torch_with_cuda_kernels_registered(stable_lib: Path) -> None:
    assert_loads_with_cuda_kernels_only(stable_lib)


def test_every_argument_boxes_and_the_checks_run(cpu_key_lib: Path) -> None:
    """TORCH_BOX checks the argument count only when an op is called: call both, through the checks."""
    assert_every_argument_reaches_the_checks(cpu_key_lib)


def test_the_loader_takes_it_for_a_later_torch_and_warns_past_the_tested(
    stable_lib: Path, tmp_path: Path
) -> None:
    import torch

    pkg = tmp_path / "fa_attn"
    shutil.copytree(KERNELS / "fa_attn", pkg, ignore=shutil.ignore_patterns("__pycache__", "manifest.json"))
    shutil.copy(stable_lib, pkg / "libfa_attn_ops.so")
    manifest = {
        "schema": 1,
        "schema_minor": 2,
        "version": f"0.1.0+cu12torch{FLOOR}plus",
        "variant": f"cu12torch{FLOOR}plus",
        "cuda_major": 12,
        "torch": FLOOR,
        "cxx11abi": None,
        "binding": "libfa_attn_ops.so",
        "binding_form": "stable",
        "torch_tested": [FLOOR],
        "features": [],
        "kernels": [],
        "coverage": [],
    }
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    script = textwrap.dedent("""
        import warnings, torch, fa_attn
        from fa_attn import loader
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert loader.load_binding() is None, loader.load_binding()
        assert torch._C._dispatch_has_kernel_for_dispatch_key("fa_attn::bwd", "CUDA")
        (w,) = [w for w in caught if issubclass(w.category, fa_attn.FaUntestedTorchWarning)]
        assert "torch-newer-than-tested" in str(w.message), str(w.message)
        print("ok")
    """)
    # CI's torch (2.13) is newer than the floor, the only minor this manifest says was tested
    assert versions.torch_version(torch.__version__) > versions.torch_version(FLOOR)
    proc = run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=tmp_path)
    assert proc.stdout.strip() == "ok"
