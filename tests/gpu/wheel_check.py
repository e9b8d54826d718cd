"""Was this prebuilt wheel built from the kernels/ checked out here? The GPU runs what is in .carry/,
not the source tree, so a wheel left over from before a change would test old code.

    python tests/gpu/wheel_check.py .carry/wheels-h100/fa_attn-*.whl .carry/wheels-turing/fa_attn-*.whl

The manifest's source_sha256 (docs/contracts.md section 3) is what the packager hashed; it must equal
buildtool's kernels_src.source_hash of this checkout's kernels/ (csrc/, tiles.py, binding/ and the
fa_attn/ runtime: what the wheel is built from). Exit status 0 when every wheel matches, 1 naming each
one that does not (with both hashes), 2 for an unreadable one.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from buildtool.core.kernels_src import source_hash  # after the repo root went on sys.path
from buildtool.core.runtime import schema

MANIFEST = schema.MANIFEST_PATH

REBUILD = "rebuild .carry/ from this checkout: python tests/gpu/carry.py build"


def read_manifest(wheel: Path) -> dict:
    """The manifest of a .whl, or of an unpacked wheel (a site dir or its fa_attn/ folder)."""
    if wheel.is_dir():
        for cand in (wheel / MANIFEST, wheel / "manifest.json"):
            if cand.is_file():
                return json.loads(cand.read_text())
        raise FileNotFoundError(f"{wheel}: no {MANIFEST} in it")
    with zipfile.ZipFile(wheel) as zf:
        return json.loads(zf.read(MANIFEST))


def mismatch(manifest: dict, where: str, kernels_root: Path = REPO / "kernels") -> str | None:
    """Why the wheel described by `manifest` was not built from `kernels_root`; None when it was."""
    ours = source_hash(kernels_root)
    try:
        theirs = schema.Manifest.from_json(manifest).source_sha256
    except schema.SchemaError as e:
        return f"{where}: its manifest is not one this checkout reads ({e}): {REBUILD}"
    if theirs is None:
        return (
            f"{where}: its manifest records no source_sha256 (built before schema 1.2, or the "
            f"universal wheel); this checkout's kernels hash to {ours}: {REBUILD}"
        )
    if theirs != ours:
        return (
            f"{where}: built from other kernel sources: manifest source_sha256 {theirs}, this "
            f"checkout's kernels/ (csrc, tiles.py, binding, fa_attn) {ours}: {REBUILD}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheels", nargs="+", type=Path, help="wheels (.whl) or unpacked wheels")
    ap.add_argument(
        "--kernels", type=Path, default=REPO / "kernels", help="the kernels/ tree to compare with"
    )
    args = ap.parse_args(argv)
    status = 0
    for wheel in args.wheels:
        try:
            man = read_manifest(wheel)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            print(f"{wheel}: cannot read its manifest ({e}); {REBUILD}", file=sys.stderr)
            status = max(status, 2)
            continue
        problem = mismatch(man, str(wheel), args.kernels)
        if problem:
            print(problem, file=sys.stderr)
            status = max(status, 1)
        else:
            print(f"{wheel}: built from this checkout's kernels ({man['source_sha256'][:16]}...)")
    return status


if __name__ == "__main__":
    sys.exit(main())
