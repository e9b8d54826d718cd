"""Reasons: why a wheel does not fit an environment, and what is wrong with the stack beneath us.

Pure functions over `Env` (probe.py) and `schema.IndexEntry` (wheel_index.py). Every "no" is a `Reason` with a
stable code (fa_attn/reasons.py), a message with the numbers involved, and a one-line fix.
All reasons are collected, never only the first: a P100 with torch 1.13 hears about both.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags, mac_platforms
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from buildtool.compat.env import Env
from buildtool.core.cpus import RELEASE_GLIBC, RELEASE_MANYLINUX, canonical, windows_cpu
from buildtool.core.cuda_facts import TOOLKITS, TORCH_LAST_MINOR
from buildtool.core.runtime import all_wheel, decision, reasons, schema, versions

Reason = reasons.Reason  # the runtime's own: doctor's and a live call's reasons are one type


# ---------------------------------------------------------------------------------------------------
# Platform tags


def supported_tags(env: Env) -> list[Tag]:
    """The wheel tags `env` installs, most specific first, as pip would compute them on that machine."""
    platforms = _platforms(env)
    py = env.python_version
    interpreter = f"cp{py[0]}{py[1]}"
    # Free-threaded CPython has its own ABI ("cp313t") and cannot load abi3 extensions.
    abis = [interpreter + ("t" if env.free_threaded else "")]
    tags = list(cpython_tags(py, abis=abis, platforms=platforms))
    if env.free_threaded:
        tags = [t for t in tags if t.abi != "abi3"]
    tags += list(compatible_tags(py, interpreter=interpreter, platforms=platforms))
    return tags


def _platforms(env: Env) -> list[str]:
    arch = env.arch
    if env.os == "linux":
        platforms = []
        if env.glibc:
            glibc_minor = int(env.glibc.split(".")[1])
            # pip goes down to manylinux_2_5 on x86 and to 2_17 elsewhere (packaging/_manylinux.py).
            lowest = 5 if arch in ("x86_64", "i686") else 17
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
            for minor in range(glibc_minor, lowest - 1, -1):
                platforms.append(f"manylinux_2_{minor}_{arch}")
                if minor in legacy:
                    platforms.append(f"{legacy[minor]}_{arch}")
        return [*platforms, f"linux_{arch}"]
    if env.os == "darwin":
        # The env does not carry the macOS version; any wheel of ours is Linux or "any" anyway.
        return list(mac_platforms((15, 0), "arm64" if arch in ("arm64", "aarch64") else arch))
    return {"x86_64": ["win_amd64"], "arm64": ["win_arm64"], "aarch64": ["win_arm64"]}.get(
        arch, [f"win_{arch}"]
    )


# ---------------------------------------------------------------------------------------------------
# Does a wheel fit?


@dataclass(frozen=True)
class TagIndex:
    """An environment's supported tags as the fit asks about them, made once per environment (select
    asks for every wheel of an index): the tags, their (interpreter, abi) pairs and their platforms."""

    tags: frozenset[Tag]
    pairs: frozenset[tuple[str, str]]
    platforms: frozenset[str]

    @classmethod
    def of(cls, tags: Iterable[Tag]) -> TagIndex:
        tags = frozenset(tags)
        return cls(tags, frozenset((t.interpreter, t.abi) for t in tags), frozenset(t.platform for t in tags))


@functools.lru_cache(maxsize=4096)
def _file_tags(file: str) -> frozenset[Tag]:
    """A wheel file name's tags (InvalidWheelFilename for a name that is not a wheel's)."""
    return frozenset(parse_wheel_filename(file)[3])


def wheel_reasons(
    entry: schema.IndexEntry, env: Env, tags: TagIndex | list[Tag] | None = None
) -> list[Reason]:
    """Every reason `entry` cannot be installed and used on `env`; [] when it fits."""
    if not isinstance(tags, TagIndex):
        tags = TagIndex.of(supported_tags(env) if tags is None else tags)
    return (
        _tag_reasons(entry, env, tags)
        + _python_requirement(entry, env)
        + _torch_reasons(entry, env)
        + _driver_reasons(entry, env)
    )


def _tag_reasons(entry: schema.IndexEntry, env: Env, supported: TagIndex) -> list[Reason]:
    try:
        wheel_tags = _file_tags(entry.file)
    except InvalidWheelFilename as exc:
        return [
            Reason(
                "unsupported-platform",
                f"{entry.file} is not a valid wheel file name ({exc})",
                "rebuild the index with fa build",
            )
        ]
    if wheel_tags & supported.tags:
        return []
    reasons = []
    if not any((t.interpreter, t.abi) in supported.pairs for t in wheel_tags):
        wanted = ", ".join(sorted({f"{t.interpreter}-{t.abi}" for t in wheel_tags}))
        reasons.append(
            Reason(
                "python-unsupported",
                f"the wheel is for {wanted}; this Python is {env.python}",
                "use a Python the wheel is built for, or build one with fa build",
            )
        )
    wheel_platforms = {t.platform for t in wheel_tags}
    if not wheel_platforms & supported.platforms:
        needed = _glibc_needed(wheel_platforms, env)
        if needed is not None:
            reasons.append(
                Reason(
                    "glibc-too-old",
                    f"the wheel needs glibc {needed}; this system has {env.glibc}",
                    _glibc_fix(needed, env),
                )
            )
        else:
            where = f"{env.os} {env.arch}" + (f" glibc {env.glibc}" if env.glibc else "")
            reasons.append(
                Reason(
                    "unsupported-platform",
                    f"the wheel is for {', '.join(sorted(wheel_platforms))}; this is {where}",
                    _platform_fix(entry, env),
                )
            )
    return reasons


def _platform_fix(entry: schema.IndexEntry, env: Env) -> str:
    cpu = canonical(env.arch)
    for_windows = windows_cpu(entry.platform_tag or "") is not None
    if env.os == "linux" and for_windows:
        return "use the Linux wheel of the same variant (fa install picks it)"
    if env.os == "linux" and cpu is not None and cpu != entry.info.platform:
        return (
            f'use a wheel built for {cpu} (add "{cpu}" to platforms in matrix.yaml and run fa build), '
            "or the universal wheel (fallback only)"
        )
    if env.os == "windows" and cpu == "x86_64":
        return (
            "use a win_amd64 wheel (fa builds those of its stable-ABI variants only, for the torch minors "
            "from their floor on), or the universal wheel (fallback only)"
        )
    return "run on Linux x86_64 or aarch64 or Windows x86_64, or use the universal wheel (fallback only)"


def _glibc_fix(needed: str, env: Env) -> str:
    """A wheel built above the release's manylinux floor (a local build is tagged by the glibc it ran
    on) on a system that meets the floor: the release's wheels fit, only this build does not."""
    release = ".".join(map(str, RELEASE_GLIBC))
    have = tuple(int(p) for p in (env.glibc or "0.0").split(".")[:2])
    if have >= RELEASE_GLIBC and tuple(int(p) for p in needed.split(".")) > RELEASE_GLIBC:
        return (
            f"the release's {RELEASE_MANYLINUX} wheels fit glibc {env.glibc} (`fa install --index` with "
            f"the release's index); this one is a local build, which needs the glibc it was built on "
            f"({needed}): build on glibc {release} to {env.glibc} for one that fits here"
        )
    return f"use a system with glibc >= {needed} (e.g. a newer distribution or container)"


