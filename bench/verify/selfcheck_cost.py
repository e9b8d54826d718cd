"""What the runtime's first-use self-check (fa_attn.selfcheck) costs per call class, on the CPU emulator.

    python bench/verify/selfcheck_cost.py            # 3 runs each, medians side by side
    python bench/verify/selfcheck_cost.py --record   # and write them to docs/figures.md (section selfcheck-cost)

A unit serves a call only of a class it was checked for (selfcheck.CallClass: causal, window, softcap,
layout, page size, GQA group, MQA, head dim; per direction), so each class's first call pays one check
on a small problem of that class (selfcheck.problem_for). Figures, medians of --runs: (1) the check of
the sm 8.0 fp16 d64 units for each class, next to (2) one flash_attn_func call of the plain class's
size on the same emulated kernels, and (3) what a decode step pays once its class is verified (the
memoised admission, per call, in microseconds). On the emulator (1) and (2) are CPU seconds of a
thread-at-a-time emulation, so only their ratio carries over to a GPU, and there it is an upper bound:
a GPU check is one launch of a small grid plus an fp32 reference of an 80x80-sized problem. Not
verified on a GPU. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for folder in ("kernels", "tests/api", "tests/emu", "tests/gpu", "", "bench"):
    sys.path.insert(0, str(REPO / folder))

import emulated
import fa_attn
import figures
import torch
from _pytest.monkeypatch import MonkeyPatch
from fa_attn.verify import selfcheck


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


CLASSES = {  # name: (direction, the class's changes from the plain one)
    "fwd plain": ("fwd", {}),
    "fwd causal": ("fwd", {"causal": True}),
    "fwd window left": ("fwd", {"window": "left"}),
    "fwd window both": ("fwd", {"window": "both"}),
    "fwd softcap": ("fwd", {"softcap": True}),
    "fwd GQA 4": ("fwd", {"group": 4}),
    "fwd MQA 8": ("fwd", {"group": 8, "mqa": True}),
    "fwd head dim 40": ("fwd", {"head_dim": 40}),
    "fwd varlen": ("fwd", {"layout": "varlen"}),
    "fwd kvcache": ("fwd", {"layout": "kvcache"}),
    "fwd paged 64": ("fwd", {"layout": "kvcache", "page_size": 64}),
    "split-KV + combine": ("splitkv", {}),
    "bwd plain": ("bwd", {}),
    "bwd causal": ("bwd", {"causal": True}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    n = 64 + selfcheck.TINY_EXTRA_KEYS  # the sm 8.0 d64 forward's key block + 15
    q, k, v = (torch.randn(1, n, 2, 64, generator=gen).half() for _ in range(3))
    plain = selfcheck.CallClass(False, "none", False, "padded", 0, 1, False, 64)
    mp = MonkeyPatch()
    cost: dict[str, float] = {}
    with emulated.kernels_on_cpu(mp):
        mp.setenv("FA_SELF_CHECK", "first-use")
        mp.setenv("FA_CHECK_RECORDS", "/nonexistent-fa-records")
        call = fa_attn.inputs.check_padded(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False)
        route = emulated._decide(call, q, k, v, backward=False)
        grad_route = emulated._decide(call, q, k, v, backward=True)
        units = {"fwd": route.fwd, "splitkv": route.splitkv, "bwd": grad_route.bwd}
        for name, (direction, changes) in CLASSES.items():
            launch, cls = units[direction], plain._replace(**changes)
            cost[name] = median_s(
                lambda launch=launch, cls=cls, direction=direction: selfcheck._run_check(
                    direction, launch, torch.float16, cls, q.device
                ),
                args.runs,
            )
        one_call = median_s(lambda: fa_attn.flash_attn_func(q, k, v), args.runs)
        decode_q = q[:, :1]
        decode = fa_attn.inputs.check_padded(decode_q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False)
        fa_attn.flash_attn_func(decode_q, k, v)  # verified from here on
        admit = median_s(lambda: selfcheck.admit(route, decode, q.device, q.dtype, False, False), 2000)
    mp.undo()
    lines = [f"emulated sm 8.0, fp16, d64 units, one check per class; medians of {args.runs} runs", ""]
    lines += ["| what | CPU seconds | x one call |", "|---|---:|---:|"]
    lines += [f"| check, {name} | {sec:.3f} | {sec / one_call:.1f} |" for name, sec in cost.items()]
    lines += [f"| one flash_attn_func call, {n}x{n} | {one_call:.3f} | 1.0 |"]
    lines += ["", f"Admission once a class is verified, per decode call: {admit * 1e6:.1f} us."]
    print("\n".join(lines))
    if args.record:
        figures.record("selfcheck-cost", "\n".join(lines))


if __name__ == "__main__":
    main()
