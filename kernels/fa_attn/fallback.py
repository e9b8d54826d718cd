"""Attention in plain PyTorch, with flash-attn 2.x semantics, for every call our kernels cannot serve.

Two paths, both differentiable by ordinary autograd:
- torch SDPA (`scaled_dot_product_attention`) for the plain cases (no LSE wanted, no softcap/alibi/window,
  causal only when seqlen_q == seqlen_k, where top-left and bottom-right alignment agree). On CUDA it
  picks torch's own fused kernels.
- an explicit math path (scores in fp32, or fp64 for fp64 inputs) for everything else: bottom-right
  causal masks, sliding windows, softcap, ALiBi, and the log-sum-exp. It materialises the
  (batch, heads, seqlen_q, seqlen_k) scores, which is fine for a fallback and exact.

Rows that see no key (causal with seqlen_q > seqlen_k, windows) give out 0 and lse +inf, as flash-attn.
ALiBi is flash-attn's kernels' bias, so the LSE matches theirs too: -slope * |i + seqlen_k - seqlen_q - j|,
except under a purely causal mask (window (-1, 0)), where flash-attn adds slope * j. Over the visible
keys (j <= i + seqlen_k - seqlen_q) the two differ by the row constant slope * (i + seqlen_k - seqlen_q):
the same output, and an LSE larger by that constant than the textbook one.
Varlen calls loop over the sequences.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from .inputs import AttnCall


def attention(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d), lse (b, h, sq) fp32 or None."""
    group = call.heads // call.heads_k
    if group > 1:  # GQA/MQA: query head i reads kv head i // group (repeat_interleave order)
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
    sq, sk = q.shape[1], k.shape[1]
    plain = (
        not want_lse
        and call.softcap == 0
        and call.alibi_slopes is None
        and not call.has_window
        and (not call.causal or sq == sk)
        and q.numel() > 0
        and k.numel() > 0
    )
    if plain:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=call.dropout_p,
            is_causal=call.causal,
            scale=call.softmax_scale,
        )
        return out.transpose(1, 2), None
    return _math(call, q, k, v, want_lse)


def _allowed(call: AttnCall, sq: int, sk: int, device: torch.device) -> torch.Tensor | None:
    """(sq, sk) bool mask of visible keys, bottom-right aligned; None when every key is visible."""
    left, right = call.window_left, call.window_right
    if left < 0 and right < 0:
        return None
    rows = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)  # key index on query i's diagonal
    cols = torch.arange(sk, device=device).unsqueeze(0)
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= cols >= rows - left
    if right >= 0:
        allowed &= cols <= rows + right
    return allowed


def _math(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads, sq = q.shape[2], q.shape[1]
    sk = k.shape[1]
    qf, kf, vf = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (b, h, s, d)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * call.softmax_scale
    if call.softcap > 0:
        scores = torch.tanh(scores / call.softcap) * call.softcap
    if call.alibi_slopes is not None:
        slopes = call.alibi_slopes.to(compute).reshape(-1, heads, 1, 1)  # (1|b, h, 1, 1)
        rows = torch.arange(sq, device=q.device).unsqueeze(1) + (sk - sq)
        cols = torch.arange(sk, device=q.device).unsqueeze(0)
        if call.causal and call.window_left < 0:  # flash-attn's causal form (module docstring)
            scores = scores + slopes * cols.to(compute)
        else:
            scores = scores - slopes * (rows - cols).abs().to(compute)
    allowed = _allowed(call, sq, sk, q.device)
    if allowed is None:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    visible = allowed.any(dim=-1, keepdim=True)  # (sq, 1): rows with at least one key
    # Masked entries -inf; rows with no visible key get finite zeros so softmax (and its gradient) stay
    # finite, and their probabilities are zeroed below.
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~visible, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
    if call.dropout_p > 0:
        probs = F.dropout(probs, p=call.dropout_p)
    out = torch.matmul(probs, vf).transpose(1, 2).to(q.dtype)
    lse = None
    if want_lse:
        lse = torch.logsumexp(scores, dim=-1).masked_fill(~visible.squeeze(-1), float("inf"))
    return out, lse


def varlen_attention(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Packed q (total_q, h, d), k/v (total_k, hk, d) -> out (total_q, h, d), lse (h, total_q) or None."""
    assert call.varlen is not None
    outs, lses = [], []
    start_q = start_k = 0
    for index, (len_q, len_k) in enumerate(zip(call.varlen.seqlens_q, call.varlen.seqlens_k)):
        seq = call
        if call.alibi_slopes is not None and call.alibi_slopes.dim() == 2:
            seq = replace(call, alibi_slopes=call.alibi_slopes[index])
        out, lse = attention(
            seq,
            q[start_q : start_q + len_q].unsqueeze(0),
            k[start_k : start_k + len_k].unsqueeze(0),
            v[start_k : start_k + len_k].unsqueeze(0),
            want_lse,
        )
        outs.append(out.squeeze(0))
        if lse is not None:
            lses.append(lse.squeeze(0))
        start_q += len_q
        start_k += len_k
    out = torch.cat(outs, dim=0) if outs else q.new_empty(q.shape)
    if not want_lse:
        return out, None
    lse = torch.cat(lses, dim=1) if lses else q.new_empty((q.shape[1], 0), dtype=torch.float32)
    return out, lse
