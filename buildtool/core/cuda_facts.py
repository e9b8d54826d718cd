"""What each CUDA major means for fa: the pinned NVRTC wheel, the driver it needs, the archs it targets.

Facts, with their sources:
- Minimum drivers under minor-version compatibility (SASS only): CUDA 11.x 450.80.02, 12.x 525.60.13,
  13.x 580 on Linux; 452.39, 528.33, 580 on Windows (CUDA Compatibility guide, "Minor Version
  Compatibility", table 2).
- PTX is JIT-compiled only by a driver at least as new as the toolkit that wrote it
  (cudaErrorUnsupportedPtxVersion otherwise), so a wheel's PTX needs the toolkit's own GA driver:
  11.8 GA 520.61.05, 12.9 GA 575.51.03, 13.0 GA 580.65.06 (CUDA Toolkit release notes, table 3).
- Targetable archs are what each NVRTC reports through nvrtcGetSupportedArchs (checked against the
  pinned libraries: 11.8 -> 35..90, 12.9 -> 50..121, 13.0 -> 75..121 with 110 for Thor).
- The arch-specific target sm_90a ("9.0a": wgmma, setmaxnreg) is compiled by NVRTC 12.9 and 13.0 (HGMMA in
  the SASS) and refused by 11.8 (issue 39's probe), so it is in the CUDA 12 and 13 lists only. Its SASS
  runs on compute capability 9.0 exactly (versions.sass_runs_on) and no PTX of it is ever shipped.
- Pinned files and hashes are PyPI's, for each host CPU NVIDIA publishes (x86_64 and aarch64/SBSA):
  a build on an Arm machine (GH200, DGX Spark, an Arm CI runner) compiles with the same NVRTC version.
- Our kernels need mma.sync with fp16 operands, so nothing below sm_75 is built.
- The last torch minor PyTorch built for each CUDA major (RELEASE.md and the per-release RFCs): CUDA 11
  (cu118) with 2.7 (pytorch/pytorch#147383, #155509); CUDA 12 (cu126, "legacy") with 2.14, as the 2.15
  RFC removes it (#190385). matrix.yaml's excludes say the same (a test keeps them equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from buildtool.core.runtime import versions


@dataclass(frozen=True)
class PinnedWheel:
    file: str
    sha256: str


@dataclass(frozen=True)
class Toolkit:
    major: int
    package: str  # the PyPI distribution holding NVRTC
    version: str  # pinned
    wheels: Mapping[
        str, PinnedWheel
    ]  # per host CPU ("x86_64", "aarch64"): the manylinux file of that version
    lib_subdir: str  # where libnvrtc.so.* sits inside the wheel
    min_driver: str  # to run SASS built by this toolkit (Linux)
    windows_min_driver: str  # the same on Windows, whose drivers are numbered differently
    ptx_min_driver: str  # to JIT PTX written by this toolkit
    archs: tuple[
        str, ...
    ]  # real targets this NVRTC can compile and fa has kernels for ("9.0a": arch-specific)
    default_archs: tuple[str, ...]  # SASS built when matrix.yaml names none; PTX for the last plain one

    def wheel_for(self, host: str) -> PinnedWheel | None:
        """The NVRTC wheel that runs on a `host` CPU, None if NVIDIA publishes none for it."""
        return self.wheels.get(host)


TOOLKITS: dict[int, Toolkit] = {
    11: Toolkit(
        major=11,
        package="nvidia-cuda-nvrtc-cu11",
        version="11.8.89",
        wheels={
            "x86_64": PinnedWheel(
                "nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl",
                "a8d02f3cba345be56b1ffc3e74d8f61f02bb758dd31b0f20e12277a5a244f756",
            ),
            "aarch64": PinnedWheel(
                "nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_aarch64.whl",
                "8ab17ed51e7c4928f7170a0551e3e3b42f89d973bd267ced9688c238b3e10aef",
            ),
        },
        lib_subdir="nvidia/cuda_nvrtc/lib",
        min_driver="450.80.02",
        windows_min_driver="452.39",
        ptx_min_driver="520.61.05",
        archs=("7.5", "8.0", "8.6", "8.7", "8.9", "9.0"),
        default_archs=("7.5", "8.0", "8.6", "9.0"),
    ),
    12: Toolkit(
        major=12,
        package="nvidia-cuda-nvrtc-cu12",
        version="12.9.86",
        wheels={
            "x86_64": PinnedWheel(
                "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
                "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
            ),
            "aarch64": PinnedWheel(
                "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                "096d4de6bda726415dfaf3198d4f5c522b8e70139c97feef5cd2ca6d4cd9cead",
            ),
        },
        lib_subdir="nvidia/cuda_nvrtc/lib",
        min_driver="525.60.13",
        windows_min_driver="528.33",
        ptx_min_driver="575.51.03",
        archs=("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.1", "10.3", "12.0", "12.1"),
        default_archs=("7.5", "8.0", "8.6", "9.0", "9.0a", "10.0", "12.0"),
    ),
    13: Toolkit(
        major=13,
        package="nvidia-cuda-nvrtc",
        version="13.0.88",
        wheels={
            "x86_64": PinnedWheel(
                "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
                "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
            ),
            "aarch64": PinnedWheel(
                "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                "d27f20a0ca67a4bb34268a5e951033496c5b74870b868bacd046b1b8e0c3267b",
            ),
        },
        lib_subdir="nvidia/cu13/lib",
        min_driver="580",
        windows_min_driver="580",
        ptx_min_driver="580.65.06",
        archs=(
            "7.5",
            "8.0",
            "8.6",
            "8.7",
            "8.8",
            "8.9",
            "9.0",
            "9.0a",
            "10.0",
            "10.3",
            "11.0",
            "12.0",
            "12.1",
        ),
        # 11.0 (Jetson Thor) only here: no other major can serve it (SASS never crosses majors, CUDA 12's
        # sm_101 is Thor's pre-13 name, which a CUDA 13 driver does not report, and 12.0's PTX cannot JIT
        # down to 11.0). 10.3 and 12.1 are served by 10.0's and 12.0's SASS (same major, higher minor).
        default_archs=("7.5", "8.0", "8.6", "9.0", "9.0a", "10.0", "11.0", "12.0"),
    ),
}


# CUDA major -> the older major whose SASS its wheels ship for every arch that older NVRTC targets and
# every unit whose NVRTC program (source, -D defines, options) is that older major's too: a chain,
# 13 -> 12 -> 11 (buildtool/builder/wheel_specs.py sass_compiler). A cubin runs on its arch under any
# driver at least as new as its toolkit's floor (NVIDIA's CUDA Compatibility guide: binary
# compatibility across driver upgrades), and each newer major's floor is above the older's (11.x
# 450.80.02, 12.x 525.60.13, 13.x 580), so a cu12 wheel needs NVRTC 12 only for the archs 11.8 cannot
# target (9.0a, 10.x, 12.x) and for units whose tile is per major (kernels/tiles.py), a cu13 wheel
# NVRTC 13 only for Jetson Thor's 11.0, and a cu11, cu12 and cu13 user on an A100 run the same cubin
# bytes. matrix.yaml `sass_per_major` opts a major back into its own.
SASS_FROM: dict[int, int] = {12: 11, 13: 12}


# Archs whose GPUs only ever come as the integrated GPU of a system-on-chip with one kind of CPU: their
# SASS is of use only in that CPU's wheels (fa builds x86_64 and aarch64; cpus.py). Arch -> (the CPU,
# the GPUs). Sources: 8.7 is Jetson Orin and DRIVE Orin (NVIDIA's CUDA GPUs list), whose SoC has Arm
# Cortex-A78AE cores; 11.0 is Thor (ollama/ollama#11999: "AGX Thor is CC 11.0, which requires CUDA
# v13"), whose SoC has Arm Neoverse-V3AE cores, and 10.1 is Thor's name before CUDA 13 (PTX ISA 9.0
# added sm_110 as the renamed sm_101); 12.1 is GB10 (DGX Spark and its OEM twins), a Grace Blackwell
# SoC with Arm cores. Were 12.1 ever paired with an x86_64 CPU, little would be lost: 12.0's SASS (in
# every default list) runs on it (same major, lower minor).
ONE_CPU_ARCHS: dict[str, tuple[str, str]] = {
    "8.7": ("aarch64", "Jetson Orin, DRIVE Orin"),
    "10.1": ("aarch64", "Thor, CUDA 12's name for it"),
    "11.0": ("aarch64", "Jetson Thor, DRIVE Thor"),
    "12.1": ("aarch64", "GB10: DGX Spark"),
}


def sass_of_use_on(arch: str, cpu: str) -> bool:
    """Whether a GPU of `arch` can sit beside a `cpu` CPU, so that a `cpu` wheel wants its SASS."""
    only = ONE_CPU_ARCHS.get(arch)
    return only is None or only[0] == cpu


# CUDA major -> the newest torch minor with a build for it; a major not listed still gets new ones.
TORCH_LAST_MINOR: dict[int, str] = {11: "2.7", 12: "2.14"}


def sm_name(target: str) -> str:
    """ "8.6" -> "sm_86" (the NVRTC real target); "10.0" -> "sm_100"; "9.0a" -> "sm_90a"."""
    major, minor, specific = versions.parse_target(target)
    return f"sm_{major}{minor}{versions.ARCH_SPECIFIC if specific else ''}"


def compute_name(target: str) -> str:
    """ "12.0" -> "compute_120", the virtual arch of a PTX image. ValueError for an arch-specific target:
    its PTX would JIT on its own compute capability only, where its SASS runs already, so fa ships none."""
    major, minor, specific = versions.parse_target(target)
    if specific:
        raise ValueError(
            f"arch: {target!r} is arch-specific: its PTX JITs on compute capability {major}.{minor} only, "
            "so fa builds its SASS and never its PTX"
        )
    return f"compute_{major}{minor}"


def plain(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The targets that are not arch-specific ("9.0a" left out), in their order."""
    return tuple(t for t in targets if not versions.arch_specific(t))
