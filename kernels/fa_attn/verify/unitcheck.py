"""One kernel unit, run through fa_attn's own ops on one problem and measured against the fp32 reference
under FA2's rule: the check the runtime's first-use self-check and `fa check` share.

A forward unit runs `fa_attn::fwd` (or `fa_attn::fwd_splitkv` in SPLITS shares); a backward unit runs
`fa_attn::bwd` on the reference's out and lse, so its verdict does not hang on the forward's. Whatever
the ops are registered with runs: the binding's CUDA kernels on a GPU, or the CPU emulator in tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..decision import KernelLaunch
from ..ops import NO_LAUNCH
from .reference import Fa2Error, attention_ref, fa2_error, lse_error, visible_rows

SPLITS = 2  # the split-KV check's key shares


@dataclass(frozen=True)
class Problem:
    """One padded attention problem (seeded: a failure reproduces alone)."""

    dtype: torch.dtype
    head_dim: int  # the unit's (padded) head dim
    causal: bool
    seqlen_q: int
    seqlen_k: int
    heads: int = 2
    heads_k: int = 2
    batch: int = 1
    seed: int = 0

    def describe(self) -> str:
        dt = "bf16" if self.dtype == torch.bfloat16 else "fp16"
        mask = "causal" if self.causal else "full"
        return (
            f"{dt} d{self.head_dim} {mask} b{self.batch} q{self.seqlen_q} k{self.seqlen_k} "
            f"h{self.heads}/{self.heads_k}"
        )


@dataclass(frozen=True)
class Outcome:
    """A unit's result on a problem: every output's error against its bound."""

    direction: str  # "fwd" | "splitkv" | "bwd"
    problem: Problem
    errors: tuple[Fa2Error, ...]

    @property
    def passed(self) -> bool:
        return all(e.ok for e in self.errors)

    @property
    def worst(self) -> Fa2Error:
        return max(self.errors, key=lambda e: e.ratio)

    def message(self) -> str:
        """What exceeded its bound, and on which problem ("" when it passed)."""
        bad = [e for e in self.errors if not e.ok]
        if not bad:
            return ""
        what = "; ".join(f"{e.name}: error {_num(e.err)} > bound {_num(e.bound)}" for e in bad)
        return f"{what} ({self.direction} {self.problem.describe()})"


def _num(x: float) -> str:
    return "non-finite" if math.isinf(x) else f"{x:.3g}"


def tensors(problem: Problem, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout, from the problem's seed (generated on the CPU: the same numbers on every device)."""
    gen = torch.Generator().manual_seed(problem.seed)
    shape_q = (problem.batch, problem.seqlen_q, problem.heads, problem.head_dim)
    shape_k = (problem.batch, problem.seqlen_k, problem.heads_k, problem.head_dim)
    return tuple(
        torch.randn(s, generator=gen).to(device=device, dtype=problem.dtype)
        for s in (shape_q, shape_k, shape_k, shape_q)
    )


def check_forward(
    launch: KernelLaunch, problem: Problem, device: torch.device, splitkv: bool = False
) -> Outcome:
    """The forward unit `launch` (or, splitkv, the split-KV one) on `problem`: out and lse."""
    q, k, v, _ = tensors(problem, device)
    scale = 1.0 / math.sqrt(problem.head_dim)
    args = (q, k, v, None, None, None, None, None, None, problem.seqlen_q, problem.seqlen_k, scale,
            problem.causal, -1, -1, 0.0)  # fmt: skip
    with torch.no_grad():
        out_ref, lse_ref = attention_ref(q, k, v, problem.causal)
        out_low, _ = attention_ref(q, k, v, problem.causal, upcast=False)
        if splitkv:
            out, lse = torch.ops.fa_attn.fwd_splitkv(
                *args, SPLITS, launch.module, launch.entries, list(launch.launch)
            )
        else:
            out, lse = torch.ops.fa_attn.fwd(
                *args, launch.module, launch.entries, list(launch.launch), *_no_backward()
            )
    rows = visible_rows(problem.seqlen_q, problem.seqlen_k, problem.causal, q.device)
    errors = (fa2_error("out", out, out_ref, out_low), lse_error(lse.float(), lse_ref, rows))
    return Outcome("splitkv" if splitkv else "fwd", problem, errors)


def check_backward(launch: KernelLaunch, problem: Problem, device: torch.device) -> Outcome:
    """The backward unit `launch` on `problem`, fed the reference's out and lse: dq, dk and dv."""
    q, k, v, dout = tensors(problem, device)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        out_ref, lse_ref = attention_ref(qr, kr, vr, problem.causal)
        out_low, _ = attention_ref(qr, kr, vr, problem.causal, upcast=False)
        refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout, retain_graph=True)
        lows = torch.autograd.grad(out_low, (qr, kr, vr), dout)
    # The kernels' lse for a row that sees no key is +inf (the reference's is -inf).
    lse_in = torch.where(torch.isneginf(lse_ref), torch.inf, lse_ref).detach().contiguous()
    scale = 1.0 / math.sqrt(problem.head_dim)
    with torch.no_grad():
        grads = torch.ops.fa_attn.bwd(
            dout, q, k, v, out_ref.detach().contiguous(), lse_in, None, None, problem.seqlen_q,
            problem.seqlen_k, scale, problem.causal, -1, -1, 0.0, launch.module, launch.entries,
            list(launch.launch),
        )  # fmt: skip
    errors = tuple(
        fa2_error(n, g, r, lo) for n, g, r, lo in zip(("dq", "dk", "dv"), grads, refs, lows, strict=True)
    )
    return Outcome("bwd", problem, errors)


def key_block(launch: KernelLaunch) -> int:
    """The unit's key block (block_n of its first entry; 64 when the launch data do not say)."""
    return launch.launch[3] if len(launch.launch) > 3 else 64


def _no_backward() -> tuple[str, str, list[int]]:
    return NO_LAUNCH.module, NO_LAUNCH.entries, list(NO_LAUNCH.launch)
