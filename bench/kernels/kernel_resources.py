"""Registers, spills, shared memory and occupancy of every kernel unit, per arch, from ptxas itself.

    python bench/kernels/kernel_resources.py                    # CUDA 12, every arch it targets
    python bench/kernels/kernel_resources.py --cuda 11 --arch 7.5 --arch 8.0 --json out.json
    python bench/kernels/kernel_resources.py --cuda 13 --direction fwd     # forward units only
    python bench/kernels/kernel_resources.py --lib-dir /path/to/nvrtc/lib   # an unpacked NVRTC, no download
    python bench/kernels/kernel_resources.py --candidates --arch 9.0 --direction fwd --dtype bf16 --head-dim 128
                                                        # every tile of the autotuner's search space
    python bench/kernels/kernel_resources.py --alternatives --arch 8.0  # the smaller tiles sm 8.0's image
                                                        # carries for 99 KB GPUs (tiles.alternative_units)

Compiles each unit of kernels/tiles.py for each arch with `-Xptxas=-v` (in parallel, one NVRTC per
worker process), each with the tile of the --cuda major (kernels/tiles.py gives NVRTC 11.8 its own
tiles where its ptxas spills on the defaults), prints one row per (unit, arch, entry) and writes the rows as JSON. No GPU needed.
Fails (exit 1) if a compile fails or a launch's shared memory exceeds its arch's per-block limit.

Occupancy (blocks/SM) is the usual calculator's estimate from per-SM limits (CUDA C++ Programming
Guide, "Technical Specifications per Compute Capability"): registers allocated per warp in units of
256, shared memory plus the 1 KB per block the driver reserves (sm80+), threads and blocks per SM.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: figures
import figures

from buildtool.builder import cubin_fit, toolkits
from buildtool.builder.nvrtc import NvrtcError, open_nvrtc, parse_resource_usage
from buildtool.core import kernels_src
from buildtool.core.cuda_facts import TOOLKITS

REGS_PER_SM = 64 * 1024


@dataclass(frozen=True)
class SmLimits:
    smem_per_sm: int  # bytes
    reserved_per_block: int  # bytes the driver keeps per resident block
    threads: int
    blocks: int


# Per compute capability, as published.
SM_LIMITS: dict[str, SmLimits] = {
    "7.5": SmLimits(64 * 1024, 0, 1024, 16),
    "8.0": SmLimits(164 * 1024, 1024, 2048, 32),
    "8.6": SmLimits(100 * 1024, 1024, 1536, 16),
    "8.7": SmLimits(164 * 1024, 1024, 1536, 16),
    "8.9": SmLimits(100 * 1024, 1024, 1536, 24),
    "9.0": SmLimits(228 * 1024, 1024, 2048, 32),
    "10.0": SmLimits(228 * 1024, 1024, 2048, 32),
    "10.1": SmLimits(228 * 1024, 1024, 2048, 32),
    "10.3": SmLimits(228 * 1024, 1024, 2048, 32),
    "12.0": SmLimits(100 * 1024, 1024, 1536, 32),
    "12.1": SmLimits(100 * 1024, 1024, 1536, 32),
}
# 8.8 and 11.0 have no published row we could check: assumed like 8.6 and 10.0.
SM_LIMITS["8.8"] = SM_LIMITS["8.6"]
SM_LIMITS["11.0"] = SM_LIMITS["10.0"]
SM_LIMITS["9.0a"] = SM_LIMITS["9.0"]  # the arch-specific target of the same GPUs (H100, H200, GH200)


@dataclass(frozen=True)
class Row:
    unit: str
    tile: str  # tiles.Tile.label
    arch: str
    entry: str
    threads: int
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    dynamic_smem: int
    smem_limit: int
    blocks_per_sm: int
    compile_s: float

    @property
    def smem_ok(self) -> bool:
        return self.static_smem + self.dynamic_smem <= self.smem_limit


@dataclass(frozen=True)
class Job:
    unit: str
    tile: str
    arch: str
    source_name: str
    source: str
    options: tuple[str, ...]
    launches: tuple[tuple[str, int, int], ...]  # (entry, threads, dynamic smem)
    smem_limit: int  # the arch's per-block maximum (tiles.SMEM_LIMIT)


def blocks_per_sm(arch: str, threads: int, registers: int, smem: int) -> int:
    lim = SM_LIMITS[arch]
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = REGS_PER_SM // (regs_per_warp * warps)
    by_smem = lim.smem_per_sm // (smem + lim.reserved_per_block) if smem else lim.blocks
    by_threads = lim.threads // threads
    return max(0, min(by_regs, by_smem, by_threads, lim.blocks))


def _headers(kdir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((kdir / "csrc").iterdir()) if p.suffix in (".h", ".cuh")}


def _compile(job: Job, lib_dir: str, headers: dict[str, str]) -> list[Row] | str:
    """Worker body: one unit for one arch; rows, or NVRTC's log on failure."""
    t0 = time.perf_counter()
    target = "sm_" + job.arch.replace(".", "")
    try:
        out = open_nvrtc(lib_dir).compile(job.source, job.source_name, target, list(job.options), headers)
    except NvrtcError as e:
        return f"{job.unit} for {target}: {e}"
    seconds = time.perf_counter() - t0
    usage = {u.kernel: u for u in parse_resource_usage(out.log)}
    # ptxas -v reports 0 bytes smem where the sm90+ cubins carry 1 KiB in .nv.shared.<kernel>: the
    # cubin's ELF is the figure a launch is held to (buildtool/builder/cubin_fit.py).
    needs = cubin_fit.kernel_needs(out.image)
    rows = []
    for entry, threads, smem in job.launches:
        u = usage.get(entry)
        if u is None:
            return f"{job.unit} for {target}: ptxas reported nothing for entry {entry}\n{out.log}"
        static = max(u.static_smem, needs[entry].static_smem if entry in needs else 0)
        rows.append(
            Row(
                unit=job.unit,
                tile=job.tile,
                arch=job.arch,
                entry=entry,
                threads=threads,
                registers=u.registers,
                spill_stores=u.spill_stores,
                spill_loads=u.spill_loads,
                stack_bytes=u.stack_bytes,
                static_smem=static,
                dynamic_smem=smem,
                smem_limit=job.smem_limit,
                blocks_per_sm=blocks_per_sm(job.arch, threads, u.registers, smem + static),
                compile_s=round(seconds, 2),
            )
        )
    return rows


