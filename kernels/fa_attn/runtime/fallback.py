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
Varlen, paged and KV-cache calls pad their sequences with device-side indexing and attend in one
batch, so no length is read on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .inputs import AttnCall


def attention(
    call: AttnCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    want_lse: bool,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d), lse (b, h, sq) fp32 or None; `keep`:
    the dropout mask to apply (dropout_keep), or None for a fresh one."""
    group = call.heads // call.heads_k
    if group > 1:  # GQA/MQA: query head i reads kv head i // group (repeat_interleave order)
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
    sq, sk = q.shape[1], k.shape[1]
    plain = (
        not want_lse
        and keep is None
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
    return _math(call, q, k, v, want_lse, keep=keep)


def _allowed(
    call: AttnCall,
    sq: int,
    sk: int,
    device: torch.device,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """(sq, sk), or (batch, 1, sq, sk) with per-sequence `lengths` (queries, keys), bool mask of visible
    keys, bottom-right aligned per sequence; None when every key is visible."""
    left, right = call.window_left, call.window_right
    if lengths is None and left < 0 and right < 0:
        return None
    rows = torch.arange(sq, device=device).unsqueeze(1)  # (sq, 1)
    cols = torch.arange(sk, device=device).unsqueeze(0)  # (1, sk)
    if lengths is None:
        diagonal = rows + (sk - sq)  # key index on query i's diagonal
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    else:
        len_q, len_k = (n.view(-1, 1, 1, 1) for n in lengths)
        diagonal = rows + (len_k - len_q)  # (batch, 1, sq, 1)
        allowed = (cols < len_k).expand(-1, 1, sq, sk)
    if left >= 0:
        allowed = allowed & (cols >= diagonal - left)
    if right >= 0:
        allowed = allowed & (cols <= diagonal + right)
    return allowed


def _logits(
    call: AttnCall,
    qf: torch.Tensor,
    kf: torch.Tensor,
    lengths: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """qf (b, h, sq, d), kf (b, h, sk, d) in the compute dtype -> the scores with softcap and ALiBi
    (b, h, sq, sk), tanh(raw / softcap) (None without softcap: the backward's chain rule), and the
    visible keys (sq, sk) or (b, 1, sq, sk)."""
    heads, sq, sk = qf.shape[1], qf.shape[2], kf.shape[2]
    compute, device = qf.dtype, qf.device
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * call.softmax_scale
    capped = None
    if call.softcap > 0:
        capped = torch.tanh(scores / call.softcap)
        scores = capped * call.softcap
    if call.alibi_slopes is not None:
        slopes = call.alibi_slopes.to(compute).reshape(-1, heads, 1, 1)  # (1|b, h, 1, 1)
        cols = torch.arange(sk, device=device).unsqueeze(0)
        if call.causal and call.window_left < 0:  # flash-attn's causal form (module docstring)
            scores = scores + slopes * cols.to(compute)
        else:
            rows = torch.arange(sq, device=device).unsqueeze(1)
            shift = sk - sq if lengths is None else (lengths[1] - lengths[0]).view(-1, 1, 1, 1)
            scores = scores - slopes * (rows + shift - cols).abs().to(compute)
    allowed = _allowed(call, sq, sk, device, lengths)
    if allowed is None:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    return scores, capped, allowed


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _softmax(
    call: AttnCall, qf: torch.Tensor, kf: torch.Tensor, lengths: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> the scores (masked entries -inf), the probabilities (masked entries 0) and the rows that see
    at least one key (..., sq, 1)."""
    scores, _, allowed = _logits(call, qf, kf, lengths)
    visible = allowed.any(dim=-1, keepdim=True)
    # Masked entries -inf; rows with no visible key get finite zeros so softmax (and its gradient) stay
    # finite, and their probabilities are zeroed.
    scores = scores.masked_fill(allowed.logical_not(), float("-inf")).masked_fill(visible.logical_not(), 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(allowed.logical_not(), 0.0)
    return scores, probs, visible


def _dropped(probs: torch.Tensor, p: float, keep: torch.Tensor | None) -> torch.Tensor:
    """probs with dropout p: the kept entries scaled by 1 / (1 - p); `keep` (bool, broadcastable to
    probs) is the mask to apply, or None for a fresh one."""
    if p <= 0:
        return probs
    if keep is None:
        return F.dropout(probs, p=p)
    return probs * keep.to(probs.dtype) / (1.0 - p)


def dropout_keep(
    rng_state: torch.Tensor, shape: tuple[int, ...], p: float, device: torch.device
) -> torch.Tensor:
    """fa_attn's dropout mask for an rng_state (int64 (seed, offset); fa_attn writes offset 0): keep is
    torch.rand(shape) >= p drawn from a CPU torch.Generator seeded with seed, in the padded layout
    (batch, heads, seqlen_q, seqlen_k) (varlen: max_seqlen_q/k), moved to `device`. The same state gives
    the same mask, which is how a caller-driven backward replays the forward's dropout."""
    seed = int(rng_state.reshape(-1)[0].item())
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(shape, generator=generator) >= p).to(device)


def attention_probs(
    call: AttnCall, q: torch.Tensor, k: torch.Tensor, lengths: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """softmax(S) (batch, heads, seqlen_q, seqlen_k) in the compute dtype, q (b, sq, h, d), k (b, sk, hk, d)."""
    group = call.heads // call.heads_k
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
    compute = _compute_dtype(q)
    return _softmax(call, q.transpose(1, 2).to(compute), k.transpose(1, 2).to(compute), lengths)[1]


def _math(
    call: AttnCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    want_lse: bool,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The explicit path; `lengths`: per-sequence (queries, keys) of a batch padded to sq and sk; `keep`:
    the dropout mask (dropout_keep), or None for a fresh one."""
    compute = _compute_dtype(q)
    qf, kf, vf = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (b, h, s, d)
    scores, probs, visible = _softmax(call, qf, kf, lengths)
    out = torch.matmul(_dropped(probs, call.dropout_p, keep), vf).transpose(1, 2).to(q.dtype)
    lse = None
    if want_lse:
        lse = torch.logsumexp(scores, dim=-1).masked_fill(visible.squeeze(-1).logical_not(), float("inf"))
    return out, lse


Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# A backward's inputs: dout, q, k, v, out and the softmax LSE, in flash-attn's order.
BackwardInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def backward(call: AttnCall, tensors: BackwardInputs, keep: torch.Tensor | None = None) -> Grads:
    """flash-attn's backward from the caller's out and lse, which need not be this call's own (ring
    attention passes those merged over every key block): P = exp(S - lse), D = rowsum(dout * out),
    dS = P * (dout v^T - D), dq = scale * dS k, dk = scale * dS^T q, dv = P^T dout (softcap's chain rule
    on dS). With dropout (call.dropout_p > 0, `keep` the forward's mask, dropout_keep's layout): Z =
    keep / (1 - p), dv = (P * Z)^T dout and dS = P * ((dout v^T) * Z - D). Padded: dout/q/out
    (b, sq, h, d), k/v (b, sk, hk, d), lse (b, h, sq); varlen (call.varlen): packed rows
    (total, heads, d), lse (h, total_q). -> dq, dk, dv shaped and typed as q, k, v."""
    if call.varlen is not None:
        return _varlen_backward(call, tensors, keep)
    return _backward(call, tensors, keep=keep)


def _backward(
    call: AttnCall,
    tensors: BackwardInputs,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
    keep: torch.Tensor | None = None,
) -> Grads:
    """The padded backward; with `lengths`, queries past a sequence's length add nothing."""
    dout, q, k, v, out, lse = tensors
    if lengths is not None:
        k, v = _within(k, lengths[1]), _within(v, lengths[1])
    group = call.heads // call.heads_k
    compute = _compute_dtype(q)
    qf, kf, vf, dof, of = (t.transpose(1, 2).to(compute) for t in (q, k, v, dout, out))  # (b, h, s, d)
    if group > 1:  # query head i reads kv head i // group; its gradients are summed back below
        kf, vf = (t.repeat_interleave(group, dim=1) for t in (kf, vf))
    scores, capped, allowed = _logits(call, qf, kf, lengths)
    if lengths is not None:  # padded query rows: no gradient flows from them
        rows = torch.arange(scores.shape[2], device=q.device).view(1, 1, -1, 1)
        allowed = allowed & (rows < lengths[0].view(-1, 1, 1, 1))
    # A row that saw no key has lse +inf: exp(-inf) = 0 there, as in flash-attn.
    probs = torch.exp(scores - lse.to(compute).unsqueeze(-1)).masked_fill(allowed.logical_not(), 0.0)
    d_rows = (dof * of).sum(-1, keepdim=True)  # (b, h, sq, 1)
    dprobs = torch.matmul(dof, vf.transpose(-1, -2))
    if call.dropout_p > 0:
        if keep is None:
            raise ValueError("dropout_p > 0: the backward needs the forward's dropout mask (keep)")
        scale = keep.to(compute) / (1.0 - call.dropout_p)
        dprobs = dprobs * scale
        kept_probs = probs * scale
    else:
        kept_probs = probs
    dscores = probs * (dprobs - d_rows)
    if capped is not None:
        dscores = dscores * (1 - capped.square())
    dq = torch.matmul(dscores, kf) * call.softmax_scale
    dk = torch.matmul(dscores.transpose(-1, -2), qf) * call.softmax_scale
    dv = torch.matmul(kept_probs.transpose(-1, -2), dof)
    if group > 1:
        b, _, sk, d = dk.shape
        dk, dv = (t.view(b, call.heads_k, group, sk, d).sum(2) for t in (dk, dv))
    return dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype)


def padded_attention(
    call: AttnCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    want_lse: bool,
    lengths: tuple[torch.Tensor, torch.Tensor],
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (b, sq, h, d), k/v (b, sk, hk, d) where sequence i has its first lengths[0][i] queries and
    lengths[1][i] keys (device tensors: nothing is read on the host) -> out (b, sq, h, d), lse (b, h, sq)."""
    group = call.heads // call.heads_k
    k, v = _within(k, lengths[1]), _within(v, lengths[1])
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
    return _math(call, q, k, v, want_lse, lengths, keep)


def _within(t: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """t (b, s, ...) with the slots at or past count[b] zeroed. Those slots are read from memory flash-attn
    never reads (a KV cache's unfilled rows are torch.empty, a page table's unused pages anything): a
    NaN there would survive masking as 0 * NaN in P @ V and in the backward's dO @ V^T."""
    slots = torch.arange(t.shape[1], device=t.device).view(1, -1, *([1] * (t.dim() - 2)))
    past = slots >= count.view(-1, *([1] * (t.dim() - 1)))
    return t.masked_fill(past, 0)


def rows_of(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t's rows (dim 0, or dims 0 and 1 merged when index has a second dim's flat positions) at `index`,
    shaped index.shape + the rest. index_select rather than t[index]: the same gather, and fake CUDA
    tensors (tests/runtime/test_no_host_reads.py) trace it on any build."""
    return t.index_select(0, index.reshape(-1)).view(*index.shape, *t.shape[1:])


def gather_keys(
    kv: torch.Tensor, first: torch.Tensor, width: int, block_table: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, width, heads_k, dim): slot t of sequence b is row first[b] + t of packed kv
    (total, heads_k, dim), or with block_table that key of a paged kv (pages, page_size, heads_k, dim).
    Slots past a sequence's end read a clamped row (masked later): nothing is checked on the host."""
    slots = first.to(torch.long).unsqueeze(1) + torch.arange(width, device=kv.device)  # (b, width)
    if block_table is None:
        return rows_of(kv, slots.clamp(0, max(kv.shape[0] - 1, 0)))
    page_size = kv.shape[1]
    column = (slots // page_size).clamp(0, max(block_table.shape[1] - 1, 0))
    pages = torch.gather(block_table.to(torch.long), 1, column).clamp(0, max(kv.shape[0] - 1, 0))
    return rows_of(kv.flatten(0, 1), pages * page_size + slots % page_size)


@dataclass(frozen=True)
class _Layout:
    """Where a varlen call's packed rows sit in the padded batch it attends in (device tensors only)."""

    starts_q: torch.Tensor  # (b,) first packed query row of each sequence
    first_k: torch.Tensor  # (b,) first key row (or slot, paged) of each sequence
    lengths: tuple[torch.Tensor, torch.Tensor]  # (b,) queries and keys per sequence
    width_q: int
    width_k: int
    flat: torch.Tensor  # (total_q,) each packed query row's index in the flattened (b * width_q) rows


def _layout(call: AttnCall, total_q: int, device: torch.device) -> _Layout:
    varlen = call.varlen
    assert varlen is not None
    cu_q, cu_k = varlen.cu_seqlens_q.to(torch.long), varlen.cu_seqlens_k.to(torch.long)
    # narrow, not slices: the same ops, and fake CUDA tensors (tests/runtime) trace them on any build
    batch = call.batch
    starts_q, ends_q = cu_q.narrow(0, 0, batch), cu_q.narrow(0, 1, batch)
    starts_k, ends_k = cu_k.narrow(0, 0, batch), cu_k.narrow(0, 1, batch)
    len_q = ends_q - starts_q
    first_k = torch.zeros_like(starts_k) if call.kv.block_table is not None else starts_k
    len_k = ends_k - starts_k if call.kv.seqused_k is None else call.kv.seqused_k.to(torch.long)
    if call.kv.leftpad_k is not None:  # keys start that many rows later (flash-attn's BlockInfo)
        pad = call.kv.leftpad_k.to(torch.long)
        first_k, len_k = first_k + pad, len_k - pad
    width_q, width_k = max(varlen.max_seqlen_q, 1), max(varlen.max_seqlen_k, 1)
    # Back to packed rows: row r belongs to the sequence whose offsets bracket it.
    rows = torch.arange(total_q, device=device)
    seq = torch.searchsorted(ends_q, rows, right=True).clamp(max=batch - 1)
    pos = (rows - starts_q.index_select(0, seq)).clamp(0, width_q - 1)
    return _Layout(starts_q, first_k, (len_q, len_k), width_q, width_k, seq * width_q + pos)


def varlen_attention(
    call: AttnCall,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    want_lse: bool,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Packed q (total_q, h, d), k/v (total_k, hk, d) or pages (call.kv) -> out (total_q, h, d),
    lse (h, total_q) or None. The sequences are padded to max_seqlen_q/k with device-side indexing and
    attended in one batch: no length is read on the host (torch.compile and CUDA graphs need that)."""
    total_q = q.shape[0]
    if call.batch == 0 or total_q == 0:
        lse = q.new_empty((q.shape[1], total_q), dtype=torch.float32) if want_lse else None
        return q.new_zeros(q.shape), lse
    at = _layout(call, total_q, q.device)
    q_pad = gather_keys(q, at.starts_q, at.width_q)
    k_pad = gather_keys(k, at.first_k, at.width_k, call.kv.block_table)
    v_pad = gather_keys(v, at.first_k, at.width_k, call.kv.block_table)
    out, lse = padded_attention(call, q_pad, k_pad, v_pad, want_lse, at.lengths, keep)
    packed = rows_of(out.flatten(0, 1), at.flat)
    return packed, (rows_of(lse.transpose(1, 2).flatten(0, 1), at.flat).t() if lse is not None else None)


def varlen_probs(call: AttnCall, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """attention_probs of packed rows, in the padded layout (batch, heads, max_seqlen_q, max_seqlen_k)."""
    at = _layout(call, q.shape[0], q.device)
    q_pad = gather_keys(q, at.starts_q, at.width_q)
    k_pad = gather_keys(k, at.first_k, at.width_k, call.kv.block_table)
    probs = attention_probs(call, q_pad, k_pad, at.lengths)
    rows = torch.arange(at.width_q, device=q.device).view(1, 1, -1, 1)
    return probs.masked_fill(rows >= at.lengths[0].view(-1, 1, 1, 1), 0.0)  # rows past a sequence's end


def _varlen_backward(call: AttnCall, tensors: BackwardInputs, keep: torch.Tensor | None = None) -> Grads:
    """The backward of packed rows, padded as varlen_attention pads them; keys no sequence reads get zeros."""
    dout, q, k, v, out, lse = tensors
    total_q = q.shape[0]
    if call.batch == 0 or total_q == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    at = _layout(call, total_q, q.device)
    q_pad, dout_pad, out_pad = (gather_keys(t, at.starts_q, at.width_q) for t in (q, dout, out))
    lse_pad = gather_keys(lse.t(), at.starts_q, at.width_q).transpose(1, 2)  # (b, h, width_q)
    k_pad, v_pad = (gather_keys(t, at.first_k, at.width_k) for t in (k, v))
    dq_pad, dk_pad, dv_pad = _backward(
        call, (dout_pad, q_pad, k_pad, v_pad, out_pad, lse_pad), at.lengths, keep
    )
    dq = rows_of(dq_pad.flatten(0, 1), at.flat)
    # Key slots past a sequence's end read a clamped row and got exact zeros: adding them changes nothing.
    slots = at.first_k.unsqueeze(1) + torch.arange(at.width_k, device=k.device)
    slots = slots.clamp(0, max(k.shape[0] - 1, 0)).reshape(-1)
    dk = torch.zeros_like(k).index_add_(0, slots, dk_pad.flatten(0, 1))
    dv = torch.zeros_like(v).index_add_(0, slots, dv_pad.flatten(0, 1))
    return dq, dk, dv


def sinks_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    allowed: torch.Tensor,
    softmax_scale: float,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention with sinks (gpt-oss' s_aux): each head's sink is one extra logit column, the softmax
    runs over [scores, sink] and the sink's column is dropped, so a row's weights sum to less than 1.
    q (b, sq, h, d), k/v (b, sk, hk, d), sinks (h,), allowed: bool visible keys broadcastable to
    (b, h, sq, sk) -> out (b, sq, h, d). Plain autograd: q, k, v and the sinks all get their gradient.
    A row that sees no key puts all its weight on the sink: out 0."""
    heads = q.shape[2]
    group = heads // k.shape[2]
    if group > 1:  # GQA/MQA: query head i reads kv head i // group
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    compute = _compute_dtype(q)
    qf, kf, vf = (t.transpose(1, 2).to(compute) for t in (q, k, v))  # (b, h, s, d)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * softmax_scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(allowed.logical_not(), float("-inf"))
    sink = sinks.to(compute).reshape(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    return torch.matmul(probs, vf).transpose(1, 2).to(q.dtype)
