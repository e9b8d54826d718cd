"""A built fa-attn wheel read back from its file: the manifest inside it (fa_attn/manifest.json) and its
index.json entry (its name, bytes and manifest). `fa index` writes these entries (build/index.py);
doctor and install read a directory of wheels without index.json the same way (compat/wheel_index.py).
The shapes are the runtime's schema (kernels/fa_attn/schema.py, via core/runtime.py).

Nothing in a wheel is trusted on its own: its file name, its .dist-info (what pip installs) and its
manifest (what doctor and the runtime read) must tell one story (`check_agreement`), or the wheel is
refused naming the field: a manifest saying torch 2.12 in a wheel named and installed as 2.13 would
have doctor pick it for torch 2.12.
"""

from __future__ import annotations

import dataclasses
import email.parser
import json
import re
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildtool.core.cpus import linux_cpu, wheel_cpu, windows_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import all_wheel, schema
from buildtool.errors import FaError

REQUIRES_PYTHON = ">=3.9"  # every fa-attn wheel's Requires-Python (METADATA and index.json)
# A manifest lists a few hundred kernels (tens of KB); METADATA and WHEEL are a few lines. A member
# claiming more is not one fa wrote, and reading it could exhaust memory (a zip bomb).
MAX_MEMBER_BYTES = 16 << 20


class WheelDirError(FaError):
    """A file in the wheel directory that is not a readable fa-attn wheel, or one whose name, metadata
    and manifest disagree."""


