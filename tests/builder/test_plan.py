"""The torch catalog and the build plan, offline against a trimmed real PyPI answer
(tests/builder/data/torch_simple.json, made by make_torch_fixture.py)."""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version
from rich.console import Console

from buildtool.builder.matrix import Matrix, MatrixError, load_matrix, parse_matrix
from buildtool.builder.plan import (
    SKIP_EXCLUDED,
    SKIP_NO_TORCH_BUILD,
    WAITING_FOR_SOURCE,
    Cell,
    CompileJob,
    DroppedSass,
    Plan,
    local_plan,
    make_plan,
    parse_shard,
    shard_wheels,
)
from buildtool.builder.plan_view import plan_json, plan_renderable, plan_table
from buildtool.builder.pypi import (
    SIMPLE_URL,
    CatalogError,
    TorchCatalog,
    catalog_from_simple_json,
    fetch_torch_catalog,
    simple_json_from_response,
)
from buildtool.core import cuda_facts, fetch, kernels_src

DATA = Path(__file__).with_name("data")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Unit:  # the fields of tiles.KernelUnit that the plan reads
    name: str
    direction: str
    dtype: str
    head_dim: int


def units(arch: str, cuda: int | None = None) -> list[Unit]:  # noqa: ARG001 (one table for every major)
    """A small kernel table: like the real one, no bf16 on 7.5 and nothing below it."""
    if Version(arch) < Version("7.5"):
        return []
    dtypes = ("fp16",) if arch == "7.5" else ("fp16", "bf16")
    return [Unit(f"{d}_{t}_d{h}", d, t, h) for d in ("fwd", "bwd") for t in dtypes for h in (64, 128)]


TILES = SimpleNamespace(MIN_ARCH="7.5", HEAD_DIM_BUCKETS=(64, 128), units=units)


@pytest.fixture(scope="module")
def simple_json() -> dict:
    return json.loads((DATA / "torch_simple.json").read_text())


@pytest.fixture(scope="module")
def catalog(simple_json: dict) -> TorchCatalog:
    return catalog_from_simple_json(simple_json)


def matrix(text: str) -> Matrix:
    return parse_matrix(text, "m.yaml", tiles=TILES)


def plan_of(text: str, catalog: TorchCatalog, shard=None):
    return make_plan(matrix(text), catalog, shard, units=units)


RELEASE = 'torch: ["2.4", "2.6", "2.7", "2.9", "2.15"]\ncuda: [11, 12, 13]\npython: ["3.10", "3.13", "3.13t", "3.14t"]\n'


# -- catalog ---------------------------------------------------------------------------------------


def test_catalog_from_fixture(catalog: TorchCatalog) -> None:
    assert list(catalog.minors)[:2] == ["2.3", "2.4"]
    assert list(catalog.minors)[-1] == "2.15"
    t24 = catalog.minors["2.4"]
    assert t24.patches == ("2.4.0", "2.4.1")
    assert t24.pythons() == ("3.8", "3.9", "3.10", "3.11", "3.12")  # macOS, Windows dropped
    assert set(t24.builds) == {"x86_64", "aarch64"}
    # headers from the OLDEST patch, a Linux regular-CPython wheel of each CPU with its hash
    for cpu, build in t24.builds.items():
        src = build.header_source
        assert src.filename.startswith("torch-2.4.0-")
        assert src.platform_tag.endswith("_" + cpu)
        assert len(src.sha256) == 64
        assert src.url.startswith("https://")
        assert not src.python_tag.endswith("t")
    assert "3.13t" in catalog.minors["2.7"].pythons()
    assert "3.13t" not in catalog.minors["2.6"].pythons()
    # a Python published by any patch counts: 2.12.0 has 3.13t, 2.12.1 dropped it
    assert "3.13t" in catalog.minors["2.12"].pythons()
    assert "3.10" not in catalog.minors["2.15"].pythons()


def test_catalog_drops_yanked_prereleases_and_other_platforms() -> None:
    def f(name: str, **extra) -> dict:
        return {"filename": name, "url": f"https://x/{name}", "hashes": {"sha256": "0" * 64}, **extra}

    cat = catalog_from_simple_json(
        {
            "files": [
                f("torch-9.1.0-cp312-cp312-manylinux_2_28_x86_64.whl", yanked="broken"),
                f("torch-9.1.1-cp312-cp312-manylinux_2_28_x86_64.whl", size=5),
                f("torch-9.2.0rc1-cp312-cp312-manylinux_2_28_x86_64.whl"),
                f("torch-9.3.0-cp312-cp312-manylinux_2_28_aarch64.whl"),
                f("torch-9.4.0-cp312-cp312-macosx_11_0_arm64.whl"),
                f("torch-9.4.0-cp312-cp312-linux_riscv64.whl"),
                f("torch-9.3.0.tar.gz"),
            ]
        }
    )
    assert list(cat.minors) == ["9.1", "9.3"]
    assert cat.minors["9.1"].patches == ("9.1.1",)
    assert cat.minors["9.1"].builds["x86_64"].header_source.size == 5
    # an aarch64-only minor: no x86_64 Pythons, so its x86_64 cells are skipped, never built
    assert set(cat.minors["9.3"].builds) == {"aarch64"}
    assert cat.minors["9.3"].pythons() == ()
    assert cat.minors["9.3"].pythons("aarch64") == ("3.12",)


