"""flash_attn_with_kvcache against the float64 reference (kvcache_reference.py) on the fallback path.

The case list follows flash-attn's test_flash_attn_kvcache: new keys appended or not, rotary (fraction
of the head dim, interleaved or not), causal / sliding window, ALiBi, GQA/MQA, per-sequence cache
lengths, left padding, cache_batch_idx, a paged cache, and checks the cache is updated in place.
"""

from __future__ import annotations

import itertools

import fa_attn
import pytest
import torch
from kvcache_cases import caches_after
from kvcache_reference import kvcache_reference
from reference import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")


def _cases():
    layouts = ["contiguous", "ragged", "leftpad", "batch_idx", "paged"]
    masks = ["full", "causal", "local"]
    for layout, mask, (new_kv, rotary), heads in itertools.product(
        layouts,
        masks,
        [(False, None), (True, None), (True, "half-interleaved"), (True, "full-neox")],
        ["gqa", "mqa"],
    ):
        yield {"layout": layout, "mask": mask, "new_kv": new_kv, "rotary": rotary, "heads": heads}
    for layout in layouts:
        yield {
            "layout": layout,
            "mask": "causal",
            "new_kv": True,
            "rotary": None,
            "heads": "mha",
            "alibi": True,
        }
        yield {
            "layout": layout,
            "mask": "full",
            "new_kv": True,
            "rotary": "full-neox",
            "heads": "mha",
            "softcap": 3.0,
        }


def _id(case: dict) -> str:
    return "-".join(str(v) for k, v in case.items() if v not in (None, False) and k != "new_kv") + (
        "-append" if case["new_kv"] else ""
    )