def _glibc_needed(wheel_platforms: set[str], env: Env) -> str | None:
    """The lowest glibc a manylinux wheel for this very arch asks for, when that is the only obstacle."""
    if env.os != "linux":
        return None
    legacy = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
    needs = []
    for plat in wheel_platforms:
        if not plat.endswith("_" + env.arch):
            continue
        head = plat[: -len(env.arch) - 1]
        if head in legacy:
            needs.append(legacy[head])
        elif head.startswith("manylinux_"):
            glibc_major, glibc_minor = head.split("_")[1:3]
            needs.append((int(glibc_major), int(glibc_minor)))
    return ".".join(map(str, min(needs))) if needs else None


def _python_requirement(entry: schema.IndexEntry, env: Env) -> list[Reason]:
    if not entry.requires_python:
        return []
    return list(_requires_python(entry.requires_python, env.python))


@functools.lru_cache(maxsize=256)
def _requires_python(requires_python: str, python: str) -> tuple[Reason, ...]:
    """Requires-Python against a Python ("3.13t"); cached: every wheel of an index says the same."""
    spec = SpecifierSet(requires_python)  # checked when the index was read (wheel_index)
    if spec.contains(Version(python.rstrip("t"))):
        return ()
    return (
        Reason(
            "python-unsupported",
            f"the wheel requires Python {spec}; this is {python}",
            f"use a Python matching {spec}",
        ),
    )


def assumed_cxx11abi(env: Env) -> bool | None:
    """The torch C++ ABI, from the env or, when it says null on Linux, from what the torch build implies.

    Facts (NGC release notes, PyTorch 2.7 release notes): NGC containers use the new ABI; from 2.7 every pip wheel does; before 2.7
    PyPI wheels used the old one."""
    if env.torch is None or env.os != "linux":
        return None
    if env.torch.cxx11abi is not None:
        return env.torch.cxx11abi
    version = Version(env.torch.version)
    if version.local and ".nv" in f".{version.local}":
        return True
    return version.release[:2] >= (2, 7)


def _torch_reasons(entry: schema.IndexEntry, env: Env) -> list[Reason]:
    if env.torch is None:
        # fa_attn is a torch extension: without torch there is nothing to run, not even the fallback.
        return [
            Reason(
                "torch-missing",
                "torch is not installed",
                "install torch first (pip install torch), then fa install",
            )
        ]
    too_old = decision.torch_too_old(env.torch.version)
    if entry.info.universal:  # pure Python: any torch the runtime can use
        return [too_old] if too_old else []
    abi = assumed_cxx11abi(env)
    assumed = env.torch.cxx11abi is None
    if entry.info.all_wheel:  # fits when one of its bindings does
        return all_wheel.binding_reasons(entry.info, env.torch.version, abi, assumed)
    return decision.binding_problems(entry.info, env.torch.version, abi, abi_assumed=assumed)


