"""A built fa-attn wheel read back from its file: the manifest inside it (fa_attn/manifest.json) and its
index.json entry (its name, bytes and manifest). `fa index` writes these entries (build/index.py);
doctor and install read a directory of wheels without index.json the same way (compat/wheel_index.py).
The shapes are the runtime's schema (kernels/fa_attn/schema.py, via core/runtime.py)."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import schema
from buildtool.errors import FaError

REQUIRES_PYTHON = ">=3.9"  # every fa-attn wheel's Requires-Python (METADATA and index.json)


class WheelDirError(FaError):
    """A file in the wheel directory that is not a readable fa-attn wheel."""


def read_manifest(path: Path) -> schema.Manifest:
    """The manifest inside a wheel file."""
    try:
        with zipfile.ZipFile(path) as zf:
            return schema.Manifest.from_json(json.loads(zf.read(schema.MANIFEST_PATH)))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as e:  # SchemaError is a ValueError
        raise WheelDirError(
            f"{path}: not an fa-attn wheel with a readable manifest ({e}); remove it or rebuild"
        ) from e


def wheel_entry(path: Path) -> schema.IndexEntry:
    """The index.json entry of a wheel file: from its name, its bytes and its manifest."""
    try:
        _, _, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as e:
        raise WheelDirError(f"{path}: not an fa-attn wheel file name ({e}); remove it or rebuild") from e
    info = read_manifest(path).info
    (tag,) = tags  # our wheels carry exactly one tag
    if info.platform is None and tag.platform != "any":  # written before manifests named the CPU
        info = dataclasses.replace(info, platform=linux_cpu(tag.platform))
    return schema.IndexEntry(
        file=path.name,
        sha256=sha256_file(path),
        size=path.stat().st_size,
        info=info,
        python_tag=tag.interpreter,
        abi_tag=tag.abi,
        platform_tag=tag.platform,
        requires_python=REQUIRES_PYTHON,
    )
