"""Hostile and careless input for the property-based tests of fa's parsers (matrix.yaml, the environment
JSON, index.json): arbitrary values, valid documents with one value replaced, and the byte-level
accidents of real files (other encodings, truncation, deep nesting, numbers too long for int(),
non-ASCII digits, control characters). `fa_errors_only` is the property: whatever the input, the
parser returns or raises fa's own error, with a short, printable message."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import strategies as st

from buildtool.errors import FaError

T = TypeVar("T")

# Strings people and programs get wrong: look-alike digits, control characters, huge numbers, markup.
NASTY_STRINGS = [
    "",
    " ",
    "٣.١١",  # Arabic-Indic digits: str.isdigit() and int() accept them
    "3.¹¹",  # superscripts: isdigit() accepts them, int() does not
    "8.6\n",
    "\x1b[31mred\x1b[0m",
    "[/b]",
    "9" * 5000,  # past int()'s 4300-digit limit
    "2." + "9" * 30,
    "1e400",
    "NaN",
    "-1",
    "0x10",
    "cu12torch2.13",
    "../../etc/passwd",
    "a" * 10000,
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(NASTY_STRINGS),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indexes) to a value inside `doc`, the root included."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, (*prefix, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, valid: Any, values: st.SearchStrategy[Any] = json_values) -> Any:
    """`valid` with one to three values replaced by arbitrary ones, or a key removed or added."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            return draw(values)
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(values)
        else:
            parent[path[-1]] = draw(values)
    return doc


@st.composite
def damaged_text(draw: st.DrawFn, valid_text: str) -> bytes:
    """The bytes of a file that should have held `valid_text`, as accidents and attacks leave them."""
    kind = draw(
        st.sampled_from(["utf16", "utf16-bom", "latin1", "truncated", "binary", "deep", "spliced", "bom"])
    )
    if kind == "utf16":
        return valid_text.encode("utf-16-le")
    if kind == "utf16-bom":
        return valid_text.encode("utf-16")
    if kind == "latin1":
        return (valid_text + "\u00e9").encode("latin-1", "replace")
    if kind == "truncated":
        data = valid_text.encode()
        return data[: draw(st.integers(0, len(data)))]
    if kind == "binary":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(100, 1_500))  # to past the recursion limit
        return (draw(st.sampled_from(["[", '{"a": ', "- ", "{a: "])) * depth).encode()
    if kind == "bom":
        return b"\xef\xbb\xbf" + valid_text.encode()
    data = valid_text.encode()
    at = draw(st.integers(0, len(data)))
    return (
        data[:at]
        + draw(st.sampled_from([s.encode() for s in NASTY_STRINGS]) | st.binary(max_size=20))
        + data[at:]
    )


def to_json_text(value: Any) -> str:
    """JSON text of `value`, with Python's spellings for NaN and infinities (json.loads accepts them)."""
    try:
        return json.dumps(value)
    except ValueError:  # an int past the conversion limit: json cannot write it, so write it by hand
        return "9" * 5000


def fa_errors_only(call: Callable[[], T]) -> T | FaError:
    """Run `call`: its result, or the fa error it raised, after checking that the message is one a
    person can read (short, printable apart from its line breaks). Any other exception fails the test."""
    try:
        return call()
    except FaError as error:
        text = error.text()
        assert len(text) < 2000, f"a {len(text)}-character message: {text[:200]}..."
        assert text.replace("\n", "").isprintable(), f"unprintable characters in: {text!r}"
        return error


def fa_errors_only_from_file(name: str, data: bytes, load: Callable[[Path], T]) -> T | FaError:
    """`fa_errors_only` of `load(path)`, where `path` is a file `name` holding `data` in a temporary
    folder (removed afterwards): a parser fed the bytes a real file left on disk."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        return fa_errors_only(lambda: load(path))


# What a careless or hostile environment puts where fa keeps a file of its own (kernels/fa_attn/
# ownfiles.py refuses each): `plant(path, hazard)` puts it there and returns a check that it is still
# there, untouched, after fa ran.
OWN_FILE_HAZARDS = ("symlink", "fifo", "dev_zero", "deep", "foreign", "folder")
OTHER_UID = 12345  # neither this user nor root


def plant(path: Path, hazard: str) -> Callable[[], None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    if hazard == "symlink":
        target = path.parent / f"users-{path.name}"
        target.write_text("the user's own words\n")
        path.symlink_to(target)

        def intact() -> None:
            assert path.is_symlink()
            assert target.read_text() == "the user's own words\n"

    elif hazard == "fifo":
        os.mkfifo(path)

        def intact() -> None:
            assert stat.S_ISFIFO(path.lstat().st_mode)

    elif hazard == "dev_zero":  # a character device: /dev/zero's numbers, made in place (needs root)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))

        def intact() -> None:
            assert stat.S_ISCHR(path.lstat().st_mode)

    elif hazard == "deep":
        path.write_bytes(b"[" * 100_000)

        def intact() -> None:
            assert path.read_bytes() == b"[" * 100_000

    elif hazard == "foreign":  # another user's file (needs root to give it away)
        path.write_text("{}")
        os.chown(path, OTHER_UID, OTHER_UID)

        def intact() -> None:
            assert path.stat().st_uid == OTHER_UID
            assert path.read_text() == "{}"

    elif hazard == "folder":
        (path / "inside").mkdir(parents=True)

        def intact() -> None:
            assert (path / "inside").is_dir()

    else:
        raise ValueError(hazard)
    return intact


@contextlib.contextmanager
def small_filesystem(mount: Path, size: str) -> Iterator[Path]:
    """A real file system of `size` (tmpfs, "1m", "64k") mounted at `mount` (made), as root; the test
    is skipped where mounting is not allowed."""
    import pytest

    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
