"""The environment `fa install` changes, as its own interpreter reports it: where packages go, every
fa-attn it can see, and whether the one installed can be replaced (put back whole if the new one
fails), all decided before anything changes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from buildtool.core.textfile import shown
from buildtool.errors import FaError

DIST_NAME = "fa-attn"
PACKAGE_DIR = "fa_attn"


class SiteError(FaError):
    """The environment cannot be read, or its fa-attn cannot be replaced safely; exit 1."""


# The probed interpreter's environment: where packages go, and every fa-attn it can see.
_SITE = """
import importlib.metadata as m, json, sys, sysconfig
dists = []
for d in m.distributions():
    name = (d.metadata['Name'] or '').lower().replace('_', '-').replace('.', '-')
    if name != 'fa-attn':
        continue
    info = getattr(d, '_path', None)
    dists.append({'version': d.version, 'root': str(d.locate_file('')),
                  'dist_info': None if info is None else str(info),
                  'files': None if d.files is None else [str(f) for f in d.files]})
print(json.dumps({'prefix': sys.prefix, 'base_prefix': sys.base_prefix,
                  'platlib': sysconfig.get_path('platlib'), 'purelib': sysconfig.get_path('purelib'),
                  'stdlib': sysconfig.get_path('stdlib'), 'path': sys.path, 'dists': dists}))
"""
# PIP_TARGET and its kind send pip's files elsewhere; fa installs into the probed environment instead.
PLACEMENT_VARS = ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER")


@dataclass(frozen=True)
class Installed:
    """An fa-attn the probed interpreter sees."""

    version: str
    root: Path  # what its RECORD paths are relative to (site-packages)
    dist_info: Path | None
    files: tuple[str, ...] | None  # as RECORD lists them; None without a RECORD


@dataclass(frozen=True)
class Site:
    """The probed interpreter's environment, as that interpreter reports it."""

    python: str
    prefix: Path
    packages: Path  # platlib: where fa-attn's wheels (Root-Is-Purelib: false) go, and the lock
    purelib: Path
    externally_managed: Path | None  # PEP 668's marker, outside a virtual environment
    path: tuple[Path, ...]  # sys.path
    dists: tuple[Installed, ...]

    def inside(self) -> list[Installed]:
        return [d for d in self.dists if under(d.root, self.prefix)]


