"""Host time per call of fa_attn's Python, side by side with what it wraps (issue 26: at decode a kernel
takes 10-20 µs, so the Python around it must not). CPU microseconds per call of the calling thread,
median of rounds, on the CPU:

  kernel path   flash_attn_func / flash_attn_with_kvcache taking the kernel route, with fa_attn::fwd and
                fwd_splitkv replaced by a no-op CPU kernel (returns preallocated outputs), against a
                direct call of that no-op op: the difference is fa's host time per kernel call.
                The route is the one the decision would give a GPU (interface._decide_for is answered
                with a kernel route, so decide's own per-call work still runs); FA_SELF_CHECK=off.
                bf16 calls get a route with a split-KV unit (the GPU's SM count answered: 108), so the
                KV-cache case runs fwd_splitkv as a decode step does on a GPU.
  first use     the same with FA_SELF_CHECK=first-use (the default), the units answered as a GPU's
                first-use self-check passed them (selfcheck._admission) and no `fa check` record.
  fallback      flash_attn_func on the CPU (fa's fallback: torch SDPA) against a direct SDPA call on the
                same (batch, seqlen, heads, dim) tensors (transposed in and out), and
                flash_attn_with_kvcache (int cache_seqlens) against that same SDPA call.

Shapes: decode, 1 query x 256 keys x 8 heads x head dim 64 (batch 1). The target: at most 10 µs above
the op call, and the fallback at most 10 µs above SDPA.

    python bench/runtime/host_time.py [--rounds 7] [--calls 2000] [--json FILE] [--record]

`--record` writes the overheads into docs/figures.md (section `host-time`).

Not a test: numbers depend on the machine; run two checkouts' copies in turns to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "kernels"), str(REPO / "bench")]
os.environ["FA_SELF_CHECK"] = "off"

import fa_attn
import figures  # bench/figures.py
import torch
import torch.nn.functional as F
from fa_attn.runtime import interface
from fa_attn.runtime.decision import Dispatch, KernelLaunch
from fa_attn.verify import selfcheck

HEADS, HEAD_DIM, KEYS = 8, 64, 256
FWD = KernelLaunch("/pkg/kernels/sm_80/fwd_fp16_d64.cubin", "fa_fwd", (64, 128, 128, 64, 49152, 0))
SPLIT = KernelLaunch(
    "/pkg/kernels/sm_80/fwd_splitkv_bf16_d64.cubin",
    "fa_fwd_splitkv fa_fwd_splitkv_combine",
    (64, 128, 64, 64, 32768, 0),
)


def per_call_us(cases: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """Median over rounds of the mean CPU time per call of this thread, µs (thread time, not wall time:
    other processes on a busy machine do not count; torch runs single-threaded here). The cases take
    turns within each round, so whatever else varies affects them alike."""
    for fn in cases.values():
        for _ in range(min(calls, 200)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            start = time.thread_time_ns()
            for _ in range(calls):
                fn()
            samples[name].append((time.thread_time_ns() - start) / calls / 1000)
    return {name: round(statistics.median(times), 2) for name, times in samples.items()}


def no_op_kernels() -> torch.library.Library:
    """fa_attn::fwd and fwd_splitkv as no-ops on the CPU: outputs allocated once, returned as they are."""
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = tuple(q.shape)
        if key not in cache:
            cache[key] = (
                torch.empty_like(q),
                q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32),
            )
        return cache[key]

    def fwd(q: torch.Tensor, *_rest: object) -> tuple[torch.Tensor, torch.Tensor]:
        return outputs(q)

    lib = torch.library.Library("fa_attn", "IMPL")
    lib.impl("fwd", fwd, "CPU")
    lib.impl("fwd_splitkv", fwd, "CPU")
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--record", action="store_true", help="write the overheads into docs/figures.md")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    results: dict[str, float] = {}
    cases: dict[str, Callable[[], object]] = {}

    def measure(name: str, fn: Callable[[], object]) -> None:
        cases[name] = fn

    # ---- the kernel path, with the op a no-op ----
    lib = no_op_kernels()
    route = Dispatch("sass", "8.0", (), HEAD_DIM, FWD, None)
    split_route = Dispatch("sass", "8.0", (), HEAD_DIM, FWD, None, SPLIT)
    real = interface._decide_for, interface._sm_count, selfcheck._admission, selfcheck._record
    interface._decide_for = lambda _type, _index, dtype, *_facts: split_route if dtype == "bf16" else route  # type: ignore[assignment]
    interface._sm_count = lambda _device: 108  # type: ignore[assignment]
    selfcheck._admission = lambda *_facts: ("", "", "", "self-check", False)  # type: ignore[assignment]
    selfcheck._record = lambda _device: None  # type: ignore[assignment]
    try:
        q = torch.randn(1, 1, HEADS, HEAD_DIM, generator=gen).half()
        k = torch.randn(1, KEYS, HEADS, HEAD_DIM, generator=gen).half()
        v = torch.randn(1, KEYS, HEADS, HEAD_DIM, generator=gen).half()
        op_args = (q, k, v, None, None, None, None, None, None, 1, KEYS, 0.125, False, -1, -1, 0.0)
        launch = (FWD.module, FWD.entries, list(FWD.launch), "", "", [])
        measure("op_call", lambda: torch.ops.fa_attn.fwd(*op_args, *launch))
        measure("kernel_path_flash_attn_func", lambda: fa_attn.flash_attn_func(q, k, v))
        cache_k, cache_v = k.clone(), v.clone()
        measure(
            "kernel_path_flash_attn_with_kvcache",
            lambda: fa_attn.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=KEYS),
        )
        lengths = torch.full((1,), KEYS, dtype=torch.int32)
        measure(
            "kernel_path_flash_attn_with_kvcache_tensor_lengths",
            lambda: fa_attn.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=lengths),
        )
        # Split-KV: what the decode step launches on a GPU (decision.num_splits gives 4 here).
        qb, kb, vb = q.bfloat16(), cache_k.bfloat16(), cache_v.bfloat16()
        split_args = (qb, kb, vb, None, None, lengths, None, None, None, 1, KEYS, 0.125, False, -1, 0, 0.0)
        split_launch = (4, SPLIT.module, SPLIT.entries, list(SPLIT.launch))
        measure("op_call_splitkv", lambda: torch.ops.fa_attn.fwd_splitkv(*split_args, *split_launch))
        measure(
            "kernel_path_flash_attn_with_kvcache_splitkv",
            lambda: fa_attn.flash_attn_with_kvcache(qb, kb, vb, cache_seqlens=lengths),
        )
        results.update(per_call_us(cases, args.calls, args.rounds))
        # FA_SELF_CHECK's default: the admission's per-call work, with the units verified.
        os.environ["FA_SELF_CHECK"] = "first-use"
        first_use = {
            "op_call": cases["op_call"],
            "first_use_flash_attn_func": cases["kernel_path_flash_attn_func"],
            "first_use_flash_attn_with_kvcache_tensor_lengths": cases[
                "kernel_path_flash_attn_with_kvcache_tensor_lengths"
            ],
        }
        measured = per_call_us(first_use, args.calls, args.rounds)
        results["first_use_op_call"] = measured.pop("op_call")
        results.update(measured)
        cases.clear()
    finally:
        os.environ["FA_SELF_CHECK"] = "off"
        interface._decide_for, interface._sm_count, selfcheck._admission, selfcheck._record = real  # type: ignore[assignment]
        lib._destroy()

    # ---- the fallback, against SDPA ----
    q = torch.randn(1, 1, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(1, KEYS, HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(1, KEYS, HEADS, HEAD_DIM, generator=gen)
    # A direct SDPA call on flash-attn's (batch, seqlen, heads, dim) layout: transposed in and out.
    measure(
        "sdpa_call",
        lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ).transpose(1, 2),
    )
    measure("fallback_flash_attn_func", lambda: fa_attn.flash_attn_func(q, k, v))
    cache_k, cache_v = k.clone(), v.clone()
    measure(
        "fallback_flash_attn_with_kvcache",
        lambda: fa_attn.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=KEYS),
    )
    results.update(per_call_us(cases, args.calls, args.rounds))

    results["kernel_path_overhead_us"] = round(results["kernel_path_flash_attn_func"] - results["op_call"], 2)
    results["kvcache_kernel_path_overhead_us"] = round(
        results["kernel_path_flash_attn_with_kvcache"] - results["op_call"], 2
    )
    results["kvcache_tensor_lengths_kernel_path_overhead_us"] = round(
        results["kernel_path_flash_attn_with_kvcache_tensor_lengths"] - results["op_call"], 2
    )
    results["kvcache_splitkv_kernel_path_overhead_us"] = round(
        results["kernel_path_flash_attn_with_kvcache_splitkv"] - results["op_call_splitkv"], 2
    )
    results["first_use_kernel_path_overhead_us"] = round(
        results["first_use_flash_attn_func"] - results["first_use_op_call"], 2
    )
    results["first_use_kvcache_tensor_lengths_kernel_path_overhead_us"] = round(
        results["first_use_flash_attn_with_kvcache_tensor_lengths"] - results["first_use_op_call"], 2
    )
    results["fallback_overhead_us"] = round(results["fallback_flash_attn_func"] - results["sdpa_call"], 2)
    results["kvcache_fallback_overhead_us"] = round(
        results["fallback_flash_attn_with_kvcache"] - results["sdpa_call"], 2
    )
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.record:
        figures.record("host-time", overhead_table(results, args.rounds, args.calls))
    return 0


# (what the row measures, its field): the overheads, each a difference of two medians.
OVERHEADS = (
    ("flash_attn_func, kernel path", "kernel_path_overhead_us"),
    ("flash_attn_with_kvcache, int cache_seqlens, kernel path", "kvcache_kernel_path_overhead_us"),
    (
        "flash_attn_with_kvcache, cache_seqlens tensor, kernel path",
        "kvcache_tensor_lengths_kernel_path_overhead_us",
    ),
    ("the same, split-KV forward", "kvcache_splitkv_kernel_path_overhead_us"),
    ("flash_attn_func, FA_SELF_CHECK=first-use", "first_use_kernel_path_overhead_us"),
    (
        "cache_seqlens tensor, FA_SELF_CHECK=first-use",
        "first_use_kvcache_tensor_lengths_kernel_path_overhead_us",
    ),
    ("flash_attn_func, fallback (above SDPA)", "fallback_overhead_us"),
    ("flash_attn_with_kvcache, fallback (above SDPA)", "kvcache_fallback_overhead_us"),
)


def overhead_table(results: dict[str, float], rounds: int, calls: int) -> str:
    rows = [
        (
            f"Decode shape (1 query x 256 keys x 8 heads x 64, batch 1); CPU µs of the calling thread per "
            f"call, median of {rounds} rounds of {calls} calls; the target is at most 10."
        ),
        "",
        "| call | µs above the op |",
        "| --- | --- |",
    ]
    rows += [f"| {label} | {results[field]:.1f} |" for label, field in OVERHEADS]
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
