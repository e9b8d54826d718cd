"""The CPU architectures fa builds wheels for, and what building for one needs on this machine.

A wheel's platform is the CPU its host binding runs on: the cubins are device code and identical for
every CPU, so only the binding (and the torch headers it is compiled against) differ. A binding for
the machine's own architecture is built with the host compiler; for the other one with a cross
compiler from the distribution's packages (Debian: g++-aarch64-linux-gnu, g++-x86-64-linux-gnu).
The wheel's platform tag is still read from the finished binary (buildtool/builder/platform_tag.py).
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
from dataclasses import dataclass

X86_64 = "x86_64"
AARCH64 = "aarch64"
PLATFORMS = (X86_64, AARCH64)
DEFAULT_PLATFORMS = (X86_64,)
# The glibc floor of the release's Linux wheels: they are built in cibuildwheel's manylinux_2_28 images
# (release/workflow.py). A wheel built elsewhere is tagged by the glibc it links against, often newer.
RELEASE_GLIBC = (2, 28)
RELEASE_MANYLINUX = "manylinux_{}_{}".format(*RELEASE_GLIBC)

# Other spellings people (and platform.machine() on some systems) use for the same CPUs.
ALIASES = {"amd64": X86_64, "x64": X86_64, "x86-64": X86_64, "arm64": AARCH64, "armv8": AARCH64}


@dataclass(frozen=True)
class Target:
    platform: str  # "aarch64"
    triple: str  # GNU target triple, "aarch64-linux-gnu"
    cross_package: str  # Debian package with the cross g++ for this target
    qemu: str  # qemu-user binary that runs this target's programs on another CPU


TARGETS = {
    X86_64: Target(X86_64, "x86_64-linux-gnu", "g++-x86-64-linux-gnu", "qemu-x86_64"),
    AARCH64: Target(AARCH64, "aarch64-linux-gnu", "g++-aarch64-linux-gnu", "qemu-aarch64"),
}


def canonical(name: str) -> str | None:
    """ "arm64" -> "aarch64", "x86_64" -> "x86_64"; None for a CPU fa builds nothing for."""
    low = name.lower()
    low = ALIASES.get(low, low)
    return low if low in PLATFORMS else None


def host() -> str:
    """This machine's CPU as a platform name (may be one fa does not build for, e.g. "riscv64")."""
    machine = platform.machine().lower()
    return ALIASES.get(machine, machine)


def cxx_for(target: str) -> list[str]:
    """The C++ compiler for bindings that run on `target`: FA_CXX_<TARGET> if set; for the host's own
    CPU, CXX or g++; otherwise the cross g++ of the target triple."""
    override = os.environ.get(f"FA_CXX_{target.upper()}")
    if override:
        return shlex.split(override)
    if target == host():
        return shlex.split(os.environ.get("CXX") or "g++")
    return [f"{TARGETS[target].triple}-g++"]


def cxx_install_hint(target: str) -> str:
    """How to get the compiler `cxx_for(target)` names, for error messages."""
    if target == host():
        return "install g++ (apt-get install g++), or set CXX"
    t = TARGETS[target]
    return (
        f"install the cross compiler (apt-get install {t.cross_package}), set FA_CXX_{target.upper()}, "
        f"or drop {target} from platforms in matrix.yaml"
    )


def has_cxx(target: str) -> bool:
    cxx = cxx_for(target)
    return bool(cxx) and shutil.which(cxx[0]) is not None


# Windows wheels fa makes: the x86_64 stable-ABI wheels' device code with a binding MSVC builds
# (buildtool/builder/windows_wheel.py). PyTorch publishes CUDA builds for Windows on x86_64 only.
WINDOWS_TAGS = {"win_amd64": X86_64}


def windows_cpu(platform_tag: str) -> str | None:
    """win_amd64 -> "x86_64"; None for any other tag."""
    return WINDOWS_TAGS.get(platform_tag)


def wheel_cpu(platform_tag: str) -> str | None:
    """The CPU of a platform tag fa builds kernel wheels for, Linux or Windows; None for any other."""
    return linux_cpu(platform_tag) or windows_cpu(platform_tag)


def linux_cpu(platform_tag: str) -> str | None:
    """The CPU of a Linux wheel platform tag we build for: manylinux1_x86_64, manylinux2014_aarch64,
    manylinux_2_28_x86_64, linux_aarch64 -> "x86_64" / "aarch64"; None for anything else."""
    if "linux" not in platform_tag:
        return None
    return next((p for p in PLATFORMS if platform_tag.endswith("_" + p)), None)
