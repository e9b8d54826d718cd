"""Wheels (contents, manifest, metadata, reproducibility) and the index (index.json, PEP 503 pages that
pip accepts, shards merged by re-indexing)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.builder import index, package
from buildtool.builder.compile import KernelTree
from buildtool.builder.matrix import Matrix
from buildtool.builder.plan import BindingJob, Cell, CompileJob, WheelSpec, universal_wheel
from buildtool.cli import app
from buildtool.core.fetch import sha256_file
from tests.builder.conftest import pip_download

JOBS = (
    CompileJob(12, "8.0", "sass", "fwd_fp16_d64"),
    CompileJob(12, "9.0", "sass", "fwd_fp16_d64"),
    CompileJob(12, "9.0", "ptx", "fwd_fp16_d64"),
)


def _spec(torch: str = "2.8", cuda: int = 12, jobs: tuple[CompileJob, ...] = JOBS) -> WheelSpec:
    return WheelSpec(
        cuda_major=cuda,
        torch_minor=torch,
        cxx11abi=True,
        sass=tuple(dict.fromkeys(j.arch for j in jobs if j.image == "sass")),
        ptx=next((j.arch for j in jobs if j.image == "ptx"), None),
        cells=(Cell(torch, cuda, "3.11"), Cell(torch, cuda, "3.12")),
        compile_jobs=jobs,
        binding=BindingJob(torch, f"{torch}.0", True, None),
        variant=f"cu{cuda}torch{torch}",
        version=f"0.1.0+cu{cuda}torch{torch}",
    )


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lib")
    (d / "x.c").write_text("int fa_answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(d / "x.c"), "-o", str(d / "libx.so")], check=True)
    return d / "libx.so"


@pytest.fixture
def images(tmp_path: Path) -> dict[CompileJob, Path]:
    out = {}
    for i, job in enumerate(JOBS):
        p = tmp_path / f"img{i}"
        p.write_bytes(f"image of {job}".encode())
        out[job] = p
    return out


def _build(spec, out, tree, images, lib):
    return package.build_wheel(spec, out, tree, KernelTree(tree).tiles, images, lib)


def test_the_wheel_ships_the_runtime_package_whole(fixture_tree, images, host_lib, tmp_path):
    """Every file of kernels/fa_attn/ lands in the wheel, its subpackages too (runtime/, standin/,
    verify/); unpacked alone (no checkout on sys.path), the old module paths still work there:
    `python -m fa_attn.check` (docs/checking.md: the wheel-only way) and `import fa_attn.decision`."""
    built = _build(_spec(), tmp_path / "w", fixture_tree, images, host_lib)
    shipped = {
        f"fa_attn/{p.relative_to(fixture_tree / 'fa_attn').as_posix()}"
        for p in (fixture_tree / "fa_attn").rglob("*.py")
    }
    assert {"fa_attn/runtime/decision.py", "fa_attn/standin/install.py", "fa_attn/verify/check.py"} <= shipped
    site = tmp_path / "site"
    with zipfile.ZipFile(built.path) as zf:
        assert shipped <= set(zf.namelist())
        zf.extractall(site)
    env = {"PYTHONPATH": str(site), "FA_CHECK_RECORDS": str(tmp_path / "records"), "PATH": "/usr/bin:/bin"}

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-W", "ignore", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    probe = "import fa_attn, fa_attn.decision as d, fa_attn.runtime.decision as r; print(fa_attn.__file__, d is r)"
    assert run("-c", probe).split() == [str(site / "fa_attn" / "__init__.py"), "True"]
    assert "usage:" in run("-m", "fa_attn.check", "--help")


def test_kernel_wheel_contents_and_manifest(fixture_tree, images, host_lib, tmp_path):
    built = _build(_spec(), tmp_path / "w", fixture_tree, images, host_lib)
    assert built.path.name == f"fa_attn-0.1.0+cu12torch2.8-py3-none-{built.platform}.whl"
    assert built.platform.startswith("manylinux_")
    assert "admitted" in built.platform_reason
    with zipfile.ZipFile(built.path) as zf:
        names = zf.namelist()
        man = json.loads(zf.read("fa_attn/manifest.json"))
        meta = zf.read("fa_attn-0.1.0+cu12torch2.8.dist-info/METADATA").decode()
        assert zf.read("fa_attn/kernels/sm_80/fwd_fp16_d64.cubin") == images[JOBS[0]].read_bytes()
        assert zf.read("fa_attn/libfa_attn_ops.so") == host_lib.read_bytes()
    assert "fa_attn/__init__.py" in names
    assert "fa_attn/kernels/compute_90/fwd_fp16_d64.ptx" in names
    assert names[-1].endswith(".dist-info/RECORD")
    assert not any("__pycache__" in n for n in names)
    assert "Requires-Dist" not in meta
    assert "Requires-Python: >=3.9" in meta
    assert "Name: fa-attn" in meta
    assert man["cuda_major"] == 12
    assert man["toolkit"] == "12.9.86"
    assert man["min_driver"] == "525.60.13"
    assert man["ptx_min_driver"] == "575.51.03"
    assert man["sass"] == ["8.0", "9.0"]
    assert man["ptx"] == "9.0"
    assert man["torch"] == "2.8"
    assert man["cxx11abi"] is True
    assert man["binding"] == "libfa_attn_ops.so"
    assert man["features"] == ["causal"]
    files = {k["file"] for k in man["kernels"]}
    assert files == {
        "kernels/sm_80/fwd_fp16_d64.cubin",
        "kernels/sm_90/fwd_fp16_d64.cubin",
        "kernels/compute_90/fwd_fp16_d64.ptx",
    }
    k80 = next(k for k in man["kernels"] if k["arch"] == "8.0")
    assert k80["entries"]["fa_fwd"]["threads"] == 32
    assert k80["head_dim"] == 64
    assert k80["dtype"] == "fp16"
    cov = {(c["arch"], c["image"]): c["head_dims"] for c in man["coverage"]}
    assert cov[("9.0", "ptx")] == list(range(8, 65, 8))


def test_a_cu13_wheel_names_the_major_that_compiled_its_borrowed_cubins(fixture_tree, host_lib, tmp_path):
    """A cu13 wheel ships CUDA 12's cubin where NVRTC 12 targets the arch (wheel_specs.sass_compiler):
    its manifest says so per kernel (`cuda_major` 12), its own kernels stay null, and fa index and the
    runtime's schema read it."""
    from buildtool.core.runtime import schema

    # as if the plan had NVRTC 13 compile 9.0's PTX (sass_per_major, or no CUDA 12 in the matrix)
    jobs = (CompileJob(12, "8.0", "sass", "fwd_fp16_d64"), CompileJob(13, "9.0", "ptx", "fwd_fp16_d64"))
    images = {}
    for i, job in enumerate(jobs):
        images[job] = tmp_path / f"img{i}"
        images[job].write_bytes(f"image of {job}".encode())
    spec = _spec("2.9", 13, jobs)
    built = _build(spec, tmp_path / "w", fixture_tree, images, host_lib)
    with zipfile.ZipFile(built.path) as zf:
        man = schema.Manifest.from_json(json.loads(zf.read("fa_attn/manifest.json")))
        assert zf.read("fa_attn/kernels/sm_80/fwd_fp16_d64.cubin") == images[jobs[0]].read_bytes()
    assert (man.info.cuda_major, man.info.toolkit, man.info.min_driver) == (13, "13.0.88", "580")
    assert {(k.arch, k.image): k.cuda_major for k in man.kernels} == {
        ("8.0", "sass"): 12,
        ("9.0", "ptx"): None,
    }
    (entry,) = index.write_index(tmp_path / "w")["wheels"]
    assert entry["variant"] == "cu13torch2.9"


