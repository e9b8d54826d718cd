"""The verification record: what `fa check` found for one wheel on one GPU, kept for later processes.

One JSON file per (wheel, GPU name, GPU UUID, compute capability, driver, torch version) in the records
folder: $FA_CHECK_RECORDS when set, else platformdirs' user cache for "fa" (…/fa/checks; on Linux
~/.cache/fa/checks). The wheel is named by the sha256 of its manifest.json, which lists every kernel
file with its own sha256, so another build of the same version is another wheel; the UUID names the
physical GPU, so two GPUs of one model keep two verdicts. Per unit (a kernel file, "sm_80/<name>"):
pass or fail, the worst output's error and bound, and, when `fa check --bench` measured them, fa's
time over SDPA's per speed class ("fwd", "fwd-causal", "fwd-decode", "bwd", "bwd-causal": speed_key)
and key length. docs/contracts.md section "Verification record" is the schema.

A record is evidence, not an assertion: it is read only from a regular file owned by this user (or
root) and writable by no one else, in such a folder (fa_attn/ownfiles.py), only for the key it was
written for; a unit counts as passed only if its numbers say so (max_err finite and at most its
bound). A malformed field is ignored with one warning (RecordWarning), never an exception on a call.
Writes are atomic and merged under a lock: a unit another `fa check` wrote meanwhile is kept.

Stdlib only: the runtime reads records on every machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import ownfiles

RECORD_SCHEMA = 1
RECORDS_ENV = "FA_CHECK_RECORDS"
RECORD_LIMIT = 4 << 20  # bytes: a record of every unit with speeds is a few tens of KB
LOCK_TIMEOUT_S = 10.0
SPEED_DIRECTIONS = ("fwd", "bwd")


class RecordWarning(UserWarning):
    """A verification record, or a field of one, that fa ignores (said once per file and problem)."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(path: object, problem: str) -> None:
    text = f"fa_attn ignores {problem} of the verification record {path}"
    with _warned_lock:
        if text in _warned:
            return
        _warned.add(text)
    warnings.warn(
        f"{text}; the runtime checks those units itself. Fix: re-run `fa check`, or move the file away",
        RecordWarning,
        stacklevel=3,
    )


def normal_uuid(text: str) -> str:
    """A GPU UUID as one spelling: lowercase hex with dashes, without nvidia-smi's "GPU-" prefix."""
    text = text.strip().lower()
    return text.removeprefix("gpu-")


def speed_key(direction: str, causal: bool, decode: bool) -> str:
    """A speed class's key under a unit's `speed`: "fwd", "fwd-causal", "fwd-decode", "bwd-causal"...
    (decode: few queries per sequence; a decode step's mask hardly matters, so it has no causal split)."""
    if decode and direction == "fwd":
        return "fwd-decode"
    return direction + ("-causal" if causal else "")


@dataclass(frozen=True)
class RecordKey:
    """Where a record applies: this wheel on this GPU with this driver and torch."""

    wheel: str  # sha256 of the wheel's fa_attn/manifest.json
    gpu: str  # the device name torch reports, "NVIDIA A100-SXM4-80GB"
    sm: str  # compute capability, "8.0"
    driver: str  # "575.51.03"; "" when unknown
    torch: str  # torch.__version__
    uuid: str = ""  # the physical GPU's (normal_uuid); "" when the driver does not say

    def file_name(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24] + ".json"


@dataclass(frozen=True)
class UnitResult:
    """One unit's verdict on this GPU."""

    verdict: str  # "pass" | "fail"
    error: str = ""  # what failed: "dq: error 0.31 > bound 0.0039 (fwd causal bf16 d64)", or a crash
    max_err: float = 0.0  # the worst output's error ...
    bound: float = 0.0  # ... and the most the rule allowed it
    # fa's time / SDPA's, per speed class (speed_key), per key length (a string in JSON): > 1 means fa
    # is slower.
    speed: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """A pass its numbers bear out: the worst error finite and within its bound."""
        return self.verdict == "pass" and math.isfinite(self.max_err) and self.max_err <= self.bound


@dataclass(frozen=True)
class Record:
    key: RecordKey
    written: str  # ISO 8601 UTC
    by: str  # "fa check", "python -m fa_attn.check", "fa check --emulate"
    units: dict[str, UnitResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RECORD_SCHEMA,
            "key": asdict(self.key),
            "written": self.written,
            "by": self.by,
            "units": {name: asdict(u) for name, u in sorted(self.units.items())},
        }

    @classmethod
    def from_json(cls, data: Any, path: object = "") -> Record:
        """The record in `data` (ValueError when it is not one: no schema, key or units); a malformed
        unit or speed entry is left out with one warning."""
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"not a verification record of schema {RECORD_SCHEMA}")
        key, units = data.get("key"), data.get("units")
        names = {f.name for f in fields(RecordKey)}
        if not isinstance(key, dict) or not isinstance(units, dict) or not names - {"uuid"} <= set(key):
            raise ValueError("a verification record needs its key and units")
        kept = {}
        for name, u in units.items():
            result = _unit_result(u, path, name)
            if result is not None:
                kept[str(name)] = result
        return cls(
            RecordKey(**{k: str(v) for k, v in key.items() if k in names}),
            str(data.get("written", "")),
            str(data.get("by", "")),
            kept,
        )


