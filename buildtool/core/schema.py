"""The data every wheel carries and index.json repeats: the distribution's names, where the manifest
sits in a wheel (docs/contracts.md section 3), and one index.json entry read back from a wheel (section 5).

The build writes both (build/package.py, build/index.py); the install side reads them
(compat/wheel_index.py), so their one definition lives here.
"""

from __future__ import annotations

import email.parser
import json
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.errors import FaError

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


class WheelDirError(FaError):
    """A file in the wheel directory that is not a readable fa-attn wheel, or one whose name, metadata
    and manifest disagree."""


class Disagreement(ValueError):
    """An index entry whose file name, version, variant and the facts the variant names do not agree;
    `field` is the entry's key that disagrees."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# A kernel wheel's variant (the version's local label): cu<CUDA major>torch<torch minor>, plus
# cxx11abi<true|false> where the C++ ABI is ambiguous (build/plan.py variant_label writes it).
_VARIANT = re.compile(
    r"cu(?P<cuda>[0-9]+)torch(?P<torch>[0-9]+\.[0-9]+)(?:cxx11abi(?P<abi>true|false))?", re.ASCII
)


# The platform tags fa's kernel wheels can carry (build/platform_tag.py computes them).
_LINUX_TAG = re.compile(
    r"(manylinux_[0-9]{1,2}_[0-9]{1,3}|manylinux1|manylinux2010|manylinux2014|linux)_(x86_64|aarch64)",
    re.ASCII,
)


def check_agreement(entry: Mapping[str, Any]) -> None:
    """Raise Disagreement unless the entry's file name, `version`, `variant`, `platform`, `cuda_major`,
    `torch` and `cxx11abi` tell one story. Each is written by fa build from one plan, so any
    difference is a renamed, hand-edited or foreign file, and trusting either side would pick a wheel
    for the wrong torch or CUDA."""
    file = entry.get("file")
    try:
        name, file_version, _, tags = parse_wheel_filename(str(file))
    except InvalidWheelFilename as e:
        raise Disagreement("file", f"{file!r} is not a wheel file name ({e})") from None
    if canonicalize_name(name) != PROJECT:
        raise Disagreement("file", f"{file!r} is a wheel of {name!r}, not of {PROJECT}")
    if len(tags) != 1:
        raise Disagreement(
            "file", f"{file!r} carries {len(tags)} tags; fa's wheels carry one, py3-none-<platform>"
        )
    (tag,) = tags
    if (tag.interpreter, tag.abi) != ("py3", "none"):
        raise Disagreement("file", f"{file!r} is tagged {tag}; fa's wheels are py3-none-<platform>")
    try:
        version = Version(str(entry.get("version")))
    except InvalidVersion:
        raise Disagreement("version", f"{entry.get('version')!r} is not a PEP 440 version") from None
    if version != file_version:
        raise Disagreement("version", f"{entry.get('version')!r}, but the file name says {file_version}")
    variant = entry.get("variant")
    if variant != (version.local or ""):
        raise Disagreement("variant", f"{variant!r}, but the version's label says {version.local or ''!r}")
    cpu = linux_cpu(tag.platform)
    platform = entry.get("platform")
    if platform is not None and platform != cpu:
        raise Disagreement("platform", f"{platform!r}, but the file is tagged {tag.platform}")
    if variant == "":
        for key in ("cuda_major", "torch", "cxx11abi"):
            if entry.get(key) is not None:
                raise Disagreement(
                    key, f"{entry.get(key)!r} in the universal wheel (no variant), which has no kernels"
                )
        if tag.platform != "any":
            raise Disagreement("file", f"the universal wheel (no variant) is tagged {tag.platform}, not any")
        return
    parts = _VARIANT.fullmatch(str(variant))
    if parts is None:
        raise Disagreement(
            "variant", f"{variant!r} is not a variant fa builds (cu12torch2.7, cu12torch2.5cxx11abifalse)"
        )
    if cpu is None or not _LINUX_TAG.fullmatch(tag.platform):
        raise Disagreement(
            "file", f"a kernel wheel tagged {tag.platform}; fa builds Linux x86_64 and aarch64 ones"
        )
    said = {"cuda_major": int(parts["cuda"]), "torch": parts["torch"]}
    for key, value in said.items():
        if entry.get(key) != value:
            raise Disagreement(key, f"{entry.get(key)!r}, but the variant {variant} says {value!r}")
    abi = entry.get("cxx11abi")
    if parts["abi"] is not None and abi != (parts["abi"] == "true"):
        raise Disagreement("cxx11abi", f"{abi!r}, but the variant {variant} says {parts['abi']}")
    if parts["abi"] is None and abi is False:
        raise Disagreement("cxx11abi", f"false, but the variant {variant} names no ABI (the C++11 one)")


# A manifest lists a few hundred kernels (tens of KB); METADATA and WHEEL are a few lines. A member
# claiming more is not one fa wrote, and reading it could exhaust memory (a zip bomb).
MAX_MEMBER_BYTES = 16 << 20


def _member(zf: zipfile.ZipFile, name: str) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > MAX_MEMBER_BYTES:
        raise ValueError(f"{name} is {info.file_size} bytes unpacked (fa writes under {MAX_MEMBER_BYTES})")
    with zf.open(info) as f:
        return f.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES]


def _dist_info(zf: zipfile.ZipFile, path: Path, version: Version, tag: str) -> None:
    """The wheel's own metadata must say what its file name says (pip installs what METADATA says)."""
    folders = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    expected = f"{DIST}-{version}.dist-info"
    if folders != {expected}:
        raise WheelDirError(
            f"{path}: holds {', '.join(sorted(folders)) or 'no .dist-info folder'}, expected {expected} "
            "(renamed or not an fa-attn wheel); remove it or rebuild it with fa build"
        )
    metadata = email.parser.HeaderParser().parsestr(
        _member(zf, f"{expected}/METADATA").decode("utf-8", "replace")
    )
    wheel = email.parser.HeaderParser().parsestr(_member(zf, f"{expected}/WHEEL").decode("utf-8", "replace"))
    found = {
        "METADATA Name": (canonicalize_name(metadata.get("Name") or ""), PROJECT),
        "METADATA Version": (metadata.get("Version"), str(version)),
        "WHEEL Tag": (sorted(wheel.get_all("Tag") or []), [tag]),
    }
    for field, (got, want) in found.items():
        if got != want:
            raise WheelDirError(
                f"{path}: {expected}/{field.split()[0]}: {field.split()[1]} is {got!r}, but the file name "
                f"says {want!r}; refusing it (a renamed or altered wheel): rebuild it with fa build"
            )


