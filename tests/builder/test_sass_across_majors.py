"""One SASS per arch across CUDA 11, 12 and 13: a cu12 (and so a cu13) wheel carries CUDA 11.8's cubin
for every unit whose NVRTC program (source, -D defines, options) is the same as CUDA 11's, a chain
13 -> 12 -> 11 (cuda_facts.SASS_FROM, wheel_specs.sass_compiler); a unit whose program differs per
major (its tile is per major in kernels/tiles.py) is compiled by each. Planning and packaging only:
nothing is compiled; not verified on a GPU."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tiles
from fa_attn.schema import Manifest

from buildtool.builder import all_wheel, package
from buildtool.builder.compile import KernelTree
from buildtool.builder.matrix import load_matrix, parse_matrix
from buildtool.builder.plan import Plan, make_plan, units_per_major
from buildtool.builder.pypi import TorchCatalog, catalog_from_simple_json
from buildtool.builder.wheel_specs import CompileJob, WheelSpec
from buildtool.core import cuda_facts

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def catalog() -> TorchCatalog:
    return catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))


def readme_plan(catalog: TorchCatalog, **changes: object) -> Plan:
    """README's first command's plan (x86_64) with kernels/tiles.py, for the minors the fixture has."""
    matrix = load_matrix(REPO / "matrix.yaml")
    matrix = dataclasses.replace(
        matrix, torch=tuple(t for t in matrix.torch if t in catalog.minors), **changes
    )
    return make_plan(matrix, catalog, platform="x86_64")


def kernel_wheel(plan: Plan, major: int) -> WheelSpec:
    return next(w for w in plan.wheels if w.cuda_major == major and w.binding is not None)


def program(arch: str, major: int, name: str) -> tuple[object, ...] | None:
    """What NVRTC `major` is given for unit `name` on `arch` (the real table), None if it has no such unit."""
    unit = {u.name: u for u in units_per_major(tiles.units)(arch, major)}.get(name)
    return None if unit is None else (unit.source, sorted(unit.defines.items()), tiles.nvrtc_options(arch))


def test_readme_plan_compiles_cuda_11s_programs_once_for_11_12_and_13(catalog: TorchCatalog) -> None:
    plan = readme_plan(catalog)
    per_major = readme_plan(catalog, sass_per_major=(12, 13))  # every major its own, as before
    cu11, cu12, cu13 = (kernel_wheel(plan, m) for m in (11, 12, 13))
    older = set(cuda_facts.TOOLKITS[11].archs)
    for wheel in (cu12, cu13):
        for job in wheel.compile_jobs:
            if job.image == "sass" and job.arch in older:
                # 11.8's cubin unless the unit's program differs between 11 and 12
                same = program(job.arch, 11, job.unit) == program(job.arch, 12, job.unit)
                assert job.cuda_major == (11 if same else 12), job
        borrowed = {j for j in wheel.compile_jobs if j.cuda_major == 11}
        assert borrowed <= set(cu11.compile_jobs)  # the cu11 wheels' own programs, no compile of its own
    # NVRTC 12 compiles what 11.8 cannot target (9.0a, 10.0, 12.0 and its PTX) and the units whose
    # program differs; cu11 compiles what it compiled before.
    own12 = [j for j in plan.compile_jobs if j.cuda_major == 12]
    assert {j.arch for j in own12 if j.arch not in older} == {a for a in cu12.sass if a not in older} | {
        cu12.ptx
    }
    assert cu12.ptx == "12.0"
    assert all(j.cuda_major == 12 for j in cu12.compile_jobs if j.image == "ptx")
    count = Counter(j.cuda_major for j in plan.compile_jobs)
    before = Counter(j.cuda_major for j in per_major.compile_jobs)
    assert count[11] == before[11]
    shared = sum(1 for j in per_major.compile_jobs if j.cuda_major == 12 and j.arch in older) - sum(
        1 for j in own12 if j.arch in older
    )
    assert shared > 100  # the bulk of CUDA 12's own 7.5/8.0/8.6/9.0 compiles
    assert count[12] == before[12] - shared
    assert count[13] == 0 == before[13] - sum(1 for j in per_major.compile_jobs if j.cuda_major == 13)
    assert len(plan.compile_jobs) == len(per_major.compile_jobs) - shared - before[13]


def test_sass_per_major_12_keeps_cuda_12s_own_cubins_and_cuda_13_takes_them(catalog: TorchCatalog) -> None:
    plan = readme_plan(catalog, sass_per_major=(12,))
    assert {j.cuda_major for j in kernel_wheel(plan, 12).compile_jobs} == {12}
    assert {j.cuda_major for j in kernel_wheel(plan, 13).compile_jobs} == {12}


@dataclass(frozen=True)
class Unit:  # the fields of tiles.KernelUnit that a plan without a kernel filter reads and compares
    name: str
    source: str
    defines: dict[str, int] = field(hash=False)


def units(arch: str, cuda: int | None = 12) -> list[Unit]:
    """A table whose sm 8.0 fp16 forward has another tile under CUDA 11 (as NVRTC 11.8 spills on it)."""
    out = []
    for dtype in ("fp16", "bf16"):
        block_n = 32 if (arch, dtype, cuda) == ("8.0", "fp16", 11) else 64
        out.append(Unit(f"fwd_{dtype}_d64", "csrc/fwd.cu", {"FA_BLOCK_N": block_n}))
    return out


MATRIX = (
    'torch: ["2.7"]\ncuda: [11, 12, 13]\npython: ["3.12"]\n'
    'archs: {"11": ["8.0", "9.0"], "12": ["8.0", "9.0", "12.0"], "13": ["8.0", "9.0", "12.0"]}\n'
    'ptx: {"11": "9.0", "12": "12.0", "13": "12.0"}\nexclude: []\n'
)


def test_a_unit_whose_program_differs_per_major_is_compiled_by_both(catalog: TorchCatalog) -> None:
    m = parse_matrix(MATRIX.replace('"2.7"', '"2.7", "2.9"'), "m.yaml")
    plan = make_plan(m, catalog, units=units)
    cu11, cu12, cu13 = (kernel_wheel(plan, major) for major in (11, 12, 13))
    jobs12 = {(j.arch, j.image, j.unit): j.cuda_major for j in cu12.compile_jobs}
    assert jobs12 == {
        ("8.0", "sass", "fwd_fp16_d64"): 12,  # its program differs from CUDA 11's
        ("8.0", "sass", "fwd_bf16_d64"): 11,
        ("9.0", "sass", "fwd_fp16_d64"): 11,
        ("9.0", "sass", "fwd_bf16_d64"): 11,
        ("12.0", "sass", "fwd_fp16_d64"): 12,  # NVRTC 11.8 does not target 12.0
        ("12.0", "sass", "fwd_bf16_d64"): 12,
        ("12.0", "ptx", "fwd_fp16_d64"): 12,
        ("12.0", "ptx", "fwd_bf16_d64"): 12,
    }
    # The chain: CUDA 13 takes what CUDA 12 ships, 11.8's cubin included.
    assert {(j.arch, j.image, j.unit): j.cuda_major for j in cu13.compile_jobs} == jobs12
    assert CompileJob(11, "8.0", "sass", "fwd_fp16_d64") in cu11.compile_jobs
    assert CompileJob(12, "8.0", "sass", "fwd_fp16_d64") in plan.compile_jobs
    assert Counter(j.cuda_major for j in plan.compile_jobs) == {11: 6, 12: 5}


def test_no_toolkit_is_fetched_only_to_share(catalog: TorchCatalog) -> None:
    """Without CUDA 11 in the matrix, CUDA 12 compiles its own (and CUDA 13 takes CUDA 12's)."""
    text = MATRIX.replace("[11, 12, 13]", "[12, 13]").replace('"11": ["8.0", "9.0"], ', "")
    m = parse_matrix(text.replace('"11": "9.0", ', ""), "m.yaml")
    plan = make_plan(m, catalog, units=units)
    assert {j.cuda_major for j in plan.compile_jobs} == {12}


def test_a_packaged_cu12_wheel_names_the_11_8_cubin(fixture_tree: Path) -> None:
    """The cu12 wheel of a CUDA 11 + 12 plan ships 11.8's sm_80 cubin and its manifest says so per
    kernel; its PTX (a matrix asking for compute 9.0) is 11.8's too, so JIT needs 11.8's driver, not
    12.9's; the all-wheel stores the shared cubin once, under cu11/, for both kernel sets."""
    matrix = parse_matrix(
        'torch: ["2.7"]\ncuda: [11, 12]\npython: ["3.12"]\narchs: {"11": ["8.0"], "12": ["8.0"]}\n'
        'ptx: {"11": "9.0", "12": "9.0"}\nexclude: []\nall_wheel: true\n',
        "m.yaml",
    )
    tree = KernelTree(fixture_tree)
    catalog = catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))
    plan = make_plan(matrix, catalog, units=tree.tiles.units)
    cu12 = kernel_wheel(plan, 12)
    assert {j.cuda_major for j in cu12.compile_jobs} == {11}
    man = package.manifest(cu12, tree.tiles)
    assert (man.info.cuda_major, man.info.toolkit, man.info.min_driver) == (12, "12.9.86", "525.60.13")
    assert man.info.ptx_min_driver == cuda_facts.TOOLKITS[11].ptx_min_driver == "520.61.05"
    assert {(k.arch, k.image, k.file): k.cuda_major for k in man.kernels} == {
        ("8.0", "sass", "kernels/sm_80/fwd_fp16_d64.cubin"): 11,
        ("8.0", "sass", "kernels/sm_80/fwd_bf16_d64.cubin"): 11,
        ("9.0", "ptx", "kernels/compute_90/fwd_fp16_d64.ptx"): 11,
        ("9.0", "ptx", "kernels/compute_90/fwd_bf16_d64.ptx"): 11,
    }
    read = Manifest.from_json(json.loads(json.dumps(man.to_json())))
    assert {k.cuda_major for k in read.kernels} == {11}

    (spec,) = plan.all_wheels
    allman = all_wheel.manifest(spec, tree.tiles)
    sets = {k.cuda_major: k for k in allman.info.kernel_sets}
    assert (sets[12].ptx, sets[12].ptx_min_driver) == ("9.0", "520.61.05")  # 11.8's PTX, 11.8's floor
    files = {m: {f.file for f in allman.kernels if f.cuda_major == m} for m in sets}
    assert files[11] == {"kernels/cu11/sm_80/fwd_fp16_d64.cubin", "kernels/cu11/sm_80/fwd_bf16_d64.cubin"}
    assert files[11] < files[12]  # the same cubins, and the PTX
    assert {all_wheel.kernel_file(j) for j in spec.compile_jobs} == files[12]  # each file stored once


