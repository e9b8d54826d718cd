"""The fp32 attention reference and flash-attn's (FA2's) error rule: the one definition that
`fa check`, the runtime's first-use self-check (fa_attn.selfcheck) and the GPU tests (tests/gpu) share.

The reference is plain PyTorch math (no SDPA, so no backend of its own can hide a bug), with flash-attn's
semantics: q (b, sq, h, d), k/v (b, sk, h_k, d), GQA by repeat_interleave over heads, causal masks aligned
to the bottom right (query i sees key j when j <= i + sk - sq). A query row that sees no key gives an
output of 0 (flash-attn's convention; its lse is +-inf and is not compared).

The error rule is FA2's: our error against the fp32 reference may be at most twice the error of the same
math done by PyTorch in the inputs' own dtype, plus a small absolute slack for results PyTorch happens to
get exactly right. Needs torch, not a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def bottom_right_mask(seqlen_q: int, seqlen_k: int, device: torch.device) -> torch.Tensor:
    """True where query i may attend key j: j <= i + seqlen_k - seqlen_q."""
    return visible_mask(seqlen_q, seqlen_k, True, (-1, -1), device)


def visible_mask(
    seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """(sq, sk) bool, flash-attn's rule: with diag = sk - sq, key j is visible to query i when
    j <= i + diag + right and j >= i + diag - left; causal means right = 0; a side < 0 is unbounded."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    diag = seqlen_k - seqlen_q
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= j <= i + diag + right
    if left >= 0:
        visible &= j >= i + diag - left
    return visible


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    softmax_scale: float | None = None,
    upcast: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (b, sq, h, d) in q's dtype, lse (b, h, sq) fp32). Differentiable.

    upcast=True is the fp32 reference; upcast=False is "PyTorch at the same dtype" for the error rule.
    softcap > 0: logits are softcap * tanh(scale * q.k / softcap), as flash-attn's `softcap`.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    heads, heads_k = q.shape[2], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if heads != heads_k:
        k = k.repeat_interleave(heads // heads_k, dim=2)
        v = v.repeat_interleave(heads // heads_k, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k * scale)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    visible = visible_mask(q.shape[1], k.shape[1], causal, window, q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    # Rows that see no key are all -inf: softmax gives NaN, flash-attn gives 0.
    probs = probs.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0)
    out = torch.einsum("bhts,bshd->bthd", probs, v)
    return out.to(dtype), lse


def visible_rows(
    seqlen_q: int, seqlen_k: int, causal: bool, device: torch.device, window: tuple[int, int] = (-1, -1)
) -> torch.Tensor:
    """(sq,) bool: rows that see at least one key (the others have out 0 and lse +-inf)."""
    return visible_mask(seqlen_q, seqlen_k, causal, window, device).any(dim=-1)


def eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


@dataclass(frozen=True)
class Fa2Error:
    """One output's max error against the reference, and the most the rule allows."""

    name: str
    err: float  # inf when our result has a non-finite value
    bound: float

    @property
    def ok(self) -> bool:
        return self.err <= self.bound

    @property
    def ratio(self) -> float:
        """err / bound: at most 1 passes; the smoke table reports it."""
        return self.err / self.bound if self.bound > 0 else (0.0 if self.err == 0 else math.inf)


def fa2_error(name: str, ours: torch.Tensor, ref: torch.Tensor, low: torch.Tensor) -> Fa2Error:
    """FA2's rule: |ours - ref| <= 2 * |low - ref| + atol (max norms), atol scaled to the data."""
    if ours.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(ours.shape)} != reference {tuple(ref.shape)}")
    ref_f = ref.float()
    finite = bool(torch.isfinite(ours).all())
    ours_err = (ours.float() - ref_f).abs().max().item() if finite and ours.numel() else 0.0
    low_err = (low.float() - ref_f).abs().max().item() if low.numel() else 0.0
    atol = eps(low.dtype) * max(1.0, ref_f.abs().max().item() if ref.numel() else 0.0) * 0.5
    return Fa2Error(name, ours_err if finite else math.inf, 2 * low_err + atol)


def assert_fa2_close(name: str, ours: torch.Tensor, ref: torch.Tensor, low: torch.Tensor) -> None:
    e = fa2_error(name, ours, ref, low)
    assert math.isfinite(e.err), f"{name}: non-finite values in our result"
    assert e.ok, f"{name}: max error {e.err:.3e} > 2 x PyTorch-{low.dtype} error (bound {e.bound:.3e})"


def lse_error(lse: torch.Tensor, lse_ref: torch.Tensor, rows: torch.Tensor) -> Fa2Error:
    """lse is computed in fp32 from exact products: within 1e-3 (relative to its size) on the rows that
    see a key (`rows`: a mask of lse's shape, or of its last dim); a non-finite value there is inf."""
    if lse.shape != lse_ref.shape:
        raise AssertionError(f"lse: shape {tuple(lse.shape)} != {tuple(lse_ref.shape)}")
    got, want = (
        (lse[rows], lse_ref[rows]) if rows.shape == lse.shape else (lse[..., rows], lse_ref[..., rows])
    )
    if not bool(torch.isfinite(got).all()):
        return Fa2Error("lse", math.inf, 0.0)
    err = (got - want).abs().max().item() if got.numel() else 0.0
    bound = 1e-3 * max(1.0, want.abs().max().item() if want.numel() else 0.0)
    return Fa2Error("lse", err, bound)
