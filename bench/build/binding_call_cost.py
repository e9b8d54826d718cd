"""What one operator call costs on the host in the binding's form, by the form's optimisation level.

    python bench/build/binding_call_cost.py [--opts -O1 -O0] [--calls 20000] [--rounds 5]

The form (kernels/binding/forms/aten.cpp) is compiled at binding.FORM_OPT; a lower level compiles in
less CPU, but the form is on every call's path. This measures that path without a GPU: the binding
built as `fa build` builds it (binding.binding_command: the installed torch's headers, the cached
shared objects, fa's flags) with each level in turn and -DFA_BINDING_DISPATCH_KEY=CPU, so that
fa_attn::fwd and fa_attn::bwd called with CPU tensors run the form's code for real: every argument read
off the dispatcher's stack, the input checks, up to the first check a CPU tensor fails ("q must be a
CUDA tensor"). The figure is the median over `--rounds` of the microseconds per call (each round
`--calls` calls, the levels' processes taking turns); also each compile's CPU seconds.

Prints a table. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CALLS = """
import json, sys, time, torch
import fa_attn  # defines the operators' schemas (fa_attn/runtime/ops.py)
torch.ops.load_library(sys.argv[1])
calls = int(sys.argv[2])
q = torch.zeros(1, 4, 2, 8, dtype=torch.float16)
lse = torch.zeros(1, 2, 4)
launch = [8, 128, 64, 64, 0, 0]
ops = {
    "fwd": lambda: torch.ops.fa_attn.fwd(q, q, q, None, None, None, None, None, None, 4, 4, 0.3, False, -1, -1,
                                         0.0, "m", "fa_fwd", launch, "", "", []),
    "bwd": lambda: torch.ops.fa_attn.bwd(q, q, q, q, q, lse, None, None, 4, 4, 0.3, False, -1, -1, 0.0, "m",
                                         "fa_bwd", launch),
}
out = {}
for name, call in ops.items():
    for _ in range(200):  # warm: the dispatcher's caches, the first exception's unwinding tables
        try:
            call()
        except RuntimeError:
            pass
    t0 = time.perf_counter()
    for _ in range(calls):
        try:
            call()
        except RuntimeError as err:
            if "must be a CUDA tensor" not in str(err):
                raise
    out[name] = (time.perf_counter() - t0) / calls * 1e6
print(json.dumps(out))
"""


def _build(opt: str, out: Path) -> float:
    """The CPU-key binding at `opt`, built by fa's own command; returns the compile's CPU seconds."""
    from buildtool.builder import binding, torch_headers
    from buildtool.core import cpus, kernels_src

    _, headers = torch_headers.local_torch()
    root = kernels_src.kernels_dir()
    platform = cpus.host()
    objects = [str(o) for o in binding.shared_objects(_abi(), root, platform)]
    cmd = binding.binding_command(headers, _abi(), root, platform, None, objects, out)
    cmd = [opt if w == binding.FORM_OPT else w for w in cmd]
    cmd.insert(cmd.index(opt) + 1, "-DFA_BINDING_DISPATCH_KEY=CPU")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _abi() -> bool:
    import torch

    return bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opts", nargs="+", default=["-O1", "-O0"])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / "kernels")]
    with tempfile.TemporaryDirectory(prefix="fa-bench-call-") as work:
        return _compare(args, Path(work))


def _compare(args: argparse.Namespace, work: Path) -> int:
    """Each level's binding built into `work`, then the calls timed, the levels taking turns."""
    libs = {opt: work / f"lib{opt}.so" for opt in args.opts}
    compile_s = {opt: _build(opt, lib) for opt, lib in libs.items()}
    env = {**os.environ, "PYTHONPATH": str(REPO / "kernels")}
    per_call: dict[str, dict[str, list[float]]] = {opt: {} for opt in args.opts}
    for i in range(args.rounds):
        for opt in args.opts if i % 2 == 0 else reversed(args.opts):
            proc = subprocess.run(
                [sys.executable, "-c", _CALLS, str(libs[opt]), str(args.calls)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            for op, us in json.loads(proc.stdout).items():
                per_call[opt].setdefault(op, []).append(us)
    print(
        f"{'form':<6} {'compile CPU s':>14} {'fwd us/call':>12} {'bwd us/call':>12}   (median of {args.rounds})"
    )
    for opt in args.opts:
        med = {op: statistics.median(v) for op, v in per_call[opt].items()}
        print(f"{opt:<6} {compile_s[opt]:>14.2f} {med['fwd']:>12.2f} {med['bwd']:>12.2f}")
        print(f"       fwd runs {[round(x, 2) for x in per_call[opt]['fwd']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