def test_wheels_are_reproducible(fixture_tree, images, host_lib, tmp_path):
    a = _build(_spec(), tmp_path / "a", fixture_tree, images, host_lib)
    b = _build(_spec(), tmp_path / "b", fixture_tree, images, host_lib)
    assert a.path.read_bytes() == b.path.read_bytes()


def test_an_unchanged_wheel_is_not_rewritten_and_a_changed_one_is(fixture_tree, images, host_lib, tmp_path):
    first = _build(_spec(), tmp_path, fixture_tree, images, host_lib)
    inode = first.path.stat().st_ino
    again = _build(_spec(), tmp_path, fixture_tree, images, host_lib)
    assert again.path == first.path
    assert again.path.stat().st_ino == inode
    (fixture_tree / "fa_attn" / "_probe_change.py").write_text("x = 1\n")
    try:
        changed = _build(_spec(), tmp_path, fixture_tree, images, host_lib)
    finally:
        (fixture_tree / "fa_attn" / "_probe_change.py").unlink()
    assert changed.path.stat().st_ino != inode
    assert "fa_attn/_probe_change.py" in zipfile.ZipFile(changed.path).namelist()


def test_universal_wheel(fixture_tree, tmp_path):
    matrix = Matrix(
        version="0.1.0", torch=("2.8",), cuda=(12,), python=("3.11",), archs={12: ("8.0",)}, ptx={12: "8.0"}
    )
    built = _build(universal_wheel(matrix), tmp_path, fixture_tree, {}, None)
    assert built.path.name == "fa_attn-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(built.path) as zf:
        man = json.loads(zf.read("fa_attn/manifest.json"))
        assert "Root-Is-Purelib: true" in zf.read("fa_attn-0.1.0.dist-info/WHEEL").decode()
    for key in (
        "cuda_major",
        "toolkit",
        "torch",
        "cxx11abi",
        "min_driver",
        "ptx_min_driver",
        "ptx",
        "binding",
    ):
        assert man[key] is None, key
    assert man["sass"] == []
    assert man["kernels"] == []
    assert man["coverage"] == []
    assert man["variant"] == ""


