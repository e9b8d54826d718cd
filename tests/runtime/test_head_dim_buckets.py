"""Head dims 193 to 256 run the d256 units, as FlashAttention-2's do (flash_api.cpp rounds a head dim
above 192 to 256; it has no hdim224 kernels): the packager's manifest, read back from its JSON, lists
no d224 unit and its d256 units serve 200..256, and the decision sends a d224 call (forward, backward,
split-KV) to them on every arch. Nothing here compiles or runs a kernel; not verified on a GPU."""

from __future__ import annotations

import re

import pytest
import tiles
from fa_attn.runtime.decision import Call, Device

from tests.runtime.test_arch_specific import built, modules, route

ARCHS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
MANIFEST = built(sass=("7.5", "8.0", "8.6", "9.0", "10.0", "12.0"))  # a cu12 wheel's SASS


def test_the_buckets_are_flash_attention_2s() -> None:
    assert tiles.HEAD_DIM_BUCKETS == (32, 64, 96, 128, 160, 192, 256)
    assert [tiles.bucket_of(d) for d in (192, 200, 224, 256)] == [192, 256, 256, 256]


def test_the_manifest_has_no_d224_unit_and_d256_serves_200_to_256() -> None:
    assert not [k.file for k in MANIFEST.kernels if "_d224" in k.file]
    d256 = [row for row in MANIFEST.info.coverage if 256 in row.head_dims]
    assert d256
    for row in d256:
        assert row.head_dims == tuple(range(200, 257, 8)), row


@pytest.mark.parametrize("sm", ARCHS)
@pytest.mark.parametrize("head_dim", [200, 224, 256])
def test_a_head_dim_above_192_runs_the_d256_unit(sm: str, head_dim: int) -> None:
    dtypes = ("fp16",) if sm == "7.5" else ("fp16", "bf16")
    for dtype in dtypes:
        for backward in (False, True):
            chosen = route(Device("cuda", sm, None, "580.65.06"), Call(dtype, head_dim, backward), MANIFEST)
            if sm == "7.5" and backward:  # Turing has no backward above 192: a named fallback
                assert chosen.path == "fallback"
                assert [r.code for r in chosen.reasons] == ["backward-unsupported"]
                continue
            assert chosen.path == "sass", (sm, dtype, backward, chosen)
            assert chosen.head_dim == head_dim
            launched = modules(chosen)
            assert launched
            for module in launched:
                assert re.search(rf"/(fwd|bwd|splitkv)_{dtype}_d256[_.]", module), module
            assert chosen.fwd is not None
            assert chosen.fwd.launch[0] == 256  # the bucket the kernel is launched with
