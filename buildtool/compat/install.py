"""`fa install`: the side effects, as one transaction per environment (compat/install_txn.py).

Under the environment's install lock, and after putting right whatever an interrupted install left:
fetch the selected wheel (its sha256, name, metadata and manifest checked against the index), check
what it may contain (core/wheel_members.py), let pip (or uv) install it into a scratch folder beside
site-packages (`--target`, `--no-deps --no-index`, isolated from pip's configuration and PIP_*
variables), import it from there, and only then swap it in: the previous fa-attn's folders are renamed
aside, the new ones renamed in, `import fa_attn` is checked in a fresh interpreter, and the swap is
committed (or undone). The journal records each rename before it is made, so a kill -9 at any point
is rolled back (or, once committed, finished) by the next `fa install`; SIGINT and SIGTERM roll back
at once (core/interrupts.py).

Only fa-attn changes: nothing else is installed, uninstalled or downloaded. A previous fa-attn is
replaced only when it can be put back whole: all its files (RECORD) under `fa_attn/` and its own
`.dist-info`, and nothing in `fa_attn/` that RECORD does not list (but compiled `.pyc` files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from buildtool.compat import install_txn
from buildtool.compat.choose import Selection
from buildtool.compat.install_site import (
    DIST_NAME,
    PACKAGE_DIR,
    Installed,
    Site,
    SiteError,
    check_site,
    installed_version,
    read_site,
    replaced_tops,
    under,
)
from buildtool.compat.install_txn import Move
from buildtool.compat.wheel_index import WheelIndex, WheelIndexError, fetch_wheel, wheel_location
from buildtool.core import children, interrupts, wheel_members
from buildtool.core.runtime import ownfiles, schema
from buildtool.core.textfile import shown
from buildtool.errors import FaError

# What `import fa_attn` in a fresh interpreter finds: its file and the fa-attn version installed.
_CHECK_IMPORT = (
    "import importlib.metadata as m, json, fa_attn\n"
    "print(json.dumps({'file': fa_attn.__file__, 'version': m.version('fa-attn')}))\n"
)
_TIMEOUT_S = 600
LOCK_WAIT_S = 300.0  # how long a second fa install waits for the first, by default
_UV_LOCK = ".lock"  # uv leaves its own lock file in a --target folder


class InstallError(FaError):
    """The install was refused or failed; the message says why and what state the environment is in."""


# Every error run_install raises but Interrupted: a refusal or failure, with the environment's state.
FAILURES = (InstallError, SiteError, install_txn.TxnError)


@dataclass(frozen=True)
class Installer:
    """pip, or uv when it is on PATH, always driving one interpreter, always into a scratch folder."""

    python: str
    uv: str | None

    def install(self, wheel: str, target: Path) -> list[str]:
        if self.uv:
            return [
                self.uv,
                "pip",
                "install",
                "--python",
                self.python,
                "--no-config",
                "--no-deps",
                "--no-index",
                "--target",
                str(target),
                wheel,
            ]
        return [
            self.python,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--disable-pip-version-check",
            "--no-input",
            "--target",
            str(target),
            wheel,
        ]

    def environ(self, tmp: Path) -> dict[str, str]:
        """The installer's environment: no PIP_* variable, no configuration file, TMPDIR inside the
        transaction folder (so a killed installer leaves nothing elsewhere)."""
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) or k == "UV_CACHE_DIR"
        }
        env.update(PIP_CONFIG_FILE=os.devnull, TMPDIR=str(tmp))
        env.pop("PYTHONPATH", None)
        return env


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
        """The installer's command (into the scratch folder the new fa-attn is swapped in from)."""
        where = Path(f"<site-packages>/{install_txn.TXN_DIR}/{install_txn.WORK_DIR}/stage")
        return self.installer.install(self.source, where) if self.source else None


@dataclass(frozen=True)
class InstallResult:
    installed: str  # the fa-attn version now installed
    previous: str | None  # the fa-attn version before, if any
    location: str  # where `import fa_attn` found it
    commands: tuple[str, ...]  # what was run, for the log


@dataclass(frozen=True)
class Options:
    allow_older: bool = False  # install a version older than the installed one
    wait_s: float = LOCK_WAIT_S  # for another fa install into the same environment


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


# ---------------------------------------------------------------------------------------------------
# The transaction


