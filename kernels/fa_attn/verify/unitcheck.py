"""One kernel unit, run through fa_attn's own ops on one problem and measured against the fp32 reference
under FA2's rule: the check the runtime's first-use self-check and `fa check` share.

A forward unit runs `fa_attn::fwd` (or `fa_attn::fwd_splitkv` in SPLITS shares); a backward unit runs
`fa_attn::bwd` on the reference's out and lse, so its verdict does not hang on the forward's. Whatever
the ops are registered with runs: the binding's CUDA kernels on a GPU, or the CPU emulator in tests.

A problem's layout is one of the three the runtime sends the same kernels: padded (b, s, h, d);
varlen (two sequences of different lengths packed along the tokens, with cu_seqlens); and kvcache (a
cache of `seqlen_k` rows per sequence, of which the second sequence uses fewer: seqused_k). The
reference is computed per sequence, so each layout's indexing is checked, not only its arithmetic.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..decision import KernelLaunch
from ..ops import NO_LAUNCH
from .reference import Fa2Error, attention_ref, fa2_error, lse_error

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
    layout: str = "padded"  # "padded" | "varlen" | "kvcache" (LAYOUTS)

    def sequences(self) -> list[tuple[int, int]]:
        """(queries, keys) of each sequence: `batch` equal ones when padded; varlen and kvcache have two,
        the second shorter (a kvcache sequence keeps its queries and uses fewer of its cache rows)."""
        if self.layout == "padded":
            return [(self.seqlen_q, self.seqlen_k)] * self.batch
        keys = min(self.seqlen_k, max(1, self.seqlen_k // 2 + 3))
        queries = self.seqlen_q if self.layout == "kvcache" else max(1, self.seqlen_q // 2 + 1)
        return [(self.seqlen_q, self.seqlen_k), (queries, keys)]

    def describe(self) -> str:
        dt = "bf16" if self.dtype == torch.bfloat16 else "fp16"
        mask = "causal" if self.causal else "full"
        shape = " ".join(f"q{sq}k{sk}" for sq, sk in self.sequences()[:2])
        if self.layout == "padded":
            shape = f"b{self.batch} q{self.seqlen_q} k{self.seqlen_k}"
        return f"{dt} d{self.head_dim} {mask} {self.layout} {shape} h{self.heads}/{self.heads_k}"


LAYOUTS = ("padded", "varlen", "kvcache")


@dataclass(frozen=True)
class Inputs:
    """A problem's tensors in its layout, and the ops' layout arguments."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    seqused_k: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int


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


def _random(p: Problem, rows: int, sq: int, sk: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout of `rows` sequences, from the problem's seed (made on the CPU: the same numbers on
    every device)."""
    gen = torch.Generator().manual_seed(p.seed)
    shape_q, shape_k = (rows, sq, p.heads, p.head_dim), (rows, sk, p.heads_k, p.head_dim)
    return tuple(
        torch.randn(s, generator=gen).to(device=device, dtype=p.dtype)
        for s in (shape_q, shape_k, shape_k, shape_q)
    )


def inputs(problem: Problem, device: torch.device) -> Inputs:
    """The problem's tensors: padded (b, s, h, d); varlen packs its sequences' tokens (total, h, d) with
    cu_seqlens; kvcache keeps (b, seqlen_k, h_k, d) caches with each sequence's used rows in seqused_k."""
    seqs = problem.sequences()
    if problem.layout == "padded":
        q, k, v, dout = _random(problem, problem.batch, problem.seqlen_q, problem.seqlen_k, device)
        return Inputs(q, k, v, dout, None, None, None, problem.seqlen_q, problem.seqlen_k)
    if problem.layout == "kvcache":
        q, k, v, dout = _random(problem, len(seqs), problem.seqlen_q, problem.seqlen_k, device)
        used = torch.tensor([sk for _, sk in seqs], dtype=torch.int32, device=device)
        return Inputs(q, k, v, dout, None, None, used, problem.seqlen_q, max(sk for _, sk in seqs))
    if problem.layout != "varlen":
        raise ValueError(f"layout {problem.layout!r}: one of {', '.join(LAYOUTS)}")
    q, k, v, dout = _random(problem, 1, sum(sq for sq, _ in seqs), sum(sk for _, sk in seqs), device)

    def cu(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)

    return Inputs(
        q[0], k[0], v[0], dout[0], cu([sq for sq, _ in seqs]), cu([sk for _, sk in seqs]), None,
        max(sq for sq, _ in seqs), max(sk for _, sk in seqs),
    )  # fmt: skip


