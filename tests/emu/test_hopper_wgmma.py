"""wgmma on the emulator, against the PTX ISA's documented layouts (tests/emu/hopper_kernels.py computes
them in Python): hopper.cuh's Wgmma<N>::ss / ::rs over every swizzle mode, K-major and MN-major (the
imm-trans operands) tiles, A from shared memory and from registers, chained k16 steps, fp16 and bf16; and
a deliberately broken kernel for each rule of the asynchronous groups (a missing wgmma.fence, an
accumulator read before its wait_group, no wait at all, shared memory written under a pending wgmma, an
ordinary write between the fence and the wgmma, a partial warpgroup, a wrong swizzle)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import emu_harness as H
import hopper_kernels as K
import pytest
import torch

pytestmark = pytest.mark.slow  # each (N, dtype) is one g++ build of the kernel

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Operand:
    mode: int  # descriptor swizzle mode: 0 none, 1 128B, 2 64B, 3 32B
    mn_major: bool = False

    def layout(self, rows: int, k: int) -> tuple[int, int, int, int]:
        """(lbo, sbo, bytes per k16 step, tile bytes) of a rows x k tile in this layout."""
        if self.mode == 0:  # core matrices: k neighbours 128 B apart, 8-row groups after all of k
            lbo, sbo = 128, 128 * (k // 8)
            return lbo, sbo, 2 * lbo, (rows // 8) * sbo
        width = K.SWIZZLE_WIDTH[self.mode]
        if self.mn_major:  # one W-byte row per k, MN blocks of W / 2 after all k rows
            blocks = -(-rows // (width // 2))
            return k * width, 8 * width, 16 * width, blocks * k * width
        assert 2 * k <= width, "a K-major swizzled tile holds W / 2 elements of k"
        return 16, 8 * width, 32, rows * width  # rows: a multiple of 8


def _values(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small dyadic values: every product and sum is exact in fp32, so the result is compared exactly."""
    gen = torch.Generator().manual_seed(seed)
    choices = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
    return choices[torch.randint(0, len(choices), (rows, cols), generator=gen)].to(dtype)


def run_wgmma(
    n: int,
    dtype: str,
    a_op: Operand | None,
    b_op: Operand,
    ksteps: int,
    faults: int = 0,
    kernel_b_mode: int | None = None,
    threads: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """D (64 x n) as the emulated kernel computes it and as A @ B^T gives it; A from registers if a_op
    is None. kernel_b_mode: the swizzle the kernel's B descriptor claims (default: B's own)."""
    tdt = DTYPES[dtype]
    k = 16 * ksteps
    a = _values(64, k, tdt, 1)
    b = _values(n, k, tdt, 2)  # B as n x k: D = A B^T
    image = bytearray(64 * 1024)
    args = K.WgmmaArgs()
    if a_op is not None:
        lbo_a, sbo_a, step_a, bytes_a = a_op.layout(64, k)
        K.place(image, 0, a, a_op.mode, a_op.mn_major, lbo_a, sbo_a)
        args.desc_a, args.step_a, args.trans_a = (
            K.descriptor(lbo_a, sbo_a, a_op.mode),
            step_a,
            int(a_op.mn_major),
        )
    else:
        bytes_a = 0
        frags = torch.stack([K.a_fragment(a[:, 16 * s : 16 * s + 16]) for s in range(ksteps)])
        args.a_in_regs = 1
    lbo_b, sbo_b, step_b, bytes_b = b_op.layout(n, k)
    off_b = -(-max(bytes_a, 1) // 1024) * 1024
    K.place(image, off_b, b, b_op.mode, b_op.mn_major, lbo_b, sbo_b)
    mode_b = b_op.mode if kernel_b_mode is None else kernel_b_mode
    args.desc_b, args.step_b, args.trans_b = K.descriptor(lbo_b, sbo_b, mode_b), step_b, int(b_op.mn_major)
    size = off_b + bytes_b
    img = torch.frombuffer(bytearray(image[:size]), dtype=torch.uint8).clone()
    out = torch.full((128, n // 2), float("nan"))
    em = H.EmulatedSource(
        H.build_source(
            K.WGMMA_SOURCE, f"wgmma-n{n}-{dtype}", "9.0a", {"WN": n, "FA_DTYPE_BF16": int(dtype == "bf16")}
        ),
        "9.0a",
    )
    em.register("image", img)
    em.register("out", out)
    if args.a_in_regs:
        frags = frags.contiguous()
        em.register("a_frag", frags)
        args.a_frag = frags.data_ptr()
    args.image, args.out = img.data_ptr(), out.data_ptr()
    args.image_bytes, args.off_a, args.off_b, args.ksteps, args.faults = size, 0, off_b, ksteps, faults
    em.launch("wgmma_kernel", (1, 1, 1), threads, size, ctypes.pointer(args))
    want = a.double() @ b.double().T
    return K.gather_d(out, n), want.float()


CASES = {
    "n8-f16-kmajor128": (8, "f16", Operand(1), Operand(1), 4),
    "n64-bf16-kmajor64-b-mnmajor128": (64, "bf16", Operand(2), Operand(1, True), 2),
    "n64-f16-interleaved-b-mnmajor-interleaved": (64, "f16", Operand(0), Operand(0, True), 2),
    "n64-bf16-a-mnmajor128-b-kmajor32": (64, "bf16", Operand(1, True), Operand(3), 1),
    "n256-f16-a-regs-b-kmajor128": (256, "f16", None, Operand(1), 3),
    "n256-f16-a-regs-b-mnmajor64": (256, "f16", None, Operand(2, True), 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wgmma_matches_the_documented_layouts(case: str) -> None:
    got, want = run_wgmma(*CASES[case])
    assert torch.equal(got, want), f"max error {(got - want).abs().max().item()}"


def test_wrong_swizzle_gives_wrong_numbers() -> None:
    """B laid out with the 128-byte swizzle, the kernel's descriptor saying 64: the result is wrong."""
    got, want = run_wgmma(8, "f16", Operand(1), Operand(1), 1, kernel_b_mode=2)
    assert not torch.equal(got, want)


RULES = {
    K.NO_FENCE: r"before any wgmma\.fence of its thread",
    K.READ_EARLY: r"plain C\+\+ load of an accumulator register .* before the wgmma\.wait_group that retires",
    K.NO_WAIT: r"exits with 4 accumulator registers of 'wgmma\.mma_async.* that no wgmma\.wait_group retired",
    K.WRITE_PENDING: r"writes shared byte \d+, which a wgmma no wgmma\.wait_group has retired still reads \(race\)",
    K.WRITE_AFTER_FENCE: r"accumulator register 0 .* written by an ordinary instruction after the last wgmma\.fence",
    K.HALF_WARPGROUP: r"partial warpgroup",
}


@pytest.mark.parametrize("fault", sorted(RULES))
def test_each_async_rule_catches_its_broken_kernel(fault: int) -> None:
    run_wgmma(8, "f16", Operand(1), Operand(1), 2)  # the same kernel without the fault passes
    with pytest.raises(H.EmulatorError, match=RULES[fault]):
        run_wgmma(8, "f16", Operand(1), Operand(1), 2, faults=fault)


def test_a_block_of_96_threads_has_no_whole_warpgroup() -> None:
    with pytest.raises(
        H.EmulatorError, match=r"partial warpgroup: the block's 96 threads leave warpgroup 0 only 96"
    ):
        run_wgmma(8, "f16", Operand(1), Operand(1), 1, threads=96)
