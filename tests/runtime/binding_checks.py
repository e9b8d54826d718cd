"""What the tests of both binding forms (ATen, tests/runtime/test_binding_load.py; stable ABI,
tests/runtime/test_stable_binding.py) ask of a built libfa_attn_ops.so in the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def assert_loads_with_cuda_kernels_only(lib: Path) -> None:
    """Loaded into this CPU-only torch, the binding registers CUDA (and Meta) kernels for all three
    operators and none for CPU, so a call with CPU tensors is refused before it reaches the kernels."""
    script = textwrap.dedent(f"""
        import torch, fa_attn
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        assert not has("fa_attn::fwd", "CUDA")  # Python defines schemas and fakes only
        torch.ops.load_library({str(lib)!r})
        for op in ("fa_attn::fwd", "fa_attn::fwd_splitkv", "fa_attn::bwd"):
            assert has(op, "CUDA") and has(op, "Meta") and not has(op, "CPU"), op
        q = torch.zeros(1, 4, 2, 8, dtype=torch.float16)
        try:
            torch.ops.fa_attn.fwd(q, q, q, None, None, None, None, None, None, 4, 4, 0.3, False, -1, -1,
                                  0.0, "m", "fa_fwd", [8, 128, 64, 64, 0, 0], "", "", [])
        except NotImplementedError as err:
            assert "CPU" in str(err)
        else:
            raise AssertionError("a CPU call must not reach the CUDA kernels")
        print("ok", torch.__version__)
    """)
    proc = run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(KERNELS)))
    assert proc.stdout.startswith("ok"), proc.stdout


def assert_every_argument_reaches_the_checks(cpu_key_lib: Path) -> None:
    """A binding built with -DFA_BINDING_DISPATCH_KEY=CPU: all three operators called with CPU tensors
    read every argument of their schema (a boxed kernel reads them only when called) and stop at the
    input checks with fa_attn's own message, not torch's complaint about an argument's type or count."""
    script = textwrap.dedent(f"""
        import torch, fa_attn
        torch.ops.load_library({str(cpu_key_lib)!r})
        launch = [8, 128, 64, 64, 0, 0]
        def fwd(q, cu_q=None, cu_k=None, table=None):
            return torch.ops.fa_attn.fwd(q, q, q, cu_q, cu_k, None, None, None, table, 4, 4, 0.3, False, -1, -1,
                                         0.0, "m", "fa_fwd", launch, "", "", [])
        def expect(call, text):
            try:
                call()
            except RuntimeError as err:
                assert text in str(err) and str(err).startswith("fa_attn: "), str(err)
            else:
                raise AssertionError(text)
        q16 = torch.zeros(1, 4, 2, 8, dtype=torch.float16)
        expect(lambda: fwd(torch.zeros(1, 4, 2, 8)), "the kernels take fp16 or bf16, got float32")
        expect(lambda: fwd(q16), "q must be a CUDA tensor")
        expect(lambda: fwd(q16, cu_q=torch.zeros(2, dtype=torch.int32)), "pass both cu_seqlens_q and")
        expect(lambda: fwd(q16, table=torch.zeros(1, 2, dtype=torch.int32)), "q must be a CUDA tensor")
        expect(lambda: torch.ops.fa_attn.fwd_splitkv(q16, q16, q16, None, None, None, None, None, None, 4, 4, 0.3,
                                                     False, -1, -1, 0.0, 2, "m", "fa_fwd", launch),
               "q must be a CUDA tensor")
        lse = torch.zeros(1, 2, 4)
        expect(lambda: torch.ops.fa_attn.bwd(q16, q16, q16, q16, q16, lse, None, None, 4, 4, 0.3, False,
                                             -1, -1, 0.0, "m", "fa_bwd", launch), "q must be a CUDA tensor")
        print("ok")
    """)
    proc = run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(KERNELS)))
    assert proc.stdout.strip() == "ok"
