"""The GitHub Actions the release workflow uses, each pinned to a commit (action_pins.json).

A tag such as `actions/checkout@v4` can be moved by whoever controls the action's repository (or
steals its credentials), and the release workflow publishes the wheels users install: so every
`uses:` names a full commit SHA, with the tag it was taken from as a comment. `fa ci pins --refresh`
asks each action's repository (`git ls-remote --tags`, so it needs the network) for the newest release
tag of the major already pinned, rewrites action_pins.json, and `fa ci render` puts the new SHAs into
release.yml; a new major is a deliberate edit of the file (its breaking changes read first).

Pure apart from `ls_remote` and `save`: the newest tag is chosen from ls-remote's text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from buildtool.core import atomic
from buildtool.core.runtime import ownfiles
from buildtool.errors import FaError, InputError

PINS_FILE = Path(__file__).parent / "action_pins.json"
GITHUB = "https://github.com"
PINS_MAX_BYTES = 1 << 20  # a few dozen actions take a few KB
LS_REMOTE_TIMEOUT_S = 60
# The transports git may use for --from (not ext::, which runs a command, nor fd::).
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
_SHA = re.compile(r"[0-9a-f]{40}")
_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_RELEASE_TAG = re.compile(r"v(\d{1,6})\.(\d{1,6})\.(\d{1,6})")  # v4.1.0; not v4, not v4-beta


class PinsError(FaError):
    """The pins could not be refreshed (an action's repository unreachable, or no release tag)."""


@dataclass(frozen=True)
class Pin:
    sha: str  # the commit, 40 hex digits
    tag: str  # the release tag it was taken from, for people (v4.1.0)

    @property
    def major(self) -> str:
        return self.tag.split(".")[0]


def load(path: Path = PINS_FILE) -> dict[str, Pin]:
    """The pins, read as fa's own file (ownfiles: a regular file, never through a link, at most
    PINS_MAX_BYTES); anything else is InputError (exit 2) naming it."""
    try:
        raw = ownfiles.read_json(ownfiles.named(path.parent, path.name), limit=PINS_MAX_BYTES)
    except ownfiles.Refused as exc:
        raise InputError(str(exc.path), None, exc.problem, f"{exc.fix} (or restore it from git)") from None
    except OSError as exc:
        raise InputError(
            str(path), None, f"cannot read it ({exc.strerror or exc})", "restore it from git"
        ) from None
    if not isinstance(raw, dict):
        raise InputError(str(path), None, "not a JSON object", "restore it from git")
    pins = {}
    for name, entry in raw.items():
        sha = entry.get("sha") if isinstance(entry, dict) else None
        tag = entry.get("tag") if isinstance(entry, dict) else None
        if not _NAME.fullmatch(name) or not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise InputError(str(path), name, "needs owner/repo and a 40-digit lower-case sha", "restore it")
        if not isinstance(tag, str) or not _RELEASE_TAG.fullmatch(tag):
            raise InputError(
                str(path), f"{name}.tag", f"got {tag!r}; expected a release tag like v4.1.0", "fix it"
            )
        pins[name] = Pin(sha, tag)
    return pins


def save(pins: dict[str, Pin], path: Path = PINS_FILE) -> None:
    data = {name: {"sha": p.sha, "tag": p.tag} for name, p in sorted(pins.items())}
    try:
        ownfiles.write_atomic(
            ownfiles.named(path.parent, path.name),
            (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
        )
    except ownfiles.Refused as exc:
        raise InputError(str(exc.path), None, exc.problem, exc.fix) from None
    except OSError as exc:
        raise atomic.WriteError(path, exc) from None


def uses(pins: dict[str, Pin], name: str) -> str:
    """What a step's `uses:` says: the action at its pinned commit, the tag as a YAML comment."""
    pin = pins[name]
    return f"{name}@{pin.sha} # {pin.tag}"


def newest_release(ls_remote: str, major: str) -> Pin | None:
    """The newest `vMAJOR.x.y` tag in `git ls-remote --tags` output, at the commit it points to (an
    annotated tag's `^{}` line gives the commit; a lightweight tag's own line is the commit)."""
    commits: dict[str, str] = {}
    for line in ls_remote.splitlines():
        sha, _, ref = line.partition("\t")
        if not _SHA.fullmatch(sha) or not ref.startswith("refs/tags/"):
            continue
        tag = ref.removeprefix("refs/tags/")
        if tag.endswith("^{}"):
            commits[tag[:-3]] = sha  # the peeled commit wins over the tag object
        else:
            commits.setdefault(tag, sha)
    best: tuple[tuple[int, int, int], str] | None = None
    for tag in commits:
        match = _RELEASE_TAG.fullmatch(tag)
        if match is None or f"v{match[1]}" != major:
            continue
        key = (int(match[1]), int(match[2]), int(match[3]))
        if best is None or key > best[0]:
            best = (key, tag)
    return None if best is None else Pin(commits[best[1]], best[1])


def ls_remote(url: str) -> str:
    """`git ls-remote --tags` of `url`: after `--`, so no value is read as an option, and with only the
    transports GIT_SCHEMES names (GIT_ALLOW_PROTOCOL)."""
    try:
        done = subprocess.run(
            ["git", "ls-remote", "--tags", "--", url],
            capture_output=True,
            text=True,
            timeout=LS_REMOTE_TIMEOUT_S,
            check=False,
            env={
                **os.environ,
                "GIT_TERMINAL_PROMPT": "0",  # never ask for a password
                "GIT_ALLOW_PROTOCOL": ":".join(GIT_SCHEMES),
            },
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PinsError(f"git ls-remote --tags {url}: {exc}; check the network and retry") from None
    if done.returncode != 0:
        raise PinsError(
            f"git ls-remote --tags {url}: {done.stderr.strip()[:300]}; check the network and retry"
        )
    return done.stdout


def refreshed(pins: dict[str, Pin], base: str = GITHUB) -> dict[str, Pin]:
    """Each action at the newest release of its pinned major, read from `base`/OWNER/REPO."""
    fresh = {}
    for name, pin in pins.items():
        url = f"{base.rstrip('/')}/{name}"
        newest = newest_release(ls_remote(url), pin.major)
        if newest is None:
            raise PinsError(f"{url}: no release tag {pin.major}.x.y; pin {name} by hand in {PINS_FILE.name}")
        fresh[name] = newest
    return fresh
