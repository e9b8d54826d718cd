"""What `fa check --emulate` costs per unit: each problem's CPU seconds on the emulator (in this process,
the unit's library built first and not counted), its verdict and its error / bound.

    python bench/verify/check_cost.py --arch 8.0 --unit fwd_fp16_d64 [--unit bwd_fp16_d64 ...]

Medians of --repeat runs per problem (CPU time: the machine's other load does not count)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "kernels")]

import torch
from fa_attn.runtime.decision import KernelLaunch
from fa_attn.verify.check import problems
from fa_attn.verify.unitcheck import check_backward, check_forward, key_block, query_block

from buildtool.emucheck.harness import emulator
from buildtool.emucheck.ops import kernels_on_cpu
from buildtool.emucheck.run import emulated_jobs


def unit_cost(arch: str, name: str, repeat: int) -> float:
    harness = emulator()
    ((job, unit),) = [(j, u) for j, u in emulated_jobs(arch, (name,)) if j.unit.endswith("/" + name)]
    lib = harness.Emulated(unit, arch)
    launch = KernelLaunch(job.module, job.entries, job.launch)
    dtype = torch.bfloat16 if job.dtype == "bf16" else torch.float16
    cpu = torch.device("cpu")
    total = 0.0
    with kernels_on_cpu(lambda _module: lib):
        chosen = problems(
            dtype, job.launch[0], job.direction, key_block(launch), False, query_block(launch),
            lowest_head_dim=job.lowest_head_dim,
        )  # fmt: skip
        for p in chosen:
            times = []
            for _ in range(repeat):
                start = time.process_time()
                if job.direction == "bwd":
                    outcome = check_backward(launch, p, cpu)
                else:
                    outcome = check_forward(launch, p, cpu, job.direction == "splitkv")
                times.append(time.process_time() - start)
            t = statistics.median(times)
            total += t
            verdict = "pass" if outcome.passed else "FAIL"
            print(f"  {p.name:16} {t:6.2f} s  {verdict}  error/bound {outcome.worst.ratio:.2f}")
    print(f"{job.unit}: {total:.1f} CPU seconds for its problems")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="8.0")
    ap.add_argument("--unit", action="append", required=True, help="a unit name, e.g. fwd_fp16_d64")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    for name in args.unit:
        unit_cost(args.arch, name, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