class Disagreement(ValueError):
    """A wheel's file name, version, variant and the facts the variant names do not agree; `field` is
    the key of index.json (or the manifest) that disagrees."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# A kernel wheel's variant (the version's local label): cu<CUDA major>torch<torch minor>, plus
# cxx11abi<true|false> where the C++ ABI is ambiguous (build/plan.py variant_label writes it).
ALL_VARIANT = all_wheel.VARIANT  # the all-wheel's variant; its version has no local label
_VARIANT = re.compile(
    r"cu(?P<cuda>[0-9]+)torch(?P<torch>[0-9]+\.[0-9]+)(?:cxx11abi(?P<abi>true|false)|(?P<plus>plus))?"
    r"(?:\.local\.sm(?P<local>[0-9]{2,3}))?",
    re.ASCII,
)
LOCAL_MARK = "local"


def local_build_label(variant: str, arch: str) -> str:
    """The variant of a wheel `fa install --build` makes for one GPU: "cu12torch2.10plus.local.sm80". It
    holds one arch's SASS and no PTX, so it must never pass for the release wheel of `variant` (whose
    label it would otherwise share); the label says so, and `check_agreement` holds it to one arch."""
    major, minor = (int(p) for p in arch.split("."))
    return f"{variant}.{LOCAL_MARK}.sm{major}{minor}"


# The platform tags fa's kernel wheels can carry (build/platform_tag.py computes them).
_LINUX_TAG = re.compile(
    r"(manylinux_[0-9]{1,2}_[0-9]{1,3}|manylinux1|manylinux2010|manylinux2014|linux)_(x86_64|aarch64)",
    re.ASCII,
)


def check_agreement(file: str, info: schema.WheelInfo) -> None:
    """Raise Disagreement unless the file name and the info's version, variant, platform, cuda_major,
    torch and cxx11abi tell one story. fa build writes each from one plan, so any difference is a
    renamed, hand-edited or foreign file, and trusting either side would pick a wheel for the wrong
    torch or CUDA."""
    try:
        name, file_version, _, tags = parse_wheel_filename(file)
    except InvalidWheelFilename as e:
        why = str(e).split(":", 1)[0]  # packaging's reason, without the name again (it may be long)
        raise Disagreement("file", f"{schema.shown(file)} is not a wheel file name ({why})") from None
    if canonicalize_name(name) != schema.PACKAGE:
        raise Disagreement(
            "file", f"{schema.shown(file)} is a wheel of {schema.shown(name)}, not of {schema.PACKAGE}"
        )
    if len(tags) != 1:
        raise Disagreement(
            "file", f"{file!r} carries {len(tags)} tags; fa's wheels carry one, py3-none-<platform>"
        )
    (tag,) = tags
    if (tag.interpreter, tag.abi) != ("py3", "none"):
        raise Disagreement("file", f"{file!r} is tagged {tag}; fa's wheels are py3-none-<platform>")
    try:
        version = Version(info.version)
    except (InvalidVersion, ValueError):
        raise Disagreement("version", f"{info.version!r} is not a PEP 440 version") from None
    if version != file_version:
        raise Disagreement("version", f"{info.version!r}, but the file name says {file_version}")
    if info.all_wheel or info.variant == ALL_VARIANT:
        _check_all_wheel(file, info, version, tag.platform)
        return
    if info.variant != (version.local or ""):
        raise Disagreement(
            "variant", f"{info.variant!r}, but the version's label says {version.local or ''!r}"
        )
    cpu = wheel_cpu(tag.platform)
    if info.platform is not None and info.platform != cpu:
        raise Disagreement("platform", f"{info.platform!r}, but the file is tagged {tag.platform}")
    if info.variant == "":
        for key in ("cuda_major", "torch", "cxx11abi"):
            if getattr(info, key) is not None:
                raise Disagreement(
                    key, f"{getattr(info, key)!r} in the universal wheel (no variant), which has no kernels"
                )
        if tag.platform != "any":
            raise Disagreement("file", f"the universal wheel (no variant) is tagged {tag.platform}, not any")
        return
    parts = _VARIANT.fullmatch(info.variant)
    if parts is None:
        raise Disagreement(
            "variant",
            f"{info.variant!r} is not a variant fa builds (cu12torch2.7, cu12torch2.5cxx11abifalse, "
            "cu12torch2.10plus, cu12torch2.10plus.local.sm80)",
        )
    windows = windows_cpu(tag.platform) is not None
    if cpu is None or not (windows or _LINUX_TAG.fullmatch(tag.platform)):
        raise Disagreement(
            "file",
            f"a kernel wheel tagged {tag.platform}; fa builds Linux x86_64 and aarch64 ones and Windows "
            "x86_64 ones (win_amd64)",
        )
    if windows and (parts["plus"] is None or parts["local"] is not None):
        raise Disagreement(
            "file",
            f"{info.variant!r} tagged {tag.platform}; fa's Windows wheels are the stable-ABI release "
            "wheels (cu12torch2.10plus): MSVC builds that binding only",
        )
    said = {"cuda_major": int(parts["cuda"]), "torch": parts["torch"]}
    for key, value in said.items():
        if getattr(info, key) != value:
            raise Disagreement(key, f"{getattr(info, key)!r}, but the variant {info.variant} says {value!r}")
    if parts["local"] is not None:
        sms = [f"{a.split('.')[0]}{a.split('.')[1]}" for a in info.sass]
        if sms != [parts["local"]] or info.ptx is not None:
            raise Disagreement(
                "sass",
                f"{list(info.sass)!r} and ptx {info.ptx!r}, but the local build {info.variant} holds sm "
                f"{parts['local']}'s SASS alone",
            )
    if parts["abi"] is not None and info.cxx11abi != (parts["abi"] == "true"):
        raise Disagreement(
            "cxx11abi", f"{info.cxx11abi!r}, but the variant {info.variant} says {parts['abi']}"
        )
    # "plus": the stable-ABI binding of that floor, which serves any C++ ABI (build/plan.py)
    stable = parts["plus"] is not None
    if stable != (info.binding_form == "stable"):
        raise Disagreement(
            "binding_form",
            f"{info.binding_form!r}, but the variant {info.variant} says {'stable' if stable else 'aten'}",
        )
    if stable and info.cxx11abi is not None:
        raise Disagreement(
            "cxx11abi", f"{info.cxx11abi!r}, but the stable-ABI variant {info.variant} has none"
        )
    if not stable and parts["abi"] is None and info.cxx11abi is False:
        raise Disagreement("cxx11abi", f"false, but the variant {info.variant} names no ABI (the C++11 one)")


def _check_all_wheel(file: str, info: schema.WheelInfo, version: Version, platform: str) -> None:
    """The all-wheel: variant "all", a version without a local label (so a plain `pip install fa-attn`
    takes it), a Linux tag of its CPU, and its bindings and kernels in `bindings` and `kernel_sets`."""
    if info.variant != ALL_VARIANT or not info.all_wheel or not info.bindings:
        raise Disagreement(
            "variant",
            f"{info.variant!r} with {len(info.kernel_sets)} kernel sets and {len(info.bindings)} "
            f"bindings; the all-wheel is variant {ALL_VARIANT!r} with both",
        )
    if version.local is not None:
        raise Disagreement("version", f"{info.version!r}: the all-wheel's version has no local label")
    cpu = linux_cpu(platform)
    if cpu is None or not _LINUX_TAG.fullmatch(platform) or info.platform != cpu:
        raise Disagreement("file", f"{file!r}: an all-wheel for {info.platform!r} tagged {platform}")
    for key in ("cuda_major", "torch", "cxx11abi", "binding"):
        if getattr(info, key) is not None:
            raise Disagreement(
                key, f"{getattr(info, key)!r} in the all-wheel (each binding and set has its own)"
            )


def _member(zf: zipfile.ZipFile, name: str) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > MAX_MEMBER_BYTES:
        raise ValueError(f"{name} is {info.file_size} bytes unpacked (fa writes under {MAX_MEMBER_BYTES})")
    with zf.open(info) as f:
        return f.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES]


def _check_dist_info(zf: zipfile.ZipFile, path: Path, version: Version, tag: str) -> None:
    """The wheel's own metadata must say what its file name says (pip installs what METADATA says)."""
    folders = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    expected = f"{schema.DIST}-{version}.dist-info"
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
        "METADATA Name": (canonicalize_name(metadata.get("Name") or ""), schema.PACKAGE),
        "METADATA Version": (metadata.get("Version"), str(version)),
        "WHEEL Tag": (sorted(wheel.get_all("Tag") or []), [tag]),
    }
    for field, (got, want) in found.items():
        if got != want:
            member, key = field.split()
            raise WheelDirError(
                f"{path}: {expected}/{member}: {key} is {got!r}, but the file name says {want!r}; refusing "
                "it (a renamed or altered wheel): rebuild it with fa build"
            )