def test_html_answer_reads_like_json() -> None:
    html = (
        "<!DOCTYPE html><html><body>\n"
        '<a href="https://files.example/torch-2.5.0-cp313-cp313t-manylinux1_x86_64.whl#sha256=ab12" '
        'data-requires-python="&gt;=3.9">torch-2.5.0-cp313-cp313t-manylinux1_x86_64.whl</a><br/>\n'
        '<a href="../../p/torch-2.5.0-cp312-cp312-manylinux1_x86_64.whl#sha256=cd34" data-yanked="">'
        "torch-2.5.0-cp312-cp312-manylinux1_x86_64.whl</a>\n</body></html>"
    )
    data = simple_json_from_response(html.encode(), SIMPLE_URL)
    first, second = data["files"]
    assert first == {
        "filename": "torch-2.5.0-cp313-cp313t-manylinux1_x86_64.whl",
        "url": "https://files.example/torch-2.5.0-cp313-cp313t-manylinux1_x86_64.whl",
        "hashes": {"sha256": "ab12"},
        "requires-python": ">=3.9",
        "yanked": False,
    }
    assert second["yanked"] is True
    assert second["url"].startswith("https://pypi.org/p/")
    assert catalog_from_simple_json(data).minors["2.5"].pythons() == ("3.13t",)
    with pytest.raises(CatalogError):
        simple_json_from_response(b"<html>maintenance</html>", SIMPLE_URL)


def test_fetch_uses_cache_within_ttl_and_refreshes(tmp_path: Path, simple_json: dict) -> None:
    calls: list[str] = []

    def read(_url: str, headers: dict[str, str]) -> bytes:
        calls.append(headers["Accept"])
        return json.dumps(simple_json).encode()

    cache = tmp_path / "pypi" / "torch.json"
    first = fetch_torch_catalog(read=read, cache_file=cache)
    assert len(calls) == 1
    assert "application/vnd.pypi.simple.v1+json" in calls[0]
    assert json.loads(cache.read_text())["files"] == simple_json["files"]
    assert fetch_torch_catalog(read=read, cache_file=cache) == first
    assert len(calls) == 1
    fetch_torch_catalog(refresh=True, read=read, cache_file=cache)
    assert len(calls) == 2
    old = time.time() - 2 * 24 * 3600
    os.utime(cache, (old, old))
    fetch_torch_catalog(read=read, cache_file=cache)
    assert len(calls) == 3


def test_offline(tmp_path: Path, simple_json: dict) -> None:
    def offline(url: str, _headers: dict[str, str]) -> bytes:
        raise fetch.FetchError(f"cannot fetch {url}: [Errno -3] Temporary failure in name resolution")

    cache = tmp_path / "torch.json"
    with pytest.raises(CatalogError) as info:
        fetch_torch_catalog(read=offline, cache_file=cache)
    assert "no cached copy" in info.value.problem
    assert "FA_CACHE" in info.value.fix
    cache.write_text(json.dumps(simple_json))
    old = time.time() - 30 * 24 * 3600
    os.utime(cache, (old, old))  # a stale cache beats no answer
    assert "2.4" in fetch_torch_catalog(read=offline, cache_file=cache).minors


@pytest.mark.network
def test_live_catalog() -> None:
    data = simple_json_from_response(
        fetch.read_url(SIMPLE_URL, {"Accept": "application/vnd.pypi.simple.v1+json"}), SIMPLE_URL
    )
    cat = catalog_from_simple_json(data)
    assert "2.4" in cat.minors
    assert {"3.10", "3.12"} <= set(cat.minors["2.4"].pythons())
    assert {"3.10", "3.12"} <= set(cat.minors["2.4"].pythons("aarch64"))
    newest = list(cat.minors)[-1]
    assert Version(newest) >= Version("2.15"), newest
    assert cat.minors[newest].builds["x86_64"].header_source.sha256


# -- plan --------------------------------------------------------------------------------------------


def test_every_cell_covered_or_skipped(catalog: TorchCatalog) -> None:
    m = matrix(RELEASE + 'exclude: [{torch: "<2.9", cuda: 13}]\n')
    plan = make_plan(m, catalog, units=units)
    everything = {Cell(t, c, p) for t, c, p in itertools.product(m.torch, m.cuda, m.python)}
    covered = {cell for w in plan.wheels for cell in w.cells}
    skipped = [s.cell for s in plan.skipped]
    assert covered | set(skipped) == everything
    assert not covered & set(skipped)
    assert len(skipped) == len(set(skipped))
    assert all(s.reason for s in plan.skipped)


def test_skip_reasons(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE + 'exclude: [{torch: "<2.9", cuda: 13}]\n', catalog)
    reasons = {s.cell: s for s in plan.skipped}
    no313 = reasons[Cell("2.4", 12, "3.13")]
    assert no313.code == SKIP_NO_TORCH_BUILD
    assert no313.reason.startswith("torch 2.4 has no Python 3.13 build on PyPI")
    no_ft = reasons[Cell("2.6", 12, "3.13t")]
    assert "no free-threaded Python 3.13t build" in no_ft.reason
    excluded = reasons[Cell("2.7", 13, "3.10")]
    assert excluded.code == SKIP_EXCLUDED
    assert "exclude[0] (torch: <2.9, cuda: 13)" in excluded.reason
    # 3.10 dropped by torch 2.15
    assert Cell("2.15", 12, "3.10") in reasons
    # free-threaded 3.13t is covered by the same wheel as 3.13 where torch publishes it
    w27 = next(w for w in plan.wheels if w.variant == "cu12torch2.7")
    assert {"3.13", "3.13t"} <= {c.python for c in w27.cells}


def test_abi_doubles_only_below_27(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE, catalog)
    by_key: dict[tuple, list] = {}
    for w in plan.wheels[1:]:
        by_key.setdefault((w.cuda_major, w.torch_minor), []).append(w.cxx11abi)
    for (cuda, torch), abis in by_key.items():
        expected = [False, True] if Version(torch) < Version("2.7") else [True]
        assert abis == expected, (cuda, torch)
    variants = {w.variant for w in plan.wheels}
    assert {"cu12torch2.6cxx11abifalse", "cu12torch2.6cxx11abitrue", "cu12torch2.7", ""} <= variants
    # bindings: per torch minor and ABI, shared by every CUDA major, built against the oldest patch
    keys = [(b.torch_minor, b.cxx11abi) for b in plan.binding_jobs]
    assert sorted(keys) == sorted(set(keys))
    assert ("2.4", False) in keys
    assert ("2.4", True) in keys
    assert ("2.7", False) not in keys
    b24 = next(b for b in plan.binding_jobs if b.torch_minor == "2.4")
    assert b24.torch_version == "2.4.0"
    assert b24.header_source.filename.startswith("torch-2.4.0-")


