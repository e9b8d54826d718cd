"""Grids whose (batch, head) pairs are folded over y and z (launch.cpp fold_batch_heads; the kernels'
locate_block and has_pair in kernels/csrc/attention.cuh): the limit of 65,535 per dimension is lowered
to 3 here so that 2 x 4 pairs fold into 3 x 3 blocks (one past the last pair) at emulator sizes. Every
entry of the forward, split-KV forward and backward, padded and varlen, must give the same bits as the
unfolded grid, and the unfolded grid must still be (batch, heads)."""

from __future__ import annotations

import random

import emu_harness as H
import kernel_launch
import pytest
import torch
from attn_reference import random_cu_seqlens

ARCH = "8.0"
BATCH, HEADS, HEADS_K = 2, 4, 2


@pytest.fixture(scope="module")
def libs() -> dict[str, H.Emulated]:
    units = {d: H.unit_for(ARCH, d, "fp16", 64) for d in ("fwd", "splitkv", "bwd")}
    H.build_all([(u, ARCH) for u in units.values()])
    return {d: H.Emulated(u, ARCH) for d, u in units.items()}


def _runs(libs: dict[str, H.Emulated], call: H.Call, dout: torch.Tensor) -> list[torch.Tensor]:
    out, lse = H.forward(libs["fwd"], call)
    split_out, split_lse = H.forward_splitkv(libs["splitkv"], call, 2)
    return [out, lse, split_out, split_lse, *H.backward(libs["bwd"], call, out, lse, dout)]


def _grids(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Records every grid launched from here on."""
    seen: list[tuple[int, int, int]] = []
    real = kernel_launch.grid_of

    def recording(*args, **kw):
        grid = real(*args, **kw)
        if grid is not None:
            seen.append(grid)
        return grid

    monkeypatch.setattr(kernel_launch, "grid_of", recording)
    return seen


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
def test_folded_grid_gives_the_unfolded_results(
    libs: dict[str, H.Emulated], monkeypatch: pytest.MonkeyPatch, varlen: bool
) -> None:
    gen = torch.Generator().manual_seed(7)
    sq, sk, d = 40, 50, 64
    if varlen:
        rng = random.Random(7)
        cu_q = torch.tensor(random_cu_seqlens(BATCH, sq, rng), dtype=torch.int32)
        cu_k = torch.tensor(random_cu_seqlens(BATCH, sk, rng), dtype=torch.int32)
        q, dout = (torch.randn(int(cu_q[-1]), HEADS, d, generator=gen).half() for _ in range(2))
        k, v = (torch.randn(int(cu_k[-1]), HEADS_K, d, generator=gen).half() for _ in range(2))
        call = H.Call(
            q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=sk
        )
    else:
        q, dout = (torch.randn(BATCH, sq, HEADS, d, generator=gen).half() for _ in range(2))
        k, v = (torch.randn(BATCH, sk, HEADS_K, d, generator=gen).half() for _ in range(2))
        call = H.Call(q, k, v, causal=True)
    grids = _grids(monkeypatch)
    plain = _runs(libs, call, dout)
    assert grids
    assert all(g[1:] == (BATCH, HEADS) for g in grids)
    grids.clear()
    monkeypatch.setattr(kernel_launch, "GRID_YZ_LIMIT", 3)
    folded = _runs(libs, call, dout)
    assert grids
    assert all(g[1:] == (3, 3) for g in grids)
    names = ["out", "lse", "split out", "split lse", "dq", "dk", "dv"]
    for name, a, b in zip(names, plain, folded, strict=True):
        assert torch.equal(a, b), f"{name} differs on the folded grid"


def test_the_emulator_launches_the_binding_geometry(tmp_path) -> None:
    """The grids come from kernels/binding/geometry.h, which launch.cpp launches with, compiled into the
    emulator: a copy whose query-block count rounds down (150 rows, block_m 128: one block, not two)
    leaves the last partial block's rows of the output unwritten (NaN), and the grid it reports is the
    altered one."""
    binding = tmp_path / "binding"
    binding.mkdir()
    text = (H.BINDING / "geometry.h").read_text()
    old = "(rows + block - 1) / block * splits"
    assert text.count(old) == 1
    (binding / "geometry.h").write_text(text.replace(old, "rows / block * splits"))
    unit = H.unit_for(ARCH, "fwd", "fp16", 64)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, n, 2, 64, generator=gen).half() for n in (150, 90, 90))
    call = H.Call(q, k, v)
    real, altered = H.Emulated(unit, ARCH), H.Emulated(unit, ARCH, binding=binding)
    entry, launch = next(iter(real.launches.entries.items()))
    with real.arena():
        p = kernel_launch.prepare_forward(real, call).params
        assert real.geometry(entry, launch, p, 65535) == (2, 1, 2, launch.threads, launch.smem_bytes)
        assert altered.geometry(entry, launch, p, 65535) == (1, 1, 2, launch.threads, launch.smem_bytes)
    out, _ = H.forward(real, call)
    assert not out.isnan().any()
    out, _ = H.forward(altered, call)
    assert not out[:, :128].isnan().any()
    assert out[:, 128:].isnan().all()
