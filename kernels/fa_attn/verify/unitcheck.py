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
from dataclasses import dataclass, replace

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
    window: tuple[int, int] = (-1, -1)  # flash-attn's window_size (left, right); -1 unbounded
    softcap: float = 0.0
    softmax_scale: float | None = None  # None: 1/sqrt(head_dim)
    page_size: int = 0  # kvcache only: its rows in pages of this many, read through a block table
    unit_head_dim: int = 0  # the unit's head dim when larger: q, k, v zero-padded as the runtime pads

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

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
        extra = f" window {self.window[0]},{self.window[1]}" if self.window != (-1, -1) else ""
        extra += f" softcap {self.softcap:g}" if self.softcap else ""
        extra += f" scale {self.softmax_scale:.3g}" if self.softmax_scale is not None else ""
        extra += f" pages of {self.page_size}" if self.page_size else ""
        extra += f" padded to d{self.unit_head_dim}" if self.unit_head_dim > self.head_dim else ""
        return f"{dt} d{self.head_dim} {mask} {self.layout} {shape} h{self.heads}/{self.heads_k}{extra}"


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
    block_table: torch.Tensor | None = None  # paged: k_pages and v_pages are what the op reads
    k_pages: torch.Tensor | None = None
    v_pages: torch.Tensor | None = None


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
    return tuple(  # device="cpu": whatever torch.set_default_device says
        torch.randn(s, generator=gen, device="cpu").to(device=device, dtype=p.dtype)
        for s in (shape_q, shape_k, shape_k, shape_q)
    )


def _paged(problem: Problem, cache: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A (b, rows, h_k, d) cache as pages (num_pages, page_size, h_k, d), page i of sequence b at
    order[b, i]: the block table (rows beyond the cache are zero and never read)."""
    page = problem.page_size
    rows, pages = cache.shape[1], order.shape[1]
    padded = torch.nn.functional.pad(cache, (0, 0, 0, 0, 0, pages * page - rows))
    out = torch.zeros(order.numel(), page, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
    out[order.reshape(-1).long()] = padded.reshape(order.numel(), page, *cache.shape[2:])
    return out


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
        x = Inputs(q, k, v, dout, None, None, used, problem.seqlen_q, max(sk for _, sk in seqs))
        if not problem.page_size:
            return x
        pages = -(-problem.seqlen_k // problem.page_size)
        gen = torch.Generator().manual_seed(problem.seed)
        order = torch.randperm(len(seqs) * pages, generator=gen, device="cpu").reshape(len(seqs), pages)
        table = order.to(device=device, dtype=torch.int32)
        return replace(
            x, block_table=table, k_pages=_paged(problem, k, table), v_pages=_paged(problem, v, table)
        )
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

    def ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return attention_ref(
            q, k, v, problem.causal, problem.scale, upcast, window=problem.window, softcap=problem.softcap
        )

    if problem.layout == "padded":
        return ref(q, k, v)
    outs, lses = [], []
    if problem.layout == "kvcache":
        for i, (_, sk) in enumerate(problem.sequences()):
            o, lse = ref(q[i : i + 1], k[i : i + 1, :sk], v[i : i + 1, :sk])
            outs.append(o)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)
    q0 = k0 = 0
    for sq, sk in problem.sequences():
        qi, ki, vi = (t.unsqueeze(0) for t in (q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk]))
        o, lse = ref(qi, ki, vi)
        outs.append(o[0])
        lses.append(lse[0])
        q0, k0 = q0 + sq, k0 + sk
    return torch.cat(outs), torch.cat(lses, dim=1)


def _padded(problem: Problem, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors as the runtime hands them to a unit of a larger head dim (interface.run_kernels)."""
    pad = problem.unit_head_dim - problem.head_dim
    return [torch.nn.functional.pad(t, (0, pad)) if pad > 0 else t for t in tensors]


def _scalars(problem: Problem, x: Inputs) -> tuple[object, ...]:
    """The ops' arguments from max_seqlen_q on: lengths, scale, mask, window and softcap."""
    left, right = problem.window
    return (x.max_seqlen_q, x.max_seqlen_k, problem.scale, problem.causal, left, 0 if problem.causal else right,
            problem.softcap)  # fmt: skip


def check_forward(
    launch: KernelLaunch, problem: Problem, device: torch.device, splitkv: bool = False
) -> Outcome:
    """The forward unit `launch` (or, splitkv, the split-KV one) on `problem`: out and lse."""
    x = inputs(problem, device)
    q, k, v = x.q, x.k, x.v
    paged_k = k if x.k_pages is None else x.k_pages  # what the op reads: pages, when the cache has them
    paged_v = v if x.v_pages is None else x.v_pages
    qo, ko, vo = _padded(problem, q, paged_k, paged_v)
    args = (qo, ko, vo, x.cu_seqlens_q, x.cu_seqlens_k, x.seqused_k, None, None, x.block_table,
            *_scalars(problem, x))  # fmt: skip
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
    out = out[..., : problem.head_dim]
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
    tensors = _padded(problem, dout, q, k, v, out_ref.detach().contiguous())
    with torch.no_grad():
        grads = torch.ops.fa_attn.bwd(
            *tensors, lse_in, x.cu_seqlens_q, x.cu_seqlens_k, *_scalars(problem, x), launch.module,
            launch.entries, list(launch.launch),
        )  # fmt: skip
    grads = tuple(g[..., : problem.head_dim] for g in grads)
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
