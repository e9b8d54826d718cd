"""Kernel compiles through the cache: real NVRTC (CUDA 12), the image's ELF header names its arch, a
second run compiles nothing (counters, not timing), the key follows included headers, and a failure
names the unit, the arch and NVRTC's log."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from buildtool.builder import cubin_fit
from buildtool.builder.compile import CompileError, KernelTree, compile_all, is_cached, resolve
from buildtool.builder.plan import CompileJob
from buildtool.core import cache

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
    # The key hashes the source and headers once per source; it is still this content key of all parts.
    flat = [x for pair in edited.headers for x in pair]
    parts = [edited.source_name, edited.source, *flat, edited.nvrtc_version, edited.target, *edited.options]
    assert edited.key == cache.content_key("fa-kernel-v1", *parts)


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


@pytest.mark.usefixtures("fresh_cache")
def test_a_cubin_past_its_archs_shared_memory_is_refused(fixture_tree, tmp_path):
    """The kernel's static shared memory is read from the cubin's ELF: with 1 KiB of it, a launch that
    asks for the whole 99 KiB limit on top cannot start, and the build says which, where and by how much."""
    tree_dir = tmp_path / "kernels"
    shutil.copytree(fixture_tree, tree_dir)
    tiny = tree_dir / "csrc" / "tiny.cu"
    static = "  __shared__ float staged[256];  // 1 KiB of static shared memory\n"
    use = "  staged[threadIdx.x] = p.scale_softmax;\n  __syncthreads();\n  float* lse = p.lse;\n"
    tiny.write_text(tiny.read_text().replace("  float* lse = p.lse;\n", static + use))
    tiny.write_text(
        tiny.read_text().replace("fa_scale(p.scale_softmax)", "fa_scale(staged[31 - threadIdx.x])")
    )
    job = CompileJob(12, "8.6", "sass", "fwd_fp16_d64")
    images, _ = compile_all([job], workers=1, tree=KernelTree(tree_dir))
    needs = cubin_fit.kernel_needs(images[job].read_bytes())
    assert needs["fa_fwd"].static_smem == 1024
    assert needs["fa_fwd"].registers > 0
    with pytest.raises(cubin_fit.SharedMemoryFitError, match=r"1024 B of static shared memory > the 0 B"):
        cubin_fit.check_build(images, KernelTree(tree_dir))  # the manifest would record 0 static bytes
    declared = tmp_path / "declared"  # the same unit, its 1 KiB of static shared memory recorded
    shutil.copytree(tree_dir, declared)
    tiles_py = declared / "tiles.py"
    tiles_py.write_text(tiles_py.read_text().replace("else 0  # ptxas", "else 1024  # ptxas"))
    cubin_fit.check_build(images, KernelTree(declared))  # 0 dynamic bytes: fits
    assert cubin_fit._needs_of(images[job]) == needs  # the second look reads its stamp: the same facts

    full = tmp_path / "full"  # the same unit, its launch asking for the whole limit
    shutil.copytree(declared, full)
    tiles_py = full / "tiles.py"
    tiles_py.write_text(tiles_py.read_text().replace("smem_bytes=0,", "smem_bytes=99 * 1024,"))
    with pytest.raises(cubin_fit.SharedMemoryFitError) as err:
        cubin_fit.check_build(images, KernelTree(full))
    message = str(err.value)
    assert (
        "fwd_fp16_d64 (fa_fwd) on sm 8.6: 102400 B of shared memory (1024 static + 101376 dynamic)" in message
    )
    assert "> the 101376 B a block may use" in message
