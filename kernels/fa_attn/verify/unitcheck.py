"""One kernel unit, run through fa_attn's own ops on one problem and measured against the fp32 reference
under FA2's rule: the check the runtime's first-use self-check and `fa check` share.

A forward unit runs `fa_attn::fwd` (or `fa_attn::fwd_splitkv` in `Problem.splits` shares); a backward
unit runs `fa_attn::bwd` on the reference's out and lse, so its verdict does not hang on the forward's.
Whatever the ops are registered with runs: the binding's CUDA kernels on a GPU, or the CPU emulator in
tests.

A problem carries every argument the kernels branch on (fwd.cu's and bwd.cu's headers): its head dim
(the unit's bucket or one it serves below it), heads and kv heads (GQA, MQA), softmax_scale, causal,
the sliding window, softcap, and a layout, one of the four the runtime sends the same kernels: padded
(b, s, h, d); varlen (packed sequences with cu_seqlens, any of them empty); kvcache (a cache of
`seqlen_k` rows per sequence, each using its own `seqused_k`, optionally from a left-padded first row
(`leftpad_k`) and in another cache row (`cache_batch_idx`)); and paged (the same keys through a
shuffled page table of `page_size` keys per page). The reference is computed per sequence on exactly
the keys that sequence should see, so each layout's indexing is checked, not only its arithmetic.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..runtime.decision import KernelLaunch
from ..runtime.ops import NO_LAUNCH
from .reference import Fa2Error, attention_ref, fa2_error, lse_error

SPLITS = 2  # the split-KV check's key shares, unless a problem says otherwise
NO_WINDOW = (-1, -1)


@dataclass(frozen=True)
class Problem:
    """One attention problem (seeded: a failure reproduces alone)."""

    dtype: torch.dtype
    head_dim: int  # the problem's head dim: the unit's bucket, or one it serves below it
    causal: bool
    seqlen_q: int
    seqlen_k: int  # keys per sequence (padded); the cache's rows per sequence (kvcache)
    heads: int = 2
    heads_k: int = 2
    batch: int = 1
    seed: int = 0
    layout: str = "padded"  # "padded" | "varlen" | "kvcache" | "paged" (LAYOUTS)
    window: tuple[int, int] = NO_WINDOW  # (left, right), -1 unbounded
    softcap: float = 0.0
    scale: float | None = None  # softmax_scale; None: 1 / sqrt(head_dim)
    lengths: tuple[tuple[int, int], ...] = ()  # (queries, keys) per sequence; () the layout's default
    leftpad: bool = False  # kvcache: each sequence's keys start at its own row (leftpad_k)
    cache_rows: bool = False  # kvcache: sequence b reads cache row cache_batch_idx[b] (reversed order)
    page_size: int = 0  # paged: keys per page
    splits: int = SPLITS  # the split-KV forward's shares
    name: str = ""  # what `fa check --emulate --problem` selects

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def sequences(self) -> list[tuple[int, int]]:
        """(queries, keys) of each sequence: `lengths` when given; else `batch` equal ones when padded;
        varlen, kvcache and paged have two, the second shorter (a cache's sequence keeps its queries
        and uses fewer of its cache rows)."""
        if self.lengths:
            return list(self.lengths)
        if self.layout == "padded":
            return [(self.seqlen_q, self.seqlen_k)] * self.batch
        keys = min(self.seqlen_k, max(1, self.seqlen_k // 2 + 3))
        queries = self.seqlen_q if self.layout in CACHES else max(1, self.seqlen_q // 2 + 1)
        return [(self.seqlen_q, self.seqlen_k), (queries, keys)]

    def leftpads(self) -> list[int]:
        """The first cache row of each sequence's keys (kvcache; 0 without leftpad)."""
        rows = self.cache_length()
        return [
            min(3 + 5 * i, rows - sk) if self.leftpad else 0 for i, (_, sk) in enumerate(self.sequences())
        ]

    def cache_length(self) -> int:
        """Rows per sequence of a kvcache (at least every sequence's keys), keys per sequence's pages
        of a paged cache."""
        longest = max(sk for _, sk in self.sequences())
        if self.layout == "paged":
            return -(-longest // self.page_size) * self.page_size
        return max(self.seqlen_k, longest)

    def describe(self) -> str:
        dt = "bf16" if self.dtype == torch.bfloat16 else "fp16"
        mask = "causal" if self.causal else "full"
        shape = " ".join(f"q{sq}k{sk}" for sq, sk in self.sequences()[:4])
        if self.layout == "padded":
            shape = f"b{self.batch} q{self.seqlen_q} k{self.seqlen_k}"
        extra = []
        if self.window != NO_WINDOW:
            extra.append(f"window {self.window[0]},{self.window[1]}")
        if self.softcap:
            extra.append(f"softcap {self.softcap:g}")
        if self.scale is not None:
            extra.append(f"scale {self.scale:g}")
        if self.leftpad:
            extra.append("leftpad_k")
        if self.cache_rows:
            extra.append("cache_batch_idx")
        if self.page_size:
            extra.append(f"pages of {self.page_size}")
        if self.splits != SPLITS:
            extra.append(f"{self.splits} splits")
        named = f"[{self.name}] " if self.name else ""
        what = f"{dt} d{self.head_dim} {mask} {self.layout} {shape} h{self.heads}/{self.heads_k}"
        return named + " ".join([what, *extra])


CACHES = ("kvcache", "paged")
LAYOUTS = ("padded", "varlen", *CACHES)


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
    leftpad_k: torch.Tensor | None = None
    cache_batch_idx: torch.Tensor | None = None
    block_table: torch.Tensor | None = None


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


def _random(p: Problem, *shapes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Normal tensors of `shapes` from the problem's seed (made on the CPU: the same numbers on every
    device)."""
    gen = torch.Generator().manual_seed(p.seed)
    return tuple(torch.randn(s, generator=gen).to(device=device, dtype=p.dtype) for s in shapes)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def inputs(problem: Problem, device: torch.device) -> Inputs:
    """The problem's tensors: padded (b, s, h, d); varlen packs its sequences' tokens (total, h, d) with
    cu_seqlens; kvcache keeps (rows, seqlen_k, h_k, d) caches with each sequence's used rows in
    seqused_k (counted from row 0, so leftpad_k[b] + its keys); paged keeps (pages, page_size, h_k, d)
    and a shuffled block_table."""
    p, seqs = problem, problem.sequences()
    h, hk, d = p.heads, p.heads_k, p.head_dim
    if p.layout == "padded":
        q, k, v, dout = _random(p, *_qkvd(p.batch, p.seqlen_q, p.seqlen_k, h, hk, d), device=device)
        return Inputs(q, k, v, dout, None, None, None, p.seqlen_q, p.seqlen_k)
    if p.layout == "varlen":
        total_q, total_k = sum(sq for sq, _ in seqs), sum(sk for _, sk in seqs)
        q, k, v, dout = _random(p, *_qkvd(1, total_q, total_k, h, hk, d), device=device)

        def cu(lengths: list[int]) -> torch.Tensor:
            return _index([0, *itertools.accumulate(lengths)], device)

        return Inputs(
            q[0], k[0], v[0], dout[0], cu([sq for sq, _ in seqs]), cu([sk for _, sk in seqs]), None,
            max(sq for sq, _ in seqs), max(sk for _, sk in seqs),
        )  # fmt: skip
    if p.layout not in CACHES:
        raise ValueError(f"layout {p.layout!r}: one of {', '.join(LAYOUTS)}")
    batch, rows = len(seqs), p.cache_length()
    if p.layout == "paged":
        per_seq = rows // p.page_size
        pages = batch * per_seq + 1  # one page no sequence uses
        q_shape, page_shape = (batch, p.seqlen_q, h, d), (pages, p.page_size, hk, d)
        q, k, v, dout = _random(p, q_shape, page_shape, page_shape, q_shape, device=device)
        gen = torch.Generator().manual_seed(p.seed + 1)
        table = torch.randperm(pages, generator=gen)[: batch * per_seq].view(batch, per_seq)
        used = _index([sk for _, sk in seqs], device)
        return Inputs(
            q, k, v, dout, None, None, used, p.seqlen_q, rows, block_table=table.to(torch.int32).to(device)
        )
    cache_batch = batch + (1 if p.cache_rows else 0)
    q_shape, cache_shape = (batch, p.seqlen_q, h, d), (cache_batch, rows, hk, d)
    q, k, v, dout = _random(p, q_shape, cache_shape, cache_shape, q_shape, device=device)
    pads = p.leftpads()
    used = _index([lp + sk for lp, (_, sk) in zip(pads, seqs, strict=True)], device)
    return Inputs(
        q, k, v, dout, None, None, used, p.seqlen_q, rows,
        leftpad_k=_index(pads, device) if p.leftpad else None,
        cache_batch_idx=_index(cache_rows(p), device) if p.cache_rows else None,
    )  # fmt: skip


def _qkvd(b: int, sq: int, sk: int, h: int, hk: int, d: int) -> tuple[tuple[int, ...], ...]:
    return (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d)


def cache_rows(problem: Problem) -> list[int]:
    """cache_batch_idx: sequence b reads the cache's row batch - b (row 0 unused), so a kernel that reads
    row b reads another sequence's keys."""
    batch = len(problem.sequences())
    return [batch - b for b in range(batch)]


def _sequence_keys(problem: Problem, x: Inputs, b: int, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) of cache sequence b as (1, keys, h_k, d): exactly the rows the kernels must read."""
    if problem.layout == "paged":
        assert x.block_table is not None
        pages = x.block_table[b].long()
        k, v = (t[pages].flatten(0, 1)[:keys] for t in (x.k, x.v))
        return k.unsqueeze(0), v.unsqueeze(0)
    row = cache_rows(problem)[b] if problem.cache_rows else b
    first = problem.leftpads()[b]
    return x.k[row : row + 1, first : first + keys], x.v[row : row + 1, first : first + keys]


def reference(
    problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upcast: bool = True,
    x: Inputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """attention_ref per sequence with the problem's scale, window and softcap, put back in the problem's
    layout: out as q, lse (b, h, sq) padded and in a cache, (h, total_q) varlen (flash-attn's layouts).
    Differentiable in q, k, v. A cache's keys come from `x` (its inputs)."""
    p = problem

    def ref(qi: torch.Tensor, ki: torch.Tensor, vi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return attention_ref(qi, ki, vi, p.causal, p.softmax_scale, upcast, p.window, p.softcap)

    if p.layout == "padded":
        return ref(q, k, v)
    outs, lses = [], []
    if p.layout in CACHES:
        assert x is not None, "a cache's reference needs its inputs"
        for b, (_, sk) in enumerate(p.sequences()):
            kb, vb = _sequence_keys(p, x, b, sk)
            o, lse = ref(q[b : b + 1], kb, vb)
            outs.append(o)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)
    q0 = k0 = 0
    for sq, sk in p.sequences():
        qi, ki, vi = (t.unsqueeze(0) for t in (q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk]))
        o, lse = ref(qi, ki, vi)
        outs.append(o[0])
        lses.append(lse[0])
        q0, k0 = q0 + sq, k0 + sk
    return torch.cat(outs), torch.cat(lses, dim=1)


def check_forward(
    launch: KernelLaunch, problem: Problem, device: torch.device, splitkv: bool = False
) -> Outcome:
    """The forward unit `launch` (or, splitkv, the split-KV one) on `problem`: out and lse."""
    p, x = problem, inputs(problem, device)
    q, k, v = x.q, x.k, x.v
    args = (q, k, v, x.cu_seqlens_q, x.cu_seqlens_k, x.seqused_k, x.leftpad_k, x.cache_batch_idx,
            x.block_table, x.max_seqlen_q, x.max_seqlen_k, p.softmax_scale, p.causal, *p.window, p.softcap)  # fmt: skip
    with torch.no_grad():
        out_ref, lse_ref = reference(p, q, k, v, x=x)
        out_low, _ = reference(p, q, k, v, upcast=False, x=x)
        if splitkv:
            out, lse = torch.ops.fa_attn.fwd_splitkv(
                *args, p.splits, launch.module, launch.entries, list(launch.launch)
            )
        else:
            out, lse = torch.ops.fa_attn.fwd(
                *args, launch.module, launch.entries, list(launch.launch), *_no_backward()
            )
    rows = torch.isfinite(lse_ref)  # rows that see a key (the others' lse is +-inf by convention)
    errors = (fa2_error("out", out, out_ref, out_low), lse_error(lse.float(), lse_ref, rows))
    return Outcome("splitkv" if splitkv else "fwd", p, errors)


def check_backward(launch: KernelLaunch, problem: Problem, device: torch.device) -> Outcome:
    """The backward unit `launch` on `problem`, fed the reference's out and lse: dq, dk and dv. (The
    runtime never runs a backward on a KV cache: padded and varlen problems only.)"""
    if problem.layout in CACHES:
        raise ValueError("a backward unit is checked on padded and varlen problems (no KV-cache backward)")
    p, x = problem, inputs(problem, device)
    q, k, v, dout = x.q, x.k, x.v, x.dout
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        out_ref, lse_ref = reference(p, qr, kr, vr)
        out_low, _ = reference(p, qr, kr, vr, upcast=False)
        refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout, retain_graph=True, allow_unused=True)
        lows = torch.autograd.grad(out_low, (qr, kr, vr), dout, allow_unused=True)
    # The kernels' lse for a row that sees no key is +inf (the reference's is -inf).
    lse_in = torch.where(torch.isneginf(lse_ref), torch.inf, lse_ref).detach().contiguous()
    with torch.no_grad():
        grads = torch.ops.fa_attn.bwd(
            dout, q, k, v, out_ref.detach().contiguous(), lse_in, x.cu_seqlens_q, x.cu_seqlens_k,
            x.max_seqlen_q, x.max_seqlen_k, p.softmax_scale, p.causal, *p.window, p.softcap, launch.module,
            launch.entries, list(launch.launch),
        )  # fmt: skip
    errors = tuple(
        fa2_error(n, g, _zero_if_none(r, t), _zero_if_none(lo, t))
        for n, g, r, lo, t in zip(("dq", "dk", "dv"), grads, refs, lows, (q, k, v), strict=True)
    )
    return Outcome("bwd", p, errors)


def _zero_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A gradient autograd left out (an input no output depends on: every row empty) is zero."""
    return torch.zeros_like(like) if grad is None else grad


def key_block(launch: KernelLaunch) -> int:
    """The unit's key block: the largest block_n of its entries (a backward's preprocess and convert
    entries have none); 64 when the launch data do not say. Launch data: head dim, then per entry
    threads, block_m, block_n, shared memory, grid (decision.KernelLaunch)."""
    return max(launch.launch[3::5], default=0) or 64


def query_block(launch: KernelLaunch) -> int:
    """The unit's query block: block_m of its main entry (the one with the largest block_n; the
    split-KV combine's 4 rows and the backward's row entries do not count); 64 when not said."""
    entries = list(zip(launch.launch[2::5], launch.launch[3::5], strict=True))
    return max(entries, key=lambda e: e[1], default=(64, 0))[0] or 64


def _no_backward() -> tuple[str, str, list[int]]:
    return NO_LAUNCH.module, NO_LAUNCH.entries, list(NO_LAUNCH.launch)
