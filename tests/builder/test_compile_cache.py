"""Kernel compiles through the cache: real NVRTC (CUDA 12), the image's ELF header names its arch, a
second run compiles nothing (counters, not timing), the key follows included headers, and a failure
names the unit, the arch and NVRTC's log."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from buildtool.builder.compile import CompileError, KernelTree, compile_all, is_cached, resolve
from buildtool.builder.plan import CompileJob

pytestmark = [pytest.mark.slow, pytest.mark.network]  # the CUDA 12 NVRTC wheel, once per session

EM_CUDA = 190
SASS = CompileJob(12, "8.0", "sass", "fwd_fp16_d64")
PTX = CompileJob(12, "9.0", "ptx", "fwd_fp16_d64")


def _cubin_arch(image: bytes) -> int:
    assert image[:4] == b"\x7fELF"
    (machine,) = struct.unpack_from("<H", image, 18)
    (flags,) = struct.unpack_from("<I", image, 48)
    assert machine == EM_CUDA
    return flags & 0xFF  # the SM number, e.g. 80 (CUDA 12 cubin e_flags)


@pytest.mark.usefixtures("fresh_cache")
def test_compiles_once_then_hits_the_cache(fixture_tree):
    tree = KernelTree(fixture_tree)
    assert not is_cached(SASS, tree)
    images, stats = compile_all([SASS, PTX], workers=2, tree=tree)
    assert stats.compiled == 2
    assert not stats.cached
    assert _cubin_arch(images[SASS].read_bytes()) == 80
    ptx = images[PTX].read_text()
    assert ".target sm_90" in ptx
    assert "fa_fwd" in ptx
    assert is_cached(SASS, tree)
    assert is_cached(PTX, tree)

    done: list[bool] = []
    again, stats2 = compile_all([SASS, PTX], workers=2, tree=tree, on_done=lambda _t, c: done.append(c))
    assert stats2.compiled == 0
    assert stats2.cached == {SASS, PTX}
    assert done == [True, True]
    assert again == images


def test_key_follows_included_headers_and_defines(fixture_tree, tmp_path):
    copy = tmp_path / "kernels"
    shutil.copytree(fixture_tree, copy)
    base = resolve(SASS, KernelTree(copy))
    assert [name for name, _ in base.headers] == ["params.h", "scale.cuh"]
    assert "-DFA_HEAD_DIM=64" in base.options
    (copy / "csrc" / "scale.cuh").write_text((copy / "csrc" / "scale.cuh").read_text() + "\n// edit\n")
    edited = resolve(SASS, KernelTree(copy))
    assert edited.key != base.key
    other_arch = resolve(CompileJob(12, "8.6", "sass", "fwd_fp16_d64"), KernelTree(fixture_tree))
    assert other_arch.key != base.key
    other_major = resolve(CompileJob(11, "8.0", "sass", "fwd_fp16_d64"), KernelTree(fixture_tree))
    assert other_major.key != base.key  # a different NVRTC version


@pytest.mark.usefixtures("fresh_cache")
def test_failure_names_unit_arch_and_log(broken_tree):
    with pytest.raises(CompileError) as err:
        compile_all([SASS], workers=1, tree=KernelTree(broken_tree))
    text = str(err.value)
    assert "fwd_fp16_d64" in text
    assert "sm_80" in text
    assert "no_such_function" in text
    assert not is_cached(SASS, KernelTree(broken_tree))


def test_unknown_unit_is_a_clear_error(fixture_tree):
    with pytest.raises(KeyError, match="no unit 'fwd_fp16_d999'"):
        resolve(CompileJob(12, "8.0", "sass", "fwd_fp16_d999"), KernelTree(fixture_tree))


def test_worker_images_land_whole(fixture_tree, fresh_cache):
    """Images are written by the workers through atomic renames: no temporaries remain."""
    compile_all([SASS, PTX], workers=2, tree=KernelTree(fixture_tree))
    assert list(Path(fresh_cache, "kernels").rglob("*.fa-tmp-*")) == []
