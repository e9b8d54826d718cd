"""fa probe: driver and GPUs from NVML, /sys, /proc and nvidia-smi (faked here), torch without importing
it, and the environment JSON's validation (every error names the field and the fix)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildtool.compat.env import EnvError, env_from_json, env_to_json
from buildtool.compat.probe import ProbePaths, probe
from buildtool.core.installed import TorchInfo
from tests.select.conftest import MACHINE

ENVS = Path(__file__).parent / "envs"
PROC_CLOSED = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:32:16 UTC 2025\n"
)


def paths(
    tmp_path: Path,
    sys_text: str | None = None,
    proc_text: str | None = None,
    smi: str = "no-such-smi",
    torch_dir: Path | None = None,
) -> ProbePaths:
    sys_file, proc_file = tmp_path / "sys_version", tmp_path / "proc_version"
    if sys_text is not None:
        sys_file.write_text(sys_text)
    if proc_text is not None:
        proc_file.write_text(proc_text)
    return ProbePaths(
        sys_driver_version=sys_file,
        proc_driver_version=proc_file,
        nvidia_smi=smi,
        use_nvml=False,
        torch_dir=torch_dir or tmp_path / "no-torch",
        device_tree_compatible=tmp_path / "no-compatible",
        tegra_release=tmp_path / "no-release",
    )


def test_driver_from_sys_module(tmp_path: Path):
    env = probe(paths(tmp_path, sys_text="535.104.05\n", proc_text=PROC_OPEN))
    assert env.driver == "535.104.05"
    assert env.gpus == ()
    assert env.sources["driver"].endswith("sys_version")


@pytest.mark.parametrize(("text", "version"), [(PROC_CLOSED, "535.104.05"), (PROC_OPEN, "570.86.15")])
def test_driver_from_proc_when_sys_is_missing(tmp_path: Path, text: str, version: str):
    env = probe(paths(tmp_path, proc_text=text))
    assert env.driver == version


def test_no_driver_anywhere(tmp_path: Path):
    env = probe(paths(tmp_path))
    assert env.driver is None
    assert env.gpus == ()
    assert env.torch is None


def _fake_smi(tmp_path: Path, script: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


def test_gpus_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = _fake_smi(
        tmp_path,
        'echo "550.54.15, NVIDIA A100-SXM4-80GB, 8.0, 81920"\necho "550.54.15, Tesla T4, 7.5, 15360"\n',
    )
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    env = probe(paths(tmp_path, smi="nvidia-smi"))
    assert env.driver == "550.54.15"
    assert [(g.name, g.sm, g.memory_mib) for g in env.gpus] == [
        ("NVIDIA A100-SXM4-80GB", "8.0", 81920),
        ("Tesla T4", "7.5", 15360),
    ]
    assert env.sources["gpus"] == "nvidia-smi"


def test_old_nvidia_smi_without_compute_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Drivers before 510 reject the compute_cap field; the driver version still comes through.
    bin_dir = _fake_smi(
        tmp_path,
        'case "$1" in *compute_cap*) echo "Field \\"compute_cap\\" is not a valid '
        'field to query." >&2; exit 2;; esac\necho "470.57.02, Tesla V100S-PCIE-32GB, 32510"\n',
    )
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    env = probe(paths(tmp_path, smi="nvidia-smi"))
    assert env.driver == "470.57.02"
    assert env.gpus == ()


def test_without_nvml_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    p = paths(tmp_path, sys_text="580.95.05\n")
    env = probe(ProbePaths(**{**p.__dict__, "use_nvml": True}))
    assert env.driver == "580.95.05"


def _fake_torch(
    tmp_path: Path, version_py: str, cmake: str | None = None, libc10: bytes | None = None
) -> Path:
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    (torch_dir / "version.py").write_text(version_py)
    if cmake is not None:
        (torch_dir / "share" / "cmake" / "Torch").mkdir(parents=True)
        (torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text(cmake)
    if libc10 is not None:
        (torch_dir / "lib").mkdir()
        (torch_dir / "lib" / "libc10.so").write_bytes(libc10)
    return torch_dir


VERSION_PY = (
    "from typing import Optional\n__version__ = '2.5.1+cu124'\ndebug = False\n"
    "cuda: Optional[str] = '12.4'\ngit_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'\n"
    "hip: Optional[str] = None\n"
)


@pytest.mark.skipif(sys.platform != "linux", reason="the C++11 ABI question exists only on Linux")
def test_torch_from_files_old_abi_via_cmake(tmp_path: Path):
    torch_dir = _fake_torch(tmp_path, VERSION_PY, cmake='set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")\n')
    env = probe(paths(tmp_path, torch_dir=torch_dir))
    assert env.torch == TorchInfo(version="2.5.1+cu124", cuda="12.4", hip=None, cxx11abi=False)


@pytest.mark.skipif(sys.platform != "linux", reason="the C++11 ABI question exists only on Linux")
@pytest.mark.parametrize(
    ("symbols", "abi"),
    [
        (b"\0_ZN3c1019UndefinedTensorImplC2Ev\0_ZNK3c106Device3strB5cxx11Ev\0", True),
        (b"\0_ZN3c1019UndefinedTensorImplC2Ev\0_ZNK3c106Device3strEv\0", False),
    ],
)
def test_torch_abi_from_libc10_symbols(tmp_path: Path, symbols: bytes, abi: bool):
    torch_dir = _fake_torch(tmp_path, VERSION_PY, cmake="# no flags here (torch >= 2.x)\n", libc10=symbols)
    env = probe(paths(tmp_path, torch_dir=torch_dir))
    assert env.torch is not None
    assert env.torch.cxx11abi is abi


def test_probe_never_imports_torch():
    code = (
        "import sys; from buildtool.compat.probe import probe; from buildtool.compat.env import env_to_json; "
        "import json; "
        "env = probe(); assert 'torch' not in sys.modules, 'probe imported torch'; "
        "print(json.dumps(env_to_json(env)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    env = env_from_json(json.loads(done.stdout))  # what probe writes, --env reads
    assert env.python.rstrip("t") == f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ("2.5.0a0+e000cf0ad9.nv24.10", "2.5"),
        ("2.7.0.dev20250301+cu126", "2.7"),
        ("2.5.1+cu124", "2.5"),
        ("2.10.0", "2.10"),
        ("1.13.1+cu117", "1.13"),
    ],
)
def test_torch_minor(version: str, minor: str):
    assert TorchInfo(version=version, cuda=None, hip=None, cxx11abi=None).minor == minor


def test_corpus_envs_round_trip():
    for path in sorted(ENVS.glob("*.json")):
        raw = json.loads(path.read_text())["env"]
        assert env_to_json(env_from_json(raw)) == raw, path.name


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"os": "freebsd"}, "os", "linux, windows, darwin"),
        ({"python": 3.11}, "python", '"3.11"'),
        ({"glibc": "2"}, "glibc", '"2.35"'),
        ({"torch": {**MACHINE["torch"], "version": "latest"}}, "torch.version", "torch.__version__"),
        ({"torch": {**MACHINE["torch"], "cxx11abi": "TRUE"}}, "torch.cxx11abi", "true or false"),
        ({"driver": "535"}, "driver", '{"version"'),
        ({"driver": {"version": "r535"}}, "driver.version", "535.104.05"),
        ({"gpus": [{"name": "A100", "sm": "80"}]}, "gpus[0].sm", '"8.6"'),
        ({"gpus": [{"name": "A100", "sm": "8.0", "memory_mib": "80G"}]}, "gpus[0].memory_mib", "MiB"),
    ],
)
def test_bad_env_names_field_and_fix(change: dict, field: str, fix: str):
    with pytest.raises(EnvError) as err:
        env_from_json({**MACHINE, **change})
    assert str(err.value).startswith(f"{field}:")
    assert fix in str(err.value)


def test_missing_field_is_named():
    data = {k: v for k, v in MACHINE.items() if k != "arch"}
    with pytest.raises(EnvError, match=r"^arch: got None"):
        env_from_json(data)


def test_jetson_orin_from_device_tree_and_l4t_release(tmp_path: Path):
    """JetPack 6 on an AGX Orin: no NVML, no nvidia-smi, no /proc/driver/nvidia; the SoC and L4T say it."""
    p = paths(tmp_path)
    p.device_tree_compatible.write_bytes(
        b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0"
    )
    p.tegra_release.write_text(
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
        "DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    )
    env = probe(p)
    assert [(g.name, g.sm) for g in env.gpus] == [("Orin (nvgpu)", "8.7")]
    assert env.driver == "540.4.0"
    assert "L4T R36.4.3" in env.sources["driver"]
    # An L4T release without a known driver number: the GPU is still seen, the driver stays unknown.
    p.tegra_release.write_text("# R35 (release), REVISION: 6.0, GCID: 1, BOARD: t186ref, EABI: aarch64\n")
    env = probe(p)
    assert env.gpus
    assert env.driver is None
    p.device_tree_compatible.write_bytes(b"raspberrypi,5-model-b\0brcm,bcm2712\0")
    assert probe(p).gpus == ()


def test_what_nvidia_smi_says_is_checked_before_it_is_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A GPU name is printed to people: control characters become escapes. A driver version that is
    not one is dropped, so doctor never compares garbage."""
    bin_dir = _fake_smi(tmp_path, r'printf "5x5.54, NVIDIA\033[2J A100, 8.0, 81920\n"' + "\n")
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    env = probe(paths(tmp_path, smi="nvidia-smi"))
    assert env.driver is None
    assert [g.name for g in env.gpus] == ["NVIDIA\\x1b[2J A100"]
    env_from_json(env_to_json(env))  # what the probe says is a valid env file


