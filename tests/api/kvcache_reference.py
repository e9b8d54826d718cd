"""flash_attn_with_kvcache's semantics in float64, from flash-attn's documentation, one sequence at a time.

Rotary embedding is written with complex numbers (feature pairs as real and imaginary parts), a different
formulation from fa_attn.rotary's.
"""

from __future__ import annotations

import torch
from reference import flash_attn_lse, sequence_attention


def rotate_complex(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
):
    """x (s, h, d) rotated at positions (s,) by angle rows of cos/sin (seqlen_ro, r/2)."""
    half = cos.shape[1]
    if half == 0:
        return x.double()
    x = x.double()
    rot = x[..., : 2 * half]
    if interleaved:
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
    else:
        pairs = torch.stack((rot[..., :half], rot[..., half:]), dim=-1)
    z = torch.view_as_complex(pairs.contiguous())
    angle = torch.complex(cos.double()[positions], sin.double()[positions]).unsqueeze(1)  # (s, 1, half)
    turned = torch.view_as_real(z * angle)
    if interleaved:
        rot = turned.reshape(*rot.shape)
    else:
        rot = torch.cat((turned[..., 0], turned[..., 1]), dim=-1)
    return torch.cat((rot, x[..., 2 * half :]), dim=-1)


def kvcache_reference(
    q, k_cache, v_cache, k=None, v=None, cos=None, sin=None, cache_seqlens=None, batch_idx=None,
    leftpad=None, block_table=None, causal=False, window=(-1, -1), interleaved=True, slopes=None, softcap=0.0,
):  # fmt: skip
    """-> out (b, sq, h, d), lse (b, h, sq) as flash-attn returns it, and each sequence's cache after the
    append, (b, capacity, hk, d) for k and v."""
    batch, sq = q.shape[0], q.shape[1]
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    new = 0 if k is None else k.shape[1]
    lengths = [capacity] * batch if cache_seqlens is None else list(cache_seqlens)
    left, right = window
    local = (0 <= left < capacity) or (0 <= right < capacity)
    per_token = causal or local
    outs, lses, keys_after, values_after = [], [], [], []
    for b in range(batch):
        if paged:
            pages = block_table[b].tolist()
            kc = torch.cat([k_cache[p] for p in pages]).double()
            vc = torch.cat([v_cache[p] for p in pages]).double()
        else:
            row = b if batch_idx is None else int(batch_idx[b])
            kc, vc = k_cache[row].double().clone(), v_cache[row].double().clone()
        qb = q[b].double()
        if new:
            kb = k[b].double()
            positions = torch.arange(new) + lengths[b]
            if cos is not None:
                kb = rotate_complex(kb, cos, sin, positions, interleaved)
                qpos = torch.arange(sq) + lengths[b] if per_token else torch.full((sq,), lengths[b])
                qb = rotate_complex(qb, cos, sin, qpos, interleaved)
            kc[positions] = kb.to(k.dtype).double()  # the cache holds the rotated keys in its own dtype
            vc[positions] = v[b].double()
        end = lengths[b] + new if cache_seqlens is not None else capacity
        start = 0 if leftpad is None else int(leftpad[b])
        per = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
        qb = qb.to(q.dtype).double()  # flash-attn rounds the rotated q to its dtype before the attention
        out, lse, _ = sequence_attention(
            qb, kc[start:end], vc[start:end], causal=causal, window=window, softcap=softcap, slopes=per
        )
        sk = end - start
        outs.append(out)
        lses.append(flash_attn_lse(lse, per, causal and not (0 <= left < capacity), sq, sk))
        keys_after.append(kc)
        values_after.append(vc)
    return torch.stack(outs), torch.stack(lses), torch.stack(keys_after), torch.stack(values_after)
