"""flash_attn_with_kvcache cases in every KV-cache layout, and their check against the float64 reference.

Shared by the emulated kernels (tests/api/test_emulated.py: d32 on the CPU emulator) and the GPU
(tests/gpu/test_kvcache_layouts.py: larger caches, on a device). A case is three sequences in one layout (one
long, one short, one about to get its first keys, or for leftpad one that sees only its new keys),
new k/v appended with rotary or not, GQA; `check_kvcache` compares the output, the LSE and the cache
after the append with kvcache_reference.py (float64) under FA2's rule: our error against it at most
twice that of the same math done by PyTorch in the inputs' dtype (`kvcache_twin`).
"""

from __future__ import annotations

import zlib

import torch
from attn_reference import assert_fa2_close, attention_ref
from kvcache_reference import kvcache_reference, rotate_complex
from reference import assert_close

KV_CASES = {
    # name: (layout, page size, seqlen_q, mask, rotary, heads (h, hk), num_splits)
    "ragged-decode-neox": ("ragged", 0, 1, "causal", "neox", (4, 2), 0),
    "ragged-prefill-split2": ("ragged", 0, 3, "local", None, (4, 1), 2),
    "leftpad-decode-interleaved": ("leftpad", 0, 1, "full", "interleaved", (4, 2), 0),
    "batch_idx-few-rows": ("batch_idx", 0, 3, "causal", "interleaved", (2, 2), 1),
    "paged64-decode": ("paged", 64, 1, "causal", "neox", (4, 2), 0),
    "paged128-decode-interleaved": ("paged", 128, 1, "local", "interleaved", (4, 1), 0),
    "paged256-few-rows-split3": ("paged", 256, 3, "causal", None, (4, 2), 3),
    "paged256-full-no-split": ("paged", 256, 2, "full", "neox", (2, 1), 1),
}
MASK_ARGS = {"full": (False, (-1, -1)), "causal": (True, (-1, -1)), "local": (False, (60, 2))}


def kvcache_case(
    name: str,
    head_dim: int = 32,
    capacity: int = 300,
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    heads_scale: int = 1,
) -> dict:
    """flash_attn_with_kvcache's arguments for case `name` (KV_CASES), with `heads_scale` times its heads."""
    layout, page, seqlen_q, mask, rot, (h, hk), splits = KV_CASES[name]
    h, hk = h * heads_scale, hk * heads_scale
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)
    batch, d = 3, head_dim
    lengths = [capacity - 10, capacity // 8, 0 if layout != "leftpad" else 9]
    args: dict = {
        "q": rnd(batch, seqlen_q, h, d),
        "k": rnd(batch, seqlen_q, hk, d),
        "v": rnd(batch, seqlen_q, hk, d),
    }
    if layout == "paged":
        cols = -(-capacity // page) + 1  # a spare column: pages past a sequence's end are not read
        capacity = cols * page
        pages = batch * cols + 1
        args["k_cache"], args["v_cache"] = rnd(pages, page, hk, d), rnd(pages, page, hk, d)
        args["block_table"] = torch.randperm(pages, generator=gen)[: batch * cols].reshape(batch, cols).int()
    else:
        rows = batch + 2 if layout == "batch_idx" else batch
        args["k_cache"], args["v_cache"] = rnd(rows, capacity, hk, d), rnd(rows, capacity, hk, d)
    if layout == "batch_idx":
        args["cache_batch_idx"] = torch.tensor([4, 0, 2], dtype=torch.int32)
    if layout == "leftpad":  # sequence 2 starts at its cache length: it sees only its new keys
        args["cache_leftpad"] = torch.tensor([capacity // 4 - 5, 0, 9], dtype=torch.int32)
    args["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32)
    if rot:
        angle = torch.rand(capacity, d // 4, generator=gen, dtype=torch.float64) * 6.3  # rotary_dim d / 2
        args["rotary_cos"], args["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
        args["rotary_interleaved"] = rot == "interleaved"
    args["causal"], args["window_size"] = MASK_ARGS[mask]
    args["num_splits"] = splits
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def caches_after(args: dict, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """Each sequence's logical cache (b, capacity, hk, d) read back from the mutated cache."""
    if "block_table" in args:
        table = args["block_table"].long()
        flat = lambda c: torch.stack([torch.cat([c[p] for p in row]) for row in table.tolist()])
        return flat(k_cache), flat(v_cache)
    rows = args.get("cache_batch_idx")
    rows = torch.arange(args["q"].shape[0]) if rows is None else rows.long()
    return k_cache[rows], v_cache[rows]


def kvcache_twin(
    args: dict, k_after: torch.Tensor, v_after: torch.Tensor, lengths: list[int]
) -> torch.Tensor:
    """The same call's math done by PyTorch in the inputs' dtype, sequence by sequence: q rotated and
    rounded as flash-attn does, attention over the keys [leftpad, cache_seqlens + new) of each
    sequence's cache after the append."""
    q, new = args["q"], args["k"].shape[1] if "k" in args else 0
    causal, window = args["causal"], args["window_size"]
    per_token = causal or window != (-1, -1)
    outs = []
    for b in range(q.shape[0]):
        qb = q[b]
        if "rotary_cos" in args:
            start = lengths[b]
            pos = torch.arange(q.shape[1]) + start if per_token else torch.full((q.shape[1],), start)
            qb = rotate_complex(qb, args["rotary_cos"], args["rotary_sin"], pos, args["rotary_interleaved"])
            qb = qb.to(q.dtype)
        first = int(args["cache_leftpad"][b]) if "cache_leftpad" in args else 0
        end = lengths[b] + new
        keys, values = k_after[b, first:end].unsqueeze(0), v_after[b, first:end].unsqueeze(0)
        outs.append(attention_ref(qb.unsqueeze(0), keys, values, causal, upcast=False, window=window)[0][0])
    return torch.stack(outs)


def reference_of(args: dict):
    """kvcache_reference (float64, on the CPU) of a case before it runs: out, lse, caches after."""
    a = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    return kvcache_reference(
        a["q"], a["k_cache"].clone(), a["v_cache"].clone(), a["k"], a["v"], a.get("rotary_cos"),
        a.get("rotary_sin"), a["cache_seqlens"].tolist(), a.get("cache_batch_idx"), a.get("cache_leftpad"),
        a.get("block_table"), a["causal"], a["window_size"], a.get("rotary_interleaved", True),
    )  # fmt: skip


def check_kvcache(args: dict, reference, out: torch.Tensor, lse: torch.Tensor) -> None:
    """A case's results (args' caches already mutated by the call) against its reference_of."""
    ref_out, ref_lse, ref_k, ref_v = reference
    a = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    dtype = a["q"].dtype
    k_after, v_after = caches_after(a, a["k_cache"], a["v_cache"])
    assert_close("k_cache", k_after, ref_k, dtype)
    assert torch.equal(v_after, ref_v.to(dtype)), "v_cache: the appended values differ"
    low = kvcache_twin(a, ref_k.to(dtype), ref_v.to(dtype), a["cache_seqlens"].tolist())
    assert_fa2_close("out", out.cpu(), ref_out, low)
    seen = torch.isfinite(ref_lse)
    lse = lse.cpu()
    assert torch.isposinf(lse[~seen]).all(), "rows that see no key: lse +inf"
    torch.testing.assert_close(lse[seen], ref_lse[seen].float(), rtol=1e-3, atol=1e-3)
