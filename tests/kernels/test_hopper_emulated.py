"""The sm_90a forward (kernels/csrc/hopper_fwd.cu) run on the CPU emulator (tests/emu: wgmma, mbarrier, TMA,
setmaxnreg interpreted from hopper.cuh's PTX) against the fp32 reference, with the tensor maps the binding
would encode: kernels/binding/tensor_maps.h compiled by g++ gives cuTensorMapEncodeTiled's arguments, and the
emulator's encoder takes them. The entry is the real fa_fwd_sm90a, launched by emu_harness.Emulated with
FaParams and the three maps as the binding does (the path `fa check --emulate --arch 9.0a` takes; its broken
copies are in the mutant gate, tests/mutants). Not a GPU run: it shows the pipeline, the swizzled layouts,
the wgmma operand descriptors, the masks and the softmax are right under the PTX ISA's definitions."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests" / "emu"), str(REPO / "tests" / "gpu")]

import emu_harness as H
import kernel_launch as KL
from attn_reference import assert_fa2_close, attention_ref, visible_rows
from attn_runs import check_lse

from buildtool.core import kernels_src

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(H.cxx() is None, reason="the kernel emulator needs a host C++ compiler (g++)"),
]

tiles = kernels_src.tiles()


def unit_of(dtype: str, d: int) -> tiles.KernelUnit:
    return next(u for u in tiles.units("9.0a") if u.dtype == dtype and u.head_dim == d)


def run(
    unit: tiles.KernelUnit, c: KL.Call, seed: int = 1, csrc: Path = H.CSRC
) -> tuple[torch.Tensor, torch.Tensor]:
    """fa_fwd_sm90a as `fa check --emulate` launches it (emu_harness.Emulated: FaParams and the Q, K, V maps)."""
    return H.forward(H.Emulated(unit, "9.0a", csrc, seeds=(seed,)), c)


def check_padded(out: torch.Tensor, lse: torch.Tensor, c: KL.Call) -> None:
    kw = {"window": c.window, "softcap": c.softcap}
    ref, lse_ref = attention_ref(c.q, c.k, c.v, c.causal, **kw)
    low, _ = attention_ref(c.q, c.k, c.v, c.causal, upcast=False, **kw)
    rows = visible_rows(c.q.shape[1], c.k.shape[1], c.causal, torch.device("cpu"), c.window)
    assert_fa2_close("out", out, ref, low)
    check_lse(lse, lse_ref, rows)


def tensors(b: int, sq: int, sk: int, h: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hk, d, generator=gen).to(dtype)
    return q, k, v


# Two query blocks (the second partial) and three key blocks (the last partial) at the unit's tile.
def shape_for(unit: tiles.KernelUnit) -> tuple[int, int]:
    bm, bn = unit.defines["FA_BLOCK_M"], unit.defines["FA_BLOCK_N"]
    return bm + 17, 2 * bn + 9


@pytest.mark.parametrize("causal", [False, True])
def test_d64_fp16_two_query_blocks_three_key_blocks(causal: bool) -> None:
    unit = unit_of("fp16", 64)
    sq, sk = shape_for(unit)
    q, k, v = tensors(1, sq, sk, 2, 2, 64, torch.float16)
    c = KL.Call(q, k, v, causal=causal)
    out, lse = run(unit, c)
    check_padded(out, lse, c)


# One head dim per swizzle / consumer layout: d96 (64-byte swizzle, three consumers), d128 bf16 (two),
# d256 (two, the largest accumulators); GQA, a head dim below its bucket, softcap and a window on the way.
@pytest.mark.parametrize(
    ("dtype", "d", "head_dim", "heads", "causal", "window", "softcap"),
    [
        ("fp16", 96, 88, (4, 2), False, (-1, -1), 0.0),
        ("bf16", 128, 128, (3, 1), True, (-1, -1), 0.0),
        ("bf16", 128, 120, (2, 2), False, (40, 7), 0.0),
        ("fp16", 256, 256, (2, 1), False, (-1, -1), 5.0),
    ],
)
def test_head_dims_gqa_window_softcap(dtype, d, head_dim, heads, causal, window, softcap) -> None:
    unit = unit_of(dtype, d)
    sq, sk = shape_for(unit)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    q, k, v = tensors(1, sq, sk + 5, heads[0], heads[1], head_dim, tdtype, seed=d)
    c = KL.Call(q, k, v, causal=causal, window=window, softcap=softcap)
    out, lse = run(unit, c)
    check_padded(out, lse, c)


def test_varlen_packed_sequences() -> None:
    """Three packed sequences (one shorter than a query block, one crossing two, one with more keys than
    queries): each reads only its own rows, although the TMA boxes run into the next sequence's."""
    unit = unit_of("bf16", 128)
    lens_q, lens_k = [37, 150, 5], [60, 99, 170]
    gen = torch.Generator().manual_seed(3)
    h, hk, d = 2, 1, 128
    q = torch.randn(sum(lens_q), h, d, generator=gen).bfloat16()
    k = torch.randn(sum(lens_k), hk, d, generator=gen).bfloat16()
    v = torch.randn(sum(lens_k), hk, d, generator=gen).bfloat16()
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    c = KL.Call(
        q,
        k,
        v,
        causal=True,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k),
    )
    out, lse = run(unit, c)
    for i in range(3):
        sq_, sk_ = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        qi, ki, vi = q[sq_][None], k[sk_][None], v[sk_][None]
        ref, lse_ref = attention_ref(qi, ki, vi, True)
        low, _ = attention_ref(qi, ki, vi, True, upcast=False)
        assert_fa2_close(f"out[{i}]", out[sq_][None], ref, low)
        check_lse(lse[:, sq_], lse_ref[0], visible_rows(lens_q[i], lens_k[i], True, torch.device("cpu")))


