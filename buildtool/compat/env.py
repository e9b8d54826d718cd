"""The environment description (docs/contracts.md section 6): the typed `Env` that probe() makes of this
machine and env_from_json() reads from a file written elsewhere (`fa doctor --env FILE`). Everything
downstream (fit, choose, install) works on an `Env` and never looks at the machine itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from buildtool.core import textfile
from buildtool.core.installed import TorchInfo
from buildtool.core.runtime import versions
from buildtool.core.textfile import shown
from buildtool.errors import UsageError

OS_NAMES = ("linux", "windows", "darwin")
_UUID = re.compile(r"(?:GPU-)?[0-9a-fA-F-]{0,64}", re.ASCII)  # "" too: unknown


class EnvError(UsageError):
    """An environment description that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Gpu:
    name: str
    sm: str  # compute capability "8.6"
    memory_mib: int | None
    uuid: str = ""  # "GPU-8c8a…" as NVML gives it; "" when unknown (verification records are per UUID)
    # Opt-in shared memory per block, bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin, torch's
    # shared_memory_per_block_optin); None: unknown, and the kernel table's figure for the arch stands
    # in (choose.device_of). The tiles the kernels run with are chosen by it.
    smem_per_block: int | None = None


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


def _parses(parse: Callable[[str], object], text: str | None) -> bool:
    try:
        parse(text or "")
    except ValueError:
        return False
    return True


# Every pattern is ASCII-only (as versions.py's are): str.isdigit() and re's \d accept Arabic-Indic
# digits and the like, which would pass here and break the comparisons downstream. The lengths are far
# above any real value and keep work bounded (a glibc "2.99999999" would have fa list that many
# manylinux tags).
_GLIBC = re.compile(r"2\.[0-9]{1,3}", re.ASCII)
_PYTHON = re.compile(r"3\.[0-9]{1,3}t?", re.ASCII)
_CUDA = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}", re.ASCII)
_ARCH = re.compile(r"[A-Za-z0-9_]{1,32}", re.ASCII)
_MAX_TEXT = 200  # a GPU name, a torch version
MAX_GPUS = 256
MAX_MEMORY_MIB = 1 << 30  # a petabyte: no GPU is near
MAX_SMEM = 1 << 24  # 16 MiB of shared memory per block: far above any GPU's (227 KiB)


def is_driver_version(text: str) -> bool:
    """ "535.104.05": what env_from_json accepts as a driver version (the probe checks what it reads)."""
    return _parses(versions.parse_driver, text)


def _need(cond: bool, path: str, got: Any, fix: str) -> None:
    if not cond:
        raise EnvError(f"{path}: got {shown(got)}; {fix}")


def _str_field(data: Mapping[str, Any], key: str, path: str, fix: str, nullable: bool = False) -> str | None:
    value = data.get(key)
    if value is None and nullable:
        return None
    _need(
        isinstance(value, str) and 0 < len(value) <= _MAX_TEXT and value.isprintable(),
        f"{path}{key}",
        value,
        fix if isinstance(value, str) and value.isprintable() else f"{fix} (printable text)",
    )
    return value


