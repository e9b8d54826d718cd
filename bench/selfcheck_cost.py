"""What the runtime's first-use self-check (fa_attn.selfcheck) costs, measured on the CPU emulator.

    python bench/selfcheck_cost.py            # 5 runs each, medians side by side

Three figures, medians of --runs: (1) the check of one forward unit and of one backward unit on the
tiny problem (a key block + 15 queries and keys, 2 heads), next to (2) one flash_attn_func call of the same
tiny size on the same emulated kernels, and (3) what a call pays once its units are verified (the
memoised admission, per call, in microseconds). On the emulator (1) and (2) are CPU seconds of a
thread-at-a-time emulation, so only their ratio carries over to a GPU, and there it is an upper bound:
a GPU check is one launch of a tiny grid plus an fp32 reference of an 80x80-sized problem. Not verified on a
GPU. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in ("kernels", "tests/api", "tests/emu", "tests/gpu", ""):
    sys.path.insert(0, str(REPO / folder))

import emulated
import fa_attn
import torch
from _pytest.monkeypatch import MonkeyPatch
from fa_attn import selfcheck


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    n = 64 + selfcheck.TINY_EXTRA_KEYS  # the sm 8.0 d64 forward's key block + 15
    q, k, v = (torch.randn(1, n, 2, 64, generator=gen).half() for _ in range(3))
    mp = MonkeyPatch()
    with emulated.kernels_on_cpu(mp):
        mp.setenv("FA_SELF_CHECK", "first-use")
        mp.setenv("FA_CHECK_RECORDS", "/nonexistent-fa-records")
        route = fa_attn.explain(q, k, v, causal=True)
        grad_route = emulated._decide(fa_attn.inputs.check_padded(
            q, k, v, 0.0, None, True, (-1, -1), 0.0, None, False), q.requires_grad_(), k, v)  # fmt: skip
        q.requires_grad_(False)
        fwd = median_s(
            lambda: selfcheck._run_check("fwd", route.fwd, torch.float16, True, q.device), args.runs
        )
        bwd = median_s(
            lambda: selfcheck._run_check("bwd", grad_route.bwd, torch.float16, True, q.device), args.runs
        )
        call = median_s(lambda: fa_attn.flash_attn_func(q, k, v, causal=True), args.runs)
        fa_attn.flash_attn_func(q, k, v, causal=True)  # verified from here on
        admit = median_s(lambda: selfcheck.admit(route, q.device, q.dtype, True, n, False), 2000)
    mp.undo()
    print(f"emulated sm 8.0, fp16, head dim 64, {n}x{n}, causal; medians of {args.runs} runs")
    print(f"{'self-check, forward unit':<34} {fwd:8.3f} s  ({fwd / call:4.1f}x one call)")
    print(f"{'self-check, backward unit':<34} {bwd:8.3f} s  ({bwd / call:4.1f}x one call)")
    print(f"{'one flash_attn_func call':<34} {call:8.3f} s")
    print(f"{'admission once verified, per call':<34} {admit * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
