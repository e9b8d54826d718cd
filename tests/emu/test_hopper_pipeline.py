"""The producer/consumer pipeline of an sm_90a kernel on the emulator: mbarrier phases, arrival counts and
transaction bytes, cp.async.bulk.tensor decoding the tensor map the emulator's cuTensorMapEncodeTiled made
(box copy, out-of-bounds zero fill, the swizzle pattern in shared memory), setmaxnreg between warpgroups,
elect.sync; checked against the box images computed in Python (tests/emu/hopper_kernels.py), under several
scheduler seeds, and a deliberately broken kernel for each rule: a wrong parity, a missing expect_tx, an
arrival beyond the count, a consumer reading a stage before its phase completes, a register budget the
producer never gives back, a non-uniform setmaxnreg."""

from __future__ import annotations

import ctypes

import emu_harness as H
import hopper_kernels as K
import pytest
import torch

pytestmark = pytest.mark.slow  # one g++ build per box shape

ROWS, COLS = 40, 60  # the tensor: the last tile's rows 40..47 and columns 60..63 lie outside it


def run_pipeline(
    faults: int = 0, seed: int = 1, box_cols: int = 64, swizzle: str = "128B", tiles: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the two consumers read of each stage, and what the TMA should have written there."""
    box_rows = 16
    gen = torch.Generator().manual_seed(5)
    x = torch.zeros(ROWS, 64, dtype=torch.float16)  # rows of 128 bytes, the tensor's 60 columns in front
    x[:, :COLS] = torch.randn(ROWS, COLS, generator=gen).half()
    stage = box_rows * box_cols * 2
    out = torch.zeros(2, tiles, stage, dtype=torch.uint8)
    lib = H.build_source(
        K.PIPELINE_SOURCE, f"pipeline-{box_cols}", "9.0a", {"BOX_ROWS": box_rows, "BOX_COLS": box_cols}
    )
    em = H.EmulatedSource(lib, "9.0a", seed=seed)
    em.register("x", x)
    em.register("out", out)
    raw = torch.zeros(256, dtype=torch.uint8)  # the 128-byte map, 64-byte aligned inside
    at = -raw.data_ptr() % 64
    tmap = (ctypes.c_uint64 * 16).from_address(raw.data_ptr() + at)
    em.encode_tiled(
        tmap,
        K.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        x,
        [COLS, ROWS],
        [x.stride(0) * 2],
        [box_cols, box_rows],
        K.CU_TENSOR_MAP_SWIZZLE[swizzle],
    )
    args = K.PipelineArgs(raw.data_ptr() + at, out.data_ptr(), tiles, faults)
    smem = 2 * stage + 32
    em.launch("pipeline_kernel", (1, 1, 1), 384, smem, ctypes.pointer(args))
    want = torch.stack(
        [K.tma_box_image(x[:, :COLS], t * box_rows, box_rows, box_cols, swizzle) for t in range(tiles)]
    )
    return out, want


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_both_consumers_read_every_box_as_the_tma_lays_it_out(seed: int) -> None:
    out, want = run_pipeline(seed=seed)
    assert torch.equal(out[0], want)
    assert torch.equal(out[1], want)


def test_a_64_byte_box_with_the_64_byte_swizzle() -> None:
    out, want = run_pipeline(box_cols=32, swizzle="64B")
    assert torch.equal(out[0], want)


def test_the_encoder_refuses_what_the_driver_refuses() -> None:
    lib = H.build_source(K.PIPELINE_SOURCE, "pipeline-64", "9.0a", {"BOX_ROWS": 16, "BOX_COLS": 64})
    em = H.EmulatedSource(lib, "9.0a")
    x = torch.zeros(40, 64, dtype=torch.float16)
    raw = torch.zeros(256, dtype=torch.uint8)
    tmap = (ctypes.c_uint64 * 16).from_address(raw.data_ptr() + (-raw.data_ptr() % 64))
    with pytest.raises(H.EmulatorError, match="globalStrides"):
        em.encode_tiled(tmap, K.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x, [60, 40], [120], [64, 16], 3)
    with pytest.raises(H.EmulatorError, match="exceeds the swizzle span"):
        em.encode_tiled(tmap, K.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x, [60, 40], [128], [64, 16], 2)
    with pytest.raises(H.EmulatorError, match="boxDim"):
        em.encode_tiled(tmap, K.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x, [60, 40], [128], [64, 300], 3)


RULES = {
    K.WRONG_PARITY: r"(before thread \d+ waited for that phase to complete \(race\)|which nothing has written)",
    K.NO_EXPECT_TX: r"completes 2048 bytes on the mbarrier at \d+, whose phase \d+ expects only 0: an mbarrier\.expect_tx",
    K.EXTRA_ARRIVE: r"an arrival beyond the count: the mbarrier at \d+ expects 1 arrivals per phase",
    K.NO_CONSUMER_WAIT: r"(before thread \d+ waited for that phase to complete \(race\)|which nothing has written)",
    K.NO_REG_DEC: r"deadlock: .* waits in setmaxnreg\.inc to 240 registers .* no setmaxnreg\.dec gives any back",
    # the count is an immediate, so two counts are two call sites of the .aligned instruction
    K.SPLIT_REG_COUNT: r"threads of warpgroup 2 reach 'setmaxnreg\.inc\.sync\.aligned\.u32 %0' from different call sites",
}


@pytest.mark.parametrize("fault", sorted(RULES))
def test_each_pipeline_rule_catches_its_broken_kernel(fault: int) -> None:
    for seed in (1, 2):
        with pytest.raises(H.EmulatorError, match=RULES[fault]):
            run_pipeline(faults=fault, seed=seed)