def _matches(pattern: re.Pattern[str], value: str | None) -> bool:
    return value is not None and pattern.fullmatch(value) is not None


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
    arch_fix = 'write the machine architecture, e.g. "x86_64" or "aarch64"'
    arch = _str_field(data, "arch", "", arch_fix)
    _need(_matches(_ARCH, arch), "arch", arch, arch_fix)
    glibc = _str_field(
        data, "glibc", "", 'write the glibc version like "2.35", or null off glibc Linux', True
    )
    if glibc is not None:
        _need(_matches(_GLIBC, glibc), "glibc", glibc, 'write it like "2.35"')
    python_fix = 'write major.minor like "3.11" ("3.13t" if free-threaded)'
    python = _str_field(data, "python", "", python_fix)
    _need(_matches(_PYTHON, python), "python", python, python_fix)

    torch = None
    raw_torch = data.get("torch")
    if raw_torch is not None:
        _need(isinstance(raw_torch, dict), "torch", raw_torch, "write an object or null when torch is absent")
        version_fix = 'write torch.__version__, e.g. "2.5.1+cu124"'
        version = _str_field(raw_torch, "version", "torch.", version_fix)
        try:
            release = Version(version or "").release
        except (InvalidVersion, ValueError):
            release = ()
        _need(
            len(release) >= 2 and all(part < 10**6 for part in release), "torch.version", version, version_fix
        )
        cuda = _str_field(raw_torch, "cuda", "torch.", 'write torch.version.cuda like "12.4", or null', True)
        if cuda is not None:
            _need(_matches(_CUDA, cuda), "torch.cuda", cuda, 'write it like "12.4"')
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
            _parses(versions.parse_driver, driver),
            "driver.version",
            driver,
            'write the driver version like "535.104.05" (nvidia-smi shows it)',
        )

    raw_gpus = data.get("gpus", [])
    _need(
        isinstance(raw_gpus, list) and len(raw_gpus) <= MAX_GPUS,
        "gpus",
        raw_gpus,
        "write a list (empty without NVIDIA GPUs)",
    )
    gpus = []
    for i, raw in enumerate(raw_gpus):
        _need(isinstance(raw, dict), f"gpus[{i}]", raw, 'write {"name": ..., "sm": "8.6", "memory_mib": ...}')
        name = _str_field(raw, "name", f"gpus[{i}].", "write the GPU name as nvidia-smi shows it")
        sm = _str_field(raw, "sm", f"gpus[{i}].", 'write the compute capability like "8.6"')
        _need(
            _parses(versions.parse_arch, sm),
            f"gpus[{i}].sm",
            sm,
            'write the compute capability like "8.6" (nvidia-smi --query-gpu=compute_cap)',
        )
        mem = raw.get("memory_mib")
        _need(
            mem is None
            or (isinstance(mem, int) and not isinstance(mem, bool) and 0 <= mem <= MAX_MEMORY_MIB),
            f"gpus[{i}].memory_mib",
            mem,
            "write the GPU's memory as a whole number of MiB (0 or more), or null",
        )
        uuid = raw.get("uuid", "")
        _need(
            isinstance(uuid, str) and _UUID.fullmatch(uuid) is not None,
            f"gpus[{i}].uuid",
            uuid,
            'write the GPU\'s UUID as nvidia-smi -L shows it ("GPU-" and hex digits with dashes), or leave it out',
        )
        smem = raw.get("smem_per_block")
        _need(
            smem is None or (isinstance(smem, int) and not isinstance(smem, bool) and 0 < smem <= MAX_SMEM),
            f"gpus[{i}].smem_per_block",
            smem,
            "write the GPU's opt-in shared memory per block in bytes (torch.cuda.get_device_properties(i)"
            ".shared_memory_per_block_optin, e.g. 101376), or leave it out",
        )
        gpus.append(Gpu(name=name or "", sm=sm or "", memory_mib=mem, uuid=uuid, smem_per_block=smem))
    return Env(
        os=os_name or "",
        arch=arch or "",
        glibc=glibc,
        python=python or "",
        torch=torch,
        driver=driver,
        gpus=tuple(gpus),
    )


def env_from_file(path: Path) -> Env:
    """The environment described in a JSON file (`fa doctor --env`); raises EnvError naming the file,
    the field and the fix, whatever the file holds."""
    where = f"--env {path}"
    fix = "write it like `fa probe --json` does"
    try:
        text = textfile.read_text(path, fix=fix)
    except textfile.TextFileError as e:
        raise EnvError(f"{where}: {e.problem}\n  fix: {e.fix}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise EnvError(f"{where}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); {fix}") from None
    except (ValueError, RecursionError) as e:  # a number past int()'s digit limit, nesting past the stack
        problem = "nested too deeply" if isinstance(e, RecursionError) else "a number too long to read"
        raise EnvError(f"{where}: not JSON fa can read ({problem}); {fix}") from None
    if isinstance(data, dict) and "os" not in data and isinstance(data.get("env"), dict):
        data = data["env"]  # a case of the test corpus (tests/select/envs): the env plus its expectations
    try:
        return env_from_json(data)
    except EnvError as e:
        raise EnvError(f"{where}: {e}") from None


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
        "gpus": [
            {
                "name": g.name,
                "sm": g.sm,
                "memory_mib": g.memory_mib,
                **({"uuid": g.uuid} if g.uuid else {}),
                **({"smem_per_block": g.smem_per_block} if g.smem_per_block is not None else {}),
            }
            for g in env.gpus
        ],
    }
    if env.sources:
        out["sources"] = dict(env.sources)
    return out