def as_installed(info: schema.WheelInfo, env: Env) -> schema.WheelInfo:
    """An all-wheel read as the per-variant wheel it acts as here: the binding for env's torch and the
    kernel set preferred for env's driver and torch (all_wheel.py); any other wheel as it is."""
    if not info.all_wheel:
        return info
    torch_cuda = env.torch.cuda_major if env.torch else None
    sets = all_wheel.kernel_sets_for(info, env.driver, torch_cuda) or [all_wheel.lowest_driver_set(info)]
    return all_wheel.view(info, binding_here(info, env), sets[0])


def binding_here(info: schema.WheelInfo, env: Env) -> schema.BindingFile:
    """The all-wheel's binding for env's torch (all_wheel.binding_for, the C++ ABI as assumed_cxx11abi
    reads it)."""
    torch = env.torch.version if env.torch else "0.0"
    assumed = env.torch is None or env.torch.cxx11abi is None
    return all_wheel.binding_for(info, torch, assumed_cxx11abi(env), assumed)


def untested_torch(entry: schema.IndexEntry, env: Env, view: schema.WheelInfo | None = None) -> Reason | None:
    """The warning for a stable-ABI wheel on a torch newer than the newest it was tested with; `view`
    is as_installed(entry.info, env) when the caller has it already."""
    if env.torch is None:
        return None
    return decision.untested_torch(view or as_installed(entry.info, env), env.torch.version)


def _driver_reasons(entry: schema.IndexEntry, env: Env) -> list[Reason]:
    # Without a driver there is nothing to compare; that is the stack's `no-gpu`, not a misfit.
    info = as_installed(entry.info, env)  # an all-wheel: the set this driver runs, or its oldest
    toolkit = TOOLKITS.get(info.cuda_major) if info.cuda_major is not None else None
    floor = toolkit.windows_min_driver if env.os == "windows" and toolkit is not None else None
    reason = decision.driver_too_old(info, env.driver, floor)
    return [reason] if reason else []


# ---------------------------------------------------------------------------------------------------
# The stack beneath us: things that make every call fall back, whichever wheel is installed


def stack_reasons(env: Env) -> list[Reason]:
    reasons = []
    if env.driver is None or not env.gpus:
        what = "no NVIDIA driver" if env.driver is None else "the driver reports no GPU"
        reasons.append(
            Reason(
                "no-gpu",
                f"{what} on this machine ({env.os} {env.arch})",
                "run on a machine with an NVIDIA GPU and driver; calls fall back to torch SDPA",
            )
        )
    torch = env.torch
    if torch is not None and torch.cuda is None:
        build = f"a ROCm build (hip {torch.hip})" if torch.hip else "a CPU-only build"
        reasons.append(
            Reason(
                "torch-not-cuda",
                f"torch {torch.version} is {build}",
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
            )
        )
    if torch is not None and torch.cuda_major is not None and env.driver is not None:
        floor = _torch_driver_floor(torch.cuda_major, env.os)
        if floor is not None and not versions.driver_at_least(env.driver, floor):
            reasons.append(
                Reason(
                    "torch-driver-too-old",
                    f"torch {torch.version} is built with CUDA {torch.cuda}, which needs driver >= {floor}; this "
                    f"driver is {env.driver}, so torch cannot use the GPU at all",
                    _older_torch_fix(torch.minor, env.driver, floor),
                )
            )
    return reasons


def _older_torch_fix(minor: str, driver: str, floor: str) -> str:
    """What to do when torch's CUDA is newer than the driver: update the driver, or take the newest
    torch built for a CUDA major this driver runs, which is an older torch when PyTorch has dropped that
    major (torch 2.15 has no CUDA 12 build: a driver below 580 runs no torch 2.15 at all)."""
    runs = [m for m, t in TOOLKITS.items() if versions.driver_at_least(driver, t.min_driver)]
    if not runs:
        return f"update the NVIDIA driver to >= {floor}"
    major = max(runs)
    last = TORCH_LAST_MINOR.get(major)
    if last is not None and Version(minor) > Version(last):
        return (
            f"update the NVIDIA driver to >= {floor}; torch {minor} has no CUDA {major} build (PyTorch's "
            f"last is torch {last}), so to keep this driver install torch {last} built for CUDA {major}"
        )
    return f"update the NVIDIA driver to >= {floor}, or install torch {minor} built for CUDA {major}"


def _torch_driver_floor(cuda_major: int, os_name: str) -> str | None:
    # Minor-version compatibility: a CUDA X.y runtime runs on any driver of major X's floor.
    toolkit = TOOLKITS.get(cuda_major)
    if toolkit is None:
        return None
    return toolkit.windows_min_driver if os_name == "windows" else toolkit.min_driver
