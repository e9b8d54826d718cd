"""Tiles per CUDA major (kernels/tiles.py ArchFamily.per_cuda, issue 38) through the build: a unit whose
tile differs by major is compiled by each major's NVRTC with that major's tile, and each wheel's
manifest (which the runtime reads its launches from) describes the tile of the cubin it ships: the cu11
wheel NVRTC 11.8's spill-free tile, the cu12 wheel FA2's, the cu13 wheel the cu12 cubin's (CUDA 12's
NVRTC compiles it, wheel_specs.sass_compiler), the all-wheel each major's beside the other. Real plan
of README's matrix, real packager and decision; nothing is compiled. Not verified on a GPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import tiles
from fa_attn.runtime.decision import Call, Device, decide
from fa_attn.schema import KernelFile, Manifest

from buildtool.builder import all_wheel, package
from buildtool.builder.compile import KernelTree, resolve
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.pypi import TorchCatalog, catalog_from_simple_json
from buildtool.builder.wheel_specs import CompileJob, WheelSpec

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
# (arch, head dim) of the backward units whose tile is CUDA 11's own
PER_MAJOR = [("8.0", 96), ("8.0", 192), ("8.6", 192), ("9.0", 256)]


@pytest.fixture(scope="module")
def plan() -> Plan:
    catalog: TorchCatalog = catalog_from_simple_json(json.loads((DATA / "torch_simple.json").read_text()))
    matrix = load_matrix(REPO / "matrix.yaml")
    matrix = dataclasses.replace(matrix, torch=tuple(t for t in matrix.torch if t in catalog.minors))
    return make_plan(matrix, catalog, platform="x86_64")


def kernel_wheel(plan: Plan, major: int) -> WheelSpec:
    return next(w for w in plan.wheels if w.cuda_major == major and w.binding is not None)


def shipped(man: Manifest, arch: str, unit: str) -> KernelFile:
    (k,) = [k for k in man.kernels if k.arch == arch and k.unit == unit and k.image == "sass"]
    return k


def read_back(man: Manifest) -> Manifest:
    return Manifest.from_json(json.loads(json.dumps(man.to_json())))


@pytest.mark.parametrize(("arch", "head_dim"), PER_MAJOR)
def test_each_majors_nvrtc_is_given_its_own_tile(plan: Plan, arch: str, head_dim: int) -> None:
    name = f"bwd_bf16_d{head_dim}"
    tree = KernelTree()
    for major in (11, 12):
        assert CompileJob(major, arch, "sass", name) in plan.compile_jobs
        task = resolve(CompileJob(major, arch, "sass", name), tree)
        tile = tiles.default_tile(arch, "bwd", head_dim, major)
        assert tile is not None
        expected = tiles.unit(arch, "bwd", "bf16", head_dim, tile).defines
        assert defines(task.options) == [f"-D{k}={v}" for k, v in sorted(expected.items())], major
    cu11, cu12 = (resolve(CompileJob(major, arch, "sass", name), tree) for major in (11, 12))
    assert defines(cu11.options) != defines(cu12.options)


def defines(options: tuple[str, ...]) -> list[str]:
    return [o for o in options if o.startswith("-D")]


@pytest.mark.parametrize(("arch", "head_dim"), PER_MAJOR)
def test_each_wheel_describes_the_tile_of_the_cubin_it_ships(plan: Plan, arch: str, head_dim: int) -> None:
    name = f"bwd_bf16_d{head_dim}"
    for major, compiled_by in ((11, 11), (12, 12), (13, 12)):
        man = read_back(package.manifest(kernel_wheel(plan, major), tiles))
        k = shipped(man, arch, name)
        tile = tiles.default_tile(arch, "bwd", head_dim, compiled_by)
        assert tile is not None
        assert k.tile == tile.label, major
        assert k.entries["fa_bwd"].smem_bytes == tile.smem_bytes(head_dim), major
        assert (k.entries["fa_bwd"].block_m, k.entries["fa_bwd"].block_n) == (tile.block_m, tile.block_n)
        # and the runtime launches what the manifest says: the decision reads these entries
        device = Device("cuda", arch, tiles.SMEM_LIMIT[arch], "580.65.06")
        chosen = decide(man.info, device, Call("bf16", head_dim, backward=True), man.kernels, Path("/w"))
        assert chosen.bwd is not None, (major, chosen)
        assert chosen.bwd.module.endswith(f"/{name}.cubin")
        launch = chosen.bwd.launch  # [bucket, then (threads, block_m, block_n, smem, grid) per entry]
        fa_bwd = list(k.entries).index("fa_bwd")
        assert list(launch[1 + 5 * fa_bwd : 5 + 5 * fa_bwd]) == [
            256,
            tile.block_m,
            tile.block_n,
            tile.smem_bytes(head_dim),
        ]
    cu11 = shipped(read_back(package.manifest(kernel_wheel(plan, 11), tiles)), arch, name)
    cu12 = shipped(read_back(package.manifest(kernel_wheel(plan, 12), tiles)), arch, name)
    assert cu11.tile != cu12.tile


def test_the_all_wheel_carries_each_majors_tile_beside_the_other(plan: Plan) -> None:
    (spec,) = plan.all_wheels
    man = read_back(all_wheel.manifest(spec, tiles))
    for arch, head_dim in PER_MAJOR:
        name = f"bwd_bf16_d{head_dim}"
        by_file = {
            k.file: k.tile for k in man.kernels if k.arch == arch and k.unit == name and k.image == "sass"
        }
        sm = "sm_" + arch.replace(".", "")
        for major in (11, 12):
            tile = tiles.default_tile(arch, "bwd", head_dim, major)
            assert tile is not None
            assert by_file[f"kernels/cu{major}/{sm}/{name}.cubin"] == tile.label