def _unit_result(u: Any, path: object, name: object) -> UnitResult | None:
    """One unit's entry, or None (with a warning) when its verdict or numbers are malformed; a
    malformed speed entry drops that entry only."""
    try:
        verdict, max_err, bound = u["verdict"], float(u["max_err"]), float(u["bound"])
        if verdict not in ("pass", "fail"):
            raise ValueError(verdict)
    except (KeyError, TypeError, ValueError):
        _warn_once(path, f"unit {name!r} (its verdict, max_err or bound is malformed)")
        return None
    if verdict == "pass" and not (math.isfinite(max_err) and max_err <= bound):
        _warn_once(path, f"unit {name!r}'s pass (max_err {max_err:.3g} is not within its bound {bound:.3g})")
        return None
    speed: dict[str, dict[str, float]] = {}
    raw = u.get("speed", {})
    for direction, by_len in raw.items() if isinstance(raw, dict) else ():
        for n, r in by_len.items() if isinstance(by_len, dict) else ():
            try:
                length, ratio = int(n), float(r)
                if length <= 0 or not math.isfinite(ratio) or ratio <= 0:
                    raise ValueError(n)
            except (TypeError, ValueError):
                _warn_once(path, f"unit {name!r}'s speed entry {direction!r}/{n!r}")
                continue
            speed.setdefault(str(direction), {})[str(length)] = ratio
    if not isinstance(raw, dict) or any(not isinstance(v, dict) for v in raw.values()):
        _warn_once(path, f"unit {name!r}'s speed (not a table of lengths)")
    return UnitResult(verdict, str(u.get("error", "")), max_err, bound, speed)


def records_dir() -> Path:
    """$FA_CHECK_RECORDS, or platformdirs' user cache for "fa" (its rule, without needing it)."""
    override = os.environ.get(RECORDS_ENV)
    if override:
        return Path(override)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("fa")) / "checks"
    except ImportError:  # the runtime needs nothing beyond the stdlib: the same folders by hand
        pass
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "fa" / "fa" / "Cache" / "checks"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "fa" / "checks"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fa" / "checks"


def wheel_identity(manifest_file: Path) -> str:
    """sha256 of the installed manifest.json ("" when there is none: a source checkout)."""
    try:
        return hashlib.sha256(manifest_file.read_bytes()).hexdigest()
    except OSError:
        return ""


def unit_name(module: str) -> str:
    """A kernel file's name in records and reasons: "sm_80/fa_fwd_hd64" for …/kernels/sm_80/fa_fwd_hd64.cubin."""
    path = Path(module)
    return f"{path.parent.name}/{path.stem}"


def _load(path: Path) -> Record | None:
    """The record in `path`, or None: absent, or refused (another user's or a writable-by-others file
    or folder, a link, not a regular file, oversized, too deep: one warning), or not a record."""
    try:
        data = ownfiles.read_json(path, limit=RECORD_LIMIT, private=True)
        return Record.from_json(data, path)
    except FileNotFoundError:
        return None
    except ownfiles.Refused as err:
        _warn_once(path, f"all ({err.reason})")
    except (OSError, ValueError, TypeError, AttributeError) as err:
        _warn_once(path, f"all ({type(err).__name__}: {str(err)[:120]})")
    return None


def read(key: RecordKey, folder: Path | None = None) -> Record | None:
    """The record for `key`, or None when there is none or it cannot be trusted (a damaged record is
    as good as none: the runtime then checks for itself)."""
    record = _load((folder or records_dir()) / key.file_name())
    return record if record is not None and record.key == key else None


def write(record: Record, folder: Path | None = None) -> Path:
    """Writes `record` atomically, merged under the folder's lock with the record already there for
    its key (a unit in `record` replaces its old entry; other units stay); returns its path."""
    folder = folder or records_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / record.key.file_name()
    with ownfiles.locked(folder / ".lock", timeout=LOCK_TIMEOUT_S):
        old = _load(path)
        if old is not None and old.key == record.key:
            record = Record(record.key, record.written, record.by, {**old.units, **record.units})
        data = json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n"
        ownfiles.write_atomic(path, data.encode("utf-8"), mode=0o600)
    return path


def all_records(folder: Path | None = None) -> list[tuple[Path, Record]]:
    """Every trusted record in the folder with its path (for `fa doctor`), newest first."""
    folder = folder or records_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = _load(path)
        if record is not None:
            found.append((path, record))
    return sorted(found, key=lambda pr: pr[1].written, reverse=True)


def speed_ratio(result: UnitResult, key: str, seqlen_k: int) -> float | None:
    """fa/SDPA time for the speed class `key` (speed_key) measured at the key length nearest to
    `seqlen_k` (by ratio of lengths), or None: a class never measured is never routed by another's."""
    measured = result.speed.get(key, {})
    if not measured or seqlen_k <= 0:
        return None
    nearest = min(measured, key=lambda n: abs(math.log2(int(n)) - math.log2(seqlen_k)))
    return measured[nearest]
