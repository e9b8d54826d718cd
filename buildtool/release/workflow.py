"""The release workflow (.github/workflows/release.yml), rendered from matrix.yaml.

One build job per platform (CPU) and shard. The shards are `fa build --platform P --shard K/N` with N
the number of CUDA majors the matrix builds for P: plan.shard_wheels splits by CUDA major first, so each
job builds one major's wheels for one CPU, which share every kernel program. aarch64 jobs run natively
on GitHub's Arm runners in the aarch64 manylinux image (NVRTC's aarch64 wheel compiles the kernels
there); on a laptop the same wheels come from the x86_64 cross build. Each job runs cibuildwheel once
per wheel of its shard (cibuildwheel takes exactly one wheel from each build, and fa's wheels are
py3-none, one per CUDA major, torch minor and C++ ABI, not one per Python); the build step is
`fa build --platform P --shard K/N` through the in-tree PEP 517 backend in ci/release/. A last job merges the shards, indexes them and publishes.

The text depends on matrix.yaml only, never on PyPI's torch releases, so `fa ci render --check` gives
the same answer offline and on every day. Pure: matrix in, text out; the CLI writes the file.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from packaging.version import Version

from buildtool.builder.matrix import Matrix, MatrixError
from buildtool.builder.platform_tag import TORCH_LIBS
from buildtool.core.cpus import RELEASE_MANYLINUX
from buildtool.release import pins

TEMPLATE = "release.yml.j2"
DEFAULT_OUT = Path(".github/workflows/release.yml")

# The CPython whose build identifier each cibuildwheel run uses (one per run: the wheel is py3-none),
# and in whose test venv every wheel is smoke-tested with its own torch minor's CPU build: every torch
# minor fa supports publishes cp312 wheels (2.4 covers 3.8 to 3.12, 2.15 covers 3.11 to 3.15).
BUILD_PYTHON = "cp312"
# cibuildwheel's package dir: the in-tree backend whose build step is `fa build --shard K/N`.
CIBW_PACKAGE_DIR = "ci/release"
# Where the runner's FA_CACHE and fa build's output are mounted in cibuildwheel's container, so the
# shard compiles once per job and every later run of the job only picks its wheel from the output.
CONTAINER_MOUNT = "/fa"


@dataclass(frozen=True)
class Platform:
    """Where one platform's wheels are built: a GitHub runner and cibuildwheel's manylinux image."""

    arch: str  # "x86_64": the platform tag's machine, CIBW_ARCHS
    runner: str  # GitHub Actions runner label
    manylinux_image: str  # cibuildwheel's manylinux-<arch>-image


# Where each CPU of matrix.yaml's `platforms` is built.
PLATFORMS = {
    "x86_64": Platform("x86_64", "ubuntu-24.04", RELEASE_MANYLINUX),
    "aarch64": Platform("aarch64", "ubuntu-24.04-arm", RELEASE_MANYLINUX),
}


@dataclass(frozen=True)
class BuildJob:
    platform: Platform
    shard: tuple[int, int]  # (K, N), 1-based, among this platform's shards
    universal: bool = False  # this job also makes the py3-none-any wheel (shard 1 of the first CPU)

    @property
    def id(self) -> str:
        return f"build-{self.platform.arch}-{self.shard[0]}"

    @property
    def shard_text(self) -> str:
        return f"{self.shard[0]}/{self.shard[1]}"

    @property
    def build_args(self) -> str:
        """What selects this job's wheels on the `fa build` command line."""
        return f"--platform {self.platform.arch} --shard {self.shard_text}"

    @property
    def build_identifier(self) -> str:
        return f"{BUILD_PYTHON}-manylinux_{self.platform.arch}"


@dataclass(frozen=True)
class WindowsJob:
    """The win_amd64 wheels: the x86_64 stable-ABI wheels' device code with an MSVC-built binding
    (buildtool/builder/windows_wheel.py), made after the x86_64 build jobs on a Windows runner."""

    needs: tuple[str, ...]  # the x86_64 build jobs, whose wheels it repacks
    floor: str  # matrix.yaml's stable_abi: the torch whose Windows wheel gives headers and import libraries
    runner: str = "windows-latest"


@dataclass(frozen=True)
class ReleaseWorkflow:
    matrix_path: str  # as the jobs pass it to fa build, relative to the repository root
    jobs: tuple[BuildJob, ...]
    universal_torch: str  # the torch minor the universal (no kernels) wheel is smoke-tested with
    windows: WindowsJob | None = None  # None: no stable-ABI x86_64 wheels to make Windows ones of


