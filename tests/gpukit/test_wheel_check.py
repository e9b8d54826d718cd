"""The manifest's source_sha256 and the kit's refusal of a wheel built from other sources."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import wheel_check

from buildtool.builder import package
from buildtool.builder.compile import KernelTree
from buildtool.builder.plan import BindingJob, Cell, CompileJob, WheelSpec
from buildtool.core.kernels_src import IMAGE_SOURCES, source_hash

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "builder" / "fixture_kernels"
JOB = CompileJob(13, "9.0", "sass", "fwd_fp16_d64")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small kernels/ tree (tests/builder's fixture) with the real runtime package."""
    root = tmp_path / "kernels"
    shutil.copytree(FIXTURE, root)
    shutil.copy(REPO / "kernels" / "csrc" / "params.h", root / "csrc" / "params.h")
    shutil.copytree(
        REPO / "kernels" / "fa_attn", root / "fa_attn", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def _wheel(tree: Path, tmp_path: Path) -> Path:
    lib_src = tmp_path / "x.c"
    lib_src.write_text("int fa_answer(void) { return 42; }\n")
    lib = tmp_path / "libx.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(lib_src), "-o", str(lib)], check=True)
    image = tmp_path / "img"
    image.write_bytes(b"a cubin")
    spec = WheelSpec(
        cuda_major=13,
        torch_minor="2.11",
        cxx11abi=True,
        sass=("9.0",),
        ptx=None,
        cells=(Cell("2.11", 13, "3.12"),),
        compile_jobs=(JOB,),
        binding=BindingJob("2.11", "2.11.0", True, None),
        variant="cu13torch2.11",
        version="0.1.0+cu13torch2.11",
    )
    out = tmp_path / "wheels"
    out.mkdir()
    return package.build_wheel(spec, out, tree, KernelTree(tree).tiles, {JOB: image}, lib).path


def test_the_hash_covers_what_the_wheel_is_built_from(tree: Path) -> None:
    first, images = source_hash(tree), source_hash(tree, IMAGE_SOURCES)
    assert first == source_hash(tree)
    (tree / "fa_attn" / "__pycache__").mkdir(exist_ok=True)
    (tree / "fa_attn" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"cache")
    (tree / "fa_attn" / "manifest.json").write_text("{}")  # a development manifest is not a source
    assert source_hash(tree) == first
    (tree / "fa_attn" / "extra.py").write_text("# the runtime ships in the wheel\n")
    second = source_hash(tree)
    assert second != first
    assert source_hash(tree, IMAGE_SOURCES) == images
    (tree / "csrc" / "tiny.cu").write_text((tree / "csrc" / "tiny.cu").read_text() + "\n// changed\n")
    assert source_hash(tree) != second
    assert source_hash(tree, IMAGE_SOURCES) != images


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the wheel's stand-in binding")
def test_the_packager_records_it_and_the_kit_refuses_other_sources(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = _wheel(tree, tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        recorded = json.loads(zf.read("fa_attn/manifest.json"))["source_sha256"]
    assert recorded == source_hash(tree)
    assert wheel_check.main([str(wheel), "--kernels", str(tree)]) == 0

    (tree / "csrc" / "scale.cuh").write_text("// edited after the build\n")
    assert wheel_check.main([str(wheel), "--kernels", str(tree)]) == 1
    err = capsys.readouterr().err
    assert recorded in err
    assert source_hash(tree) in err
    assert "carry.py build" in err


def test_a_manifest_without_the_field_is_refused(tree: Path) -> None:
    problem = wheel_check.mismatch({"schema": 1, "schema_minor": 1, "version": "0.1.0"}, "old.whl", tree)
    assert problem is not None
    assert "records no source_sha256" in problem
    assert source_hash(tree) in problem
