"""Facts about this machine, as an `Env` (compat/env.py).

Probing must be fast and side-effect free: no CUDA context and no `import torch` (importing torch takes
seconds and initialises CUDA libraries). Torch is read from its version.py and its libraries
(core/installed.py); the driver and GPUs from NVML, falling back to /sys, /proc and nvidia-smi (on
Windows: NVML, then nvidia-smi.exe on PATH or where the driver installs it).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from buildtool.compat.env import Env, Gpu, is_driver_version
from buildtool.core.children import read_capped
from buildtool.core.installed import find_torch, os_name, probe_torch, python_version
from buildtool.core.textfile import printable

# ---------------------------------------------------------------------------------------------------
# Probing this machine


@dataclass(frozen=True)
class ProbePaths:
    """Everything the probe reads, injectable so tests can fake a machine."""

    sys_driver_version: Path = Path("/sys/module/nvidia/version")
    proc_driver_version: Path = Path("/proc/driver/nvidia/version")
    nvidia_smi: str = "nvidia-smi"  # looked up on PATH
    use_nvml: bool = True
    # Jetson (Tegra): an integrated GPU without NVML, often without nvidia-smi; the SoC and the L4T
    # release say what NVML would.
    device_tree_compatible: Path = Path("/proc/device-tree/compatible")
    tegra_release: Path = Path("/etc/nv_tegra_release")
    torch_dir: Path | None = None  # None: find the installed torch package without importing it
    # Windows: nvidia-smi.exe is not always on PATH. DCH drivers put it in System32, older ones under
    # Program Files\NVIDIA Corporation\NVSMI; there is no /sys or /proc to read the driver from.
    windows_nvidia_smi: tuple[Path, ...] = (
        Path("C:/Windows/System32/nvidia-smi.exe"),
        Path("C:/Program Files/NVIDIA Corporation/NVSMI/nvidia-smi.exe"),
    )
    os: str | None = None  # None: this machine's (core/installed.py os_name); tests describe another


def _smi_executable(command: str, fallbacks: tuple[Path, ...]) -> str | None:
    """nvidia-smi on PATH (shutil.which adds .exe on Windows), else the first known location present."""
    found = shutil.which(command)
    if found is not None:
        return found
    return next((str(p) for p in fallbacks if p.is_file()), None)


def probe(paths: ProbePaths = ProbePaths()) -> Env:
    sources: dict[str, str] = {}
    system = paths.os or os_name()
    windows = system == "windows"
    driver, gpus = _nvml(sources) if paths.use_nvml else (None, [])
    if driver is None and not windows:
        driver = _read_driver_file(paths, sources)
    if not gpus:
        smi = _smi_executable(paths.nvidia_smi, paths.windows_nvidia_smi if windows else ())
        smi_driver, gpus = _nvidia_smi(smi, sources) if smi else (None, [])
        driver = driver or smi_driver
    if not gpus:
        tegra_driver, gpus = _tegra(paths, sources)
        driver = driver or tegra_driver
    torch_dir = paths.torch_dir if paths.torch_dir is not None else find_torch()
    torch = probe_torch(torch_dir, sources) if torch_dir else None
    return Env(
        os=system,
        arch=_arch(),
        glibc=None if windows else _glibc(),
        python=python_version(),
        torch=torch,
        driver=driver,
        gpus=tuple(gpus),
        sources=sources,
    )


def _arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64"}.get(machine, machine)


def _glibc() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.35"; absent on musl, macOS and Windows
    except (AttributeError, ValueError, OSError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    major_minor = re.match(r"(\d+\.\d+)", text.split()[1])
    return major_minor.group(1) if major_minor else None


def _nvml(sources: dict[str, str]) -> tuple[str | None, list[Gpu]]:
    try:
        import pynvml  # nvidia-ml-py; a thin ctypes wrapper, loads libnvidia-ml only in nvmlInit
    except ImportError:
        return None, []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # LibraryNotFound, DriverNotLoaded, ...: no usable NVML here
        return None, []
    try:
        reported = _text(pynvml.nvmlSystemGetDriverVersion())
        driver = reported if is_driver_version(reported) else None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            gpus.append(
                Gpu(
                    name=printable(_text(pynvml.nvmlDeviceGetName(handle))),
                    sm=f"{major}.{minor}",
                    memory_mib=int(memory),
                    uuid=uuid if re.fullmatch(r"GPU-[0-9a-fA-F-]{1,64}", uuid, re.ASCII) else "",
                )
            )
        sources["driver"] = sources["gpus"] = "nvml"
        return driver, gpus
    except pynvml.NVMLError:
        return None, []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]{1,4}(?:\.[0-9]{1,4}){1,3})\b", re.ASCII)


def _read_driver_file(paths: ProbePaths, sources: dict[str, str]) -> str | None:
    try:
        text = paths.sys_driver_version.read_text(errors="replace").strip()
        if is_driver_version(text):
            sources["driver"] = str(paths.sys_driver_version)
            return text
    except OSError:
        pass
    try:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." (open modules say
        # "Open Kernel Module for x86_64  570.86.15")
        match = _PROC_VERSION.search(paths.proc_driver_version.read_text(errors="replace"))
        if match:
            sources["driver"] = str(paths.proc_driver_version)
            return match.group(1)
    except OSError:
        pass
    return None


# nvidia-smi's answer is about 100 bytes a GPU; more is not nvidia-smi (300 MB of it took 900 MB of
# memory when read whole), and a wrapper that hangs must not hang the probe.
SMI_MAX_BYTES = 64 << 10
SMI_TIMEOUT_S = 20.0


def _nvidia_smi(exe: str, sources: dict[str, str]) -> tuple[str | None, list[Gpu]]:
    # compute_cap needs nvidia-smi from driver 510 on; older ones give the driver only.
    for fields in ("driver_version,name,compute_cap,memory.total", "driver_version,name,memory.total"):
        try:
            status, output = read_capped(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], SMI_MAX_BYTES, SMI_TIMEOUT_S
            )
        except OSError:
            return None, []
        if status is None:  # cut off: too much output, or hung
            return None, []
        if status == 0:
            break
    else:
        return None, []
    text = output.decode("utf-8", "replace")
    driver, gpus = None, []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3:
            continue
        driver = cells[0] if is_driver_version(cells[0]) else None
        if len(cells) == 4 and re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", cells[2], re.ASCII):
            memory = int(cells[3]) if re.fullmatch(r"[0-9]{1,12}", cells[3], re.ASCII) else None
            # A GPU name is shown to people: no control characters from a driver or a fake nvidia-smi.
            gpus.append(Gpu(name=printable(cells[1]), sm=cells[2], memory_mib=memory))
    if driver:
        sources.setdefault("driver", "nvidia-smi")
    if gpus:
        sources["gpus"] = "nvidia-smi"
    return driver, gpus


# Tegra SoCs (device-tree compatible string) and their integrated GPU's compute capability.
TEGRA_GPUS = {"nvidia,tegra234": ("Orin (nvgpu)", "8.7"), "nvidia,tegra194": ("Xavier (nvgpu)", "7.2")}
# L4T R36 (JetPack 6) numbers its CUDA driver 540.<revision major>.0 (nvidia-smi on R36.4: 540.4.0).
_TEGRA_RELEASE = re.compile(r"^# R(\d+) \(release\), REVISION: (\d+)\.(\d+)")


def _tegra(paths: ProbePaths, sources: dict[str, str]) -> tuple[str | None, list[Gpu]]:
    """A Jetson's GPU from its SoC, and its driver from the L4T release where its number is known."""
    try:
        compatible = paths.device_tree_compatible.read_bytes().split(b"\0")
    except OSError:
        return None, []
    socs = [
        TEGRA_GPUS[c.decode(errors="replace")] for c in compatible if c.decode(errors="replace") in TEGRA_GPUS
    ]
    if not socs:
        return None, []
    name, sm = socs[0]
    sources["gpus"] = str(paths.device_tree_compatible)
    driver = None
    try:
        match = _TEGRA_RELEASE.match(paths.tegra_release.read_text(errors="replace"))
    except OSError:
        match = None
    if match and match.group(1) == "36":
        driver = f"540.{match.group(2)}.0"
        sources["driver"] = f"{paths.tegra_release} (L4T R36.{match.group(2)}.{match.group(3)})"
    return driver, [Gpu(name=name, sm=sm, memory_mib=None)]