def test_windows_driver_from_nvidia_smi_exe_where_the_driver_installs_it(tmp_path: Path):
    """A Windows machine (described: os "windows"): no /sys or /proc, nvidia-smi.exe not on PATH but
    in System32; Windows numbers its drivers differently (566.36) and has no glibc."""
    smi = Path(_fake_smi(tmp_path, 'echo "566.36, NVIDIA GeForce RTX 4090, 8.9, 24564"\n')) / "nvidia-smi"
    system32 = tmp_path / "System32" / "nvidia-smi.exe"
    system32.parent.mkdir()
    system32.symlink_to(smi)
    where = (tmp_path / "NVSMI" / "nvidia-smi.exe", system32)
    found = probe(dataclasses.replace(paths(tmp_path), windows_nvidia_smi=where, os="windows"))
    assert (found.os, found.glibc, found.driver) == ("windows", None, "566.36")
    assert [(g.name, g.sm) for g in found.gpus] == [("NVIDIA GeForce RTX 4090", "8.9")]


def test_linux_never_looks_in_windows_locations(tmp_path: Path):
    smi = Path(_fake_smi(tmp_path, 'echo "566.36, NVIDIA GeForce RTX 4090, 8.9, 24564"\n')) / "nvidia-smi"
    found = probe(dataclasses.replace(paths(tmp_path), windows_nvidia_smi=(smi,), os="linux"))
    assert (found.driver, found.gpus) == (None, ())


def test_endless_nvidia_smi_output_is_cut_off_at_its_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """300 MB of output used to be read whole (900 MB of memory); now at most SMI_MAX_BYTES are read,
    then the command is killed, and a GPU list that long is no GPU list."""
    bin_dir = _fake_smi(tmp_path, 'while :; do echo "550.54.15, NVIDIA A100-SXM4-80GB, 8.0, 81920"; done\n')
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    env = probe(paths(tmp_path, smi="nvidia-smi"))
    assert env.gpus == ()


def test_a_hung_nvidia_smi_wrapper_and_its_child_are_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from buildtool.compat import probe as probe_module

    child = tmp_path / "child.pid"
    bin_dir = _fake_smi(tmp_path, f"sleep 300 &\necho $! > {child}\nwait\n")
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(probe_module, "SMI_TIMEOUT_S", 1.0)
    env = probe(paths(tmp_path, smi="nvidia-smi"))
    assert env.gpus == ()
    pid = int(child.read_text())
    for _ in range(50):  # the kill is sent; give the kernel a moment to reap it
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"nvidia-smi's child {pid} is still running")
