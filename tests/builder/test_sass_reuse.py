"""sm 8.6's SASS reuses sm 8.0's cubin where the unit's program is the same (source, -D defines, NVRTC
options): the plan of README's matrix compiles it once, the manifest's 8.6 entry names the sm_80
file, 8.6 and 8.9 keep exactly their own tiles, and the decision (from the manifest's JSON) loads that
file on them. A cubin runs on every GPU of its major with a minor at least its own (CUDA C++
Programming Guide, "Binary Compatibility"). Nothing here compiles a kernel; not verified on a GPU."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import tiles
from fa_attn.runtime.decision import Call, Device, decide
from fa_attn.schema import Manifest

from buildtool.builder import all_wheel, package
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.pypi import TorchCatalog, catalog_from_simple_json
from buildtool.builder.wheel_specs import CompileJob, ReusedSass, WheelSpec, keep_reused

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def catalog() -> TorchCatalog:
    return catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))


@pytest.fixture(scope="module")
def plan(catalog: TorchCatalog) -> Plan:
    """README's matrix (its torch minors the trimmed catalog has) for x86_64, with kernels/tiles.py."""
    matrix = load_matrix(REPO / "matrix.yaml")
    matrix = dataclasses.replace(matrix, torch=tuple(t for t in matrix.torch if t in catalog.minors))
    return make_plan(matrix, catalog, platform="x86_64")


def same_program(a: str, b: str, name: str) -> bool:
    ua = {u.name: u for u in tiles.units(a)}[name]
    ub = {u.name: u for u in tiles.units(b)}.get(name)
    return ub is not None and (ua.source, ua.defines) == (ub.source, ub.defines)


def kernel_wheel(plan: Plan, major: int) -> WheelSpec:
    return next(w for w in plan.wheels if w.cuda_major == major and w.binding is not None)


def read_back(man: Manifest) -> Manifest:
    return Manifest.from_json(json.loads(json.dumps(man.to_json())))


@pytest.mark.parametrize("major", [11, 12])
def test_the_plan_compiles_86s_units_that_are_80s_programs_once(plan: Plan, major: int) -> None:
    wheel = kernel_wheel(plan, major)
    assert {"8.0", "8.6"} <= set(wheel.sass)
    same = {u.name for u in tiles.units("8.6") if same_program("8.6", "8.0", u.name)}
    assert len(same) == 14  # fwd/bwd d32 and d160, split-KV d32, d64, d256; fp16 and bf16
    reused = {r.job.unit: r for r in wheel.reused_sass if r.arch == "8.6"}
    assert set(reused) == same
    by = {j.unit: j.cuda_major for j in wheel.compile_jobs if j.arch == "8.0" and j.image == "sass"}
    for name, r in reused.items():
        assert r.job == CompileJob(by[name], "8.0", "sass", name)
        assert r.job in plan.compile_jobs
        assert CompileJob(by[name], "8.6", "sass", name) not in plan.compile_jobs
    own = {j.unit for j in wheel.compile_jobs if j.arch == "8.6"}
    assert own == {u.name for u in tiles.units("8.6")} - same
    assert set(plan.reused_sass) >= set(wheel.reused_sass)


def test_the_manifest_names_80s_cubin_for_86_with_86s_own_tiles(plan: Plan) -> None:
    man = read_back(package.manifest(kernel_wheel(plan, 12), tiles))
    mine = {k.unit: k for k in man.kernels if k.arch == "8.6" and k.image == "sass"}
    assert set(mine) == {u.name for u in tiles.units("8.6")}
    for u in tiles.units("8.6"):
        assert mine[u.name].tile == u.tile  # the tile 8.6 runs today
        where = "sm_80" if same_program("8.6", "8.0", u.name) else "sm_86"
        assert mine[u.name].file == f"kernels/{where}/{u.name}.cubin"
    files = {k.file for k in man.kernels}
    assert all(f.startswith("kernels/sm_80/") for f in files if f.endswith("_d32.cubin") and "sm_8" in f)
    rows = [c for c in man.info.coverage if c.arch == "8.6" and c.image == "sass"]
    assert len(rows) == len(tiles.units("8.6"))


def test_the_all_wheel_names_the_reused_cubin_too(plan: Plan) -> None:
    (spec,) = plan.all_wheels
    man = read_back(all_wheel.manifest(spec, tiles))
    sm86 = [k for k in man.kernels if k.arch == "8.6" and k.image == "sass"]
    # cu11's and cu12's sets both name CUDA 11.8's sm_80 cubin (the same program: test_sass_across_majors)
    assert {(k.cuda_major, k.file) for k in sm86 if k.unit == "fwd_fp16_d32"} == {
        (11, "kernels/cu11/sm_80/fwd_fp16_d32.cubin"),
        (12, "kernels/cu11/sm_80/fwd_fp16_d32.cubin"),
    }
    names = {k.file for k in man.kernels}
    assert not any("/sm_86/fwd_fp16_d32." in f for f in names)


@pytest.mark.parametrize("sm", ["8.6", "8.9"])
@pytest.mark.parametrize(("head_dim", "where"), [(32, "sm_80"), (160, "sm_80"), (128, "sm_86")])
def test_the_decision_loads_80s_cubin_on_86_and_89_with_their_own_tile(
    plan: Plan, sm: str, head_dim: int, where: str
) -> None:
    man = read_back(package.manifest(kernel_wheel(plan, 12), tiles))
    device = Device("cuda", sm, 99 * 1024, "580.65.06")
    chosen = decide(man.info, device, Call("bf16", head_dim), man.kernels, Path("/w/fa_attn"))
    assert (chosen.path, chosen.arch) == ("sass", "8.6")
    assert chosen.fwd is not None
    assert f"/kernels/{where}/fwd_bf16_d{tiles.bucket_of(head_dim)}" in chosen.fwd.module
    own = tiles.default_tile("8.6", "fwd", head_dim)
    assert own is not None
    launch = chosen.fwd.launch  # [bucket, threads, block_m, block_n, ...] of the main entry
    assert (launch[2], launch[3]) == (own.block_m, own.block_n)


def test_no_arch_test_in_the_kernels_tells_a_reused_minor_from_its_cubins() -> None:
    """The kernels branch on __CUDA_ARCH__ thresholds; a reuse of X.z's cubin on X.y is only the same
    program if no threshold lies between them."""
    thresholds = {
        int(t)
        for path in (REPO / "kernels" / "csrc").iterdir()
        for t in re.findall(r"__CUDA_ARCH__\s*[<>=!]+\s*(\d+)", path.read_text())
    }
    assert thresholds  # the pattern still finds them
    low, high = 800, 860
    assert not [t for t in thresholds if low < t <= high]


def test_a_reused_unit_compiles_its_own_where_the_lower_minor_is_left_out() -> None:
    base = CompileJob(12, "8.0", "sass", "fwd_fp16_d32")
    reused = (ReusedSass("8.6", base),)
    other = CompileJob(12, "8.6", "sass", "fwd_fp16_d64")
    assert keep_reused((base, other), reused, ("8.0", "8.6")) == ((base, other), reused)
    jobs, kept = keep_reused((other,), reused, ("8.6",))
    assert kept == ()
    assert jobs == (other, CompileJob(12, "8.6", "sass", "fwd_fp16_d32"))
    assert keep_reused((base,), reused, ("8.0",)) == ((base,), ())