def run_install(
    plan: InstallPlan,
    index: WheelIndex,
    log: Callable[[str], None] = lambda _: None,
    say: Callable[[str], None] = lambda _: None,
    options: Options = Options(),
) -> InstallResult:
    """Install plan.entry. `log` gets each step, `say` what the person must read (a wait, a recovery).
    Raises InstallError (the message says what state the environment is in), TxnError, or
    interrupts.Interrupted with `state` saying what was undone."""
    if plan.entry is None:
        raise InstallError("no wheel fits this machine (fa doctor says why); nothing installed")
    site = read_site(plan.installer.python)
    with install_txn.locked(site.packages, options.wait_s, say) as root:
        install_txn.checkpoint("locked")
        recovered = install_txn.finish_or_roll_back(root, (site.packages, site.purelib))
        if recovered:
            say(recovered)
        site = read_site(plan.installer.python)  # as it is now: another install may have just ended
        previous = check_site(site)
        if previous is not None and not options.allow_older:
            _refuse_older(previous.version, plan.entry)
        try:
            return _transaction(plan, index, plan.entry, site, previous, root, log)
        finally:
            with interrupts.deferred(raise_at_end=False):
                if not (root / install_txn.JOURNAL_FILE).exists():  # else the journal still needs work/
                    install_txn.discard(root)


def _refuse_older(installed: str, entry: schema.IndexEntry) -> None:
    """A version older than the installed one (local labels aside: another variant of the same release
    is not older) needs --allow-downgrade."""
    try:
        new, old = Version(Version(entry.info.version).public), Version(Version(installed).public)
    except InvalidVersion:
        # Not silently: which is newer cannot be told, so replacing it may be a downgrade.
        raise InstallError(
            f"the installed fa-attn {shown(installed)} and {entry.file} cannot be compared (not both PEP "
            "440 versions), so installing it may be a downgrade; nothing installed\n  fix: pass "
            "--allow-downgrade to install it anyway"
        ) from None
    if new < old:
        raise InstallError(
            f"{entry.file} is fa-attn {new}, older than the installed {installed}: a downgrade; nothing "
            "installed\n  fix: pass --allow-downgrade to install it anyway, or point --wheels/--index at "
            "a newer release"
        )


def _transaction(
    plan: InstallPlan,
    index: WheelIndex,
    entry: schema.IndexEntry,
    site: Site,
    previous: Installed | None,
    root: Path,
    log: Callable[[str], None],
) -> InstallResult:
    steps = _Steps(plan.installer, entry, root, log)
    wheel, contents = steps.fetch(index, plan.source)
    stage = steps.stage(wheel, site.packages)
    location = steps.swap_in(stage, site.purelib if contents.purelib else site.packages, previous, site)
    return InstallResult(
        installed=entry.info.version,
        previous=previous.version if previous else None,
        location=location,
        commands=tuple(steps.commands),
    )


