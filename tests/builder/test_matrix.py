"""matrix.yaml: defaults, the repo's release matrix, and every validation error naming its field and fix."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.builder.matrix import KernelFilter, MatrixError, load_matrix, parse_matrix
from buildtool.core import cuda_facts, kernels_src

REPO = Path(__file__).resolve().parents[2]
# The two facts of kernels/tiles.py that validation reads (docs/contracts.md section 2).
TILES = SimpleNamespace(MIN_ARCH="7.5", HEAD_DIM_BUCKETS=(64, 128, 256))

BASE = 'torch: ["2.5", "2.7"]\ncuda: [11, 12]\npython: ["3.12", "3.13t"]\n'


def parse(text: str):
    return parse_matrix(text, "m.yaml", tiles=TILES)


def error(text: str) -> MatrixError:
    with pytest.raises(MatrixError) as info:
        parse(text)
    return info.value


def test_defaults() -> None:
    m = parse(BASE)
    assert m.version == "0.1.0"
    assert m.torch == ("2.5", "2.7")
    assert m.cuda == (11, 12)
    assert m.python == ("3.12", "3.13t")
    assert m.archs == {11: cuda_facts.TOOLKITS[11].default_archs, 12: cuda_facts.TOOLKITS[12].default_archs}
    assert m.ptx == {11: "9.0", 12: "12.0"}  # the newest SASS arch of each major
    assert m.exclude == ()
    assert m.kernels is None
    assert m.cxx11abi == "auto"


def test_additions_parse() -> None:
    m = parse(
        BASE + 'version: "1.2.0"\narchs: {"12": ["9.0", "8.0"]}\nptx: {"11": null, "12": "8.0"}\n'
        "cxx11abi: true\nkernels: {dtypes: [bf16], head_dims: [128], directions: [fwd]}\n"
    )
    assert m.version == "1.2.0"
    assert m.archs[12] == ("8.0", "9.0")  # sorted by capability
    assert m.archs[11] == cuda_facts.TOOLKITS[11].default_archs
    assert m.ptx == {11: None, 12: "8.0"}
    assert m.cxx11abi == "true"
    assert m.kernels == KernelFilter(dtypes=("bf16",), head_dims=(128,), directions=("fwd",))


def test_kernel_filter_names_split_kv() -> None:
    """directions takes every direction a unit has, split-KV included (a decode-only dev build)."""
    m = parse(BASE + "kernels: {directions: [splitkv], head_dims: [128]}\n")
    assert m.kernels == KernelFilter(head_dims=(128,), directions=("splitkv",))
    units = kernels_src.tiles().units("8.0")
    chosen = {u.name for u in units if m.kernels.accepts(u)}
    assert chosen == {"splitkv_fp16_d128", "splitkv_bf16_d128"}


def test_stable_abi_floor() -> None:
    assert parse(BASE).stable_abi is None
    assert not parse(BASE).stable("2.15")
    m = parse('torch: ["2.9", "2.10", "2.13"]\ncuda: [12]\npython: ["3.12"]\nstable_abi: "2.10"\n')
    assert m.stable_abi == "2.10"
    assert [m.stable(t) for t in ("2.9", "2.10", "2.13", "2.16")] == [False, True, True, True]


def test_repo_matrix_parses() -> None:
    m = load_matrix(REPO / "matrix.yaml", tiles=TILES)
    assert m.stable_abi == "2.10"
    assert m.torch[0] == "2.4"
    assert set(m.cuda) == {11, 12, 13}
    assert "3.13t" in m.python
    # the reasons written in matrix.yaml: no cu11 torch from 2.8, no cu13 torch before 2.9
    assert m.excluded_by("2.8", 11, "3.12") is not None
    assert m.excluded_by("2.7", 11, "3.12") is None
    assert m.excluded_by("2.8", 13, "3.12") is not None
    assert m.excluded_by("2.9", 13, "3.12") is None
    # cu12 for every torch up to 2.14; 2.15's RFC drops CUDA 12 (pytorch/pytorch#190385)
    assert all(m.excluded_by(t, 12, "3.12") is None for t in m.torch if t != "2.15")
    assert m.excluded_by("2.15", 12, "3.12") is not None


def test_error_text_names_source_field_and_fix() -> None:
    e = error(BASE + "pyton: []\n")
    assert str(e) == f"m.yaml: {e.field}: {e.problem}\n  fix: {e.fix}"


@pytest.mark.parametrize(
    ("extra", "field", "in_message", "in_fix"),
    [
        ("pyton: []\n", "pyton", "unknown key", 'did you mean "python"'),
        ("exclude: [{tourch: '2.5'}]\n", "exclude[0].tourch", "unknown key", 'did you mean "torch"'),
        ("kernels: {dtype: [fp16]}\n", "kernels.dtype", "unknown key", 'did you mean "dtypes"'),
        ('version: "1.0.0+cu12"\n', "version", "local label", '"1.0.0"'),
        ('version: "one"\n', "version", "not a PEP 440 version", '"1.0.0"'),
        ('cxx11abi: "maybe"\n', "cxx11abi", "not a C++ ABI policy", "auto"),
        (
            'archs: {"12": ["8.0", "7.5", "8.6", "7.0"]}\n',
            'archs."12"[3]',
            "below what fa's kernels support (7.5)",
            "remove it",
        ),
        (
            'archs: {"11": ["10.0"]}\n',
            'archs."11"[0]',
            "cannot be targeted by CUDA 11 (NVRTC 11.8.89 targets 7.5",
            "CUDA 12",
        ),
        ('archs: {"12": ["sm_90"]}\n', 'archs."12"[0]', 'write "9.0"', '"8.6"'),
        ('archs: {"12": ["sm100"]}\n', 'archs."12"[0]', 'write "10.0"', '"8.6"'),
        ('archs: {"12": [8.0]}\n', 'archs."12"[0]', "is a number", 'quote the arch: "8.0"'),
        ('archs: {"13": ["9.0"]}\n', 'archs."13"', "CUDA 13 is not in cuda", "add 13 to cuda"),
        ('archs: {"12": ["9.0", "9.0"]}\n', 'archs."12"[1]', "listed twice", "remove one"),
        ('ptx: {"11": "12.0"}\n', 'ptx."11"', "cannot be targeted by CUDA 11", "remove it"),
        ("exclude: [{torch: '2.x'}]\n", "exclude[0].torch", "not a torch minor", '"2.5"'),
        ("exclude: [{torch: '>=2.x'}]\n", "exclude[0].torch", "not a PEP 440 specifier", '">=2.8"'),
        ("exclude: [{torch: '2.6'}]\n", "exclude[0].torch", "excludes nothing", "remove the entry"),
        ("exclude: [{cuda: 12.4}]\n", "exclude[0].cuda", "CUDA version", "write the major only: 12"),
        ("exclude: [{}]\n", "exclude[0]", "non-empty mapping", ">=2.8"),
        ("platforms: [arm64]\n", "platforms[0]", "spelled 'aarch64' in wheel tags", 'write "aarch64"'),
        ("platforms: [riscv64]\n", "platforms[0]", "no wheels for 'riscv64'", "x86_64, aarch64"),
        ("platforms: [x86_64, x86_64]\n", "platforms[1]", "listed twice", "remove one"),
        ("platforms: []\n", "platforms", "non-empty list", '["x86_64", "aarch64"]'),
        ("exclude: [{platform: aarch64}]\n", "exclude[0].platform", "excludes nothing", "remove the entry"),
        (
            "exclude: [{platform: '>=1'}]\n",
            "exclude[0].platform",
            "a name, not a version",
            "x86_64 or aarch64",
        ),
        ("kernels: {dtypes: [fp32]}\n", "kernels.dtypes[0]", "not one of fp16, bf16", "use one of"),
        ("kernels: {head_dims: [100]}\n", "kernels.head_dims[0]", "not one of 64, 128, 256", "use one of"),
        ("kernels: {directions: []}\n", "kernels.directions", "non-empty list", "fwd, bwd"),
        ('stable_abi: "2.7"\n', "stable_abi", "needs torch 2.10 or newer", 'stable_abi: "2.10"'),
        ('stable_abi: "2.12"\n', "stable_abi", "torch 2.12 is not in torch (2.5, 2.7)", 'add "2.12"'),
        ("stable_abi: 2.10\n", "stable_abi", "YAML reads 2.10 as 2.1", 'quote the minor: "2.1"'),
        ('stable_abi: ">=2.10"\n', "stable_abi", "not a torch minor", 'like "2.5"'),
        ("sass_per_major: [13]\n", "sass_per_major[0]", "CUDA 13 is not in cuda (11, 12)", "add 13 to cuda"),
        ("sass_per_major: [11]\n", "sass_per_major[0]", "with their own NVRTC already", "only 12, 13"),
        ("sass_per_major: [12.9]\n", "sass_per_major[0]", "is a CUDA version", "write the major only: 12"),
        ("sass_per_major: 13\n", "sass_per_major", "non-empty list", "sass_per_major: [13]"),
    ],
)
def test_validation_errors(extra: str, field: str, in_message: str, in_fix: str) -> None:
    e = error(BASE + extra)
    assert e.field == field
    assert in_message in e.problem
    assert in_fix in e.fix


@pytest.mark.parametrize(
    ("text", "field", "in_message", "in_fix"),
    [
        ('torch: ["2.5", "2.x"]', "torch[1]", "not a torch minor", 'like "2.5"'),
        ('torch: ["2.5.1"]', "torch[0]", 'write "2.5"', 'like "2.5"'),
        ("torch: [2.10]", "torch[0]", "YAML reads 2.10 as 2.1", 'quote the minor: "2.1"'),
        ('torch: ["2.3"]', "torch[0]", "older than fa supports (2.4", 'raise it to "2.4"'),
        ('torch: ["2.5", "2.5"]', "torch[1]", "listed twice (also torch[0])", "remove one"),
        ("torch: []", "torch", "non-empty list", '["2.5", "2.6"]'),
        ("cuda: [12.4]", "cuda[0]", "is a CUDA version", "write the major only: 12"),
        ('cuda: ["12.4"]', "cuda[0]", "is a CUDA version", "write the major only: 12"),
        ("cuda: [10]", "cuda[0]", "CUDA 10 has no pinned toolkit", "use one of 11, 12, 13"),
        ("cuda: [true]", "cuda[0]", "not a CUDA major", "11, 12, 13"),
        ('python: ["3.9.1"]', "python[0]", "not a Python minor", 'write the minor only: "3.9"'),
        ("python: [3.10]", "python[0]", "YAML reads 3.10 as 3.1", 'quote the version: "3.1"'),
        ('python: ["3.12t"]', "python[0]", "free-threaded CPython exists from 3.13", '"3.12"'),
        ('python: ["py3.12"]', "python[0]", "not a Python minor", '"3.13t"'),
    ],
)
def test_list_value_errors(text: str, field: str, in_message: str, in_fix: str) -> None:
    lines = {"torch": 'torch: ["2.5"]', "cuda": "cuda: [12]", "python": 'python: ["3.12"]'}
    lines[text.split(":")[0]] = text
    e = error("\n".join(lines.values()) + "\n")
    assert e.field == field
    assert in_message in e.problem
    assert in_fix in e.fix


def test_shape_errors() -> None:
    assert error("- torch\n").field == "(top level)"
    missing = error('torch: ["2.5"]\npython: ["3.12"]\n')
    assert missing.field == "cuda"
    assert "add cuda:" in missing.fix
    syntax = error('torch: ["2.5"\ncuda: [12]\n')
    assert syntax.field == "(syntax)"
    assert "line" in syntax.problem


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path / "nope.yaml", tiles=TILES)
    assert info.value.field == "(file)"
    assert "cannot read" in info.value.problem


def test_exclude_exact_and_specifier_values() -> None:
    m = parse(
        'torch: ["2.5", "2.7", "2.9"]\ncuda: [11, 12, 13]\npython: ["3.12", "3.13", "3.13t"]\n'
        "exclude:\n"
        '  - {torch: ">=2.7", cuda: 11}\n'  # specifier on torch, exact cuda
        '  - {torch: "2.5", cuda: ">=13"}\n'  # exact torch, specifier on cuda
        '  - {python: "3.13t", torch: "<2.9"}\n'  # exact free-threaded Python
        '  - {python: ">=3.13", cuda: 13}\n'  # a Python specifier covers the t builds too
    )
    assert m.excluded_by("2.7", 11, "3.12") == 0
    assert m.excluded_by("2.9", 11, "3.12") == 0
    assert m.excluded_by("2.5", 11, "3.12") is None
    assert m.excluded_by("2.5", 13, "3.12") == 1
    assert m.excluded_by("2.5", 12, "3.12") is None
    assert m.excluded_by("2.7", 12, "3.13t") == 2
    assert m.excluded_by("2.7", 12, "3.13") is None
    assert m.excluded_by("2.9", 12, "3.13t") is None
    assert m.excluded_by("2.9", 13, "3.13") == 3
    assert m.excluded_by("2.9", 13, "3.13t") == 3
    assert m.excluded_by("2.9", 13, "3.12") is None


@pytest.mark.parametrize(
    ("policy", "below_27", "from_27"),
    [
        ("auto", (False, True), (True,)),
        ("both", (False, True), (False, True)),
        ("true", (True,), (True,)),
        ("false", (False,), (False,)),
    ],
)
def test_cxx11abi_policies(policy: str, below_27: tuple, from_27: tuple) -> None:
    m = parse(BASE + f"cxx11abi: {policy}\n")
    assert m.abis("2.6") == below_27
    assert m.abis("2.7") == from_27
    assert m.abis("2.10") == from_27


def test_platforms_default_to_x86_64_and_exclude_by_platform() -> None:
    assert parse(BASE).platforms == ("x86_64",)
    m = parse(BASE + 'platforms: ["x86_64", "aarch64"]\nexclude: [{platform: aarch64, cuda: 12}]\n')
    assert m.platforms == ("x86_64", "aarch64")
    assert m.excluded_by("2.5", 12, "3.12", "aarch64") == 0
    assert m.excluded_by("2.5", 12, "3.12", "x86_64") is None


def test_sass_per_major() -> None:
    """Default: none (CUDA 13 takes CUDA 12's SASS, CUDA 12 CUDA 11's); listed majors compile all their own."""
    assert parse(BASE).sass_per_major == ()
    both = BASE.replace("cuda: [11, 12]", "cuda: [12, 13]")
    assert parse(both + "sass_per_major: [13]\n").sass_per_major == (13,)
    assert parse(both + "sass_per_major: []\n").sass_per_major == ()
    assert parse(BASE + "sass_per_major: [12]\n").sass_per_major == (12,)
