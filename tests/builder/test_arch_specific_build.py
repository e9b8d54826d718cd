"""The arch-specific target "9.0a" (sm_90a, issue 39) in the build: matrix.yaml, the plan, the all-wheel,
the packager, and NVRTC itself.

sm_90a is compiled by NVRTC 12.9 and 13.0 only, into the CUDA 12 and 13 kernel sets, never as PTX; while
csrc/hopper_fwd.cu is not in this tree the plan leaves the target out and says why (the plan tests that
need its units take them from kernels/tiles.py's table, `table_units`). Not verified on a GPU.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.builder import all_wheel, package
from buildtool.builder.matrix import MatrixError, load_matrix, parse_matrix
from buildtool.builder.plan import WAITING_FOR_SOURCE, make_plan
from buildtool.builder.pypi import TorchCatalog, catalog_from_simple_json
from buildtool.core import cuda_facts, kernels_src
from buildtool.core.runtime import schema, versions

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")
tiles = kernels_src.tiles()
TABLE = SimpleNamespace(**{name: getattr(tiles, name) for name in dir(tiles) if not name.startswith("__")})
TABLE.units = tiles.table_units
HOPPER_UNITS = {f"fwd_{t}_d{d}" for t in ("fp16", "bf16") for d in (64, 96, 128, 192, 256)}


@pytest.fixture(scope="module")
def catalog() -> TorchCatalog:
    return catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))


@pytest.fixture(scope="module")
def release(catalog: TorchCatalog):
    """The repo's matrix planned with the table's units (sm_90a's included) against the fixture."""
    m = load_matrix(REPO / "matrix.yaml")
    m = replace(m, torch=tuple(t for t in m.torch if t in catalog.minors))
    return make_plan(m, catalog, units=tiles.table_units)


def test_the_targets_of_each_nvrtc() -> None:
    assert "9.0a" not in cuda_facts.TOOLKITS[11].archs
    for major in (12, 13):
        assert "9.0a" in cuda_facts.TOOLKITS[major].archs
        assert "9.0a" in cuda_facts.TOOLKITS[major].default_archs
    assert cuda_facts.sm_name("9.0a") == "sm_90a"
    assert cuda_facts.sm_name("9.0") == "sm_90"
    with pytest.raises(ValueError, match="arch-specific"):
        cuda_facts.compute_name("9.0a")
    assert versions.parse_target("9.0") < versions.parse_target("9.0a") < versions.parse_target("10.0")


def test_sm90a_units_are_compiled_in_cuda_12_and_13_only_and_never_as_ptx(release) -> None:
    for w in release.wheels[1:]:
        hopper = {j.unit for j in w.compile_jobs if j.arch == "9.0a"}
        if w.cuda_major == 11:
            assert hopper == set(), w.name
            continue
        assert "9.0a" in w.sass, w.name
        assert hopper == HOPPER_UNITS, w.name
        assert w.ptx != "9.0a"
    assert not any(j.arch == "9.0a" and j.image == "ptx" for j in release.compile_jobs)


def test_the_all_wheel_carries_sm90a(release) -> None:
    """In the all-wheel the rule stays the plain archs' one: a major that serves older drivers keeps
    its SASS, a newer major adds only what no older one has; so sm_90a comes from the oldest major that
    builds it and the main one."""
    for spec in release.all_wheels:
        sets = {k.cuda_major: k for k in spec.kernel_sets}
        majors = [m for m, k in sets.items() if "9.0a" in k.sass]
        assert 12 in majors, spec.name
        assert 11 not in majors
        man = all_wheel.manifest(spec, TABLE)
        for kernel_set in man.info.kernel_sets:
            assert "9.0a" not in kernel_set.sass
            assert kernel_set.arch_specific == (("9.0a",) if kernel_set.cuda_major in majors else ())
        files = [k for k in man.kernels if k.arch_specific]
        assert {k.file.split("/")[2] for k in files} == {"sm_90a"}
        assert {k.cuda_major for k in files} == set(majors)
        assert schema.Manifest.from_json(json.loads(json.dumps(man.to_json()))) == man


def test_without_its_source_the_build_leaves_sm90a_out_and_says_so(catalog: TorchCatalog) -> None:
    if not tiles.missing_sources("9.0a"):
        pytest.skip("csrc/hopper_fwd.cu is in this tree: sm_90a builds (the gate has nothing to do)")
    assert tiles.units("9.0a") == []
    assert tiles.missing_sources("9.0a") == ["csrc/hopper_fwd.cu"]
    m = load_matrix(REPO / "matrix.yaml")
    plan = make_plan(replace(m, torch=tuple(t for t in m.torch if t in catalog.minors)), catalog)
    assert not any(j.arch == "9.0a" for j in plan.compile_jobs)
    waiting = {(d.platform, d.cuda_major) for d in plan.dropped_sass if d.arch == "9.0a"}
    assert waiting == {(cpu, major) for cpu in m.platforms for major in (12, 13)}
    assert all(d.reason == WAITING_FOR_SOURCE for d in plan.dropped_sass if d.arch == "9.0a")


MATRIX = """
torch: ["2.9"]
cuda: [{cuda}]
python: ["3.12"]
archs: {{"{cuda}": {archs}}}
{extra}
"""


def matrix_error(cuda: int, archs: str, extra: str = "") -> MatrixError:
    with pytest.raises(MatrixError) as caught:
        parse_matrix(MATRIX.format(cuda=cuda, archs=archs, extra=extra), "m.yaml", tiles=tiles)
    return caught.value


def test_the_matrix_refuses_sm90a_for_cuda_11() -> None:
    err = matrix_error(11, '["8.0", "9.0a"]')
    assert 'archs."11"[1]' in str(err)
    assert "cannot be targeted by CUDA 11" in str(err)
    assert "build it with CUDA 12, 13" in str(err)


def test_the_matrix_refuses_ptx_of_sm90a() -> None:
    err = matrix_error(12, '["9.0", "9.0a"]', 'ptx: {"12": "9.0a"}')
    assert 'ptx."12"' in str(err)
    assert "arch-specific" in str(err)
    assert '"9.0"' in str(err)  # the fix names the plain arch


def test_the_default_ptx_is_never_arch_specific() -> None:
    m = parse_matrix(MATRIX.format(cuda=12, archs='["8.0", "9.0a"]', extra=""), "m.yaml", tiles=tiles)
    assert m.archs[12] == ("8.0", "9.0a")
    assert m.ptx[12] == "8.0"
    m = parse_matrix(MATRIX.format(cuda=12, archs='["9.0a"]', extra=""), "m.yaml", tiles=tiles)
    assert m.ptx[12] is None


@pytest.mark.parametrize("bad", ["9.0b", "sm_90a", "9.0aa", "90a"])
def test_other_spellings_are_refused(bad: str) -> None:
    err = matrix_error(12, f'["{bad}"]')
    assert "not a compute capability" in str(err)
    with pytest.raises(ValueError):
        versions.parse_target(bad)


def test_a_gpu_is_never_an_arch_specific_target() -> None:
    """A device's compute capability is plain: "9.0a" is a build target, never what a GPU reports."""
    with pytest.raises(ValueError, match="not a compute capability"):
        versions.parse_arch("9.0a")
    assert versions.sass_runs_on("9.0a", "9.0")
    assert not any(versions.sass_runs_on("9.0a", gpu) for gpu in ("8.0", "8.9", "9.1", "10.0", "12.0"))
    assert versions.sass_runs_on("9.0", "9.1")


def cubin_sm(image: bytes) -> int:
    """The SM number in a cubin's ELF flags (ABI 7: bits 0-7; ABI 8, CUDA 13: bits 8-15)."""
    (flags,) = struct.unpack_from("<I", image, 48)
    return flags & 0xFF if image[8] == 7 else (flags >> 8) & 0xFF


WGMMA = 'extern "C" __global__ void k(float* x) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); *x = 1; }'


@pytest.mark.network
@pytest.mark.parametrize("major", [11, 12, 13])
def test_nvrtc_compiles_sm90a_where_cuda_facts_says(major: int) -> None:
    """The pinned NVRTCs themselves: sm_90a (and its wgmma) from 12.9 and 13.0, not from 11.8; plain
    sm_90 never takes wgmma. What cuda_facts' target lists claim."""
    from buildtool.builder import toolkits
    from buildtool.builder.nvrtc import NvrtcError, open_nvrtc

    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(major)))
    with pytest.raises(NvrtcError, match="wgmma.fence|Unknown modifier"):
        nvrtc.compile(WGMMA, "k.cu", "sm_90", ["-std=c++17"], {})
    if "9.0a" not in cuda_facts.TOOLKITS[major].archs:
        with pytest.raises(NvrtcError, match="invalid value for --gpu-architecture"):
            nvrtc.compile(WGMMA, "k.cu", cuda_facts.sm_name("9.0a"), ["-std=c++17"], {})
        return
    out = nvrtc.compile(WGMMA, "k.cu", cuda_facts.sm_name("9.0a"), ["-std=c++17"], {})
    assert out.kind == "cubin"
    assert cubin_sm(out.image) == 90


