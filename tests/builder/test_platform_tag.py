"""Platform tags computed from what binaries really need, against auditwheel's manylinux policies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildtool.builder.platform_tag import ElfNeeds, PlatformTagError, elf_needs, platform_tag, policy_problem


def _tag_for(needs: ElfNeeds) -> str:
    from buildtool.builder.platform_tag import manylinux_policies

    for pol in manylinux_policies():
        if policy_problem(pol, needs) is None:
            return pol["name"]
    return "linux"


def _needs(*versions: tuple[str, str], libs: tuple[str, ...] = ("libc.so.6",)) -> ElfNeeds:
    return ElfNeeds("libx.so", "x86_64", libs, tuple(sorted(versions)))


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ((("libc.so.6", "GLIBC_2.2.5"),), "manylinux_2_5"),
        ((("libc.so.6", "GLIBC_2.17"),), "manylinux_2_17"),
        ((("libc.so.6", "GLIBC_2.28"), ("libstdc++.so.6", "GLIBCXX_3.4.21")), "manylinux_2_28"),
        ((("libc.so.6", "GLIBC_2.32"),), "manylinux_2_34"),  # no 2_32 policy: the next one up
        ((("libstdc++.so.6", "CXXABI_1.3.9"), ("libc.so.6", "GLIBC_2.14")), "manylinux_2_24"),  # gcc 5 ABI
    ],
)
def test_most_compatible_policy_that_admits_the_versions(versions, expected):
    libs = tuple(sorted({lib for lib, _ in versions}))
    assert _tag_for(_needs(*versions, libs=libs)) == expected


def test_torch_libraries_are_allowed_other_libraries_are_not():
    assert (
        _tag_for(_needs(("libc.so.6", "GLIBC_2.17"), libs=("libc.so.6", "libc10.so", "libtorch_cpu.so")))
        == "manylinux_2_17"
    )
    assert _tag_for(_needs(("libc.so.6", "GLIBC_2.17"), libs=("libc.so.6", "libcuda.so.1"))) == "linux"


def test_a_real_binary(tmp_path: Path):
    src = tmp_path / "x.cpp"
    src.write_text('#include <string>\nextern "C" int f(const char* s) { return std::string(s).size(); }\n')
    so = tmp_path / "libx.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", str(src), "-o", str(so)], check=True)
    needs = elf_needs(so)
    assert "libc.so.6" in needs.libraries
    assert any(v.startswith("GLIBC_") for _, v in needs.versions)
    tag = platform_tag([so])
    assert tag.tag.endswith("_x86_64")
    assert tag.reason
    newest_glibc = max(
        (tuple(map(int, v[6:].split("."))) for _, v in needs.versions if v.startswith("GLIBC_"))
    )
    if tag.tag.startswith("manylinux_"):
        major, minor = map(int, tag.tag.split("_")[1:3])
        assert (major, minor) >= newest_glibc[:2]


def test_not_an_elf_file(tmp_path: Path):
    bad = tmp_path / "lib.so"
    bad.write_bytes(b"hello")
    with pytest.raises(PlatformTagError, match="not a readable ELF"):
        platform_tag([bad])
