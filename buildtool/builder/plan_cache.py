"""Plans kept in the cache: make_plan is pure (plan.py), so the same matrix, torch catalog, kernel table,
fa code and options give the same plan, and a build with nothing changed reads it back (a few ms)
instead of expanding the matrix again (about 0.1 s of CPU for the release, a tenth of a no-op rebuild).

The key is fa's code, the versions of Python and of `packaging` (whose version and specifier rules the
plan applies), the kernels tree by file state (tiles.py's table and which sources exist), the parsed
matrix and catalog as data, and the shard and CPU asked for. A plan file fa did not write as
this user (another user's in a shared FA_CACHE, or one others may write) is never loaded: plans are
stored with pickle, which runs what the file says; one that cannot be read is made again and rewritten.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import stat
import sys
from pathlib import Path

import packaging

from buildtool.builder import package
from buildtool.builder.matrix import Matrix
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.pypi import TorchCatalog
from buildtool.core import atomic, cache


def plan_path(
    matrix: Matrix,
    catalog: TorchCatalog,
    shard: tuple[int, int] | None,
    platform: str | None,
    kernels_root: Path,
) -> Path:
    """Where the plan of these inputs is kept."""
    key = cache.content_key(
        "fa-plan-v1",
        cache.own_code_hash(),
        packaging.__version__,  # the plan compares versions and specifiers with it
        sys.version.split()[0],
        package.tree_state(kernels_root),
        repr(matrix),
        repr(catalog),
        repr(shard),
        repr(platform),
    )
    return Path(os.path.join(cache.cache_dir(), "plans", key[:2], f"{key}.pickle"))


def _own(path: Path) -> bool:
    """A regular file of this user's that no one else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def cached_plan(
    matrix: Matrix,
    catalog: TorchCatalog,
    shard: tuple[int, int] | None,
    *,
    platform: str | None,
    kernels_root: Path,
) -> Plan:
    """make_plan(matrix, catalog, shard, platform=platform) with the kernel table of `kernels_root`,
    read back from the cache when these inputs were planned before."""
    path = plan_path(matrix, catalog, shard, platform, kernels_root)
    if _own(path):
        with contextlib.suppress(Exception):  # any damage a pickle can show: plan again
            plan = pickle.loads(path.read_bytes())  # this user's own file (the docstring says why)
            if isinstance(plan, Plan):
                return plan
    plan = make_plan(matrix, catalog, shard, platform=platform)
    # Not kept: the next build plans again. Written whole (renamed into place), readable by this user.
    with contextlib.suppress(atomic.WriteError, OSError):
        atomic.write_bytes(path, pickle.dumps(plan))
    return plan