# The paged KV cache: each sequence's keys in pages of one and of two key blocks, placed by a shuffled
# block table over a cache of other random keys (tests/emu/kv_layouts.py: a wrong page reads plausible
# numbers, not zeros), one sequence ending mid-block and one with no key. Decode (one query row) and a
# query block's worth; d64 (three consumers, one GEMM at a time) and d128 (two, the overlapped loop).
@pytest.mark.parametrize(
    ("d", "layout", "seqlen_q", "causal", "window"),
    [
        (64, "paged-1", 1, False, (-1, -1)),
        (64, "paged-2", 70, True, (-1, -1)),
        (128, "paged-1", 40, False, (90, 3)),
        (128, "paged-2", 1, True, (-1, -1)),
    ],
)
def test_paged_kv_through_the_block_table(d, layout, seqlen_q, causal, window) -> None:
    import kv_layouts

    unit = unit_of("fp16", d)
    problem = kv_layouts.build(
        layout, unit.defines["FA_BLOCK_N"], seqlen_q, causal, window, d, seed=d + seqlen_q
    )
    out, lse = run(unit, problem.call)
    kv_layouts.check(problem, out, lse)


def _poison_unread_slots(problem) -> None:
    """NaN in every cache slot no sequence owns (torch.empty memory: flash_attn.modules.mha's cache, a
    serving engine's page pool), in k and v: flash-attn 2 never reads them (its loads zero-fill past a
    sequence's end), so they must not reach the output (0 * NaN in P V)."""
    c = problem.call
    lengths = [k.shape[0] for k in problem.keys]
    owned = torch.zeros(c.k.shape[:2], dtype=torch.bool)
    for b, n in enumerate(lengths):
        if c.block_table is not None:
            page = c.k.shape[1]
            for t in range(n):
                owned[int(c.block_table[b, t // page]), t % page] = True
        else:
            owned[b, :n] = True
    c.k[~owned] = float("nan")
    c.v[~owned] = float("nan")


# The key block that holds a sequence's last key runs past it (one ending mid-block): its V rows past the
# end are the cache's other slots, here NaN. d64 (three consumers) and d128 (two, overlapped); pages of
# one and of two key blocks, and a padded cache with seqused_k.
@pytest.mark.parametrize(("d", "layout"), [(64, "paged-1"), (128, "paged-2"), (128, "ragged")])
def test_cache_slots_past_a_sequence_are_never_read(d: int, layout: str) -> None:
    import kv_layouts

    unit = unit_of("fp16", d)
    problem = kv_layouts.build(layout, unit.defines["FA_BLOCK_N"], 5, True, (-1, -1), d, seed=7 * d)
    _poison_unread_slots(problem)
    out, lse = run(unit, problem.call)
    kv_layouts.check(problem, out, lse)


# The tail's hand-over broken three ways in a copy of kernels/csrc, each caught by the emulator's rules for
# shared memory written by one warpgroup and read by another's wgmma: the producer arrives before it saw the
# TMA land (the consumers read TMA bytes no one they synchronised with waited for), arrives before it
# zeroes (its stores are not released by the arrival the consumers waited for), or omits the proxy fence
# (wgmma reads through the async proxy).
TAIL_WAIT = "  mbar_wait(sm.v_tail(), 0);\n"
TAIL_ARRIVE = "  sm90::fence_async_shared();\n  mbar_arrive(sm.v_full(stage));\n"


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        (((TAIL_WAIT, ""),), "a TMA writes on the mbarrier"),
        (
            ((TAIL_WAIT, TAIL_WAIT + "  mbar_arrive(sm.v_full(stage));\n"), (TAIL_ARRIVE, "")),
            r"another warpgroup\) with no __syncthreads between \(race\); an mbarrier arrival after the write",
        ),
        (((TAIL_ARRIVE, "  mbar_arrive(sm.v_full(stage));\n"),), "no fence.proxy.async"),
    ],
    ids=["arrive-before-the-tma-landed", "zeroes-after-the-arrival", "no-proxy-fence"],
)
def test_a_broken_tail_hand_over_is_caught(
    tmp_path: Path, edits: tuple[tuple[str, str], ...], why: str
) -> None:
    import kv_layouts

    dst = tmp_path / "csrc"
    shutil.copytree(H.CSRC, dst)
    text = (dst / "hopper_fwd.cu").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (dst / "hopper_fwd.cu").write_text(text)
    unit = unit_of("fp16", 64)
    problem = kv_layouts.build("paged-1", unit.defines["FA_BLOCK_N"], 5, False, (-1, -1), 64, seed=3)
    with pytest.raises(H.EmulatorError, match=why):
        run(unit, problem.call, csrc=dst)
