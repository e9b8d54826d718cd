"""One case through fa_attn's public API, forward and backward, checked against the fp32 reference.

Shared by the GPU tests (test_attention.py, test_turing.py) and the sanitizer sweep (sanitize_sweep.py).
The runtime must report that our kernels ran (fa_attn.last_dispatch().path is "sass" or "ptx"); callers
also set FA_STRICT=1 so a fallback raises instead of passing with PyTorch's own numbers.
"""

from __future__ import annotations

import itertools
import math
import random

import torch
from attn_reference import (
    Case,
    assert_fa2_close,
    attention_ref,
    lse_error,
    random_case_tensors,
    random_cu_seqlens,
    visible_rows,
)


def assert_ran_our_kernel(expect_arch: str | None = None) -> None:
    import fa_attn

    last = fa_attn.last_dispatch()
    assert last is not None, f"the call fell back: {last}"
    assert last.path in ("sass", "ptx"), f"the call fell back: {last}"
    if expect_arch is not None:
        assert last.arch == expect_arch, f"ran the {last.arch} image ({last.path}), expected {expect_arch}"


def check_lse(lse: torch.Tensor, lse_ref: torch.Tensor, rows: torch.Tensor) -> None:
    """lse is computed in fp32 from exact products: compare tightly on rows that see a key."""
    e = lse_error(lse, lse_ref, rows)
    assert math.isfinite(e.err), "lse: non-finite value on a row that sees a key"
    assert e.ok, f"lse: max error {e.err:.3e} > {e.bound:.1e}"


def run_padded(
    case: Case,
    backward: bool = True,
    expect_arch: str | None = None,
    check: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> None:
    """flash_attn_func on one case; check=False only exercises the kernels (sanitizer runs)."""
    from fa_attn import flash_attn_func

    device = torch.device("cuda")
    q, k, v, dout = random_case_tensors(case, device)
    if backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    out, lse, _ = flash_attn_func(
        q, k, v, causal=case.causal, window_size=window, softcap=softcap, return_attn_probs=True
    )
    assert_ran_our_kernel(expect_arch)
    grads = torch.autograd.grad(out, (q, k, v), dout) if backward else None
    torch.cuda.synchronize()
    if not check:
        return

    out_ref, lse_ref = attention_ref(q, k, v, case.causal, window=window, softcap=softcap)
    out_low, _ = attention_ref(q, k, v, case.causal, upcast=False, window=window, softcap=softcap)
    rows = visible_rows(case.seqlen_q, case.seqlen_k, case.causal, device, window)
    assert (out[:, ~rows] == 0).all(), "rows that see no key must give 0"
    assert_fa2_close("out", out, out_ref, out_low)
    check_lse(lse, lse_ref, rows)
    if grads is None:
        return
    refs = torch.autograd.grad(out_ref, (q, k, v), dout)
    lows = torch.autograd.grad(out_low, (q, k, v), dout)
    for name, ours, ref, low in zip(("dq", "dk", "dv"), grads, refs, lows, strict=True):
        assert_fa2_close(name, ours, ref, low)


def _lens(cu: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(cu)]


def run_varlen(case: Case, expect_arch: str | None = None, check: bool = True) -> None:
    """flash_attn_varlen_func on a batch of random lengths (max case.seqlen_q / case.seqlen_k)."""
    from fa_attn import flash_attn_varlen_func

    device = torch.device("cuda")
    rng = random.Random(case.seed)
    cu_q = random_cu_seqlens(case.batch, case.seqlen_q, rng)
    cu_k = cu_q if case.seqlen_k == case.seqlen_q else random_cu_seqlens(case.batch, case.seqlen_k, rng)
    packed = Case(
        1, cu_q[-1], cu_k[-1], case.heads, case.heads_k, case.head_dim, False, case.dtype, seed=case.seed
    )
    q, k, v, dout = (t[0] for t in random_case_tensors(packed, device))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=device)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=device)
    out, lse, _ = flash_attn_varlen_func(
        q,
        k,
        v,
        cu_q_t,
        cu_k_t,
        max(_lens(cu_q)),
        max(_lens(cu_k)),
        causal=case.causal,
        return_attn_probs=True,
    )
    assert_ran_our_kernel(expect_arch)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    if not check:
        return

    # The reference runs sequence by sequence; results are concatenated back into the packed layout.
    names = ("out", "dq", "dk", "dv")
    refs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    lows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for i in range(case.batch):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        qi, ki, vi = q[sq].unsqueeze(0), k[sk].unsqueeze(0), v[sk].unsqueeze(0)
        o_ref, lse_ref = attention_ref(qi, ki, vi, case.causal)
        o_low, _ = attention_ref(qi, ki, vi, case.causal, upcast=False)
        g_ref = torch.autograd.grad(o_ref, (qi, ki, vi), dout[sq].unsqueeze(0))
        g_low = torch.autograd.grad(o_low, (qi, ki, vi), dout[sq].unsqueeze(0))
        for name, r, lo in zip(names, (o_ref, *g_ref), (o_low, *g_low), strict=True):
            refs[name].append(r[0])
            lows[name].append(lo[0])
        rows = visible_rows(sq.stop - sq.start, sk.stop - sk.start, case.causal, device)
        check_lse(lse[:, sq], lse_ref[0], rows)  # flash-attn's varlen lse is (heads, total_q)
    for name, ours in zip(names, (out, dq, dk, dv), strict=True):
        assert_fa2_close(name, ours, torch.cat(refs[name]), torch.cat(lows[name]))
