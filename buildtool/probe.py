"""Facts about a machine: the environment description of docs/contracts.md section 6.

Two ways in: `probe()` looks at this machine, `env_from_json()` reads a description written elsewhere
(`fa doctor --env FILE`). Both give the same typed `Env`; everything downstream (rules, select, install)
works on that and never looks at the machine itself.

Probing must be fast and side-effect free: no CUDA context and no `import torch` (importing torch takes
seconds and initialises CUDA libraries). Torch is read from its version.py and its libraries; the driver
and GPUs from NVML, falling back to /sys, /proc and nvidia-smi.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

OS_NAMES = ("linux", "windows", "darwin")


class EnvError(ValueError):
    """An environment description that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class TorchInfo:
    version: str  # as torch reports it, e.g. "2.5.0a0+e000cf0ad9.nv24.10"
    cuda: str | None  # "12.4"; None for CPU-only and ROCm builds
    hip: str | None  # ROCm version for ROCm builds
    cxx11abi: bool | None  # None: unknown (non-Linux, or could not be read)

    @property
    def minor(self) -> str:
        """ "2.5.0a0+e000cf0ad9.nv24.10" -> "2.5": local and pre-release parts don't change the minor."""
        release = Version(self.version).release
        return f"{release[0]}.{release[1] if len(release) > 1 else 0}"

    @property
    def cuda_major(self) -> int | None:
        return int(self.cuda.split(".")[0]) if self.cuda else None


@dataclass(frozen=True)
class Gpu:
    name: str
    sm: str  # compute capability "8.6"
    memory_mib: int | None


@dataclass(frozen=True)
class Env:
    os: str  # linux | windows | darwin
    arch: str  # x86_64, aarch64, arm64, ...
    glibc: str | None  # "2.35"; None off glibc Linux
    python: str  # "3.11", "3.13t" for free-threaded
    torch: TorchInfo | None
    driver: str | None  # NVIDIA driver version, "535.104.05"; None without a driver
    gpus: tuple[Gpu, ...]
    # Where each fact came from (probe only; not needed in --env files).
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def python_version(self) -> tuple[int, int]:
        major, minor = self.python.rstrip("t").split(".")
        return int(major), int(minor)

    @property
    def free_threaded(self) -> bool:
        return self.python.endswith("t")


# ---------------------------------------------------------------------------------------------------
# Reading and writing the JSON shape


def version_tuple(text: str) -> tuple[int, ...]:
    """Driver versions compare numerically: "525.60.13" < "535.104.05", and a plain "580" works too."""
    return tuple(int(part) for part in text.split("."))


def _need(cond: bool, path: str, got: Any, fix: str) -> None:
    if not cond:
        raise EnvError(f"{path}: got {got!r}; {fix}")


def _str_field(data: Mapping[str, Any], key: str, path: str, fix: str, nullable: bool = False) -> str | None:
    value = data.get(key)
    if value is None and nullable:
        return None
    _need(isinstance(value, str) and bool(value), f"{path}{key}", value, fix)
    return value


