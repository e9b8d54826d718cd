"""The binding built with g++ against torch headers, linked to stub torch libraries: it needs
libc10.so/libtorch_cpu.so by name and its ops register under the real torch (in a subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from buildtool.builder import binding, torch_headers
from buildtool.builder.platform_tag import elf_needs
from buildtool.builder.pypi import fetch_torch_catalog

pytestmark = pytest.mark.slow

LOAD = """
import sys, torch
torch.ops.load_library(sys.argv[1])
print(int(torch.ops.fa_fixture.params_size(torch.zeros(1)).item()))
"""


@pytest.mark.usefixtures("fresh_cache")
def test_local_binding_builds_links_stubs_and_registers_ops(fixture_tree):
    _, headers = torch_headers.local_torch()
    built = binding.build_binding(headers, True, fixture_tree)
    assert not built.cached
    assert {"libc10.so", "libtorch_cpu.so"} <= set(elf_needs(built.path).libraries)
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(built.path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0  # sizeof(FaParams) seen from the host side
    again = binding.build_binding(headers, True, fixture_tree)
    assert again.cached
    assert again.path == built.path
    assert binding.binding_key(headers, False, fixture_tree) != built.key  # the ABI is in the key


@pytest.mark.usefixtures("fresh_cache")
def test_compiler_failure_is_reported(fixture_tree, tmp_path):
    import shutil

    broken = tmp_path / "k"
    shutil.copytree(fixture_tree, broken)
    (broken / "binding" / "forms" / "aten.cpp").write_text("this is not C++\n")
    _, headers = torch_headers.local_torch()
    with pytest.raises(binding.BindingError, match="failed"):
        binding.build_binding(headers, True, broken)


@pytest.mark.network
@pytest.mark.usefixtures("build_cache")
def test_binding_against_pypi_headers_of_an_older_torch(fixture_tree):
    minor = fetch_torch_catalog().minors["2.5"].builds["x86_64"]
    headers = torch_headers.headers_for(minor.oldest, minor.header_source)
    assert (headers.include / "torch" / "library.h").is_file()
    built = binding.build_binding(headers, False, fixture_tree)
    assert built.path.is_file()
    assert "libc10.so" in elf_needs(built.path).libraries


@pytest.mark.usefixtures("fresh_cache")
def test_gcc_memory_params_leave_the_binding_bytes_as_they_were(fixture_tree, tmp_path):
    """The GCC heap params (kept out of the cache key) only save CPU: the binding built with them is
    byte for byte the one built without."""
    _, headers = torch_headers.local_torch()
    objects = [str(o) for o in binding.shared_objects(True, fixture_tree, "x86_64")]
    binding.stub_dir("x86_64")
    cmd = binding.binding_command(headers, True, fixture_tree, "x86_64", None, objects, tmp_path / "with.so")
    params = binding.memory_params("x86_64")
    assert params == list(binding.GCC_MEMORY_PARAMS)  # this machine's g++ is GCC
    assert all(p in cmd for p in params)
    without = [w for w in cmd if w not in params]
    without[without.index(str(tmp_path / "with.so"))] = str(tmp_path / "without.so")
    for run in (cmd, without):
        subprocess.run(run, check=True, capture_output=True)
    assert (tmp_path / "with.so").read_bytes() == (tmp_path / "without.so").read_bytes()


@pytest.mark.parametrize(
    ("torch_version", "std"),
    [
        ("2.4.0", "-std=c++17"),
        ("2.13.0+cpu", "-std=c++17"),
        ("2.14.1", "-std=c++17"),
        ("2.15.0", "-std=c++20"),
    ],
)
def test_a_form_is_compiled_in_the_standard_torch_builds_its_extensions_in(fixture_tree, torch_version, std):
    """C++17 parses torch's headers in less CPU; 2.15's ATen.h refuses it. The shared objects (no torch
    header) stay C++20 whatever the torch; tests/runtime/test_binding_load.py links the two and calls
    every operator."""
    headers = torch_headers.Headers(torch_version, fixture_tree / "include", "test")
    words = binding.flags(headers, True, fixture_tree)
    assert [w for w in words if w.startswith("-std=")] == [std]
    assert [w for w in binding._object_flags(True, fixture_tree) if w.startswith("-std=")] == ["-std=c++20"]


def test_headers_of_no_version_are_a_binding_error(fixture_tree):
    headers = torch_headers.Headers("nightly", fixture_tree / "include", "test")
    with pytest.raises(binding.BindingError, match="torch headers of version 'nightly': not a version"):
        binding.flags(headers, True, fixture_tree)