def test_abi_named_when_it_is_not_the_default(catalog: TorchCatalog) -> None:
    plan = plan_of('torch: ["2.5", "2.9"]\ncuda: [12]\npython: ["3.12"]\ncxx11abi: both\n', catalog)
    assert [w.variant for w in plan.wheels] == [
        "",
        "cu12torch2.5cxx11abifalse",
        "cu12torch2.5cxx11abitrue",
        "cu12torch2.9cxx11abifalse",
        "cu12torch2.9",
    ]


def test_versions_are_valid_pep440_with_the_variant_as_local_label(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE + 'version: "1.0.0"\n', catalog)
    assert plan.wheels[0].cuda_major is None
    assert plan.wheels[0].version == "1.0.0"
    for w in plan.wheels[1:]:
        v = Version(w.version)
        assert v.public == "1.0.0"
        assert v.local == w.variant
        assert str(v) == w.version
    assert len({w.version for w in plan.wheels}) == len(plan.wheels)


def test_kernels_shared_by_the_wheels_of_one_major(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE, catalog)
    for major in (11, 12, 13):
        jobs = {w.compile_jobs for w in plan.wheels if w.cuda_major == major}
        assert len(jobs) == 1
    cu11 = next(w for w in plan.wheels if w.cuda_major == 11)
    assert cu11.sass == ("7.5", "8.0", "8.6", "9.0")
    assert cu11.ptx == "9.0"
    # fp16 only on 7.5 (4 units), 8 units elsewhere, PTX of 9.0 (8 units)
    assert len(cu11.compile_jobs) == 4 + 3 * 8 + 8
    assert len(plan.compile_jobs) == len(set(plan.compile_jobs))
    assert {j.image for j in cu11.compile_jobs if j.arch == "9.0"} == {"sass", "ptx"}


def test_kernel_filter(catalog: TorchCatalog) -> None:
    plan = plan_of(
        'torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\narchs: {"12": ["7.5", "8.0"]}\n'
        "kernels: {dtypes: [bf16], head_dims: [128], directions: [fwd]}\n",
        catalog,
    )
    wheel = plan.wheels[1]
    assert wheel.sass == ("8.0",)  # 7.5 has no bf16 unit: nothing to ship for it
    assert [(j.arch, j.image, j.unit) for j in wheel.compile_jobs] == [
        ("8.0", "sass", "fwd_bf16_d128"),
        ("8.0", "ptx", "fwd_bf16_d128"),
    ]


def test_plan_errors(catalog: TorchCatalog) -> None:
    with pytest.raises(MatrixError) as info:
        plan_of('torch: ["2.5", "2.16"]\ncuda: [12]\npython: ["3.12"]\n', catalog)
    e = info.value
    assert e.field == "torch[1]"
    assert "never published on PyPI" in e.problem
    assert "2.15" in e.problem

    def no_kernels_for_90(arch: str, cuda: int) -> list[Unit]:
        return [] if arch == "9.0" else units(arch, cuda)

    m = matrix('torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\narchs: {"12": ["8.0", "9.0"]}\n')
    with pytest.raises(MatrixError) as info:
        make_plan(m, catalog, units=no_kernels_for_90)
    assert info.value.field == 'archs."12"[1]'
    assert "no kernels for arch 9.0" in info.value.problem

    m = matrix(
        'torch: ["2.9"]\ncuda: [12]\npython: ["3.12"]\narchs: {"12": ["7.5"]}\nptx: {"12": null}\n'
        "kernels: {dtypes: [bf16]}\n"
    )
    with pytest.raises(MatrixError) as info:
        make_plan(m, catalog, units=units)
    assert info.value.field == "kernels"
    assert "widen" in info.value.fix


def test_plan_is_deterministic(catalog: TorchCatalog) -> None:
    a = plan_of(RELEASE, catalog)
    b = plan_of("\n".join(reversed(RELEASE.strip().splitlines())) + "\n", catalog)  # key order differs
    assert a.wheels == b.wheels
    assert a.skipped == b.skipped
    assert a.compile_jobs == b.compile_jobs
    assert json.dumps(plan_json(a, lambda _j: False)) == json.dumps(plan_json(b, lambda _j: False))


# -- shards --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 40])
def test_shards_partition_the_wheels(catalog: TorchCatalog, n: int) -> None:
    full = plan_of(RELEASE, catalog)
    shards = [plan_of(RELEASE, catalog, (k, n)) for k in range(1, n + 1)]
    listed = [w for s in shards for w in s.wheels]
    assert sorted(listed, key=full.wheels.index) == list(full.wheels)  # each exactly once
    assert shards[0].wheels[0].cuda_major is None  # universal in shard 1
    assert shards[0].skipped == full.skipped
    assert all(s.skipped == () for s in shards[1:])
    for s in shards:
        assert s.shard is not None
        assert set(s.compile_jobs) == {j for w in s.wheels for j in w.compile_jobs}


def test_shards_group_by_cuda_major(catalog: TorchCatalog) -> None:
    shards = [plan_of(RELEASE, catalog, (k, 3)) for k in (1, 2, 3)]
    majors = [{w.cuda_major for w in s.wheels} - {None} for s in shards]
    assert sorted(len(m) for m in majors) == [1, 1, 1]
    assert set().union(*majors) == {11, 12, 13}
    # more shards than majors: a major is split, never mixed, so no shard compiles two toolkits' kernels
    for k in range(1, 6):
        assert len({w.cuda_major for w in plan_of(RELEASE, catalog, (k, 5)).wheels} - {None}) <= 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0", "-1/2"])
def test_bad_shard(text: str) -> None:
    with pytest.raises(MatrixError) as info:
        parse_shard(text)
    assert info.value.field == "--shard"
    assert "--shard" in info.value.fix


