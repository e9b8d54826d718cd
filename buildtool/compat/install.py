"""`fa install`: the side effects. Fetch the selected wheel, check its sha256 against the index, try it in a
scratch --target directory, then install it for real with pip (or uv) and confirm it imports.

Only fa-attn changes: every installer call passes --no-deps (and --no-index, so nothing is downloaded
behind our back), so torch and every other package stay exactly as they were. A refused or failed
install leaves the environment as it was; if the final check fails after the real install, the new
fa-attn is removed and the previous one restored from the index when it is there (else the result
says exactly what state is left).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from buildtool.compat.choose import Selection
from buildtool.compat.wheel_index import WheelIndex, WheelIndexError, fetch_wheel, wheel_location
from buildtool.core.runtime import schema
from buildtool.errors import FaError

DIST_NAME = "fa-attn"
_CHECK_IMPORT = "import fa_attn; print(fa_attn.__file__)"
_VERSION_OF = (
    "import importlib.metadata as m, sys\n"
    "try:\n    print(m.version('fa-attn'))\n"
    "except m.PackageNotFoundError:\n    sys.exit(3)\n"
)
_TIMEOUT_S = 600


class InstallError(FaError):
    """The install was refused or failed; the message says why and what state the environment is in."""


@dataclass(frozen=True)
class Installer:
    """pip, or uv when it is on PATH, always driving one interpreter."""

    python: str
    uv: str | None

    def install(self, wheel: str, target: Path | None = None) -> list[str]:
        where = ["--target", str(target)] if target else []
        if self.uv:
            return [
                self.uv,
                "pip",
                "install",
                "--python",
                self.python,
                "--no-deps",
                "--no-index",
                "--reinstall-package",
                DIST_NAME,
                *where,
                wheel,
            ]
        return [
            self.python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            "--disable-pip-version-check",
            "--no-input",
            *where,
            wheel,
        ]

    def uninstall(self) -> list[str]:
        if self.uv:
            return [self.uv, "pip", "uninstall", "--python", self.python, DIST_NAME]
        return [self.python, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", DIST_NAME]


def default_installer(python: str, use_uv: bool | None = None) -> Installer:
    uv = shutil.which("uv") if use_uv is not False else None
    if use_uv and uv is None:
        raise InstallError("uv was asked for but is not on PATH; install uv or let fa use pip")
    return Installer(python=python, uv=uv)


@dataclass(frozen=True)
class InstallPlan:
    selection: Selection
    entry: schema.IndexEntry | None  # None: nothing fits
    source: str | None  # path or URL of the wheel
    installer: Installer

    def command(self) -> list[str] | None:
        return self.installer.install(self.source) if self.source else None


@dataclass(frozen=True)
class InstallResult:
    installed: str  # the fa-attn version now installed
    previous: str | None  # the fa-attn version before, if any
    location: str  # where `import fa_attn` found it
    commands: tuple[str, ...]  # what was run, for the log


def plan_install(index: WheelIndex, selection: Selection, installer: Installer) -> InstallPlan:
    entry = selection.selected
    return InstallPlan(
        selection=selection,
        entry=entry,
        source=wheel_location(index, entry) if entry else None,
        installer=installer,
    )


def installed_version(python: str) -> str | None:
    done = _run([python, "-c", _VERSION_OF])
    return done.stdout.strip() if done.returncode == 0 else None


def run_install(
    plan: InstallPlan, index: WheelIndex, log: Callable[[str], None] = lambda _: None
) -> InstallResult:
    if plan.entry is None:
        raise InstallError("no wheel fits this machine (fa doctor says why); nothing installed")
    entry, installer = plan.entry, plan.installer
    commands: list[str] = []

    def run(
        cmd: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        commands.append(shlex.join(cmd))
        log(f"{what}: {shlex.join(cmd)}")
        return _run(cmd, env=env, cwd=cwd)

    with tempfile.TemporaryDirectory(prefix="fa-install-") as tmp_name:
        tmp = Path(tmp_name)
        log(f"fetching {plan.source}")
        try:
            wheel = fetch_wheel(index, entry, tmp)
        except WheelIndexError as exc:
            raise InstallError(f"{exc}; nothing installed") from exc
        log(f"sha256 ok ({entry.sha256})")
        previous = installed_version(installer.python)

        # 1. A scratch install that touches nothing: does the wheel install and import at all?
        stage = tmp / "stage"
        done = run(installer.install(str(wheel), target=stage), "trial install")
        if done.returncode != 0:
            raise InstallError(f"the installer refused {entry.file}:\n{_tail(done)}\nnothing installed")
        done = run([installer.python, "-c", _CHECK_IMPORT], "trial import", env=_pythonpath(stage), cwd=tmp)
        if done.returncode != 0 or not done.stdout.strip().startswith(str(stage)):
            raise InstallError(f"`import fa_attn` fails with {entry.file}:\n{_tail(done)}\nnothing installed")

        # 2. The real install; pip undoes a half-done install itself.
        done = run(installer.install(str(wheel)), "install")
        if done.returncode != 0:
            raise InstallError(
                f"installing {entry.file} failed:\n{_tail(done)}\n{_state(installer.python, previous)}"
            )

        # 3. Confirm in a fresh interpreter; undo if it does not hold.
        done = run([installer.python, "-c", _CHECK_IMPORT], "check import", env=_pythonpath(None), cwd=tmp)
        now = installed_version(installer.python)
        if done.returncode != 0 or now != entry.info.version:
            problem = (
                _tail(done) if done.returncode != 0 else f"fa-attn is {now}, expected {entry.info.version}"
            )
            undo = _roll_back(installer, previous, index, tmp, run)
            raise InstallError(f"the installed {entry.file} does not work: {problem}\n{undo}")
        return InstallResult(
            installed=entry.info.version,
            previous=previous,
            location=done.stdout.strip(),
            commands=tuple(commands),
        )


def _roll_back(
    installer: Installer,
    previous: str | None,
    index: WheelIndex,
    tmp: Path,
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> str:
    run(installer.uninstall(), "roll back")
    if previous is None:
        return f"rolled back: {DIST_NAME} removed again; the environment is as it was"
    match = next((e for e in index.entries if e.info.version == previous), None)
    if match is not None:
        try:
            wheel = fetch_wheel(index, match, tmp)
            if run(installer.install(str(wheel)), "restore previous").returncode == 0:
                return f"rolled back: the previous {DIST_NAME} {previous} is reinstalled from the index"
        except WheelIndexError:
            pass
    return (
        f"rolled back: the new {DIST_NAME} is removed, but the previous {DIST_NAME} {previous} could "
        f"not be restored (it is not in the index); {DIST_NAME} is now absent: reinstall it with "
        f"pip install --no-deps '{DIST_NAME}=={previous}'"
    )


def _state(python: str, previous: str | None) -> str:
    now = installed_version(python)
    if now == previous:
        return f"{DIST_NAME} is as before ({previous or 'not installed'})"
    return f"{DIST_NAME} is now {now or 'absent'} (was {previous or 'not installed'})"


def _pythonpath(stage: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if stage is not None:
        env["PYTHONPATH"] = str(stage)
    return env


def _run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd, check=False, capture_output=True, text=True, env=env, cwd=cwd, timeout=_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))


def _tail(done: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    text = (done.stderr or "") + (done.stdout or "")
    return "\n".join(text.strip().splitlines()[-lines:])
