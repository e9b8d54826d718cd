"""One compiled unit, run on one problem and measured against the fp32 reference: the check that the
smoke test (every unit a wheel ships) and the autotuner's correctness gate (every candidate tile) share.

A unit runs on the GPU from its image file through the driver API (GpuUnit) or on the CPU emulator
from its kernels/tiles.py definition (EmulatedUnit); either way through the binding's launch steps
(kernel_launch.py). A backward unit takes the reference's out and lse, so its verdict does not hang
on the forward's. Every output gets FA2's error measure (attn_reference.fa2_error): the verdict is ok
when each is within its bound, wrong otherwise; a raised error becomes a verdict too (`verdict_of`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import torch
from attn_reference import (
    Case,
    Fa2Error,
    attention_ref,
    fa2_error,
    lse_error,
    random_case_tensors,
    visible_rows,
)
from kernel_launch import Call, LaunchError, UnitLaunch


class UnitRunner(Protocol):
    device: str  # where the problem's tensors live: "cuda" or "cpu"

    def forward(self, call: Call) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward_splitkv(self, call: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(
        self, call: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


class GpuUnit:
    """A cubin or PTX image on GPU 0, launched with `launch` (a manifest kernel or a tiles unit)."""

    device = "cuda"

    def __init__(self, image: Path | bytes, launch: UnitLaunch, name: str | None = None) -> None:
        import cuda_launch

        self._cuda = cuda_launch
        data = image if isinstance(image, bytes) else Path(image).read_bytes()
        self.module = cuda_launch.CudaModule(
            data, name or (image.name if isinstance(image, Path) else launch.name)
        )
        self.dev = cuda_launch.CudaDevice(self.module)
        self.launch = launch

    def forward(self, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        return self._cuda.run_forward(self.dev, self.launch, call)

    def forward_splitkv(self, call: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._cuda.run_forward_splitkv(self.dev, self.launch, call, num_splits)

    def backward(
        self, call: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._cuda.run_backward(self.dev, self.launch, call, out, lse, dout)

    def resources(self) -> dict[str, dict[str, int]]:
        """Per entry, what the loaded code uses per thread (registers, local memory bytes)."""
        return {entry: self.module.attributes(entry) for entry in self.launch.entries}


class EmulatedUnit:
    """A kernels/tiles.py unit on the CPU emulator (tests/emu), compiled for `arch`."""

    device = "cpu"

    def __init__(self, unit: Any, arch: str) -> None:
        import emu_harness

        self._emu = emu_harness
        self.lib = emu_harness.Emulated(unit, arch)

    def forward(self, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        return self._emu.forward(self.lib, call)

    def forward_splitkv(self, call: Call, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._emu.forward_splitkv(self.lib, call, num_splits)

    def backward(
        self, call: Call, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._emu.backward(self.lib, call, out, lse, dout)

    def resources(self) -> dict[str, dict[str, int]]:
        return {}


SPLITS = 3  # the split-KV checks' key shares: more than one, not dividing the key blocks evenly


def measure(runner: UnitRunner, direction: str, case: Case) -> list[Fa2Error]:
    """Every output of one run against the fp32 reference: out and lse (fwd, and splitkv with SPLITS
    shares of the keys), or dq, dk and dv (bwd)."""
    q, k, v, dout = random_case_tensors(case, torch.device(runner.device))
    call = Call(q, k, v, causal=case.causal)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out_ref, lse_ref = attention_ref(qr, kr, vr, case.causal)
    out_low, _ = attention_ref(qr, kr, vr, case.causal, upcast=False)
    if direction in ("fwd", "splitkv"):
        out, lse = runner.forward(call) if direction == "fwd" else runner.forward_splitkv(call, SPLITS)
        rows = visible_rows(case.seqlen_q, case.seqlen_k, case.causal, q.device)
        return [fa2_error("out", out, out_ref, out_low), lse_error(lse, lse_ref, rows)]
    # The kernels' lse for a row that sees no key is +inf (the reference's is -inf).
    lse_in = torch.where(torch.isneginf(lse_ref), torch.inf, lse_ref).detach().contiguous()
    grads = runner.backward(call, out_ref.detach().contiguous(), lse_in, dout)
    refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout, retain_graph=True)
    lows = torch.autograd.grad(out_low, (qr, kr, vr), dout)
    return [
        fa2_error(n, g, r, lo) for n, g, r, lo in zip(("dq", "dk", "dv"), grads, refs, lows, strict=False)
    ]


def summary(errors: list[Fa2Error]) -> dict[str, Any]:
    """verdict ok / wrong, the worst output by error / bound, and what exceeded its bound."""
    worst = max(errors, key=lambda e: e.ratio)
    bad = [e for e in errors if not e.ok]
    return {
        "verdict": "wrong" if bad else "ok",
        "worst": worst.name,
        "ratio": worst.ratio,
        "max_err": worst.err,
        "message": "; ".join(f"{e.name}: error {e.err:.3g} > bound {e.bound:.3g}" for e in bad),
    }


_CUDA_TEXT = re.compile(
    r"CUDA error|cudaError|illegal memory access|misaligned address|unspecified launch failure"
)


def verdict_of(e: BaseException) -> str:
    """cuda-error (the context is lost: start a new process), load-error (the driver refused the
    image), or error (anything else: a bad argument, a reference problem)."""
    try:
        import cuda_launch
    except ImportError:
        cuda_launch = None  # type: ignore[assignment]
    if cuda_launch is not None and isinstance(e, cuda_launch.CudaError):
        return "load-error" if str(e).startswith("loading ") else "cuda-error"
    if isinstance(e, LaunchError):
        return "error"
    return "cuda-error" if _CUDA_TEXT.search(str(e)) else "error"


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip().replace("\n", " ")[:500]
