"""Option values checked at the edge, before any file is read or anything is planned: each bad value
is one InputError (exit 2) naming the option, the value (quoted, escaped, at most 80 characters) and
what the option accepts. Typer has already checked the types (an integer is an integer); these are
the ranges and the sets. The sets (CUDA toolkits, CPUs) are imported where they are checked, so that
check_argv, which every command line passes through (`fa --help` too), loads none of them."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from buildtool.core.textfile import printable, shown
from buildtool.errors import InputError

# An option value is a path, a URL, a number or a word: 4096 characters is PATH_MAX on Linux, and
# more than anything fa's options take. A longer one is refused whole, naming only its length.
MAX_ARGUMENT_CHARS = 4096
# A name in a path: what Linux file systems allow (NAME_MAX), in bytes.
MAX_NAME_BYTES = 255
MAX_WAIT_S = 24 * 3600.0


def check_argv(argv: Sequence[str]) -> None:
    """Refuse an argument longer than MAX_ARGUMENT_CHARS, naming its option (the argument before it,
    or the `--name=` it starts with)."""
    for i, arg in enumerate(argv):
        if len(arg) <= MAX_ARGUMENT_CHARS:
            continue
        if arg.startswith("--") and "=" in arg[:64]:
            option = arg.split("=", 1)[0]
        elif i > 0 and argv[i - 1].startswith("-"):
            option = argv[i - 1]
        else:
            option = f"argument {i + 1}"
        raise InputError(
            printable(option[:64]),
            None,
            f"a value of {len(arg)} characters (starting {shown(arg[:40])})",
            f"fa's option values are paths, URLs, numbers or names of at most {MAX_ARGUMENT_CHARS} characters",
        )


def jobs(value: int, option: str = "--jobs") -> int:
    if value < 1:
        raise InputError(
            option, None, f"got {value}", f"pass a whole number of parallel compiles, 1 or more ({option} 2)"
        )
    return value


def cuda_majors(values: Iterable[int], option: str = "--cuda") -> tuple[int, ...]:
    """The majors, each once, in the order given; each one fa has a toolkit for."""
    majors = tuple(dict.fromkeys(values))
    for major in majors:
        cuda_major(major, option)
    return majors


def cuda_major(value: int, option: str = "--cuda") -> int:
    from buildtool.core.cuda_facts import TOOLKITS

    if value not in TOOLKITS:
        known = ", ".join(map(str, sorted(TOOLKITS)))
        raise InputError(option, None, f"CUDA {value} has no pinned toolkit in fa", f"pass one of {known}")
    return value


def arch(value: str, cuda: int | None, option: str = "--arch") -> str:
    """A compute capability one of fa's toolkits (`cuda`'s, when given) can build for."""
    from buildtool.core.cuda_facts import TOOLKITS
    from buildtool.core.runtime import versions

    toolkits = [TOOLKITS[cuda]] if cuda in TOOLKITS else list(TOOLKITS.values())
    known = sorted({a for t in toolkits for a in t.archs}, key=versions.parse_target)
    if value in known and versions.arch_specific(value):
        plain = versions.target_arch(value)
        raise InputError(
            option,
            None,
            f"got {shown(value)}, an arch-specific target, not a GPU's compute capability",
            f"pass {plain}: a build for a {plain} GPU includes its sm_{plain.replace('.', '')}a units",
        )
    if value not in known:
        which = f"CUDA {cuda}'s toolkit" if cuda in TOOLKITS else "fa's toolkits"
        raise InputError(
            option,
            None,
            f"got {shown(value)}, which {which} cannot build for",
            f"pass one of {', '.join(known)}",
        )
    return value


def one_of(value: str, choices: Sequence[str], option: str) -> str:
    if value not in choices:
        raise InputError(option, None, f"got {shown(value)}", f"pass one of {', '.join(choices)}")
    return value


def platform(value: str, option: str = "--platform") -> str:
    """A CPU fa builds for (or one of its aliases: amd64, arm64, ...)."""
    from buildtool.core.cpus import PLATFORMS, canonical

    if canonical(value) is None:
        raise InputError(option, None, f"got {shown(value)}", f"pass one of {', '.join(PLATFORMS)}")
    return value


def wait_seconds(value: float, option: str = "--wait") -> float:
    if not (math.isfinite(value) and 0 <= value <= MAX_WAIT_S):
        raise InputError(
            option, None, f"got {value}", f"pass seconds from 0 (do not wait) to {MAX_WAIT_S:.0f} (a day)"
        )
    return value


def path(value: Path, option: str) -> Path:
    """A path whose every name fits a file system (the system's own error is a traceback's worth of
    text), with no NUL or other control character."""
    text = os.fsencode(value)
    if not str(value).isprintable():
        raise InputError(option, None, f"{shown(str(value))} holds a control character", "pass a plain path")
    for name in text.split(b"/"):
        if len(name) > MAX_NAME_BYTES:
            start = shown(os.fsdecode(name[:40]))
            raise InputError(
                option,
                None,
                f"a name of {len(name)} bytes in the path (starting {start})",
                f"file systems allow names of at most {MAX_NAME_BYTES} bytes; pass a shorter path",
            )
    return value


def git_source(value: str, option: str = "--from") -> str:
    """Where git repositories are: a URL of one of pins.GIT_SCHEMES with a host (file:// with a path),
    or an existing local folder. Never anything git would read as an option (a leading "-") or as
    another transport (`ext::...`), nor empty."""
    from buildtool.release.pins import GIT_SCHEMES

    accepts = (
        f"pass a URL ({', '.join(s + '://' for s in GIT_SCHEMES)}) or a local folder, "
        f"e.g. {option} https://github.com"
    )
    if not value.strip():
        raise InputError(option, None, "is empty", accepts)
    if value.startswith("-"):
        raise InputError(
            option, None, f"{shown(value)} starts with '-', which git would read as an option", accepts
        )
    if not value.isprintable():
        raise InputError(option, None, f"{shown(value)} holds a control character", accepts)
    scheme, sep, rest = value.partition("://")
    if sep:
        host = rest.split("/", 1)[0]
        if scheme.lower() not in GIT_SCHEMES or not (host or scheme.lower() == "file") or not rest:
            raise InputError(option, None, f"{shown(value)} is not a URL git may fetch from", accepts)
        return value
    if "::" in value or not Path(value).is_dir():
        raise InputError(option, None, f"{shown(value)} is neither a URL nor a folder", accepts)
    return str(Path(value).resolve())
