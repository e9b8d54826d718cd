"""The same sources give the same wheel bytes from any checkout path and any FA_CACHE.

Two checkouts of one kernels tree at paths of different lengths, each built with its own FA_CACHE
(so torch's headers are included from different paths): the kernel images, the binding and the wheel
come out byte-identical, and neither path appears in them. The binding uses a header that puts
__FILE__ into the binary the way torch's do (TORCH_CHECK, intrusive_ptr.h): without path maps, the
wheel embedded /tmp/.../torch-headers/.../intrusive_ptr.h and the source path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from buildtool.builder import binding, package
from buildtool.builder.compile import KernelTree, compile_all
from buildtool.builder.plan import BindingJob, Cell, CompileJob, WheelSpec
from buildtool.builder.torch_headers import Headers

pytestmark = pytest.mark.slow  # NVRTC and g++ (each well under a second here)

JOBS = (CompileJob(12, "8.0", "sass", "fwd_fp16_d64"), CompileJob(12, "8.0", "ptx", "fwd_fp16_d64"))
SPEC = WheelSpec(
    cuda_major=12,
    torch_minor="2.13",
    cxx11abi=True,
    sass=("8.0",),
    ptx="8.0",
    cells=(Cell("2.13", 12, "3.12"),),
    compile_jobs=JOBS,
    binding=BindingJob("2.13", "2.13.0", True, None),
    variant="cu12torch2.13",
    version="0.1.0+cu12torch2.13",
)

# Like torch's headers: the path of the header and of the including source end up in the binary.
HEADER = """#pragma once
#include <stdexcept>
#define FAKE_TORCH_CHECK(cond) \\
  if (!(cond)) throw std::runtime_error(std::string(__FILE__) + ": check failed")
inline const char* fake_torch_header() { return __FILE__; }
"""
SOURCE = """#include <torch/fake_check.h>
#include "params.h"
extern "C" __attribute__((visibility("default"))) const char* fa_where(int n) {
  FAKE_TORCH_CHECK(n >= 0);
  return n ? fake_torch_header() : __FILE__;
}
"""


def _checkout(root: Path, fixture_tree: Path) -> Path:
    kernels = root / "checkout" / "kernels"
    shutil.copytree(fixture_tree, kernels)
    (kernels / "binding" / "forms" / "aten.cpp").write_text(SOURCE)
    return kernels


def _cache(root: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Headers:
    cache = root / "fa-cache"
    cache.mkdir()
    (cache / "toolkits").symlink_to(build_cache / "toolkits")  # the unpacked NVRTC, not re-downloaded
    include = cache / "torch-headers" / "x86_64" / "2.13.0"
    (include / "torch").mkdir(parents=True)
    (include / "torch" / "fake_check.h").write_text(HEADER)
    monkeypatch.setenv("FA_CACHE", str(cache))
    return Headers("2.13.0", include, "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl")


def _build(root: Path, fixture_tree: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    kernels = _checkout(root, fixture_tree)
    headers = _cache(root, build_cache, monkeypatch)
    tree = KernelTree(kernels)
    images, _ = compile_all(JOBS, workers=1, tree=tree)
    lib = binding.build_binding(headers, True, kernels).path
    wheel = package.build_wheel(SPEC, root / "wheels", kernels, tree.tiles, images, lib).path
    data = wheel.read_bytes()
    for path in (root, kernels, headers.include):
        assert str(path).encode() not in data  # the zip is deflated: look in the binary too
        assert str(path).encode() not in lib.read_bytes()
    return data


def test_same_wheel_bytes_from_two_checkouts_and_two_caches(fixture_tree, build_cache, tmp_path, monkeypatch):
    first = _build(tmp_path / "a", fixture_tree, build_cache, monkeypatch)
    second = _build(tmp_path / "a-much-longer-checkout-path" / "x", fixture_tree, build_cache, monkeypatch)
    assert first == second