def env_from_json(data: Any) -> Env:
    """Validate a parsed environment description; every error names the field and how to fix it."""
    _need(
        isinstance(data, dict),
        "environment",
        type(data).__name__,
        "write a JSON object like `fa probe --json`",
    )
    os_name = _str_field(data, "os", "", f"use one of {', '.join(OS_NAMES)}")
    _need(os_name in OS_NAMES, "os", os_name, f"use one of {', '.join(OS_NAMES)}")
    arch = _str_field(data, "arch", "", 'write the machine architecture, e.g. "x86_64" or "aarch64"')
    glibc = _str_field(
        data, "glibc", "", 'write the glibc version like "2.35", or null off glibc Linux', True
    )
    if glibc is not None:
        _need(re.fullmatch(r"2\.\d+", glibc) is not None, "glibc", glibc, 'write it like "2.35"')
    python = _str_field(data, "python", "", 'write major.minor like "3.11" ("3.13t" if free-threaded)')
    _need(
        re.fullmatch(r"3\.\d+t?", python or "") is not None,
        "python",
        python,
        'write major.minor like "3.11" ("3.13t" if free-threaded)',
    )

    torch = None
    raw_torch = data.get("torch")
    if raw_torch is not None:
        _need(isinstance(raw_torch, dict), "torch", raw_torch, "write an object or null when torch is absent")
        version = _str_field(raw_torch, "version", "torch.", 'write torch.__version__, e.g. "2.5.1+cu124"')
        try:
            Version(version or "")
        except InvalidVersion:
            raise EnvError(f'torch.version: got {version!r}; write torch.__version__, e.g. "2.5.1+cu124"')
        cuda = _str_field(raw_torch, "cuda", "torch.", 'write torch.version.cuda like "12.4", or null', True)
        if cuda is not None:
            _need(re.fullmatch(r"\d+\.\d+", cuda) is not None, "torch.cuda", cuda, 'write it like "12.4"')
        hip = _str_field(raw_torch, "hip", "torch.", "write torch.version.hip, or null", True)
        abi = raw_torch.get("cxx11abi")
        _need(
            abi is None or isinstance(abi, bool),
            "torch.cxx11abi",
            abi,
            "write true or false (torch._C._GLIBCXX_USE_CXX11_ABI), or null if unknown",
        )
        torch = TorchInfo(version=version or "", cuda=cuda, hip=hip, cxx11abi=abi)

    driver = None
    raw_driver = data.get("driver")
    if raw_driver is not None:
        _need(isinstance(raw_driver, dict), "driver", raw_driver, 'write {"version": "535.104.05"} or null')
        driver = _str_field(raw_driver, "version", "driver.", 'write the driver version like "535.104.05"')
        _need(
            re.fullmatch(r"\d+(\.\d+)*", driver or "") is not None,
            "driver.version",
            driver,
            'write the driver version like "535.104.05" (nvidia-smi shows it)',
        )

    raw_gpus = data.get("gpus", [])
    _need(isinstance(raw_gpus, list), "gpus", raw_gpus, "write a list (empty without NVIDIA GPUs)")
    gpus = []
    for i, raw in enumerate(raw_gpus):
        _need(isinstance(raw, dict), f"gpus[{i}]", raw, 'write {"name": ..., "sm": "8.6", "memory_mib": ...}')
        name = _str_field(raw, "name", f"gpus[{i}].", "write the GPU name as nvidia-smi shows it")
        sm = _str_field(raw, "sm", f"gpus[{i}].", 'write the compute capability like "8.6"')
        _need(
            re.fullmatch(r"\d+\.\d+", sm or "") is not None,
            f"gpus[{i}].sm",
            sm,
            'write the compute capability like "8.6" (nvidia-smi --query-gpu=compute_cap)',
        )
        mem = raw.get("memory_mib")
        _need(
            mem is None or (isinstance(mem, int) and not isinstance(mem, bool)),
            f"gpus[{i}].memory_mib",
            mem,
            "write an integer number of MiB, or null",
        )
        gpus.append(Gpu(name=name or "", sm=sm or "", memory_mib=mem))
    return Env(
        os=os_name or "",
        arch=arch or "",
        glibc=glibc,
        python=python or "",
        torch=torch,
        driver=driver,
        gpus=tuple(gpus),
    )


def env_to_json(env: Env) -> dict[str, Any]:
    out: dict[str, Any] = {
        "os": env.os,
        "arch": env.arch,
        "glibc": env.glibc,
        "python": env.python,
        "torch": None
        if env.torch is None
        else {
            "version": env.torch.version,
            "cuda": env.torch.cuda,
            "hip": env.torch.hip,
            "cxx11abi": env.torch.cxx11abi,
        },
        "driver": None if env.driver is None else {"version": env.driver},
        "gpus": [{"name": g.name, "sm": g.sm, "memory_mib": g.memory_mib} for g in env.gpus],
    }
    if env.sources:
        out["sources"] = dict(env.sources)
    return out


# ---------------------------------------------------------------------------------------------------
# Probing this machine


@dataclass(frozen=True)
class ProbePaths:
    """Everything the probe reads, injectable so tests can fake a machine."""

    sys_driver_version: Path = Path("/sys/module/nvidia/version")
    proc_driver_version: Path = Path("/proc/driver/nvidia/version")
    nvidia_smi: str = "nvidia-smi"  # looked up on PATH
    use_nvml: bool = True
    torch_dir: Path | None = None  # None: find the installed torch package without importing it


def probe(paths: ProbePaths = ProbePaths()) -> Env:
    sources: dict[str, str] = {}
    driver, gpus = _nvml(sources) if paths.use_nvml else (None, [])
    if driver is None:
        driver = _read_driver_file(paths, sources)
    if not gpus:
        smi_driver, gpus = _nvidia_smi(paths.nvidia_smi, sources)
        driver = driver or smi_driver
    torch_dir = paths.torch_dir if paths.torch_dir is not None else find_torch()
    torch = probe_torch(torch_dir, sources) if torch_dir else None
    return Env(
        os=_os_name(),
        arch=_arch(),
        glibc=_glibc(),
        python=python_version(),
        torch=torch,
        driver=driver,
        gpus=tuple(gpus),
        sources=sources,
    )