def under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def read_site(python: str) -> Site:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        # From "/": `python -c` puts its working directory first on sys.path, and a .dist-info there
        # (an unpacked wheel) is no install of this environment.
        done = subprocess.run(
            [python, "-c", _SITE], capture_output=True, text=True, env=env, cwd="/", timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SiteError(f"cannot run {python}: {exc}; nothing installed") from None
    try:
        data = json.loads(done.stdout)
        marker = Path(data["stdlib"]) / "EXTERNALLY-MANAGED"
        outside_venv = data["prefix"] == data["base_prefix"]
        return Site(
            python=python,
            prefix=Path(data["prefix"]),
            packages=Path(data["platlib"]),
            purelib=Path(data["purelib"]),
            externally_managed=marker if outside_venv and marker.is_file() else None,
            path=tuple(Path(p) for p in data["path"] if p),
            dists=tuple(
                Installed(
                    version=str(d["version"]),
                    root=Path(d["root"]),
                    dist_info=Path(d["dist_info"]) if d["dist_info"] else None,
                    files=None if d["files"] is None else tuple(d["files"]),
                )
                for d in data["dists"]
            ),
        )
    except (ValueError, KeyError, TypeError):
        raise SiteError(
            f"cannot read {python}'s environment:\n{done.stderr.strip()[-2000:]}\nnothing installed"
        ) from None


def installed_version(python: str) -> str | None:
    """The fa-attn version installed in `python`'s environment (None: none)."""
    inside = read_site(python).inside()
    return inside[0].version if inside else None


def placement_notes() -> list[str]:
    """What the PIP_* variables that move pip's files would have done, and that fa ignores them."""
    return [
        f"{name}={shown(os.environ[name])} is ignored: fa installs into the environment it probed"
        for name in PLACEMENT_VARS
        if os.environ.get(name)
    ]


def check_site(site: Site) -> Installed | None:
    """The fa-attn to replace (None: none), once it is found replaceable; raises SiteError (nothing
    changed) otherwise."""
    if site.externally_managed is not None:
        raise SiteError(
            f"{site.python}'s environment is managed by the system ({site.externally_managed}): pip "
            "refuses to install into it, and so does fa; nothing installed\n"
            "  fix: make a virtual environment that sees its packages (python -m venv "
            "--system-site-packages DIR) and run DIR/bin/fa install"
        )
    inside = site.inside()
    if len(inside) > 1:
        where = ", ".join(str(d.dist_info or d.root) for d in inside)
        raise SiteError(
            f"{len(inside)} fa-attn installs in one environment ({where}); fa cannot tell which one to "
            f"replace; nothing installed\n  fix: pip uninstall {DIST_NAME} until none is left, then re-run"
        )
    for other in site.dists:
        if other not in inside and _shadows(site, other):
            raise SiteError(
                f"fa-attn {other.version} at {other.root}, outside this environment ({site.prefix}), comes "
                f"first on its sys.path and would hide the one fa installs; nothing installed\n"
                f"  fix: remove it (pip uninstall {DIST_NAME} with the Python that installed it there)"
            )
    previous = inside[0] if inside else None
    if previous is not None:
        _check_replaceable(previous)
    elif os.path.lexists(site.packages / PACKAGE_DIR):
        raise SiteError(
            f"{site.packages / PACKAGE_DIR} exists but no installed distribution owns it (the remains of a "
            "removed install?); fa does not delete what it did not install; nothing installed\n"
            f"  fix: move it away (mv {shlex.quote(str(site.packages / PACKAGE_DIR))} <elsewhere>), then re-run"
        )
    return previous


def _shadows(site: Site, other: Installed) -> bool:
    order = [p.resolve() for p in site.path]
    mine = site.packages.resolve()
    theirs = other.root.resolve()
    return theirs in order and (mine not in order or order.index(theirs) < order.index(mine))


def replaced_tops(previous: Installed) -> list[str]:
    """The top-level folders the previous install's RECORD lists (checked: only fa_attn/ and its own
    .dist-info)."""
    assert previous.files is not None
    assert previous.dist_info is not None
    own = {PACKAGE_DIR, previous.dist_info.name}
    found: set[str] = set()
    for rel in previous.files:
        parts = PurePosixPath(rel).parts
        if not parts or parts[0] not in own or ".." in parts or len(parts) < 2:
            raise SiteError(
                f"the installed {DIST_NAME} {previous.version} ({previous.dist_info}) has files outside "
                f"{PACKAGE_DIR}/ and its .dist-info ({shown(rel)}), which fa could not put back whole if "
                f"the new one failed; nothing installed\n"
                f"  fix: uninstall it first (pip uninstall {DIST_NAME}), then re-run"
            )
        found.add(parts[0])
    return sorted(found)


def _check_replaceable(previous: Installed) -> None:
    if previous.files is None or previous.dist_info is None:
        raise SiteError(
            f"the installed {DIST_NAME} {previous.version} has no RECORD, so fa could not put it back if the "
            f"new one failed; nothing installed\n"
            f"  fix: uninstall it first (pip uninstall {DIST_NAME}), then re-run"
        )
    replaced_tops(previous)
    listed = {PurePosixPath(f) for f in previous.files}
    package = previous.root / PACKAGE_DIR
    for folder, _, names in os.walk(package):
        for name in names:
            rel = PurePosixPath(Path(folder, name).relative_to(previous.root).as_posix())
            if rel in listed or (rel.parent.name == "__pycache__" and rel.suffix == ".pyc"):
                continue
            raise SiteError(
                f"{previous.root / rel} is not one of the installed {DIST_NAME}'s files (its RECORD does not "
                "list it); replacing fa-attn would delete it, and fa deletes only what it installed; nothing "
                "installed\n  fix: move it out of the package folder, then re-run"
            )
