"""Compile every candidate tile of kernels/tiles.py with NVRTC for one arch, and keep those without
register spills: the autotuner's first stage, run here (.carry/) or on the GPU machine.

    python bench/kernels/tile_compile.py --arch 9.0 --out .carry/autotune         # the pinned CUDA 13 NVRTC
    python bench/kernels/tile_compile.py --arch 9.0 --out /tmp/c --nvrtc-lib DIR    # any unpacked NVRTC

One NVRTC program per (dtype, head-dim bucket, direction, candidate tile) with `-Xptxas=-v`; a unit
whose entries spill registers (ptxas's spill stores or loads) is pruned before anything runs, as is
one NVRTC refuses. Shared memory was pruned by tiles.candidates() already. Writes one cubin per kept
candidate and index.json: the arch, the NVRTC version, the hash of what the images are compiled from
(buildtool's source_hash of csrc/ and tiles.py) and every candidate with its registers and its fate.
Compiles run in worker processes, one NVRTC each.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO, REPO / "kernels"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import tiles  # kernels/ is on sys.path above

from buildtool.builder.nvrtc import NvrtcError, open_nvrtc, parse_resource_usage
from buildtool.core.kernels_src import IMAGE_SOURCES, source_hash

INDEX = "index.json"
CUBINS = "cubins.tar.gz"  # pack()'s one file


@dataclass(frozen=True)
class Candidate:
    """One tile for one (arch, dtype, head-dim bucket, direction): what the autotuner compiles,
    checks and times. `fields` are the tile's dataclass fields, `default` marks the table's tile."""

    arch: str
    dtype: str
    head_dim: int
    direction: str
    label: str
    fields: dict[str, int]
    default: bool

    @property
    def key(self) -> str:
        return f"{self.direction}_{self.dtype}_d{self.head_dim}"

    @property
    def id(self) -> str:
        return f"{self.key}-{self.label}"

    @property
    def file(self) -> str:
        return f"sm{self.arch.replace('.', '')}/{self.id}.cubin"

    def tile(self) -> Any:
        """The Tile object (its class is the default tile's: tiles.py decides the knobs)."""
        cls = type(tiles.default_tile(self.arch, self.direction, self.head_dim))
        return cls(**self.fields)

    def unit(self) -> Any:
        return tiles.unit(self.arch, self.direction, self.dtype, self.head_dim, self.tile())


def candidates(arch: str, dtypes: list[str], head_dims: list[int], directions: list[str]) -> list[Candidate]:
    """Every candidate tiles.py offers, in the order given (the default of each key first)."""
    family = tiles.arch_family(arch)
    if family is None:
        raise ValueError(f"--arch {arch}: kernels/tiles.py has no kernels for it")
    out = []
    for d in head_dims:
        for dtype in (t for t in dtypes if t in family.dtypes):
            for direction in directions:
                default = tiles.default_tile(arch, direction, d)
                for tile in tiles.candidates(arch, direction, d):
                    fields = {f.name: getattr(tile, f.name) for f in dataclasses.fields(tile)}
                    out.append(Candidate(arch, dtype, d, direction, tile.label, fields, tile == default))
    return out


@dataclass
class Compiled:
    id: str
    verdict: str  # "kept" | "spills" | "compile-error"
    registers: dict[str, int]  # entry -> registers per thread
    spill_bytes: int  # spill stores + loads over every entry
    compile_s: float
    message: str = ""


def _compile_one(cand: Candidate, lib_dir: str, out_dir: str, kernels: str) -> Compiled:
    """Worker body: compile, read ptxas's report, keep the cubin when nothing spills."""
    t0 = time.perf_counter()
    unit = cand.unit()
    root = Path(kernels)
    headers = {p.name: p.read_text() for p in sorted((root / "csrc").iterdir()) if p.suffix in (".h", ".cuh")}
    options = [
        *tiles.nvrtc_options(cand.arch),
        *(f"-D{k}={v}" for k, v in sorted(unit.defines.items())),
        "-Xptxas=-v",
    ]
    try:
        out = open_nvrtc(lib_dir).compile(
            (root / unit.source).read_text(),
            unit.source,
            "sm_" + cand.arch.replace(".", ""),
            options,
            headers,
        )
    except NvrtcError as e:
        return Compiled(cand.id, "compile-error", {}, 0, round(time.perf_counter() - t0, 2), str(e)[-2000:])
    usage = {u.kernel: u for u in parse_resource_usage(out.log)}
    regs = {e: usage[e].registers for e in unit.entries if e in usage}
    spills = sum(usage[e].spill_stores + usage[e].spill_loads for e in unit.entries if e in usage)
    seconds = round(time.perf_counter() - t0, 2)
    missing = [e for e in unit.entries if e not in usage]
    if missing:
        return Compiled(
            cand.id, "compile-error", regs, spills, seconds, f"ptxas reported nothing for {missing}"
        )
    if spills:
        return Compiled(cand.id, "spills", regs, spills, seconds, f"{spills} bytes of spill stores and loads")
    path = Path(out_dir) / cand.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.image)
    return Compiled(cand.id, "kept", regs, 0, seconds)


