"""Verification records: what `fa check` and the runtime's first-use self-check found on one GPU.

A record is one JSON file per (GPU name, compute capability, driver, torch version): the machine facts
that can change how a kernel image behaves. Inside it, one entry per kernel image, keyed by the sha256
of the image's bytes (the cubin or PTX file the runtime would load), so a record can never vouch for
another build of the same unit. An entry says pass or fail, the largest error against the bound of
flash-attn's rule, the error when the unit crashed, who checked it and when, and (from `fa check
--bench`) fa's speed against torch SDPA per sequence-length bucket.

Where: $FA_CHECK_RECORDS if set, else the user cache directory platformdirs names for "fa"
($XDG_CACHE_HOME or ~/.cache on Linux, %LOCALAPPDATA% on Windows, ~/Library/Caches on macOS), in a
`checks/` folder. Writes are atomic (a temporary file renamed over the record) under a lock file, so
two processes that check at once both keep their entries.

Stdlib only: the runtime reads records at a call, and buildtool loads this same file
(buildtool/core/runtime.py) for `fa check` and `fa doctor`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD_SCHEMA = 1
ENV_DIR = "FA_CHECK_RECORDS"
# Sequence-length buckets of the speed ratios: a call with seqlen_k up to the bound falls in it.
LENGTH_BUCKETS = (512, 2048, 8192, 1 << 62)


def records_dir() -> Path:
    """Where records live: $FA_CHECK_RECORDS, else platformdirs' user cache for "fa", /checks."""
    own = os.environ.get(ENV_DIR)
    if own:
        return Path(own)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "fa" / "Cache"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches" / "fa"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fa"
    return base / "checks"


@dataclass(frozen=True)
class Machine:
    """What a record is keyed by, besides the image: the GPU, the driver and torch."""

    gpu: str  # "NVIDIA H100 80GB HBM3"
    sm: str  # "9.0"
    driver: str | None  # "550.54.15"; None where it cannot be read
    torch: str  # "2.13.0+cu130"

    def file_name(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", self.gpu).strip("-")[:60] or "gpu"
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
        return f"{slug}-sm{self.sm}-{digest}.json"


@dataclass(frozen=True)
class UnitResult:
    """One kernel image's result on one machine."""

    unit: str  # "fwd_bf16_d128"
    image: str  # "sass" | "ptx"
    passed: bool
    max_error: float | None  # the largest error / bound ratio over the outputs checked (<= 1 passes)
    detail: str  # what was checked and, on a failure, what went wrong (the output, the error, the bound)
    by: str  # "fa check" | "first-use self-check" | "fa check --emulate"
    checked_at: str  # ISO 8601, UTC
    # fa's time / SDPA's time per length bucket ("<=512", ...) and direction, from `fa check --bench`
    speed: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def now(cls, **fields: Any) -> UnitResult:
        stamp = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
        return cls(checked_at=stamp, **fields)


def image_sha256(path: str | Path) -> str:
    """The key of a kernel image in a record: the sha256 of its file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bucket_of(seqlen_k: int) -> str:
    """The length bucket of a call, as speed ratios name them: "<=512", "<=2048", "<=8192", ">8192"."""
    for bound in LENGTH_BUCKETS[:-1]:
        if seqlen_k <= bound:
            return f"<={bound}"
    return f">{LENGTH_BUCKETS[-2]}"


def read(machine: Machine, directory: Path | None = None) -> dict[str, UnitResult]:
    """The record of `machine`: image sha256 -> result. A missing or unreadable record is empty (a
    damaged file is never trusted, and the next write replaces it)."""
    path = (directory or records_dir()) / machine.file_name()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("schema") != RECORD_SCHEMA
        or data.get("machine") != asdict(machine)
    ):
        return {}
    out: dict[str, UnitResult] = {}
    for sha, raw in (data.get("units") or {}).items():
        try:
            out[str(sha)] = UnitResult(**raw)
        except TypeError:
            continue  # an entry of another shape: not a result
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (POSIX); elsewhere, the atomic rename alone."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write(machine: Machine, results: Mapping[str, UnitResult], directory: Path | None = None) -> Path:
    """Merge `results` (image sha256 -> result) into the record of `machine`, atomically; returns its
    path. A newer result for an image replaces the older one."""
    folder = directory or records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / machine.file_name()
    with _locked(folder / ".lock"):
        merged = {**read(machine, folder), **results}
        data = {
            "schema": RECORD_SCHEMA,
            "machine": asdict(machine),
            "units": {sha: asdict(r) for sha, r in sorted(merged.items())},
        }
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path


def all_records(directory: Path | None = None) -> list[tuple[Machine, dict[str, UnitResult]]]:
    """Every record in the directory (for `fa doctor`): its machine and results."""
    folder = directory or records_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            machine = Machine(**json.loads(path.read_text(encoding="utf-8"))["machine"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append((machine, read(machine, folder)))
    return found
