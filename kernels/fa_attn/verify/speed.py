"""`fa check --bench`: one unit against what torch SDPA picks on this GPU, timed side by side in one
process with CUDA events; medians of repeated runs; the ratio fa/SDPA per speed class and key length
(> 1: fa slower). The classes are the ones the runtime routes by (record.speed_key): a forward unit
non-causal and causal with as many queries as keys, and a decode step (one query); a backward unit
non-causal and causal.

Not verified on a GPU (this project has none): the timing is the usual CUDA-event pattern (warm-up,
then REPEATS timed runs of each, interleaved so clocks and caches treat both alike).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..runtime.decision import KernelLaunch
from ..runtime.ops import NO_LAUNCH
from .record import speed_key

REPEATS = 20
WARMUP = 3


def _time(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def ratio(fa: Callable[[], object], sdpa: Callable[[], object]) -> float:
    """median(fa) / median(sdpa) over REPEATS interleaved runs."""
    for _ in range(WARMUP):
        fa()
        sdpa()
    fa_ms, sdpa_ms = [], []
    for _ in range(REPEATS):
        fa_ms.append(_time(fa))
        sdpa_ms.append(_time(sdpa))
    return statistics.median(fa_ms) / max(statistics.median(sdpa_ms), 1e-9)


Run = Callable[[], object]


def _pair(job: Any, launch: KernelLaunch, n: int, causal: bool, queries: int) -> tuple[Run, Run]:
    """(fa, SDPA) for one unit at `queries` queries and `n` keys: batch 2, 8 heads, the unit's head dim."""
    device = torch.device("cuda", job.device)
    dtype = torch.bfloat16 if job.dtype == "bf16" else torch.float16
    head_dim, heads, batch = job.launch[0], 8, 2
    q, dout = (torch.randn(batch, queries, heads, head_dim, device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(batch, n, heads, head_dim, device=device, dtype=dtype) for _ in range(2))
    scale = 1.0 / math.sqrt(head_dim)
    args = (
        q,
        k,
        v,
        None,
        None,
        None,
        None,
        None,
        None,
        queries,
        n,
        scale,
        causal,
        -1,
        0 if causal else -1,
        0.0,
    )
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    # SDPA's is_causal is top-left aligned; flash-attn's (fa's) bottom-right: equal when queries == keys,
    # and a decode step's one query sees every key either way.
    sdpa_causal = causal and queries == n
    unit = (launch.module, launch.entries, list(launch.launch))
    if job.direction == "splitkv":
        return (lambda: torch.ops.fa_attn.fwd_splitkv(*args, 2, *unit)), (
            lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=sdpa_causal)
        )
    if job.direction == "fwd":
        no_bwd = (NO_LAUNCH.module, NO_LAUNCH.entries, list(NO_LAUNCH.launch))
        return (lambda: torch.ops.fa_attn.fwd(*args, *unit, *no_bwd)), (
            lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=sdpa_causal)
        )
    out = torch.empty_like(q)
    lse = torch.zeros(batch, heads, queries, device=device, dtype=torch.float32)
    qg, kg, vg = (t.detach().requires_grad_() for t in (qt, kt, vt))
    with torch.enable_grad():
        ref = F.scaled_dot_product_attention(qg, kg, vg, is_causal=sdpa_causal)
    bwd_args = (dout, q, k, v, out, lse, None, None, queries, n, scale, causal, -1, 0 if causal else -1, 0.0,
                *unit)  # fmt: skip
    return (lambda: torch.ops.fa_attn.bwd(*bwd_args)), (
        lambda: torch.autograd.grad(ref, (qg, kg, vg), dout.transpose(1, 2), retain_graph=True)
    )


def speed_classes(direction: str) -> list[tuple[str, bool, bool]]:
    """(record key, causal, decode) of every class a unit of `direction` is timed in."""
    base = "bwd" if direction == "bwd" else "fwd"
    shapes = [(False, False), (True, False)] + ([] if base == "bwd" else [(False, True)])
    return [(speed_key(base, causal, decode), causal, decode) for causal, decode in shapes]


def measure_speed(job: Any, seqlens: Sequence[int]) -> dict[str, dict[str, float]]:
    """{speed class: {key length: fa/SDPA}} for one unit (a check.Job) on its GPU."""
    launch = KernelLaunch(job.module, job.entries, job.launch)
    measured: dict[str, dict[str, float]] = {}
    for key, causal, decode in speed_classes(job.direction):
        for n in seqlens:
            fa, sdpa = _pair(job, launch, n, causal, 1 if decode else n)
            with torch.no_grad():  # the SDPA backward's graph was built in _pair
                measured.setdefault(key, {})[str(n)] = ratio(fa, sdpa)
    return measured
