"""The emulator's newer rules (tests/emu/emu.h), each tripped by a deliberately broken kernel or launch
as test_emulator_catches.py does for the older ones: tanh.approx's documented error, the .aligned rule
of the warp-wide instructions, cp.async groups still pending at exit, and the launch limits a cubin
states (launch bounds, registers, static plus dynamic shared memory). The shipped kernels pass all of
them (test_emulated_kernels.py, whose softcap cases run under the tanh error, and the baseline of
test_emulator_catches.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import emu_harness as H
import pytest
import torch
from attn_reference import assert_fa2_close, attention_ref
from test_emulator_catches import altered, run

from buildtool.builder.cubin_fit import KernelNeeds

# bwd.cu recomputes the softcapped scores with tanh.approx, as the forward did. The broken copy
# computes the exact tanh from exp2 instead: with an exact tanh.approx both agree and the gradients
# pass; with the hardware's error the backward's P no longer matches the forward's LSE.
BWD_TANH = "          raw = tanh_approx(raw * kb.tanh_scale);"
BWD_EXACT_TANH = """          {
            const float x2 = fminf(fmaxf(2.f * raw * kb.tanh_scale, -30.f), 30.f);
            const float e = exp2_approx(x2 * 1.4426950408889634f);
            raw = (e - 1.f) / (e + 1.f);
          }"""


def _softcap_gradients(csrc: Path, exact_tanh: bool) -> None:
    """Forward and backward (sm80, fp16, d64) of a softcapped causal call, checked against the
    reference under FA2's rule."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, n, 2, 64, generator=gen).half() for n in (96, 96, 96, 96))
    q = 3 * q
    kw = {"softcap": 30.0, "softmax_scale": 0.3}
    call = H.Call(q, k, v, causal=True, **kw)
    units = [H.unit_for("8.0", d, "fp16", 64) for d in ("fwd", "bwd")]
    if exact_tanh:
        units = [dataclasses.replace(u, defines={**u.defines, "EMU_TANH_EXACT": 1}) for u in units]
    fwd, bwd = (H.Emulated(u, "8.0", csrc) for u in units)
    out, lse = H.forward(fwd, call)
    dq, dk, dv = H.backward(bwd, call, out, lse, dout)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out_ref, _ = attention_ref(qr, kr, vr, True, **kw)
    out_low, _ = attention_ref(qr, kr, vr, True, upcast=False, **kw)
    refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout)
    lows = torch.autograd.grad(out_low, (qr, kr, vr), dout)
    assert_fa2_close("out", out, out_ref, out_low)
    for name, ours, ref, low in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, lows, strict=True):
        assert_fa2_close(name, ours, ref, low)


def test_tanh_error_exposes_a_backward_that_recomputes_tanh_differently(tmp_path: Path) -> None:
    csrc = altered(tmp_path, "bwd.cu", BWD_TANH, BWD_EXACT_TANH)
    _softcap_gradients(csrc, exact_tanh=True)  # what the exact model of tanh.approx let through
    with pytest.raises(AssertionError, match=r"d[qkv]: max error"):
        _softcap_gradients(csrc, exact_tanh=False)


def test_lanes_at_different_call_sites_break_the_aligned_rule(tmp_path: Path) -> None:
    """The combine's max over the warp, its shfl.sync reached from two call sites by the two half-warps
    (same instruction kind, same results: only the .aligned rule sees it)."""
    old = "for (int m = 16; m > 0; m >>= 1) mx = fmax2(mx, shfl_xor(mx, m));"
    new = "for (int m = 16; m > 0; m >>= 1) mx = fmax2(mx, lane < 16 ? shfl_xor(mx, m) : shfl_xor(mx + 0.f, m));"
    with pytest.raises(H.EmulatorError, match=r"different call sites .*\.aligned"):
        run(tmp_path, "8.0", "splitkv", "fwd.cu", old, new)


def test_cp_async_pending_at_exit(tmp_path: Path) -> None:
    """A copy issued into the K/V buffers (which nothing reads in the last barrier interval) after the
    output is stored, and never waited for."""
    old = "  store_output(params, blk, sQ, o, st);\n"
    new = (
        old
        + "  copy16_async(sQ.base + QTile::kBytes + 16 * threadIdx.x, params.q, false);\n  copy_commit();\n"
    )
    with pytest.raises(H.EmulatorError, match=r"exits with cp\.async copies no wait_group retired"):
        run(tmp_path, "8.0", "fwd", "fwd.cu", old, new)


def _call() -> H.Call:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=gen).half() for _ in range(3))
    return H.Call(q, k, v)


def test_static_plus_dynamic_shared_memory_past_the_limit() -> None:
    """A launch asking for all of 99 KiB fits sm86; sm120 has 99 KiB too, but its cubins carry 1 KiB
    of static shared memory beside it."""
    unit = H.unit_for("8.6", "fwd", "fp16", 256)
    entries = {name: dataclasses.replace(e, smem_bytes=99 * 1024) for name, e in unit.entries.items()}
    unit = dataclasses.replace(unit, entries=entries)
    H.forward(H.Emulated(unit, "8.6"), _call())  # sm86: no static shared memory, fits exactly
    with pytest.raises(H.EmulatorError, match=r"102400 B of shared memory \(1024 static \+ 101376 dynamic\)"):
        H.forward(H.Emulated(unit, "12.0"), _call())