def plan(
    archs: list[str],
    directions: tuple[str, ...] = ("fwd", "bwd", "splitkv"),
    dtypes: tuple[str, ...] | None = None,
    head_dims: tuple[int, ...] | None = None,
    every_candidate: bool = False,
    alternatives: bool = False,
    cuda: int | None = None,
) -> list[Job]:
    """One job per unit of tiles.units(arch, cuda) (with every_candidate: per tile of tiles.candidates;
    with alternatives: tiles.alternative_units instead, the smaller tiles for GPUs with less shared
    memory) that passes the filters: the tiles CUDA `cuda`'s NVRTC compiles (tiles per CUDA major)."""
    tiles = kernels_src.tiles()
    kdir = kernels_src.kernels_dir()
    jobs = []
    for arch in archs:
        for u in tiles.alternative_units(arch, cuda) if alternatives else tiles.units(arch, cuda):
            if u.direction not in directions or (dtypes and u.dtype not in dtypes):
                continue
            if head_dims and u.head_dim not in head_dims:
                continue
            rows = tiles.candidates(arch, u.direction, u.head_dim, cuda) if every_candidate else [None]
            for tile in rows:
                if tile is None:
                    unit = u  # its own tile: the default, or the alternative's
                else:
                    unit = tiles.unit(arch, u.direction, u.dtype, u.head_dim, tile)
                defines = tuple(f"-D{k}={v}" for k, v in sorted(unit.defines.items()))
                jobs.append(
                    Job(
                        unit=unit.name,
                        tile=unit.tile,
                        arch=arch,
                        source_name=unit.source,
                        source=(kdir / unit.source).read_text(),
                        options=(*tiles.nvrtc_options(arch), *defines, "-Xptxas=-v"),
                        launches=tuple(
                            (name, lc.threads, lc.smem_bytes) for name, lc in unit.entries.items()
                        ),
                        smem_limit=tiles.SMEM_LIMIT[arch],
                    )
                )
    return jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda", type=int, default=12, choices=sorted(TOOLKITS), help="CUDA major (default 12)")
    ap.add_argument(
        "--arch", action="append", help="arch like 8.0 (repeatable; default: all the toolkit targets)"
    )
    ap.add_argument("--lib-dir", help="an unpacked NVRTC lib dir (default: the pinned wheel, fetched once)")
    ap.add_argument(
        "--direction", choices=("fwd", "bwd", "splitkv"), action="append", help="only these directions"
    )
    ap.add_argument("--dtype", choices=("fp16", "bf16"), action="append", help="only these dtypes")
    ap.add_argument("--head-dim", type=int, action="append", help="only these head-dim buckets")
    ap.add_argument("--candidates", action="store_true", help="every candidate tile, not just the defaults")
    ap.add_argument(
        "--alternatives", action="store_true", help="the alternative tiles (tiles.alternative_units) instead"
    )
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--json",
        type=Path,
        help="where to write the rows (default: the user's cache, bench/kernel_resources_cuN.json)",
    )
    args = ap.parse_args(argv)

    archs = args.arch or list(TOOLKITS[args.cuda].archs)
    unknown = [a for a in archs if a not in SM_LIMITS]
    if unknown:
        ap.error(f"--arch {', '.join(unknown)}: no per-SM limits known (known: {', '.join(SM_LIMITS)})")
    lib_dir = args.lib_dir or str(toolkits.nvrtc_lib_dir(args.cuda))
    jobs = plan(
        archs,
        tuple(args.direction or ("fwd", "bwd", "splitkv")),
        tuple(args.dtype) if args.dtype else None,
        tuple(args.head_dim) if args.head_dim else None,
        args.candidates,
        args.alternatives,
        args.cuda,
    )
    headers = _headers(kernels_src.kernels_dir())

    rows: list[Row] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, args.workers), mp_context=ctx) as pool:
        futs = [pool.submit(_compile, j, lib_dir, headers) for j in jobs]
        for fut in cf.as_completed(futs):
            res = fut.result()
            if isinstance(res, str):
                errors.append(res)
            else:
                rows.extend(res)
    wall = time.perf_counter() - t0
    order = {a: i for i, a in enumerate(archs)}
    rows.sort(key=lambda r: (order[r.arch], r.unit, r.tile, r.entry))

    head = (
        f"{'unit':<18} {'tile':<13} {'arch':>5} {'entry':<18} {'thr':>4} {'regs':>4} {'spill st/ld':>11} "
        f"{'smem':>7} {'limit':>7} {'blk/SM':>6} {'compile':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        flag = "" if r.smem_ok else "  OVER SMEM LIMIT"
        print(
            f"{r.unit:<18} {r.tile:<13} {r.arch:>5} {r.entry:<18} {r.threads:>4} {r.registers:>4} "
            f"{f'{r.spill_stores}/{r.spill_loads}':>11} {r.static_smem + r.dynamic_smem:>7} {r.smem_limit:>7} "
            f"{r.blocks_per_sm:>6} {r.compile_s:>6.1f}s{flag}"
        )
    total = sum(r.compile_s for r in {(r.unit, r.tile, r.arch): r for r in rows}.values())
    print(
        f"\n{len(jobs)} programs, CUDA {args.cuda} ({lib_dir}); NVRTC time {total:.1f}s summed, "
        f"{wall:.1f}s wall on {args.workers} workers"
    )

    out = args.json or figures.cache_out(f"kernel_resources_cu{args.cuda}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "cuda": args.cuda,
                "lib_dir": lib_dir,
                "wall_s": round(wall, 1),
                "rows": [asdict(r) for r in rows],
                "errors": errors,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")

    over = [r for r in rows if not r.smem_ok]
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    for r in over:
        print(
            f"error: {r.unit} on {r.arch}: {r.static_smem + r.dynamic_smem} B smem > {r.smem_limit}",
            file=sys.stderr,
        )
    spilled = [r for r in rows if r.spill_stores or r.spill_loads]
    for r in spilled:
        print(
            f"{'note' if args.candidates else 'error'}: {r.unit} {r.tile} on {r.arch} spills", file=sys.stderr
        )
    # A default unit must not spill; a spilling candidate is what the autotuner prunes.
    return 1 if errors or over or (spilled and not args.candidates) else 0


if __name__ == "__main__":
    sys.exit(main())
