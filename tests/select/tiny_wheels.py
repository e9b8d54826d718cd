"""Tiny real fa-attn wheels for install tests: an `fa_attn` package with a manifest, written with the
`wheel` package's WheelFile (which writes RECORD and its hashes). A test helper, not production code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wheel.wheelfile import WheelFile

from buildtool.compat.wheel_index import entry_from_wheel
from buildtool.core.runtime import schema
from tests.select.fixture_index import kernel_entry, universal_entry


def build_wheel(out_dir: Path, entry: dict[str, Any], init_py: str | None = None) -> Path:
    """A wheel named and described like `entry` (an index entry from fixture_index)."""
    version = entry["version"]
    dist_info = f"fa_attn-{version}.dist-info"
    manifest = {
        "schema": schema.SCHEMA_MAJOR,
        "package": schema.PACKAGE,
        "binding": None if entry["cuda_major"] is None else schema.BINDING_FILE,
        "kernels": [],
        **{
            k: v
            for k, v in entry.items()
            if k not in ("file", "sha256", "size", "python_tag", "abi_tag", "platform_tag")
        },
    }
    tag = entry["file"].removesuffix(".whl").split("-", 2)[2]
    path = out_dir / entry["file"]
    with WheelFile(path, "w") as wf:
        wf.writestr("fa_attn/__init__.py", init_py or f"__version__ = {version!r}\n")
        wf.writestr("fa_attn/manifest.json", json.dumps(manifest))
        wf.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: fa-attn\nVersion: {version}\nRequires-Python: >=3.9\n",
        )
        wf.writestr(
            f"{dist_info}/WHEEL",
            f"Wheel-Version: 1.0\nGenerator: fa-tests\nRoot-Is-Purelib: false\nTag: {tag}\n",
        )
    return path


BROKEN = "raise ImportError('fa_attn test wheel: deliberately broken')\n"
# Imports from pip's scratch --target directory, fails once really installed: exercises the roll back.
BROKEN_WHEN_INSTALLED = (
    "if '/.fa-attn-install/work/stage/' not in __file__:\n"
    "    raise ImportError('fa_attn test wheel: broken once installed')\n"
)


def build_wheelhouse(
    out_dir: Path,
    torch_minor: str,
    cxx11abi: bool,
    broken: str | None = None,
    init_py: str = BROKEN,
    version: str = "0.1.0",
) -> Path:
    """Wheels for `torch_minor` (cu12 and cu13), one for another torch, the universal one, and index.json.
    `broken`: the variant whose fa_attn/__init__.py is `init_py`. Wheels already in out_dir are indexed too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = [
        kernel_entry(12, torch_minor, cxx11abi),
        kernel_entry(13, torch_minor, cxx11abi),
        kernel_entry(12, "2.5", False),
        universal_entry(),
    ]
    for entry in entries:
        for key in ("file", "version"):
            entry[key] = entry[key].replace("0.1.0", version, 1)
        build_wheel(out_dir, entry, init_py if entry["variant"] == broken else None)
    index = schema.index_json(entry_from_wheel(w) for w in sorted(out_dir.glob("*.whl")))
    (out_dir / "index.json").write_text(json.dumps(index, indent=1))
    return out_dir