def test_parse_shard() -> None:
    assert parse_shard("2/3") == (2, 3)
    assert parse_shard(" 1 / 1 ") == (1, 1)
    assert shard_wheels((), (1, 2)) == ()


# -- local plan ------------------------------------------------------------------------------------


def test_local_plan() -> None:
    plan = local_plan("2.13.0+cpu", True, "3.11", (12, 13), units=units)
    assert [w.variant for w in plan.wheels] == ["cu12torch2.13", "cu13torch2.13"]
    (binding,) = plan.binding_jobs
    assert binding.torch_version == "2.13.0+cpu"
    assert binding.header_source is None
    assert binding.cxx11abi
    assert plan.wheels[0].cells == (Cell("2.13", 12, "3.11"),)
    ngc = local_plan("2.5.0a0+e000cf0ad9.nv24.10", True, "3.10", (12,), units=units)
    assert ngc.wheels[0].variant == "cu12torch2.5cxx11abitrue"
    with pytest.raises(MatrixError) as info:
        local_plan("2.13.0", True, "3.11", (10,), units=units)
    assert info.value.field == "--cuda"


def test_local_plan_builds_for_this_machines_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an Arm machine (a GH200, a DGX Spark) `fa build --local` makes an aarch64 wheel natively."""
    from buildtool.core import cpus

    monkeypatch.setattr(cpus.platform, "machine", lambda: "aarch64")
    plan = local_plan("2.9.0+cu130", True, "3.12", (13,), units=units)
    (wheel,) = plan.wheels
    assert wheel.platform == "aarch64"
    assert wheel.binding.platform == "aarch64"
    assert wheel.cells == (Cell("2.9", 13, "3.12", "aarch64"),)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("FA_CXX_AARCH64", raising=False)
    assert cpus.cxx_for("aarch64") == ["g++"]  # native there; the x86_64 bindings would be the cross ones
    assert cpus.cxx_for("x86_64") == ["x86_64-linux-gnu-g++"]
    monkeypatch.setattr(cpus.platform, "machine", lambda: "riscv64")
    with pytest.raises(MatrixError) as info:
        local_plan("2.9.0", True, "3.12", (13,), units=units)
    assert info.value.field == "platform"
    assert "x86_64 or aarch64" in info.value.fix


def test_a_one_gpu_build_makes_no_all_wheel() -> None:
    """The all-wheel has no local label: built for one GPU it would pass for the release's."""
    matrix = Matrix(
        version="0.1.0",
        torch=("2.13",),
        cuda=(12,),
        python=("3.11",),
        archs={12: ("8.0",)},
        ptx={12: "8.0"},
        all_wheel=True,
    )
    plan = local_plan("2.13.0+cpu", True, "3.11", (12,), matrix, units=units, stable_floor="2.10", sass="8.0")
    assert (len(plan.wheels), plan.all_wheels) == (1, ())


def test_local_plan_stable_form_for_one_gpu() -> None:
    """`fa install --build`: at or above the floor the stable form (it outlives a torch upgrade),
    below it the ATen form; SASS for this GPU's arch only (the toolkit's nearest lower one), no PTX."""
    plan = local_plan("2.13.0+cpu", True, "3.11", (12,), units=units, stable_floor="2.10", sass="8.9")
    (wheel,) = plan.wheels
    assert wheel.form == "stable"
    assert wheel.variant == "cu12torch2.10plus.local.sm89"  # never named like the release wheel
    assert wheel.version.endswith("+cu12torch2.10plus.local.sm89")
    assert wheel.cxx11abi is None
    assert wheel.sass == ("8.9",)
    assert wheel.ptx is None
    assert wheel.torch_tested == ("2.13",)
    assert wheel.binding.torch_minor == "2.10"
    assert wheel.binding.torch_version == "2.13.0+cpu"
    assert wheel.binding.header_source is None
    below = local_plan("2.9.0", True, "3.11", (13,), units=units, stable_floor="2.10", sass="10.1")
    assert below.wheels[0].form == "aten"
    assert below.wheels[0].variant == "cu13torch2.9.local.sm100"
    assert below.wheels[0].sass == ("10.0",)  # NVRTC 13 has no sm 10.1; 10.0's SASS runs there
    with pytest.raises(MatrixError) as info:
        local_plan("2.9.0", True, "3.11", (11,), units=units, sass="10.0")
    assert info.value.field == "--arch"
    assert "newer CUDA major" in info.value.fix


# -- stable ABI -------------------------------------------------------------------------------------

STABLE = 'torch: ["2.9", "2.10", "2.13", "2.15"]\ncuda: [12, 13]\npython: ["3.12", "3.13t"]\nplatforms: [x86_64, aarch64]\n'


def test_stable_abi_wheel_serves_every_minor_from_its_floor(catalog: TorchCatalog) -> None:
    per_minor = plan_of(STABLE, catalog)
    plan = plan_of(STABLE + 'stable_abi: "2.10"\n', catalog)
    stable = [w for w in plan.wheels if w.form == "stable"]
    assert [(w.platform, w.variant) for w in stable] == [
        ("x86_64", "cu12torch2.10plus"),
        ("x86_64", "cu13torch2.10plus"),
        ("aarch64", "cu12torch2.10plus"),
        ("aarch64", "cu13torch2.10plus"),
    ]
    for w in stable:
        assert Version(w.version).local == w.variant  # a PEP 440 local label pip accepts
        assert w.torch_minor == "2.10"
        assert w.cxx11abi is None
        assert w.torch_tested == ("2.10", "2.13", "2.15")
        b = w.binding
        assert b.torch_version == "2.10.0"
        assert b.header_source.filename.startswith("torch-2.10.0")
        assert b.header_source.platform_tag.endswith("_" + w.platform)
        # exactly the cells the per-minor wheels of 2.10 and newer covered
        before = {
            c
            for p in per_minor.wheels
            if p.platform == w.platform and p.cuda_major == w.cuda_major and p.torch_minor != "2.9"
            for c in p.cells
        }
        assert set(w.cells) == before
    assert not any(w.form == "aten" and w.torch_minor != "2.9" for w in plan.wheels[1:])
    assert {c for w in plan.wheels for c in w.cells} == {c for w in per_minor.wheels for c in w.cells}
    assert (len(per_minor.wheels), len(plan.wheels)) == (1 + 2 * 2 * 4, 1 + 2 * 2 * 2)
    assert (len(per_minor.binding_jobs), len(plan.binding_jobs)) == (2 * 4, 2 * 2)
    assert plan.compile_jobs == per_minor.compile_jobs  # the kernels do not depend on the binding
    data = plan_json(plan, lambda _j: False)
    w = next(w for w in data["wheels"] if w["variant"] == "cu13torch2.10plus")
    assert w["form"] == "stable"
    assert w["torch_tested"] == ["2.10", "2.13", "2.15"]
    assert w["binding"]["form"] == "stable"
    assert w["binding"]["torch_minor"] == "2.10"
    console = Console(record=True, width=80)
    console.print(plan_table(plan, lambda _j: False))
    row = next(line for line in console.export_text().splitlines() if line.startswith("cu13torch2.10plus"))
    assert row.split()[2] == "2.10+"  # the stable ABI's floor and every torch after it


