"""buildtool/core/install_lines.py: the per-variant index of each wheel of the repo's matrix, and the pip
and uv lines for it, read back the way pip, a shell and uv's TOML reader read them."""

from __future__ import annotations

import shlex

import pytest

from buildtool.core import install_lines
from buildtool.core.runtime import schema
from tests.select.fixture_index import all_wheel_index, fixture_index


def _entries() -> list[schema.IndexEntry]:
    data, alls = fixture_index(), all_wheel_index()
    return [schema.IndexEntry.from_json(e, "entry") for e in data["wheels"] + alls["all_wheels"]]


ENTRIES = _entries()


def _by_variant(variant: str, cpu: str | None = "x86_64") -> schema.IndexEntry:
    return next(e for e in ENTRIES if e.info.variant == variant and e.info.platform == cpu)


@pytest.mark.parametrize(
    ("variant", "name"),
    [
        ("cu12torch2.10plus", "cu12"),  # the stable-ABI wheel: torch >= 2.10, torch.version.cuda 12.x
        ("cu13torch2.10plus", "cu13"),
        ("cu12torch2.9", "cu12-torch2.9"),
        ("cu13torch2.9", "cu13-torch2.9"),
        ("cu12torch2.7", "cu12-torch2.7"),
        ("cu12torch2.5cxx11abifalse", "cu12-torch2.5-cxx11abifalse"),
        ("cu11torch2.6cxx11abitrue", "cu11-torch2.6-cxx11abitrue"),
        ("", "universal"),
    ],
)
def test_index_name_is_guessable_from_torch(variant: str, name: str) -> None:
    cpu = None if variant == "" else "x86_64"
    assert install_lines.variant_index_name(_by_variant(variant, cpu)) == name


def test_both_cpus_of_a_variant_share_its_index() -> None:
    names = {
        install_lines.variant_index_name(_by_variant("cu12torch2.9", cpu)) for cpu in ("x86_64", "aarch64")
    }
    assert names == {"cu12-torch2.9"}


@pytest.mark.parametrize(("variant", "cpu"), [("all", "x86_64"), ("all", "aarch64"), ("", None)])
def test_all_wheel_and_universal_wheel_are_in_every_index(variant: str, cpu: str | None) -> None:
    entry = _by_variant(variant, cpu)
    variants = [n for n in install_lines.index_names(ENTRIES) if n != install_lines.UNIVERSAL]
    assert all(entry in install_lines.index_members(ENTRIES, n) for n in variants)


def test_an_index_holds_one_variant_plus_the_shared_wheels() -> None:
    members = install_lines.index_members(ENTRIES, "cu12-torch2.9")
    assert {e.info.variant for e in members} == {"cu12torch2.9", "all", ""}


def test_the_root_index_holds_only_the_shared_wheels() -> None:
    assert {e.info.variant for e in install_lines.index_members(ENTRIES, None)} == {"all", ""}


def test_the_universal_index_holds_the_universal_wheel_alone() -> None:
    members = install_lines.index_members(ENTRIES, install_lines.UNIVERSAL)
    assert [e.info.variant for e in members] == [""]


def test_every_variant_wheel_has_exactly_one_index() -> None:
    named = [e for e in ENTRIES if not install_lines.in_every_index(e)]
    assert all(
        sum(e in install_lines.index_members(ENTRIES, n) for n in install_lines.index_names(ENTRIES)) == 1
        for e in named
    )


def test_pip_line_points_at_the_variant_index_and_pins_the_release() -> None:
    lines = install_lines.install_lines(_by_variant("cu12torch2.9"), "https://example.org/fa/")
    assert shlex.split(lines.pip) == [
        "pip",
        "install",
        "--index-url",
        "https://example.org/fa/cu12-torch2.9/simple/",
        "fa-attn==0.1.0",
    ]


def test_uv_line_is_uv_pip_with_the_same_index() -> None:
    lines = install_lines.install_lines(_by_variant("cu13torch2.10plus"), "file:///srv/wheels")
    assert shlex.split(lines.uv)[:4] == ["uv", "pip", "install", "--index-url"]
    assert shlex.split(lines.uv)[4] == "file:///srv/wheels/cu13/simple/"


def test_requirements_file_lines() -> None:
    lines = install_lines.install_lines(_by_variant("cu12torch2.10plus"), "https://example.org/fa")
    assert lines.requirements_txt.splitlines() == [
        "--index-url https://example.org/fa/cu12/simple/",
        "fa-attn==0.1.0",
    ]


def test_uv_pyproject_snippet_pins_fa_attn_to_an_explicit_index() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's)
    lines = install_lines.install_lines(_by_variant("cu12torch2.8"), "https://example.org/fa")
    toml = tomllib.loads(lines.uv_pyproject)
    (index,) = toml["tool"]["uv"]["index"]
    assert (index, toml["tool"]["uv"]["sources"], toml["project"]["dependencies"]) == (
        {"name": "fa-cu12-torch2.8", "url": "https://example.org/fa/cu12-torch2.8/simple/", "explicit": True},
        {"fa-attn": {"index": "fa-cu12-torch2.8"}},
        ["fa-attn==0.1.0"],
    )


def test_all_wheel_installs_from_the_root_index() -> None:
    lines = install_lines.install_lines(_by_variant("all"), "https://example.org/fa")
    assert (lines.index_name, lines.index_url) == (None, "https://example.org/fa/simple/")


def test_a_base_url_needing_quotes_is_quoted_for_the_shell() -> None:
    lines = install_lines.install_lines(_by_variant("cu12torch2.9"), "file:///tmp/my wheels")
    assert shlex.split(lines.pip)[3] == "file:///tmp/my wheels/cu12-torch2.9/simple/"
