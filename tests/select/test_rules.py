"""Rules: numeric driver comparison, the platform tags an environment installs, and the reasons a wheel
does not fit (all of them, not the first)."""

from __future__ import annotations

import pytest
from fa_attn.versions import driver_at_least

from buildtool.compat.env import env_from_json
from buildtool.compat.fit import stack_reasons, supported_tags, wheel_reasons
from buildtool.compat.wheel_index import entry_from_dict
from tests.select.fixture_index import kernel_entry, universal_entry


def env(**change):
    base = {
        "os": "linux",
        "arch": "x86_64",
        "glibc": "2.35",
        "python": "3.11",
        "torch": {"version": "2.5.1+cu124", "cuda": "12.4", "hip": None, "cxx11abi": False},
        "driver": {"version": "550.54.15"},
        "gpus": [{"name": "NVIDIA A100", "sm": "8.0", "memory_mib": 1}],
    }
    return env_from_json({**base, **change})


@pytest.mark.parametrize(
    ("driver", "floor", "ok"),
    [
        ("535.104.05", "525.60.13", True),
        ("525.60.13", "525.60.13", True),
        ("525.60.12", "525.60.13", False),
        ("525.105.17", "525.60.13", True),  # 105 > 60 numerically, though "105" < "60" as text
        ("580", "580", True),
        ("575.51.03", "580", False),
        ("580.65.06", "580", True),
        ("470.57.02", "450.80.02", True),
    ],
)
def test_driver_versions_compare_numerically(driver: str, floor: str, ok: bool):
    assert driver_at_least(driver, floor) is ok


def test_tags_for_glibc_linux():
    tags = {str(t) for t in supported_tags(env())}
    assert {
        "py3-none-manylinux_2_28_x86_64",
        "py3-none-manylinux2014_x86_64",
        "py3-none-manylinux_2_35_x86_64",
        "py3-none-linux_x86_64",
        "py3-none-any",
        "cp311-abi3-manylinux_2_17_x86_64",
    } <= tags
    assert "py3-none-manylinux_2_36_x86_64" not in tags


def test_tags_for_free_threaded_python_exclude_abi3():
    # Free-threaded CPython cannot load abi3 extensions (packaging may offer its own "abi3t").
    tags = supported_tags(env(python="3.13t"))
    names = {str(t) for t in tags}
    assert "cp313-cp313t-manylinux_2_28_x86_64" in names and "py3-none-manylinux_2_28_x86_64" in names
    assert not any(t.abi == "abi3" for t in tags)


def test_tags_off_linux():
    win = {str(t) for t in supported_tags(env(os="windows", glibc=None))}
    assert "py3-none-win_amd64" in win and not any("linux" in t for t in win)
    mac = {t.platform for t in supported_tags(env(os="darwin", arch="arm64", glibc=None))}
    assert all(p.startswith("macosx_") or p == "any" for p in mac)


def test_every_reason_is_reported():
    # A P100 box with torch 1.13, driver 515 and CentOS 7 against a cu12 torch 2.5 new-ABI wheel.
    e = env(
        glibc="2.17",
        python="3.8",
        torch={"version": "1.13.1+cu117", "cuda": "11.7", "hip": None, "cxx11abi": False},
        driver={"version": "515.65.01"},
    )
    wheel = entry_from_dict(kernel_entry(12, "2.5", True), "test")
    codes = [r.code for r in wheel_reasons(wheel, e)]
    assert codes == [
        "glibc-too-old",
        "python-unsupported",
        "torch-version-mismatch",
        "cxx11abi-mismatch",
        "driver-too-old",
    ]
    assert all(r.message and r.fix for r in wheel_reasons(wheel, e))


def test_universal_wheel_fits_anywhere_with_torch():
    wheel = entry_from_dict(universal_entry(), "test")
    assert wheel_reasons(wheel, env(os="darwin", arch="arm64", glibc=None)) == []
    assert [r.code for r in wheel_reasons(wheel, env(torch=None))] == ["torch-missing"]


@pytest.mark.parametrize(
    ("change", "codes"),
    [
        ({}, []),
        ({"driver": None, "gpus": []}, ["no-gpu"]),
        (
            {"torch": {"version": "2.5.1+cpu", "cuda": None, "hip": None, "cxx11abi": False}},
            ["torch-not-cuda"],
        ),
        (
            {
                "torch": {"version": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133", "cxx11abi": False},
                "driver": None,
                "gpus": [],
            },
            ["no-gpu", "torch-not-cuda"],
        ),
        (
            {
                "torch": {"version": "2.9.0+cu130", "cuda": "13.0", "hip": None, "cxx11abi": True},
                "driver": {"version": "575.57.08"},
            },
            ["torch-driver-too-old"],
        ),
        ({"driver": {"version": "470.57.02"}}, ["torch-driver-too-old"]),
    ],
)
def test_stack_reasons(change: dict, codes: list[str]):
    assert [r.code for r in stack_reasons(env(**change))] == codes


def test_rocm_message_names_hip():
    e = env(torch={"version": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133", "cxx11abi": False})
    assert "ROCm" in stack_reasons(e)[0].message