def reference(
    problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upcast: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_ref per sequence, put back in the problem's layout: out as q, lse (b, h, sq) padded and
    kvcache, (h, total_q) varlen (flash-attn's layouts). Differentiable in q, k, v."""
    if problem.layout == "padded":
        return attention_ref(q, k, v, problem.causal, upcast=upcast)
    outs, lses = [], []
    if problem.layout == "kvcache":
        for i, (_, sk) in enumerate(problem.sequences()):
            o, lse = attention_ref(
                q[i : i + 1], k[i : i + 1, :sk], v[i : i + 1, :sk], problem.causal, upcast=upcast
            )
            outs.append(o)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)
    q0 = k0 = 0
    for sq, sk in problem.sequences():
        qi, ki, vi = (t.unsqueeze(0) for t in (q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk]))
        o, lse = attention_ref(qi, ki, vi, problem.causal, upcast=upcast)
        outs.append(o[0])
        lses.append(lse[0])
        q0, k0 = q0 + sq, k0 + sk
    return torch.cat(outs), torch.cat(lses, dim=1)


def check_forward(
    launch: KernelLaunch, problem: Problem, device: torch.device, splitkv: bool = False
) -> Outcome:
    """The forward unit `launch` (or, splitkv, the split-KV one) on `problem`: out and lse."""
    x = inputs(problem, device)
    q, k, v = x.q, x.k, x.v
    scale = 1.0 / math.sqrt(problem.head_dim)
    args = (q, k, v, x.cu_seqlens_q, x.cu_seqlens_k, x.seqused_k, None, None, None, x.max_seqlen_q,
            x.max_seqlen_k, scale, problem.causal, -1, -1, 0.0)  # fmt: skip
    with torch.no_grad():
        out_ref, lse_ref = reference(problem, q, k, v)
        out_low, _ = reference(problem, q, k, v, upcast=False)
        if splitkv:
            out, lse = torch.ops.fa_attn.fwd_splitkv(
                *args, SPLITS, launch.module, launch.entries, list(launch.launch)
            )
        else:
            out, lse = torch.ops.fa_attn.fwd(
                *args, launch.module, launch.entries, list(launch.launch), *_no_backward()
            )
    rows = torch.isfinite(lse_ref)  # rows that see a key (the others' lse is +-inf by convention)
    errors = (fa2_error("out", out, out_ref, out_low), lse_error(lse.float(), lse_ref, rows))
    return Outcome("splitkv" if splitkv else "fwd", problem, errors)


def check_backward(launch: KernelLaunch, problem: Problem, device: torch.device) -> Outcome:
    """The backward unit `launch` on `problem`, fed the reference's out and lse: dq, dk and dv. (The
    runtime never runs a backward on a KV cache: padded and varlen problems only.)"""
    if problem.layout == "kvcache":
        raise ValueError("a backward unit is checked on padded and varlen problems (no KV-cache backward)")
    x = inputs(problem, device)
    q, k, v, dout = x.q, x.k, x.v, x.dout
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        out_ref, lse_ref = reference(problem, qr, kr, vr)
        out_low, _ = reference(problem, qr, kr, vr, upcast=False)
        refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout, retain_graph=True)
        lows = torch.autograd.grad(out_low, (qr, kr, vr), dout)
    # The kernels' lse for a row that sees no key is +inf (the reference's is -inf).
    lse_in = torch.where(torch.isneginf(lse_ref), torch.inf, lse_ref).detach().contiguous()
    scale = 1.0 / math.sqrt(problem.head_dim)
    with torch.no_grad():
        grads = torch.ops.fa_attn.bwd(
            dout, q, k, v, out_ref.detach().contiguous(), lse_in, x.cu_seqlens_q, x.cu_seqlens_k,
            x.max_seqlen_q, x.max_seqlen_k, scale, problem.causal, -1, -1, 0.0, launch.module,
            launch.entries, list(launch.launch),
        )  # fmt: skip
    errors = tuple(
        fa2_error(n, g, r, lo) for n, g, r, lo in zip(("dq", "dk", "dv"), grads, refs, lows, strict=True)
    )
    return Outcome("bwd", problem, errors)


def key_block(launch: KernelLaunch) -> int:
    """The unit's key block: the largest block_n of its entries (a backward's preprocess and convert
    entries have none); 64 when the launch data do not say. Launch data: head dim, then per entry
    threads, block_m, block_n, shared memory, grid (decision.KernelLaunch)."""
    return max(launch.launch[3::5], default=0) or 64


def _no_backward() -> tuple[str, str, list[int]]:
    return NO_LAUNCH.module, NO_LAUNCH.entries, list(NO_LAUNCH.launch)