def build(case: dict, seqlen_q: int, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    batch, heads, d, capacity, page = 3, 4, 32, 12, 4
    heads_k = {"mha": 4, "gqa": 2, "mqa": 1}[case["heads"]]
    new = seqlen_q if case["new_kv"] else 0
    layout = case["layout"]
    lengths = {"contiguous": [5, 5, 5], "batch_idx": [4, 6, 2]}.get(layout, [6, 2, 0 if new else 1])
    args = {"q": rand(batch, seqlen_q, heads, d)}
    if layout == "paged":
        num_blocks = 11
        args["k_cache"], args["v_cache"] = (
            rand(num_blocks, page, heads_k, d),
            rand(num_blocks, page, heads_k, d),
        )
        table = torch.randperm(num_blocks, generator=gen)[: batch * (capacity // page)].reshape(batch, -1)
        args["block_table"] = table.to(torch.int32)
    else:
        rows = batch + 2 if layout == "batch_idx" else batch
        args["k_cache"], args["v_cache"] = rand(rows, capacity, heads_k, d), rand(rows, capacity, heads_k, d)
    if layout == "batch_idx":
        args["cache_batch_idx"] = torch.tensor([4, 0, 2], dtype=torch.int32)
    if layout == "leftpad":
        args["cache_leftpad"] = torch.tensor([2, 1, 0], dtype=torch.int32)
    if new:
        args["k"], args["v"] = rand(batch, new, heads_k, d), rand(batch, new, heads_k, d)
    args["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32)
    if case["rotary"]:
        rotary_dim = d // 2 if case["rotary"].startswith("half") else d
        angle = torch.rand(capacity, rotary_dim // 2, generator=gen, dtype=torch.float64) * 6.3
        args["rotary_cos"], args["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
        args["rotary_interleaved"] = case["rotary"].endswith("interleaved")
    args["causal"] = case["mask"] == "causal"
    args["window_size"] = (3, 1) if case["mask"] == "local" else (-1, -1)
    if case.get("alibi"):
        args["alibi_slopes"] = torch.rand(batch, heads, generator=gen) * 0.3
    if case.get("softcap"):
        args["softcap"] = case["softcap"]
    return args


def reference_for(args: dict):
    return kvcache_reference(
        args["q"], args["k_cache"], args["v_cache"], args.get("k"), args.get("v"), args.get("rotary_cos"),
        args.get("rotary_sin"), args["cache_seqlens"].tolist(), args.get("cache_batch_idx"),
        args.get("cache_leftpad"), args.get("block_table"), args["causal"], args["window_size"],
        args.get("rotary_interleaved", True), args.get("alibi_slopes"), args.get("softcap", 0.0),
    )  # fmt: skip


@pytest.mark.parametrize("seqlen_q", [1, 3])
@pytest.mark.parametrize("case", list(_cases()), ids=_id)
def test_kvcache_matches_reference(case: dict, seqlen_q: int) -> None:
    args = build(case, seqlen_q)
    ref_out, ref_lse, ref_k, ref_v = reference_for(
        {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    )
    out, lse = fa_attn.flash_attn_with_kvcache(**args, return_softmax_lse=True)
    assert out.shape == args["q"].shape
    assert lse.shape == (3, 4, seqlen_q)
    assert_close("out", out, ref_out, torch.float64)
    assert_close("lse", lse, ref_lse, torch.float64)
    k_after, v_after = caches_after(args, args["k_cache"], args["v_cache"])
    assert_close("k_cache", k_after, ref_k, torch.float64)
    assert torch.equal(v_after, ref_v.to(v_after.dtype)), "v_cache: the appended values differ"


def _poison_unread_rows(args: dict) -> None:
    """NaN into every cache slot flash-attn never reads: before a sequence's left pad, from its
    cache_seqlens + seqlen_new on, and rows no sequence maps to. A cache is torch.empty memory past its
    filled rows (flash_attn.modules.mha allocates it so), so those slots may hold NaN or inf."""
    new = args["k"].shape[1] if "k" in args else 0
    rows = args.get("cache_batch_idx", torch.arange(args["q"].shape[0])).tolist()
    firsts = args.get("cache_leftpad", torch.zeros(len(rows), dtype=torch.int32)).tolist()
    ends = [n + new for n in args["cache_seqlens"].tolist()]
    for cache in (args["k_cache"], args["v_cache"]):
        read = torch.zeros(cache.shape[:2], dtype=torch.bool)
        for row, first, end in zip(rows, firsts, ends, strict=True):
            read[row, first:end] = True
        cache[read.logical_not()] = float("nan")


@pytest.mark.parametrize("layout", ["contiguous", "ragged", "leftpad", "batch_idx"])
@pytest.mark.parametrize("mask", ["full", "causal", "local"])
def test_slots_past_the_keys_are_never_read(layout: str, mask: str) -> None:
    """NaN in the unwritten part of a cache changes nothing (it did: P @ V took 0 * NaN there)."""
    case = {"layout": layout, "mask": mask, "new_kv": True, "rotary": "half-interleaved", "heads": "gqa"}
    args = build(case, 2)
    ref_out, ref_lse, _, _ = reference_for(
        {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    )
    _poison_unread_rows(args)
    out, lse = fa_attn.flash_attn_with_kvcache(**args, return_softmax_lse=True)
    assert_close("out", out, ref_out, torch.float64)
    assert_close("lse", lse, ref_lse, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_kvcache_low_precision(dtype: torch.dtype, layout: str) -> None:
    case = {"layout": layout, "mask": "causal", "new_kv": True, "rotary": "full-neox", "heads": "gqa"}
    args = build(case, 2, dtype=dtype)
    ref_out, ref_lse, ref_k, _ = reference_for(
        {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    )
    out, lse = fa_attn.flash_attn_with_kvcache(**args, return_softmax_lse=True)
    assert out.dtype == dtype
    assert_close("out", out, ref_out, dtype)
    assert_close("lse", lse, ref_lse, torch.float32)
    assert_close("k_cache", caches_after(args, args["k_cache"], args["v_cache"])[0], ref_k, dtype)


def test_whole_cache_without_cache_seqlens() -> None:
    """No cache_seqlens: every sequence attends its whole cache (flash-attn's default)."""
    args = build(
        {"layout": "contiguous", "mask": "causal", "new_kv": False, "rotary": None, "heads": "gqa"}, 2
    )
    del args["cache_seqlens"]
    out = fa_attn.flash_attn_with_kvcache(**args)
    ref_out = kvcache_reference(args["q"], args["k_cache"], args["v_cache"], causal=True)[0]
    assert_close("out", out, ref_out, torch.float64)


@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_num_splits_does_not_change_the_result(num_splits: int) -> None:
    args = build({"layout": "ragged", "mask": "full", "new_kv": False, "rotary": None, "heads": "gqa"}, 1)
    ref = fa_attn.flash_attn_with_kvcache(**args)
    torch.testing.assert_close(
        fa_attn.flash_attn_with_kvcache(**args, num_splits=num_splits), ref, rtol=0, atol=0
    )


def _base():
    return build(
        {"layout": "contiguous", "mask": "full", "new_kv": True, "rotary": "half", "heads": "gqa"}, 2
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"cache_seqlens": None}, r"^cache_seqlens: required with new k/v"),
        ({"v": None}, r"^k, v: pass both"),
        ({"cache_seqlens": torch.tensor([11, 0, 0], dtype=torch.int32)}, r"^cache_seqlens: sequence 0 holds 11 keys \+ 2 new = 13, more than the cache's 12"),
        ({"cache_seqlens": torch.tensor([1, 2, 3])}, r"^cache_seqlens: dtype torch.int64; pass cache_seqlens.to\(torch.int32\)"),
        ({"cache_seqlens": torch.tensor([1, 2], dtype=torch.int32)}, r"^cache_seqlens: expected shape \(3,\)"),
        ({"cache_batch_idx": torch.tensor([0, 1, 7], dtype=torch.int32)}, r"^cache_batch_idx: 7 is outside the cache's 3 rows"),
        ({"cache_leftpad": torch.tensor([9, 0, 0], dtype=torch.int32)}, r"^cache_leftpad: 9 for sequence 0 must be in \[0, cache_seqlens\]"),
        ({"rotary_sin": None}, r"^rotary_cos, rotary_sin: pass both"),
        ({"rotary_cos": torch.zeros(12, 20, dtype=torch.float64), "rotary_sin": torch.zeros(12, 20, dtype=torch.float64)}, r"^rotary_cos: rotary_dim 40 .* larger than head_dim 32"),
        ({"rotary_cos": torch.zeros(5, 8, dtype=torch.float64), "rotary_sin": torch.zeros(5, 8, dtype=torch.float64)}, r"^rotary_cos: 5 positions, fewer than the cache's 12"),
        ({"num_splits": -1}, r"^num_splits: -1 must be >= 0"),
        ({"k_cache": torch.zeros(3, 12, 2, 16, dtype=torch.float64), "v_cache": torch.zeros(3, 12, 2, 16, dtype=torch.float64)}, r"^k_cache: head dim 16 differs"),
        ({"q": torch.zeros(2, 2, 4, 32, dtype=torch.float64)}, r"^k_cache: batch 3 differs from q's 2"),
        ({"block_table": torch.zeros(3, 2, dtype=torch.int32), "cache_batch_idx": torch.zeros(3, dtype=torch.int32)}, r"^cache_batch_idx: not supported with a paged cache"),
    ],
)  # fmt: skip
def test_kvcache_bad_input(change: dict, match: str) -> None:
    args = {**_base(), **change}
    args = {k: v for k, v in args.items() if v is not None or k in ("cache_seqlens",)}
    if change.get("v", 0) is None:
        args.pop("v", None)
    if change.get("rotary_sin", 0) is None:
        args.pop("rotary_sin", None)
    with pytest.raises(ValueError, match=match):
        fa_attn.flash_attn_with_kvcache(**args)


def test_paged_block_table_must_cover_the_keys() -> None:
    args = build({"layout": "paged", "mask": "full", "new_kv": True, "rotary": None, "heads": "gqa"}, 3)
    args["cache_seqlens"] = torch.tensor([10, 0, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 0 holds 10 keys \+ 3 new = 13"):
        fa_attn.flash_attn_with_kvcache(**args)
    args["cache_seqlens"] = torch.tensor([1, 0, 0], dtype=torch.int32)
    args["block_table"] = args["block_table"].clone()
    args["block_table"][1, 0] = 99
    with pytest.raises(ValueError, match=r"^block_table: sequence 1 uses page 99, outside the 11 pages"):
        fa_attn.flash_attn_with_kvcache(**args)
