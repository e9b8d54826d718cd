"""Are fa's wheels reproducible? The real kernels, built twice by `fa build` from two copies of the
kernels tree at different paths, each with its own FA_CACHE (downloads shared through symlinks, so
torch's headers are included from different paths): prints each wheel's sha256 and whether they match.

    python bench/build/reproducible.py                   # bench/build/reproducible.yaml: one kernel unit, torch 2.13
    python bench/build/reproducible.py --matrix m.yaml   # any matrix

Needs PyPI (the torch catalog) the first time; compiles real kernels (minutes on 2 cores). Not a test:
tests/builder/test_reproducible.py checks the same property on the fixture kernels in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = ("toolkits", "torch-headers", "pypi")  # downloads only: compiled kernels and bindings are per cache


def build(root: Path, matrix: Path, user_cache: Path) -> dict[str, str]:
    kernels = root / "checkout" / "kernels"
    shutil.copytree(REPO / "kernels", kernels, ignore=shutil.ignore_patterns("__pycache__"))
    cache = root / "cache"
    cache.mkdir()
    for name in SHARED:
        (user_cache / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(user_cache / name)
    out = root / "wheels"
    env = {**os.environ, "FA_CACHE": str(cache), "FA_KERNELS_DIR": str(kernels)}
    cmd = [sys.executable, "-m", "buildtool.cli", "build", "--matrix", str(matrix), "--out", str(out)]
    subprocess.run([*cmd, "--no-progress"], env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in sorted(out.glob("*.whl"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=REPO / "bench" / "build" / "reproducible.yaml")
    args = parser.parse_args()
    from buildtool.core.cache import cache_dir

    user_cache = cache_dir()
    with tempfile.TemporaryDirectory(prefix="fa-repro-") as tmp:
        a = build(Path(tmp) / "a", args.matrix.resolve(), user_cache)
        b = build(Path(tmp) / "second-checkout-at-a-longer-path", args.matrix.resolve(), user_cache)
    for name in sorted(a.keys() | b.keys()):
        same = "same" if a.get(name) == b.get(name) else "DIFFERENT"
        print(f"{same:9} {a.get(name, '-')[:16]} {b.get(name, '-')[:16]}  {name}")
    identical = a == b and bool(a)
    print(
        f"\n{len(a)} wheels, {'byte-identical' if identical else 'NOT identical'} across checkouts and caches"
    )
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
