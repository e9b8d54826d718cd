"""What README and the docs say each CPU's all-wheel holds is what the release plan puts in it (issue
37: README said the all-wheel holds every CUDA major's kernels; x86_64's holds CUDA 11's and 12's, and
aarch64's CUDA 12's with 13's for Jetson Thor's sm 11.0 alone). Read from the plan offline, with the
fixture catalog, as the plan figures are (tests/ci/test_figures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from buildtool.builder.pypi import catalog_from_simple_json
from tests.ci import offline_catalog

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "build")]

import plan_size  # bench/build/plan_size.py

PAGES = ("README.md", "docs/using.md", "docs/build.md")


def holds(cpu_kernel_sets: list[tuple[int, tuple[str, ...], bool]]) -> str:
    """'CUDA 11's and 12's kernels' or 'CUDA 12's kernels, and 13's for sm 11.0 only': the majors with PTX or below it
    are whole; a newer major without PTX serves only the archs it lists."""
    main = max(major for major, _, ptx in cpu_kernel_sets if ptx)
    whole = [str(major) for major, _, _ in cpu_kernel_sets if major <= main]
    text = "CUDA " + " and ".join(f"{m}'s" for m in whole) + " kernels"
    for major, sass, _ in cpu_kernel_sets:
        if major > main:
            text += f", and {major}'s for sm {', '.join(sass)} only"
    return text


def release_all_wheels() -> dict[str, str]:
    catalog = catalog_from_simple_json(offline_catalog.simple_json())
    release = plan_size.plans(catalog)["x86_64 and aarch64 (the release)"]
    return {
        spec.platform: holds([(k.cuda_major, k.sass, k.ptx is not None) for k in spec.kernel_sets])
        for spec in release.all_wheels
    }


def test_the_phrase_says_what_a_plan_holds() -> None:
    assert holds([(11, ("7.5",), False), (12, ("7.5",), True)]) == "CUDA 11's and 12's kernels"
    assert (
        holds([(12, ("8.0",), True), (13, ("11.0",), False)])
        == "CUDA 12's kernels, and 13's for sm 11.0 only"
    )


@pytest.mark.parametrize("page", PAGES)
def test_each_cpus_all_wheel_is_stated_as_the_release_builds_it(page: str) -> None:
    text = " ".join((REPO / page).read_text().split())
    for cpu, what in release_all_wheels().items():
        assert f"{cpu}'s all-wheel holds {what}" in text, (
            f"{page}: say '{cpu}'s all-wheel holds {what}' (what the release plan puts in it)"
        )
    assert "every CUDA major's kernels" not in text