def _with_threads(unit, threads: int):
    entries = {name: dataclasses.replace(e, threads=threads) for name, e in unit.entries.items()}
    return dataclasses.replace(unit, entries=entries)


def test_launch_past_the_kernels_launch_bounds() -> None:
    """tiles.py launching 256 threads where the cubin's kernel is bounded to 128."""
    unit = H.unit_for("8.0", "fwd", "fp16", 64)
    bounded = {"fa_fwd": KernelNeeds(0, 0, unit.entries["fa_fwd"].threads)}
    with pytest.raises(H.EmulatorError, match="exceeds the kernel's launch bounds"):
        H.forward(
            H.Emulated(_with_threads(unit, 2 * bounded["fa_fwd"].max_threads), "8.0", needs=bounded), _call()
        )


def test_launch_past_the_register_file() -> None:
    """512 threads of a kernel using 200 registers each: 16 warps x 6400 registers > 65,536."""
    unit = H.unit_for("8.0", "fwd", "fp16", 64)
    heavy = {"fa_fwd": KernelNeeds(0, 200, 0)}
    with pytest.raises(H.EmulatorError, match="512 threads x 200 registers needs 102400 registers"):
        H.forward(H.Emulated(_with_threads(unit, 512), "8.0", needs=heavy), _call())


# ---- the rules of the real-PTX emulator: plain accesses, blocks that run together -------------------------
# The dQ accumulation of the backward (sm80 d64: no vector red before sm90, so the scalar red.add) as a plain `+=`: on a
# GPU the key blocks' read-modify-writes of one dq_accum row interleave and lose updates. Blocks that run
# one after another add correctly, so only the race rule between blocks sees it (2 key blocks: sk = 170,
# block_n = 128).
DQ_RED = "      red_add_f32(dq + dq_index(r, c, group_stride), acc[i][j][e]);"
DQ_PLAIN = "      dq[dq_index(r, c, group_stride)] += acc[i][j][e];"

# The forward's output tile stored at query block 0's rows whatever the block (2 query blocks: sq = 150,
# block_m = 128): both blocks write rows 0..127 of out.
STORE_AT_BLOCK = "store_tile<kThreads>(out + blk.row0 * p.o_row_stride, p.o_row_stride,"
STORE_AT_ZERO = "store_tile<kThreads>(out, p.o_row_stride,"

# bwd.cu's per-row lse and D, plain C++ stores to shared memory read by other warps: the barrier moved
# from after those stores to before them (so the cp.async data of the step is still waited for and
# ordered, and only the plain accesses race).
LSE_LOOP = """    for (int r = tid; r < kBlockM; r += kThreads) {
      const bool in = row0 + r < kb.seqlen_q;
      const float l = in ? kb.lse[row0 + r] : pos_inf();
      s_lse[r] = l == -pos_inf() ? pos_inf() : l * kLog2e;
      s_dsum[r] = in ? kb.dsum[row0 + r] : 0.f;
    }
    __syncthreads();
"""
LSE_LOOP_UNORDERED = "    __syncthreads();\n" + LSE_LOOP.replace("    __syncthreads();\n", "")

SEEDS = (1, 2, 3)

# Each fault: the direction to run, the file, the text and its replacement, what the emulator must say.
RACES = {
    "plain-add-for-dq": (
        "bwd",
        "bwd.cu",
        DQ_RED,
        DQ_PLAIN,
        (
            r"fa_bwd: .*race between blocks of one launch: (reads|writes) a byte block \(\d+, \d+, \d+\) "
            r"(wrote|also wrote|read), at byte \d+ of 'dq_accum'"
        ),
    ),
    "output-at-query-block-0": (
        "fwd",
        "fwd.cu",
        STORE_AT_BLOCK,
        STORE_AT_ZERO,
        (
            r"st\.global\.v4\.u32: race between blocks of one launch: writes a byte block \(\d, 0, [01]\) also "
            r"wrote, at byte \d+ of 'out'"
        ),
    ),
    "plain-shared-race-across-a-missing-barrier": (
        "bwd",
        "bwd.cu",
        LSE_LOOP,
        LSE_LOOP_UNORDERED,
        (
            r"plain C\+\+ (load from|store to) shared memory: .*(written|read) by thread \d+ with no "
            r"__syncthreads between \(race\)"
        ),
    ),
}


@pytest.mark.parametrize("fault", RACES)
def test_race_found_under_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """Each broken kernel fails under each of SEEDS (FA_EMU_SEEDS, read by every Emulated made inside):
    the rules do not depend on the order blocks and warps run in."""
    direction, file, old, new, pattern = RACES[fault]
    for seed in SEEDS:
        monkeypatch.setenv("FA_EMU_SEEDS", f"{seed},")
        with pytest.raises(H.EmulatorError, match=pattern):
            run(tmp_path / str(seed), "8.0", direction, file, old, new)


def test_plain_global_load_out_of_bounds(tmp_path: Path) -> None:
    """The backward reading lse 60 rows past its (batch, head): for the last head, a plain C++ load past
    the end of 'lse' (into its canaries), named as it happens with the buffer and offset, where the
    canaries only see stores."""
    old, new = "kb.lse[row0 + r]", "kb.lse[row0 + r + 60]"
    with pytest.raises(
        H.EmulatorError, match=r"plain C\+\+ load from global memory: .* outside the buffer 'lse'"
    ):
        run(tmp_path, "8.0", "bwd", "bwd.cu", LSE_LOOP, LSE_LOOP.replace(old, new))
