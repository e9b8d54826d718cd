"""What the GPU window carries (.carry/, git-ignored), built here and checked to fit.

    python tests/gpu/carry.py build    # the two wheels and the autotuner's cubins, then `check`
    python tests/gpu/carry.py check    # hashes against this checkout, sizes against the 64 MiB limit

build makes, from this checkout:
  .carry/wheels-h100    fa build -m tests/gpu/device_matrix.yaml (SASS 9.0 + PTX compute_90, cu13, torch 2.11)
  .carry/wheels-turing  fa build -m tests/gpu/turing_matrix.yaml (only the 7.5 image: SASS + compute_75 PTX)
  .carry/autotune       bench/kernels/tile_compile.py --arch 9.0: every candidate tile of every direction and
                        bucket in bf16 (tiles.py's tables are per family, not per dtype), compiled by
                        the pinned CUDA 13 NVRTC; those that spill registers are left out; the cubins
                        packed into cubins.tar.gz beside index.json
The device machine cannot build or download, and runs what is in .carry/, not the source tree: run
build again after any change under kernels/ (the candidates are compiled again only when csrc/ or
tiles.py changed). check refuses wheels or cubins built from other sources (the manifest's
source_sha256; index.json's image_source_sha256 for the cubins, which depend on csrc/ and tiles.py
alone) and a working tree plus .carry/ over the device tool's 64 MiB; it ends with the run(...) calls
of the plan (tests/gpu/README.md). Exit status 0 when everything is ready, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CARRY = REPO / ".carry"
LIMIT = 64 * 2**20  # the device tool's limit on the working tree plus carried paths
MARGIN = 8 * 2**20  # kept free: the tree grows between this check and the window
for _p in (REPO, HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

WHEELS = {"h100": "device_matrix.yaml", "turing": "turing_matrix.yaml"}


def build(autotune: bool) -> int:
    for name, matrix in WHEELS.items():
        cmd = [
            sys.executable,
            "-m",
            "buildtool.cli",
            "build",
            "-m",
            str(HERE / matrix),
            "-o",
            str(CARRY / f"wheels-{name}"),
            "--no-progress",
        ]
        print(f"$ {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
            print(f"carry: building wheels-{name} failed (see above)", file=sys.stderr)
            return 1
        print(f"   wheels-{name}: {time.monotonic() - t0:.0f}s", flush=True)
    if autotune and _cubins_current():
        print("   autotune: .carry/autotune was compiled from these csrc/ and tiles.py: kept", flush=True)
    elif autotune:
        out = CARRY / "autotune"
        shutil.rmtree(out, ignore_errors=True)  # old cubins would ride along unused
        cmd = [
            sys.executable,
            str(REPO / "bench" / "kernels" / "tile_compile.py"),
            "--arch",
            "9.0",
            "--out",
            str(out),
        ]
        print(f"$ {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
            print("carry: compiling the autotuner's candidates failed (see above)", file=sys.stderr)
            return 1
        sys.path.insert(0, str(REPO / "bench" / "kernels"))
        import tile_compile

        tarball = tile_compile.pack(out)
        print(
            f"   autotune: {time.monotonic() - t0:.0f}s; {tarball.stat().st_size / 2**20:.1f} MiB packed",
            flush=True,
        )
    return check()


def _cubins_current() -> bool:
    from buildtool.core.kernels_src import IMAGE_SOURCES, source_hash

    index = CARRY / "autotune" / "index.json"
    if not index.is_file():
        return False
    data = json.loads(index.read_text())
    return data.get("arch") == "9.0" and data.get("image_source_sha256") == source_hash(
        REPO / "kernels", IMAGE_SOURCES
    )


def tree_bytes() -> int:
    """What the device tool sends besides carried paths: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    return sum(
        (REPO / os.fsdecode(p)).stat().st_size for p in listed if p and (REPO / os.fsdecode(p)).is_file()
    )


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def check() -> int:
    import wheel_check
    from kit import WHEEL_GLOB

    from buildtool.core.kernels_src import IMAGE_SOURCES, source_hash

    ok = True
    ours, images = source_hash(REPO / "kernels"), source_hash(REPO / "kernels", IMAGE_SOURCES)
    print(f"checkout: kernels/ source_sha256 {ours}, of the images alone {images}")
    for name in WHEELS:
        found = sorted((CARRY / f"wheels-{name}").glob(WHEEL_GLOB))
        if len(found) != 1:
            print(
                f"MISSING .carry/wheels-{name}/{WHEEL_GLOB}: found {len(found)} (python tests/gpu/carry.py build)"
            )
            ok = False
            continue
        problem = wheel_check.mismatch(wheel_check.read_manifest(found[0]), str(found[0].relative_to(REPO)))
        print(f"{'STALE' if problem else 'ok   '} {problem or found[0].relative_to(REPO)}")
        ok &= problem is None
    index = CARRY / "autotune" / "index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        kept = sum(c["compiled"]["verdict"] == "kept" for c in data["candidates"])
        if data.get("image_source_sha256") != images or data.get("arch") != "9.0":
            print(f"STALE .carry/autotune: sm {data.get('arch')}, sources {data.get('image_source_sha256')}")
            ok = False
        else:
            print(
                f"ok    .carry/autotune: {len(data['candidates'])} candidates for sm 9.0, {kept} kept "
                f"(NVRTC {data.get('nvrtc')}); the rest spill or failed to compile"
            )
    else:
        print("note  no .carry/autotune: the tune command compiles the candidates on the GPU machine")
    tree, carried = tree_bytes(), folder_bytes(CARRY)
    total = tree + carried
    fits = total <= LIMIT - MARGIN
    print(
        f"{'ok   ' if fits else 'LARGE'} sizes: working tree {tree / 2**20:.1f} MiB + .carry {carried / 2**20:.1f} MiB "
        f"= {total / 2**20:.1f} MiB of the {LIMIT / 2**20:.0f} MiB a call may send (keeping {MARGIN / 2**20:.0f} free)"
    )
    ok &= fits
    print(
        "\nthe plan (tests/gpu/README.md), one device call each:"
        if ok
        else "\nnot ready: fix the lines above first"
    )
    if ok:
        for command, timeout in (("verify", 480), ("tune", 480), ("bench", 480)):
            print(
                f'  run(command="python3 tests/gpu/kit.py {command}", carry=[".carry"], timeout_s={timeout})'
            )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("build", "check"))
    ap.add_argument("--no-autotune", action="store_true", help="build: the wheels only")
    args = ap.parse_args(argv)
    return build(not args.no_autotune) if args.action == "build" else check()


if __name__ == "__main__":
    sys.exit(main())
