"""wheels/index.json (docs/contracts.md section 5) and a PEP 503 simple index, made from the wheels.

Everything is read back from the wheel files themselves (their names, bytes and fa_attn/manifest.json),
never from the build that wrote them, so the wheels of several shards merge by re-indexing the
directory they were copied into (`fa index wheels/`).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import jinja2
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool import cache
from buildtool.fetch import sha256_file
from buildtool.package import MANIFEST, PROJECT, REQUIRES_PYTHON
from buildtool.pypi import linux_cpu

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


def _env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def write_index(wheel_dir: Path) -> dict:
    """(Re)write wheel_dir/index.json and wheel_dir/simple/ from the *.whl files there."""
    wheels = sorted(wheel_dir.glob("fa_attn-*.whl"))  # temp files are named *.whl.tmp-*: not matched
    index = {"schema": 1, "package": PROJECT, "wheels": [wheel_entry(p) for p in wheels]}
    cache.atomic_write_json(wheel_dir / "index.json", index)
    env = _env()
    simple = wheel_dir / "simple"
    cache.atomic_write_text(
        simple / "index.html", env.get_template("root.html.j2").render(projects=[PROJECT])
    )
    page = env.get_template("project.html.j2").render(
        project=PROJECT, wheels=index["wheels"], prefix="../../"
    )
    cache.atomic_write_text(simple / PROJECT / "index.html", page)
    return index
