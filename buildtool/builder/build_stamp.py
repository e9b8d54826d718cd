"""The whole-build stamp: a build of the same plan, from the same inputs, into a folder that is as the
last successful build left it, has nothing to do.

A successful build records under the cache (stamps/build/) the state of every entry under the output
folder (links stated, never followed) and of every input its wheels were packed from (the compile
cache's images, the bindings), with the summary's wheel rows. The stamp's key covers what decides the
folder's contents: fa's own code, the folder, the resolved plan (matrix, torch releases and kernel
table, as data), the kernels tree by file state, auditwheel's version (it picks the platform tags),
the Python running fa (the build log names it) and the identity of each C++ compiler the bindings
use. The next build with that key looks at every recorded entry again, one stat each, and finds
nothing to do only when each is as recorded and none was added: a wheel edited, added or deleted, the
index touched, an image edited in the cache runs the whole build, which stamps the folder again. A
stamp that cannot be read is ignored (and rewritten by that build).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from buildtool.builder import binding, package
from buildtool.builder.plan import Plan
from buildtool.core import cache

_KIND = "build"


def key(plan: Plan, out_dir: Path, kernels_root: Path) -> str:
    """The stamp's key for building `plan` from `kernels_root` into `out_dir`."""
    compilers = sorted({binding.compiler_identity(b.platform) for b in plan.binding_jobs})
    return cache.content_key(
        "fa-build-v1",
        cache.own_code_hash(),
        str(out_dir.resolve()),
        repr(plan),
        package.tree_state(kernels_root),
        package.auditwheel_version(),
        sys.version.split()[0],  # the build log names the Python that ran the build
        *compilers,
    )


def _entry_state(path: str) -> list[int] | None:
    """A folder entry as it is: its kind and permissions, device, inode, size and times (ctime moves
    with every write or rename). A link is stated itself, never followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def folder_state(out_dir: Path) -> dict[str, list[int] | None]:
    """Every entry under `out_dir` (files, folders, links; links not followed), by relative path."""
    root = os.fspath(out_dir)
    states = {".": _entry_state(root)}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            states[os.path.relpath(path, root)] = _entry_state(path)
    return states


def unchanged(stamp_key: str, out_dir: Path) -> list[dict[str, Any]] | None:
    """The wheel rows the stamp of `stamp_key` recorded, when `out_dir` and every recorded input are as
    they were then; None: build (no stamp, one fa cannot read, or anything changed since)."""
    stamp = cache.read_stamp(_KIND, stamp_key)
    if stamp is None:
        return None
    inputs, folder, rows = stamp.get("inputs"), stamp.get("folder"), stamp.get("rows")
    if not (isinstance(inputs, dict) and isinstance(folder, dict) and isinstance(rows, list)):
        return None
    if not all(isinstance(row, dict) for row in rows):
        return None
    if any(cache.file_state(path) != state for path, state in inputs.items()):
        return None
    if folder_state(out_dir) != folder:
        return None
    return rows


def record(stamp_key: str, out_dir: Path, inputs: Iterable[Path], rows: list[dict[str, Any]]) -> None:
    """Stamps `out_dir` as a finished build of `stamp_key` left it, packed from `inputs`."""
    data = {
        "inputs": {os.fspath(p): cache.file_state(p) for p in inputs},
        "folder": folder_state(out_dir),
        "rows": rows,
    }
    cache.write_stamp(_KIND, stamp_key, data)