@pytest.mark.network
@pytest.mark.parametrize(("major", "unit_name"), [(12, "fwd_bf16_d128"), (13, "fwd_fp16_d64")])
def test_an_sm90a_unit_compiles_without_spills(major: int, unit_name: str) -> None:
    missing = tiles.missing_sources("9.0a")
    if missing:
        pytest.skip(f"kernels/{missing[0]} is not in this tree yet (issue 39's kernel, its own branch)")
    from buildtool.builder import toolkits
    from buildtool.builder.nvrtc import open_nvrtc, parse_resource_usage

    unit = next(u for u in tiles.units("9.0a") if u.name == unit_name)
    kdir = kernels_src.kernels_dir()
    headers = {p.name: p.read_text() for p in (kdir / "csrc").iterdir() if p.suffix in (".h", ".cuh")}
    options = [*tiles.nvrtc_options("9.0a"), *(f"-D{k}={v}" for k, v in unit.defines.items()), "-Xptxas=-v"]
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(major)))
    out = nvrtc.compile((kdir / unit.source).read_text(), unit.source, "sm_90a", options, headers)
    assert out.kind == "cubin" and cubin_sm(out.image) == 90
    usages = {u.kernel: u for u in parse_resource_usage(out.log)}
    assert set(usages) == {tiles.HOPPER_ENTRY}
    assert usages[tiles.HOPPER_ENTRY].spill_stores == usages[tiles.HOPPER_ENTRY].spill_loads == 0, out.log
