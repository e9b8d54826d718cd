"""The data every wheel carries and index.json repeats: the distribution's names, where the manifest
sits in a wheel (docs/contracts.md section 3), and one index.json entry read back from a wheel (section 5).

The build writes both (build/package.py, build/index.py); the install side reads them
(compat/wheel_index.py), so their one definition lives here.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file

DIST = "fa_attn"
PROJECT = "fa-attn"
REQUIRES_PYTHON = ">=3.9"
MANIFEST = f"{DIST}/manifest.json"  # inside every wheel

_FROM_MANIFEST = (
    "version",
    "variant",
    "platform",
    "cuda_major",
    "toolkit",
    "torch",
    "cxx11abi",
    "min_driver",
    "ptx_min_driver",
    "sass",
    "ptx",
    "coverage",
)


class WheelDirError(RuntimeError):
    """A file in the wheel directory that is not a readable fa-attn wheel."""


def wheel_entry(path: Path) -> dict:
    """One index.json entry, from the wheel's file name and its manifest."""
    try:
        _, _, _, tags = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as zf:
            man = json.loads(zf.read(MANIFEST))
    except (OSError, InvalidWheelFilename, zipfile.BadZipFile, KeyError, ValueError) as e:
        raise WheelDirError(
            f"{path}: not an fa-attn wheel with a manifest ({e}); remove it or rebuild"
        ) from e
    if not isinstance(man, dict):
        raise WheelDirError(f"{path}: {MANIFEST} is not an object; remove it or rebuild")
    (tag,) = tags  # our wheels carry exactly one tag
    entry = {"file": path.name, "sha256": sha256_file(path), "size": path.stat().st_size}
    entry.update({k: man.get(k) for k in _FROM_MANIFEST})
    entry.update(
        python_tag=tag.interpreter,
        abi_tag=tag.abi,
        platform_tag=tag.platform,
        requires_python=REQUIRES_PYTHON,
    )
    entry["platform"] = entry["platform"] or linux_cpu(tag.platform)  # older manifests name no CPU
    return entry