def from_matrix(matrix: Matrix, matrix_path: Path) -> ReleaseWorkflow:
    if matrix_path.is_absolute():
        raise MatrixError(
            str(matrix_path),
            "--matrix",
            "the workflow runs in a checkout, where this absolute path does not exist",
            "run fa ci render from the repository root with a relative --matrix (e.g. matrix.yaml)",
        )
    jobs = []
    for cpu in matrix.platforms:
        n = len(majors_built_for(matrix, cpu))
        jobs += [
            BuildJob(PLATFORMS[cpu], (k, n), cpu == matrix.platforms[0] and k == 1) for k in range(1, n + 1)
        ]
    newest = max(matrix.torch, key=Version)
    x86 = tuple(j.id for j in jobs if j.platform.arch == "x86_64")
    windows = WindowsJob(x86, str(matrix.stable_abi)) if matrix.stable_abi and x86 else None
    return ReleaseWorkflow(matrix_path.as_posix(), tuple(jobs), newest, windows)


def majors_built_for(matrix: Matrix, cpu: str) -> list[int]:
    """The CUDA majors with at least one cell on `cpu` that no exclude entry removes (from the matrix
    alone: a cell PyPI has no torch for still counts, so the answer does not change with PyPI)."""
    return [
        m
        for m in matrix.cuda
        if any(matrix.excluded_by(t, m, py, cpu) is None for t in matrix.torch for py in matrix.python)
    ]


def cibuildwheel_env(job: BuildJob, matrix_path: str) -> dict[str, str]:
    """The whole cibuildwheel configuration of one job, as the environment of its build step (a step's,
    not the job's: GitHub fills in `${{ runner.temp }}` only there)."""
    mount = CONTAINER_MOUNT
    excludes = " ".join(f"--exclude {lib}" for lib in sorted(TORCH_LIBS))
    arch = job.platform.arch
    return {
        "CIBW_BUILD": job.build_identifier,
        "CIBW_ARCHS": arch,
        f"CIBW_MANYLINUX_{arch.upper()}_IMAGE": job.platform.manylinux_image,
        "CIBW_CONTAINER_ENGINE": f"docker; create_args: --volume=${{{{ runner.temp }}}}/fa:{mount}",
        # The backend runs fa build from the fa installed by before-build, so no isolated build env.
        "CIBW_BUILD_FRONTEND": "pip; args: --no-build-isolation",
        "CIBW_BUILD_VERBOSITY": "1",  # fa build's plan and summary in the log
        "CIBW_BEFORE_BUILD": "pip install {project}",
        "CIBW_ENVIRONMENT": (
            f"FA_MATRIX={matrix_path} FA_SHARD={job.shard_text} FA_PLATFORM={arch} FA_CACHE={mount}/cache "
            f"FA_OUT={mount}/out PIP_CACHE_DIR={mount}/pip"
        ),
        "CIBW_ENVIRONMENT_PASS_LINUX": "FA_VARIANT",
        # torch's own libraries come with `import torch`: a wheel carrying copies would load a second
        # torch. Everything else outside the manylinux policy would be grafted (there is nothing).
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": f"auditwheel repair {excludes} -w {{dest_dir}} {{wheel}}",
        # Quoted: cibuildwheel runs it through a shell, and a checkout's path may hold spaces.
        "CIBW_TEST_COMMAND": f'python "{{project}}/{CIBW_PACKAGE_DIR}/smoke_test.py" "{{wheel}}"',
    }


def _yaml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def _template() -> jinja2.Template:
    # GitHub's own expressions are ${{ ... }} and shell code may hold ${#...}, so the template marks its
    # own parts with [= =] and [% %] instead of Jinja's braces.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        variable_start_string="[=",
        variable_end_string="=]",
        block_start_string="[%",
        block_end_string="%]",
        comment_start_string="[#",
        comment_end_string="#]",
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML
    )
    env.filters["yaml_str"] = _yaml_str
    return env.get_template(TEMPLATE)


def render(workflow: ReleaseWorkflow, action_pins: dict[str, pins.Pin] | None = None) -> str:
    """The workflow's text; each action at its commit in `action_pins` (default: action_pins.json)."""
    chosen = pins.load() if action_pins is None else action_pins
    return _template().render(
        uses=lambda name: pins.uses(chosen, name),
        wf=workflow,
        cibw={job.id: cibuildwheel_env(job, workflow.matrix_path) for job in workflow.jobs},
        package_dir=CIBW_PACKAGE_DIR,
    )


def staleness(path: Path, rendered: str, context_lines: int = 2, max_lines: int = 30) -> str | None:
    """None when `path` holds exactly `rendered`; otherwise what differs, for people."""
    try:
        current = path.read_text()
    except FileNotFoundError:
        return f"{path} does not exist"
    if current == rendered:
        return None
    diff = list(
        difflib.unified_diff(
            current.splitlines(),
            rendered.splitlines(),
            f"{path} (checked in)",
            f"{path} (rendered now)",
            n=context_lines,
            lineterm="",
        )
    )
    shown = diff[:max_lines] + (
        [f"... {len(diff) - max_lines} more diff lines"] if len(diff) > max_lines else []
    )
    return f"{path} is out of date:\n" + "\n".join(shown)
