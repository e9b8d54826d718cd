"""`fa install`: the side effects. Fetch the selected wheel, check its sha256 and its own metadata
against the index, try it in a scratch --target directory (it must install, import, and be the version
and variant the index promised), then install it for real with pip (or uv) and confirm it imports.

Only fa-attn changes: every installer call passes --no-deps (and --no-index, so nothing is downloaded
behind our back), so torch and every other package stay exactly as they were. Nothing is touched until
every check that can be made beforehand has passed. Before the real install, the files of the fa-attn
already installed are copied aside (from its RECORD); if the real install or the final check fails,
the new fa-attn is removed and those files put back, so a failed install always leaves the previous
fa-attn in place (an fa-attn without a RECORD, which could not be put back, is refused up front).
"""

from __future__ import annotations

import importlib.metadata
import json
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
# The installed fa-attn's version, where its paths are relative to, and its files (RECORD), as JSON.
_FILES_OF = (
    "import importlib.metadata as m, json, sys\n"
    "try:\n    d = m.distribution('fa-attn')\n"
    "except m.PackageNotFoundError:\n    sys.exit(3)\n"
    "files = None if d.files is None else [str(f) for f in d.files]\n"
    "print(json.dumps({'version': d.version, 'root': str(d.locate_file('')), 'files': files}))\n"
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
    downgrade: str | None = None  # why the universal wheel, when the index has kernel wheels

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
        downgrade=_downgrade(index, selection),
    )


def _downgrade(index: WheelIndex, selection: Selection) -> str | None:
    """Said whenever the universal wheel is chosen over kernel wheels: installing it is a downgrade to
    no kernels at all, and the person should hear why rather than find out from slow calls."""
    entry = selection.selected
    if entry is None or not entry.info.universal or all(e.info.universal for e in index.entries):
        return None
    why = "; ".join(f"{r.code}: {r.message}" for r in selection.deciding[:3]) or "see fa doctor"
    return (
        f"a downgrade: {entry.file} is the universal wheel, with no kernels (every call falls back to "
        f"torch SDPA), because none of the index's kernel wheels fits this machine ({why}); "
        "fa doctor lists every wheel and its fixes"
    )


def installed_version(python: str) -> str | None:
    done = _run([python, "-c", _VERSION_OF])
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True)
class Previous:
    """The fa-attn installed before, copied aside so a failed install can put it back."""

    version: str
    root: Path  # what its RECORD paths are relative to (site-packages)
    files: tuple[str, ...]  # as RECORD lists them
    saved: Path  # the copies: saved/<i> is files[i]


def save_previous(python: str, where: Path) -> Previous | None:
    """Copy the installed fa-attn's files under `where`; None when none is installed. Raises InstallError
    (before anything was changed) when they cannot all be saved."""
    done = _run([python, "-c", _FILES_OF])
    if done.returncode == 3:
        return None
    try:
        info = json.loads(done.stdout)
        version, root, files = str(info["version"]), Path(info["root"]), info["files"]
    except (ValueError, KeyError, TypeError):
        raise InstallError(
            f"cannot list the installed {DIST_NAME}:\n{_tail(done)}\nnothing installed"
        ) from None
    if files is None:
        raise InstallError(
            f"the installed {DIST_NAME} {version} has no RECORD, so fa could not put it back if the new one "
            f"failed; nothing installed\n  fix: uninstall it first (pip uninstall {DIST_NAME}), then re-run"
        )
    try:
        where.mkdir(parents=True, exist_ok=True)
        # Numbered copies: a RECORD path may climb out of site-packages (../../bin/x).
        for i, rel in enumerate(files):
            if (root / rel).is_file():
                shutil.copy2(root / rel, where / str(i))
    except OSError as exc:
        raise InstallError(
            f"cannot save the installed {DIST_NAME} {version} aside ({exc}); nothing installed"
        ) from None
    return Previous(version=version, root=root, files=tuple(files), saved=where)