# The fixture table (tests/builder/fixture_kernels/tiles.py) with one unit whose tile is per CUDA major.
PER_MAJOR = """

def all_units(arch, cuda=12):
    smem = 200 * 1024 if cuda == 11 else 64 * 1024  # CUDA 11's tile asks more than a block has
    launch = Launch(128, 64, 64 if cuda == 11 else 128, smem, "q_blocks")
    tile = "m64n64w4s1" if cuda == 11 else "m64n128w4s1"
    defines = {"FA_SMEM": smem}
    return [KernelUnit("fwd_fp16_d64", "fwd", "fp16", 64, "csrc/tiny.cu", defines, {"fa_fwd": launch}, tile)]
"""


def per_major_tree(root: Path) -> KernelTree:
    (root / "tiles.py").write_text(
        (Path(__file__).parent / "fixture_kernels" / "tiles.py").read_text() + PER_MAJOR
    )
    return KernelTree(root)


def test_a_cubin_is_checked_against_the_tile_of_the_major_that_compiled_it(tmp_path: Path) -> None:
    """cubin_fit.check_build takes each cubin's launch from its compiling major's table: CUDA 11.8's
    cubin of a unit whose tile is per major is held to CUDA 11's tile, not the default (12's)."""
    from buildtool.builder import cubin_fit

    tree = per_major_tree(tmp_path)
    image = tmp_path / "fwd.cubin"  # an ELF without kernel sections: no static shared memory
    image.write_bytes(Path("/bin/true").read_bytes())
    cubin_fit.check_build({CompileJob(12, "8.0", "sass", "fwd_fp16_d64"): image}, tree)
    with pytest.raises(cubin_fit.SharedMemoryFitError, match=r"fwd_fp16_d64 \(fa_fwd\) on sm 8.0: 204800 B"):
        cubin_fit.check_build({CompileJob(11, "8.0", "sass", "fwd_fp16_d64"): image}, tree)


def test_a_manifest_describes_the_tile_of_the_major_that_compiled_each_kernel(tmp_path: Path) -> None:
    """A cu12 wheel's entry for CUDA 11.8's cubin carries CUDA 11's tile and launch (the runtime
    chooses and launches by them), its own cubin CUDA 12's."""
    tree = per_major_tree(tmp_path)
    jobs = (CompileJob(11, "8.0", "sass", "fwd_fp16_d64"), CompileJob(12, "8.0", "ptx", "fwd_fp16_d64"))
    spec = WheelSpec(12, "2.7", True, ("8.0",), "8.0", (), jobs, None, "cu12torch2.7", "0.1.0+cu12torch2.7")
    man = package.manifest(spec, tree.tiles)
    got = {(k.image, k.cuda_major): (k.tile, k.entries["fa_fwd"].block_n) for k in man.kernels}
    assert got == {("sass", 11): ("m64n64w4s1", 64), ("ptx", None): ("m64n128w4s1", 128)}