def test_stable_abi_floor_without_a_cpus_wheel(catalog: TorchCatalog) -> None:
    """A floor PyPI has no wheel of for a CPU gives no headers to build against: said, with the fix."""
    from buildtool.builder.pypi import TorchMinor

    minor = catalog.minors["2.10"]
    x86_only = TorchMinor(minor.minor, minor.patches, {"x86_64": minor.builds["x86_64"]})
    trimmed = replace(catalog, minors={**catalog.minors, "2.10": x86_only})
    with pytest.raises(MatrixError) as info:
        plan_of(STABLE + 'stable_abi: "2.10"\n', trimmed)
    assert info.value.field == "stable_abi"
    assert "no Linux aarch64 wheel" in info.value.problem


# -- view -------------------------------------------------------------------------------------------


def test_plan_json_and_table(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE + 'exclude: [{torch: "<2.9", cuda: 13}]\n', catalog)
    cached = {j for j in plan.compile_jobs if j.arch == "8.0"}
    data = plan_json(plan, lambda j: j in cached)
    t = data["totals"]
    assert t["cells"] == 5 * 3 * 4
    assert t["covered"] + t["skipped"] == t["cells"]
    assert t["cached"] == len(cached)
    assert t["to_compile"] == len(plan.compile_jobs) - len(cached)
    assert t["wheels"] == len(plan.wheels)
    assert t["binding_jobs"] == len(plan.binding_jobs)
    w = next(w for w in data["wheels"] if w["variant"] == "cu12torch2.7")
    assert w["pythons"] == ["3.10", "3.13", "3.13t"]
    assert w["binding"]["torch_version"] == "2.7.0"
    assert w["kernels"]["cached"] + w["kernels"]["to_compile"] == w["kernels"]["total"]
    json.dumps(data)  # plain JSON

    console = Console(record=True, width=80)
    console.print(plan_renderable(plan, lambda j: j in cached))
    text = console.export_text()
    assert "skipped cells" in text
    assert "no torch build on PyPI for these Pythons" in text
    assert "exclude[0]" in text
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    # One line per wheel, nothing wrapped: every variant starts a line, with all seven columns on it.
    rows = [line.split() for line in lines if line.startswith(("cu1", "(universal)"))]
    assert len(rows) == len(plan.wheels)
    assert all(len(r) == 7 for r in rows)
    row = next(r for r in rows if r[0] == "cu12torch2.6cxx11abifalse")
    spec = next(w for w in data["wheels"] if w["variant"] == "cu12torch2.6cxx11abifalse")
    assert row[6] == f"{spec['kernels']['to_compile']}/{spec['kernels']['total']}"


def test_repo_matrix_plans_against_the_fixture(catalog: TorchCatalog) -> None:
    """The published matrix.yaml expands cleanly (the fixture has every minor it lists but a few;
    those are checked to fail with the field named)."""
    m = load_matrix(REPO / "matrix.yaml", tiles=TILES)
    missing = [t for t in m.torch if t not in catalog.minors]
    if missing:
        with pytest.raises(MatrixError) as info:
            make_plan(m, catalog, units=units)
        assert info.value.field == f"torch[{m.torch.index(missing[0])}]"
        m = replace(m, torch=tuple(t for t in m.torch if t in catalog.minors))
    plan = make_plan(m, catalog, units=units)
    assert not any(w.cuda_major == 11 and Version(w.torch_minor) >= Version("2.8") for w in plan.wheels)
    assert not any(w.cuda_major == 13 and Version(w.torch_minor) < Version("2.9") for w in plan.wheels)


def test_repo_matrix_dry_run_fits_80_columns_without_wrapping(catalog: TorchCatalog) -> None:
    """README's matrix at 80 columns: each skipped-cells entry stays on one line (its Pythons as runs
    of the matrix's order), its reason on the next; no line is longer than 80."""
    m = load_matrix(REPO / "matrix.yaml", tiles=TILES)
    m = replace(m, torch=tuple(t for t in m.torch if t in catalog.minors))
    console = Console(record=True, width=80)
    console.print(plan_renderable(make_plan(m, catalog, units=units), lambda _: False))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    entries = [i for i, line in enumerate(lines) if line.startswith("  ") and " cells: " in line]
    assert len(entries) > 10
    assert all(lines[i + 1].startswith("      ") and " cells: " not in lines[i + 1] for i in entries)
    assert any(line.endswith("Python 3.13t-3.15t") for line in lines)  # torch 2.5/2.6's unbuilt Pythons


