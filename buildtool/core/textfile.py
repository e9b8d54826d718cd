"""Reading the small text files a person hands fa (matrix.yaml, an environment JSON, index.json) and
showing their values in messages, so that no file can hang, exhaust or flood fa.

- Only regular files are read (a FIFO would block forever, /dev/zero never ends), at most a size fit
  for the kind of file, and as UTF-8 (a UTF-16 or binary file gets a message, not a traceback).
- `shown(value)` is what an error message may quote of a value: one short line, whatever the value
  (a 259-byte YAML alias bomb expands to a value whose repr is tens of MB), with control characters
  escaped so a file cannot move the cursor or recolour the terminal; `printable(text)` escapes them in
  text fa shows (a GPU name from nvidia-smi).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_INPUT_BYTES = 4 << 20  # matrix.yaml and env files are a few KB; a big index.json about 1 MB


class TextFileError(ValueError):
    """A file that cannot be read as text: `problem` says why and `fix` what to do."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
        self.fix = fix


def read_text(path: Path, max_bytes: int = MAX_INPUT_BYTES, fix: str = "pass the right file") -> str:
    """The file's text. Raises TextFileError naming the file when it cannot be opened, is not a
    regular file, is larger than `max_bytes`, or is not UTF-8."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer must not hang; regular files ignore the flag.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TextFileError(str(path), f"cannot read it ({e.strerror})", fix) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TextFileError(str(path), "not a regular file", fix)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise TextFileError(str(path), f"cannot read it ({e.strerror})", fix) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TextFileError(
            str(path), f"larger than {max_bytes // 1024} KiB, far more than a file of this kind holds", fix
        )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise TextFileError(str(path), "UTF-16 text; fa reads UTF-8", "save it as UTF-8 and retry")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFileError(
            str(path), f"not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})", "save it as UTF-8 text"
        ) from None
    return text.removeprefix("\ufeff")  # a UTF-8 byte order mark, as some editors write


def shown(value: object) -> str:
    """A short, single-line, printable repr of `value` for a message: the runtime schema's, which its
    own errors use (loaded when a message needs it, not by every command that reads a file)."""
    from buildtool.core.runtime import schema

    return schema.shown(value)


def printable(text: str) -> str:
    """`text` with control characters (and other unprintable ones) as escapes: safe to print."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
