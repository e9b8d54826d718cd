"""An independent attention reference for the runtime tests: written from flash-attn 2.x's definitions
(masks from explicit per-element rules), in fp64, with no code shared with fa_attn.fallback."""

from __future__ import annotations

import math

import torch


def visible(i: int, j: int, sq: int, sk: int, causal: bool, window: tuple[int, int]) -> bool:
    diag = i + sk - sq  # bottom-right alignment
    left, right = window
    if causal:
        right = 0
    if left >= 0 and j < diag - left:
        return False
    return not (right >= 0 and j > diag + right)


def attention_ref(q, k, v, causal=False, window=(-1, -1), scale=None, softcap=0.0, alibi=None):
    """q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d) fp64, lse (b, h, sq) fp64."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, sq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, sq), math.inf, dtype=torch.float64)
    mask = torch.tensor(
        [[visible(i, j, sq, sk, causal, window) for j in range(sk)] for i in range(sq)], dtype=torch.bool
    ).reshape(sq, sk)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            s = q[bi, :, hi].double() @ k[bi, :, kv].double().T * scale
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            if alibi is not None:
                slope = float(alibi[hi] if alibi.dim() == 1 else alibi[bi, hi])
                i = torch.arange(sq).unsqueeze(1) + sk - sq
                s = s - slope * (i - torch.arange(sk).unsqueeze(0)).abs()
            for i in range(sq):
                row = s[i][mask[i]]
                if row.numel() == 0:
                    continue
                lse[bi, hi, i] = torch.logsumexp(row, 0)
                p = torch.exp(row - lse[bi, hi, i])
                out[bi, i, hi] = p @ v[bi, :, kv].double()[mask[i]]
    return out, lse