def wheel_entry(path: Path) -> dict:
    """One index.json entry, from the wheel's file name and its manifest, after checking that the file
    name, the .dist-info metadata and the manifest agree."""
    if not path.is_file():  # a FIFO would block the zip reader forever, a device never end
        raise WheelDirError(f"{path}: not a regular file, so not a wheel; remove it")
    try:
        _, version, _, tags = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as zf:
            man = json.loads(_member(zf, MANIFEST))
            tag = str(next(iter(tags)))
            if len(tags) == 1:
                _dist_info(zf, path, version, tag)
    except (OSError, InvalidWheelFilename, zipfile.BadZipFile, KeyError, ValueError, RecursionError) as e:
        raise WheelDirError(
            f"{path}: not an fa-attn wheel with a manifest ({e}); remove it or rebuild"
        ) from e
    if not isinstance(man, dict):
        raise WheelDirError(f"{path}: {MANIFEST} is not an object; remove it or rebuild")
    entry = {"file": path.name, "sha256": sha256_file(path), "size": path.stat().st_size}
    entry.update({k: man.get(k) for k in _FROM_MANIFEST})
    tag0 = next(iter(tags))
    entry.update(
        python_tag=tag0.interpreter,
        abi_tag=tag0.abi,
        platform_tag=tag0.platform,
        requires_python=REQUIRES_PYTHON,
    )
    entry["platform"] = entry["platform"] or linux_cpu(tag0.platform)  # older manifests name no CPU
    try:
        check_agreement(entry)
    except Disagreement as e:
        where = "file name" if e.field == "file" else f"{MANIFEST} {e.field}"
        raise WheelDirError(
            f"{path}: {where}: {e.problem}; refusing it (a renamed or altered wheel): rebuild it with "
            "fa build, or remove it"
        ) from None
    return entry
