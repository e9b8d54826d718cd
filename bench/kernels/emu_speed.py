"""How long the CPU emulator (tests/emu) takes to run the kernels, builds excluded: the medians of a few
repeats of a fixed set of emulated calls (forward, split-KV forward and backward of sm80 and sm75 fp16
d64 units, 150 x 170 causal, 2 heads, the shapes tests/emu/test_emulator_catches.py runs).

    python bench/kernels/emu_speed.py [--checkout DIR] [--repeats 3]

--checkout runs another checkout's emulator (a copy of main, to compare before and after a change of
tests/emu). Each call runs under that checkout's defaults (FA_EMU_SEEDS, FA_EMU_WINDOW as set).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", type=Path, default=HERE, help="the fa checkout whose emulator runs")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = args.checkout.resolve()
    for sub in ("", "kernels", "tests/emu", "tests/gpu"):
        sys.path.insert(0, str(root / sub))
    import emu_harness as H
    import torch

    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, n, 2, 64, generator=gen).half() for n in (150, 170, 170, 150))
    call = H.Call(q, k, v, causal=True)
    cases = {}
    for arch in ("8.0", "7.5"):
        units = {d: H.unit_for(arch, d, "fp16", 64) for d in ("fwd", "splitkv", "bwd")}
        H.build_all([(u, arch) for u in units.values()])
        cases[arch] = {d: H.Emulated(u, arch) for d, u in units.items()}

    def run(arch: str) -> None:
        em = cases[arch]
        out, lse = H.forward(em["fwd"], call)
        H.forward_splitkv(em["splitkv"], call, 3)
        H.backward(em["bwd"], call, out, lse, dout)

    print(f"checkout {root}")
    for arch in cases:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run(arch)
            times.append(time.perf_counter() - t0)
        print(
            f"sm {arch}: fwd + split-KV fwd + bwd  median {statistics.median(times):.2f} s  "
            f"(of {args.repeats}: {', '.join(f'{t:.2f}' for t in times)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
