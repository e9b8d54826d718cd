"""The manifest inside every wheel and the entries of index.json (docs/contracts.md sections 3 and 5):
the runtime's own definition (kernels/fa_attn/schema.py, stdlib only), loaded once for the build, which
writes them (build/package.py, build/index.py), and for doctor and install, which read them
(compat/wheel_index.py). Also reads one index entry back from a wheel file.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core import kernels_src
from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.errors import FaError

if TYPE_CHECKING:
    from fa_attn import schema as _schema
else:
    _schema = kernels_src.runtime_module("schema")

BINDING_FILE = _schema.BINDING_FILE
DIST = _schema.DIST
MANIFEST = _schema.MANIFEST_PATH
PROJECT = _schema.PACKAGE
REQUIRES_PYTHON = ">=3.9"
SCHEMA_MAJOR = _schema.SCHEMA_MAJOR
SCHEMA_MINOR = _schema.SCHEMA_MINOR

Coverage = _schema.Coverage
IndexEntry = _schema.IndexEntry
KernelFile = _schema.KernelFile
Launch = _schema.Launch
Manifest = _schema.Manifest
SchemaError = _schema.SchemaError
WheelInfo = _schema.WheelInfo
index_json = _schema.index_json
read_index = _schema.read_index
universal_info = _schema.universal_info


class WheelDirError(FaError):
    """A file in the wheel directory that is not a readable fa-attn wheel."""


def read_manifest(path: Path) -> Manifest:
    """The manifest inside a wheel file."""
    try:
        with zipfile.ZipFile(path) as zf:
            return Manifest.from_json(json.loads(zf.read(MANIFEST)))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as e:  # SchemaError is a ValueError
        raise WheelDirError(
            f"{path}: not an fa-attn wheel with a readable manifest ({e}); remove it or rebuild"
        ) from e


def wheel_entry(path: Path) -> IndexEntry:
    """The index.json entry of a wheel file: from its name, its bytes and its manifest."""
    try:
        _, _, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as e:
        raise WheelDirError(f"{path}: not an fa-attn wheel file name ({e}); remove it or rebuild") from e
    info = read_manifest(path).info
    (tag,) = tags  # our wheels carry exactly one tag
    if info.platform is None and tag.platform != "any":  # written before manifests named the CPU
        info = dataclasses.replace(info, platform=linux_cpu(tag.platform))
    return IndexEntry(
        file=path.name,
        sha256=sha256_file(path),
        size=path.stat().st_size,
        info=info,
        python_tag=tag.interpreter,
        abi_tag=tag.abi,
        platform_tag=tag.platform,
        requires_python=REQUIRES_PYTHON,
    )
