"""Shared-memory bank conflicts of every kernel, counted by the CPU emulator (tests/emu/emu.h).

For each family's tile configuration (one arch per family, fp16: bf16 has the same addresses) this runs
one forward and backward over full blocks (batch 1, one head, seqlen twice the largest block edge, head
dim = the bucket) and prints, per entry point and access kind, the instructions and the ratio of
wavefronts to the conflict-free minimum (1.00: no conflict). ldmatrix phases are exact; per-thread
loads, stores and cp.async are grouped by call site and execution count per warp between barriers.
No GPU involved: these are properties of the addresses the kernels compute, not timings.

    python bench/kernels/smem_banks.py [--family sm80] [--bucket 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "kernels"), str(REPO / "tests" / "emu")]

import emu_harness as H
import tiles
import torch

FAMILIES = {"sm75": "7.5", "sm80": "8.0", "sm86": "8.6", "sm90": "9.0", "sm120": "12.0"}


def measure(arch: str, bucket: int) -> dict[str, dict[str, list[int]]]:
    fwd = H.Emulated(H.unit_for(arch, "fwd", "fp16", bucket), arch)
    try:
        bwd: H.Emulated | None = H.Emulated(H.unit_for(arch, "bwd", "fp16", bucket), arch)
    except LookupError:
        bwd = None
    edges = [e.block_m for em in (fwd, bwd) if em for e in em.unit.entries.values()]
    edges += [e.block_n for em in (fwd, bwd) if em for e in em.unit.entries.values()]
    seqlen = 2 * max(edges)
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, seqlen, 1, bucket, generator=gen).half() for _ in range(4))
    call = H.Call(q, k, v)
    out, lse = H.forward(fwd, call)
    result = dict(fwd.banks)
    if bwd is not None:
        H.backward(bwd, call, out, lse, dout)
        result.update(bwd.banks)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append", help="default: all")
    ap.add_argument(
        "--bucket", type=int, choices=tiles.HEAD_DIM_BUCKETS, action="append", help="default: all"
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    families = args.family or list(FAMILIES)
    buckets = args.bucket or list(tiles.HEAD_DIM_BUCKETS)
    pairs = [
        (u, FAMILIES[f])
        for f in families
        for u in tiles.units(FAMILIES[f])
        if u.dtype == "fp16" and u.head_dim in buckets
    ]
    H.build_all(pairs)
    rows = []
    print(f"{'family':6} {'bucket':>6} {'entry':18} " + " ".join(f"{k:>18}" for k in H.ACCESS_KINDS))
    for family in families:
        arch = FAMILIES[family]
        for bucket in buckets:
            for entry, kinds in measure(arch, bucket).items():
                cells = []
                for kind in H.ACCESS_KINDS:
                    n, wavefronts, ideal = kinds[kind]
                    cells.append(f"{n:>9} x {wavefronts / ideal:5.2f}" if n else f"{'-':>18}")
                    rows.append(
                        {
                            "family": family,
                            "bucket": bucket,
                            "entry": entry,
                            "kind": kind,
                            "instructions": n,
                            "wavefronts": wavefronts,
                            "conflict_free_wavefronts": ideal,
                        }
                    )
                print(f"{family:6} {bucket:>6} {entry:18} " + " ".join(cells))
    worst = max(
        (r["wavefronts"] / r["conflict_free_wavefronts"] for r in rows if r["instructions"]), default=1.0
    )
    print(f"worst ratio of wavefronts to the conflict-free minimum: {worst:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
