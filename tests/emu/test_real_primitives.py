"""The emulator runs the real kernels/csrc/primitives.cuh: its inline PTX is interpreted from the text
NVRTC compiles (tests/emu/emu.h, emu_runtime.cpp), not restated. So a one-token fault in that PTX fails
the emulated kernels: each test here alters a copy of csrc in one place, of one fault class, and shows
the failure, an emulator error naming the instruction or results outside FA2's error rule."""

from __future__ import annotations

from pathlib import Path

import emu_harness as H
import pytest
import torch
from attn_reference import assert_fa2_close, attention_ref
from test_emulator_catches import altered, run

PRIMITIVES = H.CSRC / "primitives.cuh"


def test_the_emulator_compiles_the_real_primitives() -> None:
    """The build folder's primitives.cuh is kernels/csrc's with each asm statement, and only those,
    routed to the interpreter; emu.h no longer stands in for the file."""
    source = PRIMITIVES.read_text()
    built = (H.emulator_sources() / "primitives.cuh").read_text()
    statements = source.count("asm(") + source.count("asm volatile(")
    assert statements >= 20
    assert built.count("::emu::ptx(") == statements
    assert "asm" not in built.replace("::emu::", "")
    rewritten, n = H.rewrite_asm(source, "primitives.cuh")
    assert (n, rewritten) == (statements, built)
    emu_h = H.EMU_H.read_text()
    assert "FA_PRIMITIVES_CUH_" not in emu_h
    for name in ("ldmatrix_x4", "mma_16816", "copy16_async", "pack_float2", "shfl_xor"):
        assert name not in emu_h, f"emu.h restates {name}"


def test_unknown_instruction_is_named(tmp_path: Path) -> None:
    with pytest.raises(H.EmulatorError, match=r"unknown instruction 'ex3\.approx\.ftz\.f32'"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", '"ex2.approx.ftz.f32', '"ex3.approx.ftz.f32')


def test_dropped_trans(tmp_path: Path) -> None:
    """ldmatrix_x4_trans without .trans: V (or K) read untransposed."""
    with pytest.raises(AssertionError, match="max error"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", "m8n8.x4.trans.shared", "m8n8.x4.shared")


def test_x2_for_x4(tmp_path: Path) -> None:
    """ldmatrix_x4 saying .x2: two matrices for four registers, a form the instruction does not have."""
    with pytest.raises(H.EmulatorError, match=r"ldmatrix's destination needs 2 register\(s\), 4 given"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", "m8n8.x4.shared.b16", "m8n8.x2.shared.b16")


def test_cvt_x2_operand_order(tmp_path: Path) -> None:
    """cvt.rn.f16x2.f32 puts its first source in the upper half: hi, lo swapped packs every pair
    backwards (P as the A operand of P V)."""
    old = (
        '#else\n  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));'  # pack(), not pack_half2
    )
    new = '#else\n  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(lo), "f"(hi));'
    with pytest.raises(AssertionError, match="max error"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", old, new)


def test_shfl_membermask(tmp_path: Path) -> None:
    """shfl.sync with half the warp in membermask, executed by the whole warp."""
    with pytest.raises(H.EmulatorError, match=r"membermask 0x0000ffff, which does not hold it"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", "0x1f, 0xffffffff;", "0x1f, 0x0000ffff;")


def test_shfl_clamp(tmp_path: Path) -> None:
    """shfl.sync.bfly clamped at lane 15: lanes 16-31 read their own value, so half the rows' quad
    max and sum are wrong."""
    with pytest.raises(AssertionError, match="max error"):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", "0x1f, 0xffffffff;", "0x0f, 0xffffffff;")


def test_wait_group_count(tmp_path: Path) -> None:
    """copy_wait<N> waiting for one group fewer than asked: a tile is read while its copy is in flight."""
    with pytest.raises(
        H.EmulatorError,
        match=r"before the cp\.async of thread \d+ that writes it was waited for|no wait_group retired",
    ):
        run(tmp_path, "8.0", "fwd", "primitives.cuh", '::"n"(N) : "memory"', '::"n"(N + 1) : "memory"')


def test_bf16_mma_read_as_f16(tmp_path: Path) -> None:
    """The bf16 mma saying .f16: the tensor cores read bf16 bits as fp16."""
    csrc = altered(
        tmp_path, "primitives.cuh", "m16n8k16.row.col.f32.bf16.bf16.f32", "m16n8k16.row.col.f32.f16.f16.f32"
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 64, generator=gen).bfloat16() for n in (70, 90, 90))
    fwd = H.Emulated(H.unit_for("8.0", "fwd", "bf16", 64), "8.0", csrc)
    out, _ = H.forward(fwd, H.Call(q, k, v))
    ref, _ = attention_ref(q, k, v, False)
    low, _ = attention_ref(q, k, v, False, upcast=False)
    with pytest.raises(AssertionError, match="max error"):
        assert_fa2_close("out", out, ref, low)


def test_turing_mma_shape_needs_its_arch(tmp_path: Path) -> None:
    """sm75's k8 halves written as one m16n8k16, which Turing does not have."""
    old = """      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b0));"""
    new = """      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    return;"""
    with pytest.raises(H.EmulatorError, match=r"mma\.m16n8k16 needs sm_80 \(this library is sm_75\)"):
        run(tmp_path, "7.5", "fwd", "primitives.cuh", old, new)