def _os_name() -> str:
    name = sys.platform
    return "windows" if name.startswith("win") else "darwin" if name == "darwin" else "linux"


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


def python_version() -> str:
    """ "3.11", or "3.13t" for a free-threaded build (by how it was built, not whether the GIL is on now)."""
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    return f"{sys.version_info.major}.{sys.version_info.minor}{'t' if free_threaded else ''}"


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
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(
                Gpu(
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    sm=f"{major}.{minor}",
                    memory_mib=int(memory),
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


_PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def _read_driver_file(paths: ProbePaths, sources: dict[str, str]) -> str | None:
    try:
        text = paths.sys_driver_version.read_text().strip()
        if re.fullmatch(r"\d+(\.\d+)+", text):
            sources["driver"] = str(paths.sys_driver_version)
            return text
    except OSError:
        pass
    try:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." (open modules say
        # "Open Kernel Module for x86_64  570.86.15")
        match = _PROC_VERSION.search(paths.proc_driver_version.read_text())
        if match:
            sources["driver"] = str(paths.proc_driver_version)
            return match.group(1)
    except OSError:
        pass
    return None


def _nvidia_smi(command: str, sources: dict[str, str]) -> tuple[str | None, list[Gpu]]:
    exe = shutil.which(command)
    if exe is None:
        return None, []
    # compute_cap needs nvidia-smi from driver 510 on; older ones give the driver only.
    for fields in ("driver_version,name,compute_cap,memory.total", "driver_version,name,memory.total"):
        try:
            done = subprocess.run(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                check=False,
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None, []
        if done.returncode == 0:
            break
    else:
        return None, []
    driver, gpus = None, []
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3:
            continue
        driver = cells[0]
        if len(cells) == 4 and re.fullmatch(r"\d+\.\d+", cells[2]):
            memory = int(cells[3]) if cells[3].isdigit() else None
            gpus.append(Gpu(name=cells[1], sm=cells[2], memory_mib=memory))
    if driver:
        sources.setdefault("driver", "nvidia-smi")
    if gpus:
        sources["gpus"] = "nvidia-smi"
    return driver, gpus


def find_torch() -> Path | None:
    """The installed torch package's directory, found without importing it."""
    # find_spec on a top-level name locates the package without executing it.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def probe_torch(torch_dir: Path, sources: dict[str, str] | None = None) -> TorchInfo | None:
    """torch's version, CUDA/HIP build and C++ ABI from its files (never `import torch` here)."""
    sources = {} if sources is None else sources
    values = _read_version_py(torch_dir / "version.py")
    version = values.get("__version__")
    if not isinstance(version, str):
        return None
    cuda, hip = values.get("cuda"), values.get("hip")
    abi, how = _cxx11abi(torch_dir)
    if how:
        sources["cxx11abi"] = how
    return TorchInfo(
        version=version,
        cuda=cuda if isinstance(cuda, str) else None,
        hip=hip if isinstance(hip, str) else None,
        cxx11abi=abi,
    )


def _read_version_py(path: Path) -> dict[str, object]:
    """The plain assignments of torch/version.py (`__version__ = '2.5.1+cu124'`, `cuda = '12.4'`)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return {}
    values: dict[str, object] = {}
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (node.target if isinstance(node, ast.AnnAssign) else None)
        )
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


# A c10 symbol carrying the [abi:cxx11] tag (e.g. c10::Device::str[abi:cxx11]()) exists only in a
# library built with _GLIBCXX_USE_CXX11_ABI=1.
_CXX11_TAGGED = re.compile(rb"_ZN[A-Za-z0-9_]*3c10[A-Za-z0-9_]*B5cxx11")


def _cxx11abi(torch_dir: Path) -> tuple[bool | None, str]:
    if _os_name() != "linux":
        return None, ""  # the libstdc++ dual ABI exists only on Linux
    cmake = torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    try:  # older torch writes the flag into its CMake config
        match = re.search(r"_GLIBCXX_USE_CXX11_ABI=([01])", cmake.read_text())
        if match:
            return match.group(1) == "1", "TorchConfig.cmake"
    except OSError:
        pass
    try:
        data = (torch_dir / "lib" / "libc10.so").read_bytes()
        if b"_ZN3c10" in data:
            return _CXX11_TAGGED.search(data) is not None, "libc10.so symbols"
    except OSError:
        pass
    # Last resort: ask torch itself, in a child so this process never imports it.
    code = "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    out = done.stdout.strip()
    return (out == "1", "import torch (subprocess)") if out in ("0", "1") else (None, "")