def test_missing_image_is_a_package_error(fixture_tree, images, host_lib, tmp_path):
    del images[JOBS[1]]
    with pytest.raises(package.PackageError, match=r"no image for fwd_fp16_d64 on 9.0"):
        _build(_spec(), tmp_path, fixture_tree, images, host_lib)
    assert list(tmp_path.glob("*.whl*")) == []


def test_index_json_and_pep503_pages_pip_accepts(fixture_tree, images, host_lib, tmp_path):
    out = tmp_path / "wheels"
    a = _build(_spec("2.8"), out, fixture_tree, images, host_lib)
    data = index.write_index(out)
    (entry,) = data["wheels"]
    assert entry["file"] == a.path.name
    assert entry["size"] == a.path.stat().st_size
    assert entry["sha256"] == sha256_file(a.path)
    assert entry["platform_tag"] == a.platform
    assert (entry["python_tag"], entry["abi_tag"], entry["requires_python"]) == ("py3", "none", ">=3.9")
    assert json.loads((out / "index.json").read_text()) == data
    # its variant's index lists it; the root index (the all-wheels and the universal wheel) does not
    page = (out / "cu12-torch2.8" / "simple" / "fa-attn" / "index.html").read_text()
    assert f"#sha256={entry['sha256']}" in page
    assert a.path.name not in (out / "simple" / "fa-attn" / "index.html").read_text()
    variant_index = (out / "cu12-torch2.8" / "simple").as_uri()
    for source in (["--index-url", variant_index], ["--no-index", "--find-links", str(out)]):
        fetched = pip_download(tmp_path / ("dl" + source[0]), *source, "fa-attn==0.1.0+cu12torch2.8")
        assert fetched == [a.path.name]


def test_fa_index_merges_shards(fixture_tree, images, host_lib, tmp_path):
    one, two, merged = tmp_path / "s1", tmp_path / "s2", tmp_path / "all"
    _build(_spec("2.7"), one, fixture_tree, images, host_lib)
    _build(_spec("2.8"), two, fixture_tree, images, host_lib)
    merged.mkdir()
    for d in (one, two):
        for w in d.glob("*.whl"):
            shutil.copy(w, merged)
    result = CliRunner().invoke(app, ["index", str(merged)])
    assert result.exit_code == 0, result.output
    data = json.loads((merged / "index.json").read_text())
    assert sorted(w["torch"] for w in data["wheels"]) == ["2.7", "2.8"]


def test_fa_index_rejects_a_foreign_file(tmp_path):
    (tmp_path / "fa_attn-0.1.0-py3-none-any.whl").write_bytes(b"not a zip")
    result = CliRunner().invoke(app, ["index", str(tmp_path)])
    assert result.exit_code == 1
    assert "not an fa-attn wheel" in result.output