def _restore(
    installer: Installer, previous: Previous | None, run: Callable[..., subprocess.CompletedProcess[str]]
) -> str:
    """Remove whatever fa-attn is there now and put `previous` back; says what state is left."""
    if installed_version(installer.python) is not None:
        run(installer.uninstall(), "roll back")
    if previous is None:
        now = installed_version(installer.python)
        if now is None:
            return f"rolled back: {DIST_NAME} removed again; the environment is as it was"
        return f"could not roll back: {DIST_NAME} {now} is installed (none was before); remove it with pip uninstall {DIST_NAME}"
    try:
        for i, rel in enumerate(previous.files):
            saved = previous.saved / str(i)
            if saved.is_file():
                target = previous.root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(saved, target)
    except OSError as exc:
        return f"could not put the previous {DIST_NAME} {previous.version} back ({exc}); reinstall it"
    now = installed_version(installer.python)
    if now == previous.version:
        return f"rolled back: the previous {DIST_NAME} {previous.version} is back in place"
    return f"could not put the previous {DIST_NAME} {previous.version} back ({DIST_NAME} is now {now or 'absent'}); reinstall it"


def _staged(stage: Path) -> tuple[str | None, str | None]:
    """The fa-attn version and variant a trial install in `stage` holds (what the real one will be)."""
    dists = [
        d for d in importlib.metadata.distributions(path=[str(stage)]) if d.metadata["Name"] == DIST_NAME
    ]
    version = dists[0].version if len(dists) == 1 else None
    try:
        manifest = json.loads((stage / "fa_attn" / "manifest.json").read_text())
        variant = manifest.get("variant") if isinstance(manifest, dict) else None
    except (OSError, ValueError):
        variant = None
    return version, variant


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
        log(f"sha256 ok ({entry.sha256}); name, metadata and manifest agree with the index")

        # 1. A scratch install that touches nothing: does the wheel install and import at all, and is it
        #    the version and variant the index promised?
        stage = tmp / "stage"
        done = run(installer.install(str(wheel), target=stage), "trial install")
        if done.returncode != 0:
            raise InstallError(f"the installer refused {entry.file}:\n{_tail(done)}\nnothing installed")
        version, variant = _staged(stage)
        if (version, variant) != (entry.info.version, entry.info.variant):
            raise InstallError(
                f"{entry.file} installs fa-attn {version} (variant {variant!r}), but the index promised "
                f"{entry.info.version} (variant {entry.info.variant!r}); nothing installed\n"
                "  fix: re-run fa index on the wheels to rewrite index.json"
            )
        done = run([installer.python, "-c", _CHECK_IMPORT], "trial import", env=_pythonpath(stage), cwd=tmp)
        if done.returncode != 0 or not done.stdout.strip().startswith(str(stage)):
            raise InstallError(f"`import fa_attn` fails with {entry.file}:\n{_tail(done)}\nnothing installed")

        # 2. The previous fa-attn, copied aside so that a failure below can put it back.
        previous = save_previous(installer.python, tmp / "previous")
        if previous is not None:
            log(
                f"saved the installed {DIST_NAME} {previous.version} ({len(previous.files)} files) to restore on failure"
            )

        # 3. The real install.
        done = run(installer.install(str(wheel)), "install")
        if done.returncode != 0:
            undo = _restore(installer, previous, run)
            raise InstallError(f"installing {entry.file} failed:\n{_tail(done)}\n{undo}")

        # 4. Confirm in a fresh interpreter; undo if it does not hold.
        done = run([installer.python, "-c", _CHECK_IMPORT], "check import", env=_pythonpath(None), cwd=tmp)
        now = installed_version(installer.python)
        if done.returncode != 0 or now != entry.info.version:
            problem = (
                _tail(done) if done.returncode != 0 else f"fa-attn is {now}, expected {entry.info.version}"
            )
            undo = _restore(installer, previous, run)
            raise InstallError(f"the installed {entry.file} does not work: {problem}\n{undo}")
        return InstallResult(
            installed=entry.info.version,
            previous=previous.version if previous else None,
            location=done.stdout.strip(),
            commands=tuple(commands),
        )


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
