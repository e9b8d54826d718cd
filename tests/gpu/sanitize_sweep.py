"""A small sweep of our kernels for compute-sanitizer (tests/gpu/sanitize.sh runs this under memcheck
and racecheck). Small shapes on purpose: the sanitizer slows kernels down by 10-100x. It covers tails
(odd lengths), head dims below their bucket, causal with seqlen_q != seqlen_k, GQA, varlen, both dtypes
(bf16 only where the GPU has it) and, via --quick, a subset for racecheck.

    python tests/gpu/sanitize_sweep.py [--quick] [--no-check]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from attn_reference import Case
from attn_runs import run_padded, run_varlen


def cases(quick: bool) -> list[tuple[str, Case]]:
    dtypes = [torch.float16]
    if torch.cuda.get_device_capability() >= (8, 0):
        dtypes.append(torch.bfloat16)
    out = []
    for i, dtype in enumerate(dtypes):
        for j, (sq, sk, d, causal, h, hk) in enumerate(
            [
                (1, 1, 8, False, 1, 1),
                (37, 91, 64, True, 4, 2),
                (130, 65, 128, True, 2, 2),
                (200, 200, 136, False, 8, 1),
                (77, 150, 256, True, 2, 1),
            ]
        ):
            if quick and j % 2:
                continue
            out.append(("padded", Case(2, sq, sk, h, hk, d, causal, dtype, seed=100 * i + j)))
        out.append(("varlen", Case(3, 90, 70, 4, 2, 96, True, dtype, varlen=True, seed=500 + i)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes (racecheck is the slowest tool)")
    ap.add_argument("--no-check", action="store_true", help="run the kernels only, skip the reference")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("sanitize_sweep: no CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FA_STRICT"] = "1"  # a fallback would sanitize PyTorch's kernels, not ours
    for kind, case in cases(args.quick):
        print(f"{kind} {case.id}", flush=True)
        if kind == "varlen":
            run_varlen(case, check=not args.no_check)
        else:
            run_padded(case, check=not args.no_check)
    # One banded, soft-capped case: the window bounds skip whole query blocks in the backward.
    dtype = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    band = Case(2, 150, 190, 4, 2, 64, False, dtype, seed=900)
    print(f"padded {band.id} window (40, 10) softcap 10", flush=True)
    run_padded(band, check=not args.no_check, window=(40, 10), softcap=10.0)
    print("sanitize_sweep: all cases ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
