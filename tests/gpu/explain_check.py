"""The runtime as a user meets it, on the GPU machine: fa_attn imports from the wheel (not kernels/),
its binding loads into this torch, explain() picks our SASS for the live arch, and one causal call with
backward agrees with SDPA. The kit's first verdict on the binding and dispatch (the smoke test runs the
kernels without them).

    PYTHONPATH=<unpacked wheel> python tests/gpu/explain_check.py [--arch 9.0]
    PYTHONPATH=<unpacked wheel> python tests/gpu/explain_check.py --dry-run   # no GPU: up to explain()

Exit status 0 when all holds, 1 otherwise (each line says what was found).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="9.0", help="the SASS arch explain() must pick (default 9.0)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: the wheel's import, manifest and explain() on CPU tensors",
    )
    args = ap.parse_args(argv)

    import fa_attn
    import torch
    from fa_attn.runtime import loader

    where = Path(fa_attn.__file__).resolve().parent
    print(f"fa_attn from {where}")
    if REPO / "kernels" in where.parents or where == REPO / "kernels" / "fa_attn":
        print(
            "FAIL: imported the source tree's fa_attn (no kernels), not the wheel: put it first on PYTHONPATH"
        )
        return 1
    man = loader.manifest()
    print(
        f"manifest: variant {man.info.variant}, torch {man.info.torch}, sass {list(man.info.sass)}, "
        f"ptx {man.info.ptx}, {len(man.kernels)} kernels"
    )
    problem = loader.static_binding_problem(man, loader._MANIFEST_PROBLEM)
    print("binding: fits this torch" if problem is None else f"binding: {problem.code}: {problem.message}")
    if args.dry_run:  # the runtime's API as the GPU run uses it; on CPU tensors every call falls back
        q = torch.randn(1, 16, 2, 128, dtype=torch.bfloat16)
        d = fa_attn.explain(q, q, q, causal=True)
        print(f"explain on the CPU (dry run): path {d.path}, reasons {[r.code for r in d.reasons]}")
        return 0 if d.path == "fallback" and d.reasons else 1
    if not torch.cuda.is_available():
        print("FAIL: torch sees no CUDA GPU: explain() not checked")
        return 1
    major, minor = torch.cuda.get_device_capability()
    print(f"GPU: {torch.cuda.get_device_name()}, sm {major}.{minor}; torch {torch.__version__}")
    q, k, v = (
        torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    good = True
    for causal in (False, True):
        d = fa_attn.explain(q, k, v, causal=causal)
        reasons = "; ".join(f"{r.code}: {r.message}" for r in d.reasons)
        print(
            f"explain bf16 d128 causal={causal}: path {d.path}, arch {d.arch}, head_dim {d.head_dim}"
            + (f", reasons {reasons}" if reasons else "")
        )
        good &= d.path == "sass" and d.arch == args.arch
    os.environ["FA_STRICT"] = "1"
    try:
        ours = fa_attn.flash_attn_func(q, k, v, causal=True)
        ours.sum().backward()
    except fa_attn.FaFallbackError as err:
        print(f"FAIL: the call fell back: {err}")
        return 1
    last = fa_attn.last_dispatch()
    q_, k_, v_ = (t.detach().transpose(1, 2) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, is_causal=True).transpose(1, 2)
    max_err = (ours.detach().float() - ref.float()).abs().max().item()
    finite = bool(torch.isfinite(q.grad).all()) if q.grad is not None else False
    print(
        f"one call: path {last.path}, arch {last.arch}; max |ours - sdpa| = {max_err:.3g} (bf16), dq finite: {finite}"
    )
    good &= max_err < 0.05 and finite
    print(
        "explain: PASS" if good else f"explain: FAIL (want path sass, arch {args.arch}, output close to SDPA)"
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