def test_repo_matrix_with_the_real_kernel_table(catalog: TorchCatalog) -> None:
    """kernels/tiles.py and matrix.yaml agree: every default and listed arch has kernels, but for an
    arch-specific target whose source is not in this tree yet (said under "SASS left out")."""
    tiles = kernels_src.tiles()
    m = load_matrix(REPO / "matrix.yaml")
    m = replace(m, torch=tuple(t for t in m.torch if t in catalog.minors))
    plan = make_plan(m, catalog)
    waiting = {(d.platform, d.cuda_major, d.arch) for d in plan.dropped_sass if d.why == WAITING_FOR_SOURCE}
    assert all(tiles.missing_sources(arch) for _, _, arch in waiting)
    for w in plan.wheels[1:]:
        listed = [a for a in m.archs[w.cuda_major] if cuda_facts.sass_of_use_on(a, w.platform)]
        assert w.sass == tuple(a for a in listed if (w.platform, w.cuda_major, a) not in waiting)
        assert w.ptx == m.ptx[w.cuda_major]
        defaults = sum(len(tiles.units(a)) for a in w.sass) + len(tiles.units(w.ptx))
        alternatives = [j for j in w.compile_jobs if j.unit not in {u.name for u in tiles.units(j.arch)}]
        # A unit a lower minor's cubin serves (sm 8.6 on sm 8.0's: tests/builder/test_sass_reuse.py) is
        # a manifest entry without a compile of its own.
        assert len(w.compile_jobs) + len(w.reused_sass) == defaults + len(alternatives)
        # No alternative tiles in the release: every GPU a wheel's torch runs on has SASS of its own
        # family there (cu11's compute 9.0 PTX would serve sm 12.x, where no CUDA 11 torch runs).
        assert alternatives == [], w.variant


def test_alternatives_go_where_a_gpu_below_the_image_s_shared_memory_runs_it(catalog: TorchCatalog) -> None:
    """SASS for 8.0 alone (as FlashAttention-2 ships) serves sm 8.6/8.9 with 99 KB per block: the
    99 KB parts' tiles go in beside sm 8.0's; with 8.6's own SASS in the wheel they stay out."""
    tiles = kernels_src.tiles()
    m = load_matrix(REPO / "matrix.yaml")
    m = replace(m, torch=("2.8",), cuda=(12,), platforms=("x86_64",), all_wheel=False)
    only80 = make_plan(replace(m, archs={12: ("8.0",)}, ptx={}), catalog).wheels[1]
    alternatives = {j.unit for j in only80.compile_jobs} - {u.name for u in tiles.units("8.0")}
    # sm 8.0's SASS runs on 8.6/8.9 only; alternatives for sm 12.x alone (its backward keeps V in
    # registers where 8.6's ptxas spills) come with a PTX image, never with this SASS
    on_8x = [u for u in tiles.alternative_units("8.0") if {"8.6", "8.9"} & set(u.serves)]
    assert alternatives == {u.name for u in on_8x}
    assert on_8x
    assert all("8.6" in u.serves for u in on_8x)
    with86 = make_plan(replace(m, archs={12: ("8.0", "8.6")}, ptx={}), catalog).wheels[1]
    assert {j.unit for j in with86.compile_jobs if j.arch == "8.0"} == {u.name for u in tiles.units("8.0")}
    # PTX of 9.0 as the newest image of a CUDA 12 wheel: sm 12.x (99 KB) JIT it, and get their tiles.
    ptx90 = make_plan(replace(m, archs={12: ("8.6", "9.0")}, ptx={12: "9.0"}), catalog).wheels[1]
    jitted = {(j.arch, j.image, j.unit) for j in ptx90.compile_jobs} - {
        (j.arch, j.image, u.name) for j in ptx90.compile_jobs for u in tiles.units(j.arch)
    }
    assert jitted == {("9.0", "ptx", u.name) for u in tiles.alternative_units("9.0")}