def _rewrite(wheel: Path, dest: Path, change: dict[str, bytes | None]) -> Path:
    """A copy of `wheel` named `dest` with members replaced (None: removed); everything else as is."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = change.get(info.filename, src.read(info))
            if data is not None:
                out.writestr(info, data)
    return dest


def _manifest_with(wheel: Path, **fields: object) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        man = json.loads(zf.read("fa_attn/manifest.json"))
    return json.dumps({**man, **fields}).encode()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"torch": "2.7"}, "torch: '2.7', but the variant cu12torch2.8 says '2.8'"),
        ({"cuda_major": 13}, "cuda_major: 13"),
        ({"cxx11abi": False}, "cxx11abi: false"),
        ({"version": "0.1.0+cu12torch2.7"}, "version"),
        ({"variant": "cu12torch2.7"}, "variant"),
        ({"platform": "aarch64"}, "platform"),
    ],
)
def test_fa_index_refuses_a_wheel_whose_manifest_disagrees(
    fixture_tree, images, host_lib, tmp_path, fields, named
):
    """A manifest that says torch 2.7 in a wheel whose name and metadata say 2.8 would be picked by
    doctor for torch 2.7: refused, naming the field."""
    built = _build(_spec("2.8"), tmp_path / "built", fixture_tree, images, host_lib).path
    house = tmp_path / "house"
    house.mkdir()
    _rewrite(built, house / built.name, {"fa_attn/manifest.json": _manifest_with(built, **fields)})
    result = CliRunner().invoke(app, ["index", str(house)])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "refusing it" in said
    assert named in said
    assert not (house / "index.json").exists()


def test_fa_index_refuses_a_renamed_wheel(fixture_tree, images, host_lib, tmp_path):
    built = _build(_spec("2.8"), tmp_path / "built", fixture_tree, images, host_lib).path
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(built, house / built.name.replace("torch2.8", "torch2.7"))  # file name says 2.7
    result = CliRunner().invoke(app, ["index", str(house)])
    assert result.exit_code == 1
    assert ".dist-info" in result.output
    assert "renamed" in " ".join(result.output.split())


def test_fa_index_refuses_metadata_that_disagrees(fixture_tree, images, host_lib, tmp_path):
    built = _build(_spec("2.8"), tmp_path / "built", fixture_tree, images, host_lib).path
    house = tmp_path / "house"
    house.mkdir()
    meta = "fa_attn-0.1.0+cu12torch2.8.dist-info/METADATA"
    with zipfile.ZipFile(built) as zf:
        text = zf.read(meta).decode().replace("Version: 0.1.0+cu12torch2.8", "Version: 0.2.0")
    _rewrite(built, house / built.name, {meta: text.encode()})
    result = CliRunner().invoke(app, ["index", str(house)])
    assert result.exit_code == 1
    assert "METADATA: Version is '0.2.0'" in " ".join(result.output.split())


def test_fa_index_refuses_other_tags(tmp_path, fixture_tree, images, host_lib):
    built = _build(_spec("2.8"), tmp_path / "built", fixture_tree, images, host_lib).path
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(built, house / built.name.replace("py3-none", "cp311-cp311"))
    result = CliRunner().invoke(app, ["index", str(house)])
    assert result.exit_code == 1
    assert "cp311" in result.output
    assert "Traceback" not in result.output


def test_fa_index_refuses_special_files_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "fa_attn-0.1.0-py3-none-any.whl")  # opening it for reading would block
    result = CliRunner().invoke(app, ["index", str(tmp_path)])
    assert result.exit_code == 1
    assert "not a regular file" in result.output


def test_fa_index_refuses_a_torch_tested_that_is_no_torch_minor_before_writing(
    fixture_tree, images, host_lib, tmp_path
):
    """Round three: torch_tested ["2.x"] passed the agreement check, then fa index died writing the
    page (a traceback), after index.json was written."""
    built = _build(_spec("2.8"), tmp_path / "built", fixture_tree, images, host_lib).path
    house = tmp_path / "house"
    house.mkdir()
    _rewrite(
        built, house / built.name, {"fa_attn/manifest.json": _manifest_with(built, torch_tested=["2.x"])}
    )
    result = CliRunner().invoke(app, ["index", str(house)])
    said = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "torch_tested" in said
    assert "'2.x'" in said
    assert "Traceback" not in said
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert sorted(p.name for p in house.iterdir()) == [built.name]
