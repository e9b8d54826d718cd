"""A float64 reference for flash-attn 2.x's semantics, written from its documented definitions and
sharing no code with fa_attn: one sequence at a time, explicit masks and biases.

Query i of sq sees key j of sk when j <= i + sk - sq + right and j >= i + sk - sq - left (bottom-right
alignment; causal means right = 0; -1 is unbounded). A row that sees no key has out 0 and lse +inf.
ALiBi adds -slope * |i + sk - sq - j|; `flash_attn_lse` gives the LSE flash-attn returns, which under a
purely causal mask (window (-1, 0)) is larger by slope * (i + sk - sq) (flash-attn's kernels add slope * j).
"""

from __future__ import annotations

import math

import torch


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    scale: float | None = None,
    softcap: float = 0.0,
    slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """q (sq, h, d), k (sk, hk, d) -> fp64 scores (h, sq, sk) with softcap and ALiBi (not masked), their
    derivative by the raw scores (1 - tanh^2 under softcap), the visible keys (sq, sk), each query head's
    kv head, and the scale."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, dtype=torch.float64).reshape(-1, 1) + (sk - sq)
    j = torch.arange(sk, dtype=torch.float64).reshape(1, -1)
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    kv_head = torch.arange(h) // (h // hk)
    scores = torch.einsum("ihd,jhd->hij", q.double(), k.double()[:, kv_head]) * scale
    chain = torch.ones_like(scores)
    if softcap > 0:
        chain = 1 - torch.tanh(scores / softcap) ** 2
        scores = softcap * torch.tanh(scores / softcap)
    if slopes is not None:
        scores = scores - slopes.double().reshape(h, 1, 1) * (i - j).abs()
    return scores, chain, visible, kv_head, scale


def sequence_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (sq, h, d), k/v (sk, hk, d); options causal, window, scale, softcap, slopes (as _scores) ->
    out (sq, h, d) fp64, lse (h, sq) fp64, probs (h, sq, sk) fp64."""
    scores, _, visible, kv_head, _ = _scores(q, k, **options)  # type: ignore[arg-type]
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("hij,jhd->ihd", probs, v.double()[:, kv_head])
    return out, lse.masked_fill(~visible.any(-1), math.inf), probs


def flash_attn_lse(
    lse: torch.Tensor, slopes: torch.Tensor | None, causal_only: bool, sq: int, sk: int
) -> torch.Tensor:
    """The LSE flash-attn returns for (h, sq) reference LSEs (module docstring)."""
    if slopes is None or not causal_only:
        return lse
    i = torch.arange(sq, dtype=torch.float64) + (sk - sq)
    return lse + slopes.double().reshape(-1, 1) * i


def padded_attention(q, k, v, slopes=None, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """q (b, sq, h, d), k/v (b, sk, hk, d); slopes (h,) or (b, h) -> out (b, sq, h, d), lse (b, h, sq)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        per = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
        out, lse, _ = sequence_attention(q[b], k[b], v[b], slopes=per, **options)
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def assert_close(
    name: str, ours: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, ulps: float = 16
) -> None:
    """|ours - ref| <= ulps * eps(dtype) * max(1, |ref|): the error one rounding per step in `dtype` leaves
    (fp64 results are computed in fp64, fp32 in fp32, fp16/bf16 in fp32 and rounded once). inf must match."""
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != reference {tuple(ref.shape)}"
    ours, ref = ours.double(), ref.double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(ours), inf), f"{name}: +inf where the reference has none, or the reverse"
    if (~inf).any():
        err = (ours[~inf] - ref[~inf]).abs().max().item()
        tol = ulps * torch.finfo(dtype).eps * max(1.0, ref[~inf].abs().max().item())
        assert err <= tol, f"{name}: max error {err:.3e} > {tol:.3e} ({ulps} eps of {dtype})"


def sequence_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """flash-attn's backward formula for one sequence, from the out and lse it is given (ring attention
    passes merged ones): P = exp(S - lse) on the visible keys, D_i = sum_d dout * out, dS = P (dP - D) with
    dP = dout v^T, times 1 - tanh^2 under softcap; dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
    dout/q/out (sq, h, d), k/v (sk, hk, d), lse (h, sq) as flash-attn returns it (flash_attn_lse);
    options as sequence_attention's -> fp64 dq, dk, dv (kv heads summed over their query heads)."""
    scores, chain, visible, kv_head, scale = _scores(q, k, **options)  # type: ignore[arg-type]
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    slopes = options.get("slopes")
    causal_only = bool(options.get("causal")) and options.get("window", (-1, -1))[0] < 0  # type: ignore[index]
    given = lse.double() - flash_attn_lse(torch.zeros(h, sq), slopes, causal_only, sq, sk).double()  # type: ignore[arg-type]
    probs = torch.exp(scores - given.unsqueeze(-1)).masked_fill(~visible, 0.0)
    dod, od, kd, vd = dout.double(), out.double(), k.double()[:, kv_head], v.double()[:, kv_head]
    d_rows = (dod * od).sum(-1).t().unsqueeze(-1)  # (h, sq, 1)
    dscores = probs * (torch.einsum("ihd,jhd->hij", dod, vd) - d_rows) * chain
    dq = torch.einsum("hij,jhd->ihd", dscores, kd) * scale
    dk_per_head = torch.einsum("hij,ihd->jhd", dscores, q.double()) * scale
    dv_per_head = torch.einsum("hij,ihd->jhd", probs, dod)
    dk = torch.zeros(sk, hk, d, dtype=torch.float64).index_add_(1, kv_head, dk_per_head)
    dv = torch.zeros(sk, hk, d, dtype=torch.float64).index_add_(1, kv_head, dv_per_head)
    return dq, dk, dv
