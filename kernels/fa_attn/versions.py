"""How fa reads the version strings it meets, each in one place: compute capabilities ("8.6"), NVIDIA
driver versions ("575.51.03") and torch versions ("2.5.1+cu124"), and the oldest torch fa supports.

Stdlib only: the runtime uses it, and buildtool loads this same file (buildtool/core/runtime.py).
"""

from __future__ import annotations

import re

# The oldest torch fa runs with: ops.py registers its ops with torch.library.register_fake and
# register_autograd, and the binding reaches the CUDA stream through torch's C shim
# (aoti_torch/c/shim.h); both are new in torch 2.4.
MIN_TORCH = (2, 4)

# The oldest GPU fa's kernels are written for (Turing: mma.sync m16n8k8 and ldmatrix); kernels/tiles.py's
# MIN_ARCH, which the build reads (tests/kernels/test_kernel_compile.py keeps the two equal). An older GPU
# gets no kernel from any fa wheel, so its calls run on torch SDPA.
KERNEL_ARCH_FLOOR = "7.5"

# ASCII digits only (re's \d also takes Arabic-Indic and other digits, which int() then reads as
# numbers no file of fa's means), and lengths far above any real version, so a hostile value is refused
# here instead of reaching int() (4300 digits at most) or a comparison.
_ARCH = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})", re.ASCII)
_DRIVER = re.compile(r"[0-9]{1,5}(\.[0-9]{1,5}){0,3}", re.ASCII)
_TORCH = re.compile(r"([0-9]{1,3})(?:\.([0-9]{1,3}))?", re.ASCII)


def parse_arch(arch: str) -> tuple[int, int]:
    """A compute capability as NVIDIA writes it: "8.6" -> (8, 6), "10.0" -> (10, 0). ValueError for
    anything else ("sm_86", "86"): an arch is always written major.minor in fa's files."""
    match = _ARCH.fullmatch(str(arch).strip())
    if match is None:
        raise ValueError(f"arch: {arch!r} is not a compute capability; write it like '8.6'")
    return int(match[1]), int(match[2])


# An arch-specific target ("9.0a": NVRTC's sm_90a) uses instructions that exist on that one compute
# capability only (wgmma, setmaxnreg on 9.0): its SASS runs on compute capability 9.0 exactly, never on a
# higher minor, and its PTX (compute_90a) JITs to nothing else either (PTX ISA, "Target ISA notes": targets
# with suffix "a" "do not follow the onion layer model"; CUDA C++ Programming Guide, "Architecture-Specific
# Feature Set"), so fa ships no PTX of one. A target is what a
# build compiles for and an image is built for; a GPU's compute capability is always a plain arch.
ARCH_SPECIFIC = "a"
_TARGET = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})(a?)", re.ASCII)


def parse_target(target: str) -> tuple[int, int, bool]:
    """A compile target: "8.6" -> (8, 6, False), "9.0a" -> (9, 0, True). Tuples sort a target after the
    plain arch of its compute capability and before the next one ("9.0" < "9.0a" < "10.0"). ValueError
    for anything else."""
    match = _TARGET.fullmatch(str(target).strip())
    if match is None:
        raise ValueError(f"arch: {target!r} is not a compute capability or target; write it like '8.6' or '9.0a'")
    return int(match[1]), int(match[2]), bool(match[3])


def arch_specific(target: str) -> bool:
    """Whether `target` ("9.0a") is arch-specific: its SASS runs on its own compute capability only."""
    return parse_target(target)[2]


def target_arch(target: str) -> str:
    """The compute capability a target's SASS is built for: "9.0a" -> "9.0", "8.6" -> "8.6"."""
    major, minor, _ = parse_target(target)
    return f"{major}.{minor}"


def target_name(arch: str, specific: bool) -> str:
    """The target of a compute capability: ("9.0", True) -> "9.0a"; ("8.6", False) -> "8.6"."""
    parse_arch(arch)
    return f"{arch}{ARCH_SPECIFIC}" if specific else arch


def sass_runs_on(target: str, gpu: str) -> bool:
    """Whether SASS built for `target` runs on a GPU of compute capability `gpu`: an arch-specific
    target on its own capability only; any other within the GPU's major up to its minor."""
    major, minor, specific = parse_target(target)
    have = parse_arch(gpu)
    if specific:
        return (major, minor) == have
    return major == have[0] and minor <= have[1]


def parse_driver(version: str) -> tuple[int, int, int]:
    """ "575.51.03" -> (575, 51, 3); a plain "580" is (580, 0, 0), so it compares as NVIDIA means it."""
    text = str(version).strip()
    if _DRIVER.fullmatch(text) is None:
        raise ValueError(f"driver: {version!r} is not a driver version; write it like '575.51.03'")
    parts = [int(part) for part in text.split(".")] + [0, 0]
    return parts[0], parts[1], parts[2]


def driver_at_least(driver: str, floor: str) -> bool:
    """Driver versions compare numerically: "525.105.17" is newer than "525.60.13"."""
    return parse_driver(driver) >= parse_driver(floor)


def torch_version(version: str) -> tuple[int, int]:
    """torch's major and minor: "2.5.1+cu124", "2.7.0a0+e000cf0ad9.nv24.10" -> (2, 5), (2, 7): local
    and pre-release parts never change the minor a binding is built for."""
    match = _TORCH.match(str(version).strip())
    if match is None:
        raise ValueError(f"torch: {version!r} is not a torch version; write it like '2.5.1'")
    return int(match[1]), int(match[2] or 0)


def torch_minor(version: str) -> str:
    """ "2.5.1+cu124" -> "2.5", the spelling of manifests, matrix.yaml and wheel variants."""
    major, minor = torch_version(version)
    return f"{major}.{minor}"


def version_text(version: tuple[int, ...]) -> str:
    """(2, 4) -> "2.4"."""
    return ".".join(map(str, version))
