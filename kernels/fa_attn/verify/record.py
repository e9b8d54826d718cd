"""The verification record: what `fa check` found for one wheel on one GPU, kept for later processes.

One JSON file per (wheel, GPU name, compute capability, driver, torch version) in the records folder:
$FA_CHECK_RECORDS when set, else platformdirs' user cache for "fa" (…/fa/checks; on Linux
~/.cache/fa/checks). The wheel is named by the sha256 of its manifest.json, which lists every kernel
file with its own sha256, so another build of the same version is another wheel. Per unit (a kernel
file, "sm_80/<name>"): pass or fail, the worst output's error and bound, and, when `fa check --bench`
measured them, fa's time over SDPA's per direction and key length. docs/contracts.md section
"Verification record" is the schema.

Stdlib only: the runtime reads records on every machine; writes are atomic (a temporary file in the
same folder, then os.replace), so a reader never sees half a record.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD_SCHEMA = 1
RECORDS_ENV = "FA_CHECK_RECORDS"


@dataclass(frozen=True)
class RecordKey:
    """Where a record applies: this wheel on this GPU with this driver and torch."""

    wheel: str  # sha256 of the wheel's fa_attn/manifest.json
    gpu: str  # the device name torch reports, "NVIDIA A100-SXM4-80GB"
    sm: str  # compute capability, "8.0"
    driver: str  # "575.51.03"; "" when unknown
    torch: str  # torch.__version__

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
    # fa's time / SDPA's, per "fwd" or "bwd", per key length (a string in JSON): > 1 means fa is slower.
    speed: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


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
    def from_json(cls, data: Any) -> Record:
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"not a verification record of schema {RECORD_SCHEMA}")
        units = {}
        for name, u in data["units"].items():
            speed = {
                d: {str(n): float(r) for n, r in by_len.items()} for d, by_len in u.get("speed", {}).items()
            }
            units[str(name)] = UnitResult(
                str(u["verdict"]), str(u.get("error", "")), float(u["max_err"]), float(u["bound"]), speed
            )
        return cls(
            RecordKey(**{k: str(v) for k, v in data["key"].items()}),
            str(data["written"]),
            str(data["by"]),
            units,
        )


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


def read(key: RecordKey, folder: Path | None = None) -> Record | None:
    """The record for `key`, or None when there is none or it is unreadable (a damaged record is as good
    as none: the runtime then checks for itself)."""
    path = (folder or records_dir()) / key.file_name()
    try:
        record = Record.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return record if record.key == key else None


def write(record: Record, folder: Path | None = None) -> Path:
    """Writes `record` atomically; returns its path."""
    folder = folder or records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / record.key.file_name()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=path.name + ".", suffix=".fa-tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record.to_json(), f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def all_records(folder: Path | None = None) -> list[Record]:
    """Every readable record in the folder (for `fa doctor`), newest first."""
    folder = folder or records_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append(Record.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(found, key=lambda r: r.written, reverse=True)


def speed_ratio(result: UnitResult, direction: str, seqlen_k: int) -> float | None:
    """fa/SDPA time measured at the key length nearest to `seqlen_k` (by ratio of lengths), or None."""
    measured = result.speed.get(direction, {})
    if not measured or seqlen_k <= 0:
        return None
    nearest = min(measured, key=lambda n: abs(math.log2(max(int(n), 1)) - math.log2(seqlen_k)))
    return measured[nearest]