def _open(path: Path) -> zipfile.ZipFile:
    if not path.is_file():  # a FIFO would block the zip reader forever, a device never end
        kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, a device?)"
        raise WheelDirError(
            f"{path}: {kind}, so not a wheel\n  fix: move it out of {path.parent}, then re-run"
        )
    return zipfile.ZipFile(path)


def read_manifest(path: Path) -> schema.Manifest:
    """The manifest inside a wheel file."""
    try:
        with _open(path) as zf:
            return schema.Manifest.from_json(json.loads(_member(zf, schema.MANIFEST_PATH)))
    except (
        OSError,
        zipfile.BadZipFile,
        KeyError,
        ValueError,
        RecursionError,
    ) as e:  # SchemaError: ValueError
        raise WheelDirError(
            f"{path}: not an fa-attn wheel with a readable manifest ({e}); remove it or rebuild"
        ) from e


def wheel_entry(path: Path) -> schema.IndexEntry:
    """The index.json entry of a wheel file, from its name, its bytes and its manifest, once its file
    name, .dist-info and manifest are found to agree."""
    try:
        _, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as e:
        raise WheelDirError(f"{path}: not an fa-attn wheel file name ({e}); remove it or rebuild") from e
    info = read_manifest(path).info
    tag = next(iter(tags))
    if len(tags) == 1:
        try:
            with _open(path) as zf:
                _check_dist_info(zf, path, version, str(tag))
        except (OSError, zipfile.BadZipFile, KeyError, ValueError) as e:
            raise WheelDirError(f"{path}: not an fa-attn wheel ({e}); remove it or rebuild") from e
    if info.platform is None and tag.platform != "any":  # written before manifests named the CPU
        info = dataclasses.replace(info, platform=wheel_cpu(tag.platform))
    try:
        check_agreement(path.name, info)
    except Disagreement as e:
        where = "file name" if e.field == "file" else f"{schema.MANIFEST_PATH} {e.field}"
        raise WheelDirError(
            f"{path}: {where}: {e.problem}; refusing it (a renamed or altered wheel): rebuild it with "
            "fa build, or remove it"
        ) from None
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