def test_dry_run_cli_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fa build --dry-run` end to end, PyPI answered by the fixture in a fresh FA_CACHE."""
    from typer.testing import CliRunner

    from buildtool.cli import app

    monkeypatch.setenv("FA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "pypi").mkdir(parents=True)
    (tmp_path / "cache" / "pypi" / "torch.json").write_text((DATA / "torch_simple.json").read_text())
    good = tmp_path / "good.yaml"
    good.write_text(
        'torch: ["2.6", "2.7"]\ncuda: [12]\npython: ["3.13", "3.13t"]\narchs: {"12": ["8.0"]}\n'
        "kernels: {dtypes: [bf16], directions: [fwd], head_dims: [128]}\n"
    )
    result = CliRunner().invoke(app, ["build", "--dry-run", "--json", "-m", str(good)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [w["variant"] for w in data["wheels"]] == [
        "",
        "cu12torch2.6cxx11abifalse",
        "cu12torch2.6cxx11abitrue",
        "cu12torch2.7",
    ]
    assert data["skipped"][0]["code"] == "no-torch-build"
    assert data["totals"]["compile_jobs"] == 2

    bad = tmp_path / "bad.yaml"
    bad.write_text('torch: ["2.6"]\ncuda: [11]\npython: ["3.12"]\narchs: {"11": ["12.0"]}\n')
    result = CliRunner().invoke(app, ["build", "--dry-run", "-m", str(bad)])
    assert result.exit_code == 2
    assert 'archs."11"[0]' in result.output
    assert "fix:" in result.output
    assert "Traceback" not in result.output


# -- platforms ---------------------------------------------------------------------------------------

ARM = RELEASE + 'platforms: ["x86_64", "aarch64"]\nexclude: [{platform: aarch64, cuda: 11}]\n'


def test_each_cpu_gets_its_own_bindings_and_shares_the_kernels(catalog: TorchCatalog) -> None:
    x86 = plan_of(RELEASE, catalog)
    both = plan_of(ARM, catalog)
    arm = [w for w in both.wheels if w.platform == "aarch64"]
    assert arm
    assert all(w.cuda_major != 11 and w.binding.platform == "aarch64" for w in arm)
    assert all(w.binding.header_source.platform_tag.endswith("_aarch64") for w in arm)
    assert {w.name for w in both.wheels} == {w.name for w in x86.wheels} | {w.name for w in arm}
    # No job per CPU: the x86_64 wheels' jobs are the release's but Thor's SASS (aarch64 SoCs only).
    thor = {j for j in both.compile_jobs if j.arch == "11.0" and j.image == "sass"}
    assert thor
    assert set(both.compile_jobs) - thor == set(x86.compile_jobs)
    assert len(both.binding_jobs) == len({(b.torch_minor, b.cxx11abi, b.platform) for b in both.binding_jobs})
    # Every cell of every CPU is covered by a wheel of that CPU, or skipped with the CPU named.
    for w in both.wheels:
        assert all(c.platform == w.platform for c in w.cells)
    arm_skips = [s for s in both.skipped if s.cell.platform == "aarch64" and s.code == "no-torch-build"]
    assert arm_skips
    assert all("Linux aarch64" in s.reason for s in arm_skips)


def test_platform_filter_and_cpu_shards(catalog: TorchCatalog) -> None:
    m = matrix(ARM)
    arm = make_plan(m, catalog, platform="aarch64", units=units)
    assert {w.platform for w in arm.wheels} == {"aarch64"}  # the universal wheel goes with x86_64
    assert all(s.cell.platform == "aarch64" for s in arm.skipped)
    x86 = make_plan(m, catalog, platform="x86_64", units=units)
    assert x86.wheels[0].platform is None
    assert {w.platform for w in x86.wheels[1:]} == {"x86_64"}
    for k in (1, 2):
        shard = make_plan(m, catalog, (k, 2), platform="aarch64", units=units)
        assert {w.cuda_major for w in shard.wheels} in ({12}, {13})  # one (CPU, major) group each
    with pytest.raises(MatrixError) as info:
        make_plan(matrix(RELEASE), catalog, platform="aarch64", units=units)
    assert info.value.field == "--platform"
    assert "add it to platforms" in info.value.fix


THOR = ARM + 'archs: {"13": ["8.0", "11.0", "12.0"]}\nall_wheel: true\n'


def test_sass_only_in_the_wheels_of_the_cpu_its_gpus_come_with(catalog: TorchCatalog) -> None:
    """Jetson Thor (11.0) is an aarch64 SoC: its SASS is in the aarch64 cu13 wheels only, compiled once
    for the release and not at all for an x86_64-only build; the dry run says why it is missing."""
    m = matrix(THOR)
    release = make_plan(m, catalog, units=units)
    cu13 = {w.platform: w for w in release.wheels if w.cuda_major == 13}
    assert cu13["aarch64"].sass == ("8.0", "11.0", "12.0")
    assert cu13["x86_64"].sass == ("8.0", "12.0")
    assert cu13["x86_64"].ptx == "12.0"
    assert {j.arch for j in cu13["x86_64"].compile_jobs} == {"8.0", "12.0"}
    assert set(cu13["x86_64"].compile_jobs) < set(cu13["aarch64"].compile_jobs)  # shared, not per CPU
    thor_jobs = [j for j in release.compile_jobs if j.arch == "11.0"]
    assert len(thor_jobs) == len(units("11.0"))
    assert release.dropped_sass == (DroppedSass("x86_64", 13, "11.0"),)
    alls = {a.platform: {k.cuda_major: k.sass for k in a.kernel_sets} for a in release.all_wheels}
    assert "11.0" in alls["aarch64"][13]
    assert not any("11.0" in sass for sass in alls["x86_64"].values())

    x86 = make_plan(m, catalog, platform="x86_64", units=units)
    assert not [j for j in x86.compile_jobs if j.arch == "11.0"]
    assert len(x86.compile_jobs) == len(release.compile_jobs) - len(thor_jobs)
    assert make_plan(m, catalog, platform="aarch64", units=units).dropped_sass == ()
    data = plan_json(x86, lambda _: False)
    assert data["dropped_sass"] == [
        {
            "platform": "x86_64",
            "cuda_major": 13,
            "arch": "11.0",
            "reason": "sm 11.0 GPUs (Jetson Thor, DRIVE Thor) only come with aarch64 CPUs",
        }
    ]
    console = Console(width=80, record=True)
    console.print(plan_renderable(x86, lambda _: False))
    text = console.export_text()
    assert "  sm 11.0 in x86_64 wheels (CUDA 13)\n      sm 11.0 GPUs (Jetson Thor" in text
    # Shards report it once, with the skipped cells.
    assert [bool(make_plan(m, catalog, (k, 2), units=units).dropped_sass) for k in (1, 2)] == [True, False]


def test_a_major_left_with_no_kernels_for_a_cpu(catalog: TorchCatalog) -> None:
    """A major whose only arch is another CPU's, without PTX: one error with the field and two fixes;
    excluding that CPU's cells of the major is one of them, and it works."""
    text = ARM + 'archs: {"13": ["11.0"]}\nptx: {"13": null}\n'
    with pytest.raises(MatrixError) as info:
        plan_of(text, catalog)
    assert info.value.field == 'archs."13"'
    assert "no arch of CUDA 13 is of use in x86_64 wheels" in info.value.problem
    assert "exclude {platform: x86_64, cuda: 13}" in info.value.fix
    fixed = text.replace("exclude: [", "exclude: [{platform: x86_64, cuda: 13}, ")
    plan = plan_of(fixed, catalog)
    assert {w.platform for w in plan.wheels if w.cuda_major == 13} == {"aarch64"}
    assert plan.dropped_sass == ()


def test_local_plan_drops_other_cpus_sass_but_builds_the_gpu_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An x86_64 machine's `fa build --local` leaves Thor's SASS out like the release does; `fa install
    --build --arch 11.0` (`sass`) names the GPU to build for, so it gets what it asked for."""
    from buildtool.core import cpus

    monkeypatch.setattr(cpus.platform, "machine", lambda: "x86_64")
    m = matrix('torch: ["2.9"]\ncuda: [13]\npython: ["3.12"]\narchs: {"13": ["9.0", "11.0"]}\n')
    plan = local_plan("2.9.1", True, "3.12", (13,), m, units=units)
    assert plan.wheels[0].sass == ("9.0",)
    assert plan.wheels[0].ptx == "11.0"  # PTX JITs to newer archs whatever the CPU
    assert plan.dropped_sass == (DroppedSass("x86_64", 13, "11.0"),)
    one = local_plan("2.9.1", True, "3.12", (13,), m, units=units, sass="11.0")
    assert one.wheels[0].sass == ("11.0",)
    assert one.dropped_sass == ()


# -- one SASS per arch across CUDA 12 and 13 ----------------------------------------------------------


def test_cu13_wheels_ship_the_older_majors_sass_for_the_archs_their_nvrtc_targets(
    catalog: TorchCatalog,
) -> None:
    """A cu13 wheel's cubins are CUDA 12's wherever NVRTC 12 targets the arch (a driver >= 580 runs
    them), and those are CUDA 11.8's wherever NVRTC 11.8 does (a chain): the same jobs as the older
    wheels', so the plan compiles them once. So is the PTX (a 580 driver JITs CUDA 12.9's): NVRTC 13
    compiles only Thor's 11.0, in the aarch64 wheels. The aarch64 wheels of CUDA 12 and 13 take the
    cubins the x86_64 cu11 wheels compile: a compile serves every CPU."""
    plan = make_plan(matrix(THOR), catalog, units=units)
    cu11 = next(w for w in plan.wheels if w.cuda_major == 11)
    cu12 = {w.platform: w for w in plan.wheels if w.cuda_major == 12}
    cu13 = {w.platform: w for w in plan.wheels if w.cuda_major == 13}
    for cpu in ("x86_64", "aarch64"):
        own = {(j.arch, j.image) for j in cu13[cpu].compile_jobs if j.cuda_major == 13}
        assert own == ({("11.0", "sass")} if cpu == "aarch64" else set())
        borrowed = {j for j in cu13[cpu].compile_jobs if j.cuda_major in (11, 12)}
        assert {(j.cuda_major, j.arch, j.image) for j in borrowed} == {
            (11, "8.0", "sass"),
            (12, "12.0", "sass"),
            (12, "12.0", "ptx"),
        }
        assert borrowed <= set(cu12[cpu].compile_jobs) | set(cu11.compile_jobs)  # the older wheels' programs
    # What the plan no longer compiles: NVRTC 13's SASS of 8.0 and 12.0, and its PTX of 12.0.
    per_major = make_plan(matrix(THOR + "sass_per_major: [13]\n"), catalog, units=units)
    saved = set(per_major.compile_jobs) - set(plan.compile_jobs)
    targets = (("8.0", "sass"), ("12.0", "sass"), ("12.0", "ptx"))
    assert saved == {CompileJob(13, a, image, u.name) for a, image in targets for u in units(a)}
    assert set(plan.compile_jobs) < set(per_major.compile_jobs)

    # The all-wheels hold the same kernel sets; only who compiled a borrowed cubin differs.
    def sets(p: Plan) -> list[tuple[str, int, tuple[str, ...], str | None]]:
        return [(a.platform, k.cuda_major, k.sass, k.ptx) for a in p.all_wheels for k in a.kernel_sets]

    assert sets(plan) == sets(per_major)
    # With --platform aarch64 no cu11 wheel is built (excluded there): CUDA 12 compiles its own rather
    # than fetch NVRTC 11.8 only to share.
    arm = make_plan(matrix(THOR), catalog, platform="aarch64", units=units)
    assert {j.cuda_major for j in arm.compile_jobs} == {12, 13}


def test_sass_per_major_opts_a_major_back_into_its_own_sass(catalog: TorchCatalog) -> None:
    plan = plan_of(RELEASE + "sass_per_major: [13]\n", catalog)
    cu13 = next(w for w in plan.wheels if w.cuda_major == 13)
    assert {j.cuda_major for j in cu13.compile_jobs} == {13}


def test_a_plan_without_cuda12_compiles_cu13_with_its_own_nvrtc(catalog: TorchCatalog) -> None:
    """No toolkit is fetched only to share: without CUDA 12 in the matrix (or in `fa build --local
    --cuda 13`), NVRTC 13 compiles every arch."""
    alone = plan_of('torch: ["2.9"]\ncuda: [13]\npython: ["3.12"]\n', catalog)
    assert {j.cuda_major for j in alone.compile_jobs} == {13}
    local = local_plan("2.9.1", True, "3.12", (13,), units=units)
    assert {j.cuda_major for j in local.compile_jobs} == {13}
    both = local_plan("2.9.1", True, "3.12", (12, 13), units=units)
    cu13 = both.wheels[1]
    assert {(j.cuda_major, j.image) for j in cu13.compile_jobs} == {(12, "sass"), (12, "ptx")}


def _builder_imports() -> dict[str, set[str]]:
    """Every buildtool.builder module -> the builder modules it imports anywhere (top level, inside a
    function, under TYPE_CHECKING)."""
    import ast

    graph: dict[str, set[str]] = {}
    for path in (REPO / "buildtool" / "builder").glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        prefix = "buildtool.builder."
        graph[path.stem] = {n.removeprefix(prefix) for n in names if n.startswith(prefix)} - {path.stem}
    return graph


def test_no_builder_module_imports_back_into_the_plan() -> None:
    """Data flows matrix -> plan -> all-wheel: what plan.py and all_wheel.py both need (the job and
    wheel types, the labels, which NVRTC compiles an arch) is wheel_specs.py's, so no module plan.py
    imports, directly or not, imports plan.py, not even inside a function."""
    graph = _builder_imports()
    seen: set[str] = set()
    todo = list(graph["plan"])
    while todo:
        name = todo.pop()
        if name in seen or name not in graph:
            continue
        seen.add(name)
        todo += graph[name]
    assert "all_wheel" in seen
    assert [m for m in sorted(seen) if "plan" in graph[m]] == []