@dataclass
class _Steps:
    """One install's steps, in order. Until swap_in, each refuses with InstallError and nothing has
    changed; swap_in commits or undoes its renames."""

    installer: Installer
    entry: schema.IndexEntry
    root: Path  # the transaction folder
    log: Callable[[str], None]
    commands: list[str] = dataclasses.field(default_factory=list)

    @property
    def work(self) -> Path:
        return self.root / install_txn.WORK_DIR

    def run(self, cmd: list[str], what: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(shlex.join(cmd))
        self.log(f"{what}: {shlex.join(cmd)}")
        return _run(cmd, env=env, cwd=self.work)

    def fetch(self, index: WheelIndex, source: str | None) -> tuple[Path, wheel_members.Contents]:
        """The wheel in work/, its hash, metadata and members checked, and the space for it."""
        entry = self.entry
        try:
            (self.work / "tmp").mkdir(parents=True)
        except OSError as exc:
            raise InstallError(
                f"cannot write {self.work}: {exc.strerror or exc}; nothing installed"
            ) from None
        if entry.size is not None:
            _check_space(self.work, entry.size, "the wheel")
        self.log(f"fetching {source}")
        try:
            wheel = fetch_wheel(index, entry, self.work)
        except WheelIndexError as exc:
            raise InstallError(f"{exc}; nothing installed") from exc
        self.log(f"sha256 ok ({entry.sha256}); name, metadata and manifest agree with the index")
        try:
            contents = wheel_members.check(wheel, entry)
        except wheel_members.HostileWheel as exc:
            raise InstallError(str(exc)) from None
        _check_space(self.work, contents.unpacked_bytes, "the wheel's files unpacked")
        install_txn.checkpoint("fetched")
        return wheel, contents

    def stage(self, wheel: Path, packages: Path) -> Path:
        """pip (or uv) installs into work/stage, touching nothing: does the wheel install and import at
        all, and is it the version and variant the index promised?"""
        entry, stage = self.entry, self.work / "stage"
        done = self.run(
            self.installer.install(str(wheel), stage),
            "trial install",
            self.installer.environ(self.work / "tmp"),
        )
        if done.returncode != 0:
            full = "No space left on device" in done.stderr + done.stdout
            fix = (
                f"\n  fix: free some space on the file system holding {packages}, then re-run" if full else ""
            )
            raise InstallError(f"the installer refused {entry.file}:\n{_tail(done)}\nnothing installed{fix}")
        version, variant = _staged(stage)
        if (version, variant) != (entry.info.version, entry.info.variant):
            raise InstallError(
                f"{entry.file} installs fa-attn {version} (variant {variant!r}), but the index promised "
                f"{entry.info.version} (variant {entry.info.variant!r}); nothing installed\n"
                "  fix: re-run fa index on the wheels to rewrite index.json"
            )
        _check_staged(stage, version)
        install_txn.checkpoint("staged")
        done = self.run([self.installer.python, "-c", _CHECK_IMPORT], "trial import", _clean_env(stage))
        if done.returncode != 0 or not _imported_from(done, stage):
            raise InstallError(f"`import fa_attn` fails with {entry.file}:\n{_tail(done)}\nnothing installed")
        install_txn.checkpoint("trial-imported")
        return stage

    def swap_in(self, stage: Path, target: Path, previous: Installed | None, site: Site) -> str:
        """The previous fa-attn's folders renamed aside, the new ones renamed in from `stage`, each rename
        journaled first (only moves the next recovery would follow); then `import fa_attn` in a fresh
        interpreter, and the commit (or the undo). Returns where `import fa_attn` finds it."""
        entry, old = self.entry, self.work / "old"
        old.mkdir()
        tops = [PACKAGE_DIR, f"{PACKAGE_DIR}-{entry.info.version}.dist-info"]  # the package first
        outs = tuple(Move(previous.root / n, old / n) for n in replaced_tops(previous)) if previous else ()
        ins = tuple(Move(stage / n, target / n) for n in tops)
        journal = install_txn.Journal(
            pid=os.getpid(),
            phase="swap",
            wheel=entry.file,
            version=entry.info.version,
            previous=previous.version if previous else None,
            moves=outs + ins,
        )
        stray = install_txn.stray_move(self.root, (site.packages, site.purelib), journal.moves)
        if stray is not None:  # fa journals only moves its recovery would follow
            raise InstallError(
                f"would move {stray.src} to {stray.dst}, outside {site.packages} and {site.purelib}, "
                "where fa installs; nothing installed\n  fix: pip uninstall fa-attn, then re-run"
            )
        install_txn.write_journal(self.root, journal)
        try:
            try:
                install_txn.swap(outs, "out")
                install_txn.swap(ins, "in")
            except OSError as exc:
                raise InstallError(f"cannot move {exc.filename}: {exc.strerror or exc}") from None
            install_txn.checkpoint("swapped")
            done = self.run([self.installer.python, "-c", _CHECK_IMPORT], "check import", _clean_env(None))
            problem = _check_failed(done, target, entry.info.version)
            if problem:
                raise InstallError(f"the installed {entry.file} does not work: {problem}")
            with interrupts.deferred():
                install_txn.write_journal(self.root, dataclasses.replace(journal, phase="committed"))
        except BaseException as exc:
            with interrupts.deferred(raise_at_end=False):
                state = _roll_back(journal, self.installer.python, self.root)
            if isinstance(exc, interrupts.Interrupted):
                exc.state = state
                raise
            interrupts.raise_if_interrupted(state)  # a signal during the roll back: it is done, say so
            if isinstance(exc, FaError):
                raise InstallError(f"{exc}\n{state}") from None
            raise
        installed = f"fa-attn {entry.info.version} is installed: it had passed its checks"
        try:
            install_txn.checkpoint("committed")
            interrupts.raise_if_interrupted(installed)
        except interrupts.Interrupted as exc:
            exc.state = installed
            raise
        finally:
            # A signal from here on is too late to matter: the install is done, and said to be.
            with interrupts.deferred(raise_at_end=False):
                install_txn.discard(self.root)
                (self.root / install_txn.JOURNAL_FILE).unlink(missing_ok=True)
        return str(json.loads(done.stdout)["file"])


def _roll_back(journal: install_txn.Journal, python: str, root: Path) -> str:
    """Undo the swap's renames; says what state is left."""
    try:
        install_txn.undo(journal.moves)
    except OSError as exc:
        return (
            f"could not roll back ({exc}); the journal {root / install_txn.JOURNAL_FILE} is kept: the next "
            "fa install finishes the roll back"
        )
    (root / install_txn.JOURNAL_FILE).unlink(missing_ok=True)
    now = installed_version(python)
    if journal.previous is None:
        if now is None:
            return f"rolled back: {DIST_NAME} removed again; the environment is as it was"
        return f"could not roll back: {DIST_NAME} {now} is installed (none was before); remove it with pip uninstall {DIST_NAME}"
    if now == journal.previous:
        return f"rolled back: the previous {DIST_NAME} {journal.previous} is back in place"
    return (
        f"could not put the previous {DIST_NAME} {journal.previous} back ({DIST_NAME} is now "
        f"{now or 'absent'}); reinstall it"
    )


def _check_space(work: Path, size: int, what: str) -> None:
    """Refuse before writing when the file system holding site-packages has not `size` bytes (and a
    MiB) free: a full disk then names the folder and the space, not a bare [Errno 28] half-way."""
    need = size + (1 << 20)
    free = shutil.disk_usage(work).free
    if free < need:
        raise InstallError(
            f"not enough space in {work.parent.parent}: installing needs about {_mib(need)} ({what}), "
            f"{_mib(free)} is free; nothing installed\n"
            "  fix: free some space on that file system, then re-run"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _staged(stage: Path) -> tuple[str | None, str | None]:
    """The fa-attn version and variant a trial install in `stage` holds (what the real one will be)."""
    dists = [
        d
        for d in importlib.metadata.distributions(path=[str(stage)])
        if canonicalize_name(d.metadata["Name"] or "") == DIST_NAME
    ]
    version = dists[0].version if len(dists) == 1 else None
    try:
        manifest = ownfiles.read_json(stage / PACKAGE_DIR / "manifest.json", limit=schema.MANIFEST_MAX_BYTES)
        variant = manifest.get("variant") if isinstance(manifest, dict) else None
    except (OSError, ownfiles.Refused):
        variant = None
    return version, variant


def _check_staged(stage: Path, version: str | None) -> None:
    """The installer made fa_attn/ and its .dist-info, and nothing else it would install."""
    made = {p.name for p in stage.iterdir()} - {_UV_LOCK}
    own = {PACKAGE_DIR, f"{PACKAGE_DIR}-{version}.dist-info"}
    if made != own:
        raise InstallError(
            f"the installer made {', '.join(sorted(made))} where fa expects {', '.join(sorted(own))}; "
            "nothing installed"
        )


def _imported_from(done: subprocess.CompletedProcess[str], folder: Path) -> bool:
    try:
        return under(Path(json.loads(done.stdout)["file"]), folder)
    except (ValueError, KeyError, TypeError):
        return False


def _check_failed(done: subprocess.CompletedProcess[str], target: Path, version: str) -> str | None:
    if done.returncode != 0:
        return _tail(done)
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return _tail(done)
    if found.get("version") != version:
        return f"fa-attn is {found.get('version')}, expected {version}"
    if not under(Path(found["file"]), target):
        return f"`import fa_attn` finds {found['file']}, not the one installed in {target}"
    return None


def _clean_env(stage: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if stage is not None:
        env["PYTHONPATH"] = str(stage)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own session (a Ctrl-C reaches fa, which stops it) under a guard that kills it
    and its children if fa dies (core/children.py); stopped on Interrupted or after _TIMEOUT_S."""
    try:
        proc = subprocess.Popen(
            children.guarded(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))
    try:
        out, err = proc.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} did not finish in {_TIMEOUT_S} s")
    except BaseException:
        _stop(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stop(proc: subprocess.Popen[str]) -> None:
    """The guard kills the command's process group on SIGTERM, then exits."""
    with contextlib.suppress(OSError):
        proc.terminate()
    with interrupts.deferred():
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(done: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    text = (done.stderr or "") + (done.stdout or "")
    return "\n".join(text.strip().splitlines()[-lines:])
