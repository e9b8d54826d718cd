"""One launch of a unit's entries, for Nsight Compute to profile (tests/gpu/kit.py's ncu step).

    ncu -k regex:^fa_ --launch-skip 3 --launch-count 3 ... python tests/gpu/profile_units.py \
        --package SITE/fa_attn --unit bwd_bf16_d128
    python tests/gpu/profile_units.py --dry-run --unit fwd_fp16_d64     # the same launches on the emulator

Loads the unit's SASS image for the live arch from an unpacked wheel and runs its entries twice at one
benchmark-like shape (bench/kernels/attention.py's: 16k tokens, hidden 2048): a warm-up that ncu skips
(--launch-skip = the number of entries) and the launch it profiles. Through the driver API
(cuda_launch.py), so the profile holds our kernels and torch's input setup, nothing of the binding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (HERE, REPO / "tests" / "emu", REPO / "kernels", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unit", required=True, help="a unit name, e.g. fwd_bf16_d128")
    ap.add_argument("--package", type=Path, help="an unpacked wheel's fa_attn/ directory")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="the CPU emulator, at a tiny shape")
    ap.add_argument("--arch", default="9.0", help="the dry run's arch")
    args = ap.parse_args(argv)

    import kernel_launch as kl
    import torch

    runner: Any

    if args.dry_run:
        import tiles
        import unit_check

        unit = next((u for u in tiles.units(args.arch) if u.name == args.unit), None)
        if unit is None:
            ap.error(f"--unit {args.unit}: kernels/tiles.py has no such unit for sm {args.arch}")
        runner = unit_check.EmulatedUnit(unit, args.arch)
        launch, head_dim, dtype_name, device = runner.lib.launches, unit.head_dim, unit.dtype, "cpu"
        batch, seqlen, heads = 1, 64, 2
    else:
        if args.package is None:
            ap.error("--package is required (or --dry-run)")
        import smoke
        import unit_check

        major, minor = torch.cuda.get_device_capability()
        man = json.loads((args.package / "manifest.json").read_text())
        kernels = [
            k for k in smoke.runnable_kernels(man, f"{major}.{minor}", ["sass"]) if k["unit"] == args.unit
        ]
        if not kernels:
            print(
                f"profile_units: the wheel has no SASS of {args.unit} for sm {major}.{minor}", file=sys.stderr
            )
            return 2
        k = kernels[0]
        runner = unit_check.GpuUnit(args.package / k["file"], kl.UnitLaunch.of(k))
        launch, head_dim, dtype_name, device = runner.launch, k["head_dim"], k["dtype"], "cuda"
        seqlen = args.seqlen
        batch, heads = max(1, 16384 // seqlen), max(1, 2048 // head_dim)

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (batch, seqlen, heads, head_dim)
    q, k_, v, dout = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(4))
    call = kl.Call(q, k_, v, causal=args.causal)
    direction = args.unit.split("_", 1)[0]

    def once(dev: object) -> None:
        if direction == "fwd":
            prep = kl.prepare_forward(dev, call)  # type: ignore[arg-type]
        else:
            from attn_reference import out_lse_by_heads

            out, lse = out_lse_by_heads(q, k_, v, args.causal)
            prep = kl.prepare_backward(dev, launch, call, out, lse, dout)  # type: ignore[arg-type]
        kl.launch_all(dev, launch, prep.params)  # type: ignore[arg-type]

    t0 = time.perf_counter()
    for _ in range(2):  # the warm-up, then the launch ncu profiles
        if args.dry_run:
            with runner.lib.arena():
                once(runner.lib)
        else:
            once(runner.dev)
            runner.dev.module.drv.synchronize()
    print(
        f"profile_units: {args.unit} ({', '.join(launch.entries)}) at b{batch} s{seqlen} h{heads} d{head_dim}"
        f"{' causal' if args.causal else ''}, twice, in {time.perf_counter() - t0:.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
