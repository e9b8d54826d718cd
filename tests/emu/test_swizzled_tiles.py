"""The forward's swizzled shared-memory tiles (kernels/csrc/tiles.cuh), counted on the emulator.

The padded rows they replace left the row-wise copies of the widths that are not a multiple of 64
elements 1.14 to 2 times the conflict-free wavefronts (a quarter-warp spanning two rows); swizzled,
every access kind of the forward is conflict-free at every head-dim bucket, the split-KV forward too.
"""

from __future__ import annotations

import emu_harness as H
import pytest
import torch


def _ratios(em: H.Emulated) -> dict[str, float]:
    out = {}
    for entry, kinds in em.banks.items():
        for kind, (n, wavefronts, ideal) in kinds.items():
            if n:
                out[f"{entry} {kind}"] = wavefronts / ideal
    return out


@pytest.mark.parametrize("bucket", [32, 96, 160])
def test_forward_copies_and_fragments_are_conflict_free(bucket: int) -> None:
    em = H.Emulated(H.unit_for("8.0", "fwd", "fp16", bucket), "8.0")
    gen = torch.Generator().manual_seed(bucket)
    q, k, v = (torch.randn(1, 200, 1, bucket, generator=gen).half() for _ in range(3))
    H.forward(em, H.Call(q, k, v))
    ratios = _ratios(em)
    assert {"fa_fwd cp.async", "fa_fwd ldmatrix", "fa_fwd st.shared"} <= set(ratios)
    assert ratios == dict.fromkeys(ratios, 1.0)
