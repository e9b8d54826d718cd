"""`fa install --build`: when no wheel in the index fits this machine's torch, build the one wheel it needs.

One wheel, not a matrix: this torch (its own installed headers, no download), this CPU, one CUDA major
(torch's, or --cuda for a CPU-only torch), and SASS for this GPU's arch only (no PTX), so the build is
one binding and the kernel programs of a single arch. From the stable-ABI floor on the binding is the
stable form, so the wheel keeps working when torch is upgraded; below it, the ATen form for this torch's
minor and C++ ABI. The wheels land in $FA_CACHE/local-wheels with their own index.json, where a second
run finds everything cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from buildtool.builder.compile import KernelTree
from buildtool.builder.matrix import Matrix, MatrixError, arch_option, load_matrix
from buildtool.builder.pipeline import BuildSummary, execute
from buildtool.builder.plan import Plan, local_plan
from buildtool.compat.env import Env
from buildtool.core import binding_forms, cache, cuda_facts, kernels_src
from buildtool.core.runtime import versions


@dataclass(frozen=True)
class LocalTarget:
    """What the one wheel is built for, decided from the probe and the command line."""

    torch_version: str
    cxx11abi: bool
    python: str
    cuda_major: int
    arch: str  # the GPU's compute capability, "8.9"
    stable_floor: str


def out_dir() -> Path:
    return cache.cache_dir() / "local-wheels"


def release_matrix() -> Matrix | None:
    """matrix.yaml beside the kernels (the repo's, or the copy packed into the tool's wheel): the
    package version and the stable-ABI floor of this fa."""
    root = kernels_src.kernels_dir()
    for path in (root / "matrix.yaml", root.parent / "matrix.yaml"):
        if path.is_file():
            return load_matrix(path)
    return None


def target(env: Env, arch: str | None, cuda: int | None, matrix: Matrix | None) -> LocalTarget:
    """Raises MatrixError (field "--arch", "--cuda" or "torch") when the probe cannot say it."""
    source = "fa install --build"
    if env.torch is None:
        raise MatrixError(
            source, "torch", "torch is not installed", "install torch first, then fa install --build"
        )
    if env.torch.cxx11abi is None:
        raise MatrixError(
            source, "torch", "cannot read the installed torch's C++ ABI from its files", "reinstall torch"
        )
    major = cuda or env.torch.cuda_major
    if major is None:
        raise MatrixError(
            source,
            "--cuda",
            f"torch {env.torch.version} is not a CUDA build, so it says no CUDA major",
            "pass --cuda 12 or 13 (the major of the CUDA torch you will run), or install a CUDA build of torch",
        )
    sm = arch or (env.gpus[0].sm if env.gpus else None)
    if sm is None:
        raise MatrixError(
            source,
            "--arch",
            "no NVIDIA GPU seen here to build for",
            "pass --arch with the GPU's compute capability, e.g. 8.0",
        )
    if cuda is not None:
        _check_cuda(env, cuda, source)
    if arch is not None:
        _check_arch(env, arch, source)
    floor = matrix.stable_abi if matrix and matrix.stable_abi else binding_forms.STABLE_ABI_MIN
    return LocalTarget(env.torch.version, env.torch.cxx11abi, env.python, major, sm, floor)


def _check_cuda(env: Env, cuda: int, source: str) -> None:
    """--cuda names a major fa has a toolkit for, whose kernels this machine's driver runs: a wheel
    it could not run would be installed only to fall back on every call."""
    if cuda not in cuda_facts.TOOLKITS:
        known = ", ".join(map(str, cuda_facts.TOOLKITS))
        raise MatrixError(source, "--cuda", f"CUDA {cuda} has no pinned toolkit in fa", f"use one of {known}")
    floor = cuda_facts.TOOLKITS[cuda].min_driver
    if env.driver is not None and not versions.driver_at_least(env.driver, floor):
        runs = [
            m for m, t in cuda_facts.TOOLKITS.items() if versions.driver_at_least(env.driver, t.min_driver)
        ]
        instead = f"pass --cuda {max(runs)}" if runs else "update the NVIDIA driver"
        raise MatrixError(
            source,
            "--cuda",
            f"CUDA {cuda} kernels need driver >= {floor}; this machine's driver is {env.driver}",
            f"{instead}, or update the driver to >= {floor}",
        )


def _check_arch(env: Env, arch: str, source: str) -> None:
    """--arch must give SASS that runs on GPU 0 (fa install installs for this machine): SASS runs on
    the same major at an equal or higher minor only. Without a GPU to compare, any arch goes."""
    wanted = arch_option(arch, source)
    if not env.gpus:
        return
    gpu = env.gpus[0].sm
    have = versions.parse_arch(gpu)
    if wanted[0] != have[0] or wanted > have:
        raise MatrixError(
            source,
            "--arch",
            f"sm {arch} SASS does not run on GPU 0 here ({env.gpus[0].name}, sm {gpu}): SASS runs only "
            f"on a GPU of the same major with an equal or higher minor",
            f"drop --arch (fa builds for GPU 0), pass --arch {gpu}, or build for another machine with "
            "fa build --local",
        )


def plan_for(t: LocalTarget, matrix: Matrix | None) -> Plan:
    return local_plan(
        t.torch_version,
        t.cxx11abi,
        t.python,
        (t.cuda_major,),
        matrix,
        stable_floor=t.stable_floor,
        sass=t.arch,
    )


def build(t: LocalTarget, matrix: Matrix | None, workers: int, show_progress: bool) -> BuildSummary:
    """Build the wheel into out_dir() (progress bars on stderr) and re-index that folder; the summary
    names the wheels this build made (the folder may hold earlier builds for other GPUs)."""
    return execute(plan_for(t, matrix), out_dir(), workers, KernelTree(), show_progress=show_progress)
