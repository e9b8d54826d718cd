"""Windows wheels from JSON machine descriptions and real wheel files: builder/windows_wheel.py packs
the x86_64 stable-ABI wheel's device code with an MSVC binding into a win_amd64 wheel that `fa index`
accepts, the variant's index lists beside the Linux one, real pip (`--platform win_amd64`) takes on
Windows, and fit/doctor pick for a Windows machine. The DLL here is a bare PE header: no Windows
binding has been built here (README)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from buildtool.builder import index
from buildtool.builder.windows_wheel import BINDING_FILE, WindowsWheelError, windows_wheel
from buildtool.compat.choose import Request
from buildtool.compat.doctor import build_report, report_json
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import load_index
from buildtool.core.wheel_file import wheel_entry
from tests.builder.conftest import pip_download
from tests.select.fixture_index import kernel_entry
from tests.select.tiny_wheels import build_wheel

WINDOWS = {
    "os": "windows",
    "arch": "x86_64",
    "glibc": None,
    "python": "3.12",
    "torch": {"version": "2.12.0+cu126", "cuda": "12.6", "hip": None, "cxx11abi": None},
    "driver": {"version": "566.36"},  # nvidia-smi.exe on Windows 11 (Windows numbering: 528.33 runs CUDA 12)
    "gpus": [{"name": "NVIDIA GeForce RTX 4090", "sm": "8.9", "memory_mib": 24564}],
}


def _dll(path: Path, machine: int = 0x8664) -> Path:
    head = bytearray(0x100)
    head[:2] = b"MZ"
    struct.pack_into("<I", head, 0x3C, 0x80)
    head[0x80:0x84] = b"PE\0\0"
    struct.pack_into("<H", head, 0x84, machine)
    path.write_bytes(bytes(head))
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    out = tmp_path / "wheels"
    out.mkdir()
    for entry in (kernel_entry(12, "2.10", None), kernel_entry(12, "2.9", True)):
        build_wheel(out, entry)
    return out


def _linux(wheels: Path, variant: str) -> Path:
    return next(wheels.glob(f"fa_attn-0.1.0+{variant}-py3-none-manylinux_2_28_x86_64.whl"))


def test_the_windows_wheel_is_the_linux_one_with_the_msvc_binding(wheels: Path, tmp_path: Path) -> None:
    linux = _linux(wheels, "cu12torch2.10plus")
    win = windows_wheel(linux, _dll(tmp_path / "fa_attn_ops.dll"), wheels)
    entry = wheel_entry(win)  # name, .dist-info and manifest agree
    assert win.name == "fa_attn-0.1.0+cu12torch2.10plus-py3-none-win_amd64.whl"
    assert (entry.info.platform, entry.info.binding, entry.info.variant) == (
        "x86_64",
        BINDING_FILE,
        "cu12torch2.10plus",
    )
    with zipfile.ZipFile(linux) as a, zipfile.ZipFile(win) as b:
        device = {n for n in a.namelist() if n.startswith("fa_attn/") and n != "fa_attn/manifest.json"}
        assert device <= set(b.namelist())
    assert linux.is_file()  # the Linux wheel of the same version stays beside it


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: p.write_bytes(b"\x7fELF" + bytes(60)), "no MZ header"),
        (lambda p: _dll(p, machine=0x14C), "not x86_64"),
    ],
)
def test_a_binding_that_is_not_an_x86_64_dll_is_refused(
    wheels: Path, tmp_path: Path, make, problem: str
) -> None:
    dll = tmp_path / "fa_attn_ops.dll"
    make(dll)
    with pytest.raises(WindowsWheelError, match=problem):
        windows_wheel(_linux(wheels, "cu12torch2.10plus"), dll, wheels)


def test_a_per_minor_wheel_has_no_windows_counterpart(wheels: Path, tmp_path: Path) -> None:
    with pytest.raises(WindowsWheelError, match="stable-ABI wheels"):
        windows_wheel(_linux(wheels, "cu12torch2.9"), _dll(tmp_path / "x.dll"), wheels)


def test_doctor_picks_it_for_a_windows_machine_and_names_its_index(wheels: Path, tmp_path: Path) -> None:
    windows_wheel(_linux(wheels, "cu12torch2.10plus"), _dll(tmp_path / "fa_attn_ops.dll"), wheels)
    index.write_index(wheels)
    out = report_json(build_report(env_from_json(WINDOWS), load_index(str(wheels)), Request()))
    assert (out["verdict"], out["selected"]) == (
        "ok",
        "fa_attn-0.1.0+cu12torch2.10plus-py3-none-win_amd64.whl",
    )
    assert out["install"]["index"] == "cu12"


def test_pip_for_windows_takes_the_windows_wheel_from_the_variant_index(wheels: Path, tmp_path: Path) -> None:
    windows_wheel(_linux(wheels, "cu12torch2.10plus"), _dll(tmp_path / "fa_attn_ops.dll"), wheels)
    index.write_index(wheels)
    got = tmp_path / "got"
    windows = ["--platform", "win_amd64", "--python-version", "3.12", "--implementation", "cp"]
    source = ["--index-url", (wheels / "cu12" / "simple").as_uri(), "fa-attn==0.1.0"]
    fetched = pip_download(got, "--only-binary=:all:", *windows, *source)
    assert fetched == ["fa_attn-0.1.0+cu12torch2.10plus-py3-none-win_amd64.whl"]


def test_a_windows_machine_with_torch_below_the_floor_is_told_why(wheels: Path, tmp_path: Path) -> None:
    windows_wheel(_linux(wheels, "cu12torch2.10plus"), _dll(tmp_path / "fa_attn_ops.dll"), wheels)
    index.write_index(wheels)
    old = {**WINDOWS, "torch": {**WINDOWS["torch"], "version": "2.5.1+cu124", "cuda": "12.4"}}
    out = report_json(build_report(env_from_json(old), load_index(str(wheels)), Request()))
    win = next(w for w in out["wheels"] if w["file"].endswith("win_amd64.whl"))
    assert [r["code"] for r in win["reasons"]] == ["torch-below-floor"]
    assert out["selected"] is None