def find_nvrtc() -> Path | None:
    """An NVRTC already installed in this Python (NVIDIA's nvidia-cuda-nvrtc wheel, a dependency of
    torch's CUDA builds): the lib dir holding libnvrtc.so.* and its builtins. The newest major first."""
    found = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            found += [p.parent for p in base.glob("*/lib/libnvrtc.so.*") if ".alt." not in p.name]
    found = [d for d in dict.fromkeys(found) if any(d.glob("libnvrtc-builtins.so.*"))]
    return max(found, key=lambda d: max(p.name for p in d.glob("libnvrtc.so.*")), default=None)


def compile_all(
    cands: list[Candidate], lib_dir: Path, out_dir: Path, workers: int, log: Any = sys.stdout
) -> dict[str, Compiled]:
    """Compile every candidate (in parallel); write index.json. Returns id -> outcome."""
    out_dir.mkdir(parents=True, exist_ok=True)
    nv = open_nvrtc(str(lib_dir))
    results: dict[str, Compiled] = {}
    t0 = time.perf_counter()
    kernels = str(REPO / "kernels")
    if workers <= 1:
        done = (_compile_one(c, str(lib_dir), str(out_dir), kernels) for c in cands)
        for r in done:
            results[r.id] = r
    else:
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futs = [pool.submit(_compile_one, c, str(lib_dir), str(out_dir), kernels) for c in cands]
            for n, fut in enumerate(cf.as_completed(futs), 1):
                r = fut.result()
                results[r.id] = r
                if n % 50 == 0:
                    print(
                        f"  compiled {n}/{len(cands)} ({time.perf_counter() - t0:.0f}s)", file=log, flush=True
                    )
    wall = time.perf_counter() - t0
    index = {
        "arch": cands[0].arch if cands else None,
        "nvrtc": ".".join(map(str, nv.version)),
        "nvrtc_lib": str(lib_dir),
        "image_source_sha256": source_hash(REPO / "kernels", IMAGE_SOURCES),
        "wall_s": round(wall, 1),
        "candidates": [
            {**dataclasses.asdict(c), "compiled": dataclasses.asdict(results[c.id])}
            for c in cands
            if c.id in results
        ],
    }
    (out_dir / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    print(
        f"compiled {len(cands)} candidates for sm {index['arch']} with NVRTC {index['nvrtc']} in {wall:.0f}s on "
        f"{workers} workers: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())),
        file=log,
        flush=True,
    )
    return results


def read_index(out_dir: Path) -> dict:
    return json.loads((out_dir / INDEX).read_text())


def pack(out_dir: Path) -> Path:
    """The cubins into one out_dir/cubins.tar.gz (a quarter of their size: what .carry/ sends)."""
    tarball = out_dir / CUBINS
    folders = sorted(p for p in out_dir.iterdir() if p.is_dir())
    with tarfile.open(tarball, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name)
    for folder in folders:
        shutil.rmtree(folder)
    return tarball


def cubin_dir(images: Path, scratch: Path) -> Path:
    """Where the cubins of `images` (a --out of this script) are: itself, or its cubins.tar.gz unpacked
    into `scratch`."""
    tarball = images / CUBINS
    if not tarball.is_file():
        return images
    with tarfile.open(tarball) as tar:
        tar.extractall(scratch, filter="data")
    return scratch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="9.0")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--dtypes", nargs="+", default=["bf16"], help="default bf16 (tiles.py's tables are per family)"
    )
    ap.add_argument("--head-dims", type=int, nargs="+", help="head-dim buckets (default: every bucket)")
    ap.add_argument("--directions", nargs="+", default=list(tiles.DIRECTIONS), choices=tiles.DIRECTIONS)
    ap.add_argument("--nvrtc-lib", type=Path, help="an NVRTC lib dir (default: the pinned CUDA 13 one)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    lib_dir = args.nvrtc_lib
    if lib_dir is None:
        from buildtool.builder import toolkits

        lib_dir = toolkits.nvrtc_lib_dir(13)
    cands = candidates(
        args.arch, args.dtypes, args.head_dims or list(tiles.HEAD_DIM_BUCKETS), args.directions
    )
    results = compile_all(cands, lib_dir, args.out, args.workers)
    return 1 if any(r.verdict == "compile-error" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
