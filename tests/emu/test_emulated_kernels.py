"""fa's forward and backward kernels, run on the CPU emulator, against the fp32 reference.

Every tile configuration that kernels/tiles.py builds for one arch of each family (sm75, sm80, sm86,
sm90) runs here, forward, backward and split-KV forward (partials and combine), with the tile
choices, the sm75 register-staged loads or the sm80+ cp.async pipeline, and the launch steps of the
binding, on random shapes that cross block edges (odd lengths, seqlen_q !=
seqlen_k, GQA, head dims below their bucket). The features (causal, sliding window, softcap, varlen,
strided inputs, rows that see no key) run on one head dim per family. Results must meet FA2's error rule
against the fp32 reference, the same rule as the GPU tests (tests/gpu), and the emulator fails a launch
on any out-of-bounds access, shared-memory race, divergent warp instruction or hang (tests/emu/emu.h).

This is not a GPU run: it shows the kernels' indexing, masking and synchronisation are right under the
PTX ISA's definition of the instructions, not that ptxas or the hardware agree.
"""

from __future__ import annotations

import itertools
import os
import random
import zlib
from dataclasses import dataclass

import emu_harness as H
import pytest
import tiles
import torch
from attn_reference import assert_fa2_close, attention_ref, random_cu_seqlens, visible_rows
from attn_runs import check_lse

ARCHS = {"sm75": "7.5", "sm80": "8.0", "sm86": "8.6", "sm90": "9.0"}
# Families that take another's tables but a few tiles: only the buckets whose tiles differ run (the
# rest are their base family's units, run above).
VARIANTS = {"sm100": ("10.0", "sm90"), "sm120": ("12.0", "sm86"), "sm87": ("8.7", "sm80")}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Config:
    """One family's kernels for one dtype and head-dim bucket."""

    family: str
    dtype: str
    bucket: int
    cuda: int | None = (
        None  # a CUDA major with tiles of its own (tiles.ArchFamily.per_cuda); None: the defaults
    )

    @property
    def arch(self) -> str:
        return ARCHS[self.family] if self.family in ARCHS else VARIANTS[self.family][0]

    @property
    def id(self) -> str:
        return f"{self.family}-{self.dtype}-d{self.bucket}" + (f"-cu{self.cuda}" if self.cuda else "")

    @property
    def runs_split_kv(self) -> bool:
        """sm90's split-KV units are sm80's (same tiles, and the forward uses nothing sm90 adds), so the
        emulator runs them once, on sm80, but a tile of sm90's own (d96); the variants' are their base
        family's, except a tile of their own (sm120's d256)."""
        if self.cuda is not None:  # a major's own tiles: its split-KV only if one of them
            own = tiles.arch_family(self.arch)
            return own is not None and "splitkv" in own.per_cuda.get(self.cuda, {})
        base = (
            VARIANTS[self.family][1] if self.family in VARIANTS else "sm80" if self.family == "sm90" else ""
        )
        if base:
            fam = tiles.arch_family(self.arch)
            return fam is not None and fam.splitkv.get(self.bucket) != tiles.FAMILIES[base].splitkv.get(
                self.bucket
            )
        return self.family in ("sm75", "sm80", "sm86")

    def unit(self, direction: str) -> tiles.KernelUnit | None:
        for u in tiles.units(self.arch, self.cuda):
            if u.direction == direction and u.dtype == self.dtype and u.head_dim == self.bucket:
                return u
        return None


def _configs() -> list[Config]:
    """Every bucket of every family in fp16; bf16 (the same tiles, other conversions) on sm80."""
    out = []
    for family, arch in ARCHS.items():
        fam = tiles.arch_family(arch)
        assert fam is not None
        for dtype in fam.dtypes:
            if dtype == "bf16" and family != "sm80":
                continue
            out.extend(Config(family, dtype, d) for d in tiles.HEAD_DIM_BUCKETS)
    for family, (arch, base) in VARIANTS.items():
        fam, base_fam = tiles.arch_family(arch), tiles.FAMILIES[base]
        assert fam is not None
        assert fam.name == family
        for d in tiles.HEAD_DIM_BUCKETS:
            own = (fam.fwd[d], fam.bwd.get(d), fam.splitkv.get(d))
            if own != (base_fam.fwd[d], base_fam.bwd.get(d), base_fam.splitkv.get(d)):
                out.append(Config(family, "fp16", d))
    # a CUDA major's own tiles (NVRTC 11.8's where it spills on the defaults): those buckets, in fp16
    for family, arch in {**ARCHS, **{f: a for f, (a, _) in VARIANTS.items()}}.items():
        fam = tiles.arch_family(arch)
        assert fam is not None
        for cuda, tables in fam.per_cuda.items():
            out.extend(
                Config(family, "fp16", d, cuda) for d in sorted({d for t in tables.values() for d in t})
            )
    return out


CONFIGS = _configs()
_LIBS: dict[tuple[str, str, str], H.Emulated] = {}


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    """Compile every library this module uses at once, in parallel (about 1.5 s each)."""
    pairs = []
    for cfg in dict.fromkeys(CONFIGS + [c for c, _ in SWEEP]):
        for direction in tiles.DIRECTIONS:
            if direction == "splitkv" and not cfg.runs_split_kv:
                continue
            unit = cfg.unit(direction)
            if unit is not None:
                pairs.append((unit, cfg.arch))
    H.build_all(pairs)


def emulated(cfg: Config, direction: str) -> H.Emulated | None:
    unit = cfg.unit(direction)
    if unit is None:
        return None
    key = (unit.name, unit.tile, cfg.arch)
    if key not in _LIBS:
        _LIBS[key] = H.Emulated(unit, cfg.arch)
    return _LIBS[key]


def _rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def _grads(
    out: torch.Tensor, inputs: tuple[torch.Tensor, ...], dout: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, inputs, dout)


def check_padded(
    cfg: Config,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    num_splits: int = 3,
) -> None:
    """Forward, the split-KV forward with `num_splits` (more than the key blocks is allowed: the empty
    splits must weigh nothing) and the backward where the family builds one, against the fp32
    reference."""
    call = H.Call(q, k, v, causal=causal, window=window, softcap=softcap, softmax_scale=softmax_scale)
    fwd = emulated(cfg, "fwd")
    assert fwd is not None
    out, lse = H.forward(fwd, call)
    outs = [("out", out, lse)]
    split = emulated(cfg, "splitkv") if cfg.runs_split_kv else None
    if split is not None:
        outs.append(("split-KV out", *H.forward_splitkv(split, call, num_splits)))

    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    kw = {"window": window, "softcap": softcap, "softmax_scale": softmax_scale}
    out_ref, lse_ref = attention_ref(qr, kr, vr, causal, **kw)
    out_low, _ = attention_ref(qr, kr, vr, causal, upcast=False, **kw)
    rows = visible_rows(q.shape[1], k.shape[1], causal, q.device, window)
    for name, o, lse_o in outs:
        assert (o[:, ~rows] == 0).all(), f"{name}: rows that see no key must give 0"
        assert torch.isinf(lse_o[..., ~rows]).all(), "their lse must be +inf"
        assert (lse_o[..., ~rows] > 0).all(), "their lse must be +inf"
        assert_fa2_close(name, o, out_ref, out_low)
        check_lse(lse_o, lse_ref, rows)

    bwd = emulated(cfg, "bwd")
    if bwd is None:
        return
    grads = H.backward(bwd, call, out, lse, dout)
    refs = _grads(out_ref, (qr, kr, vr), dout)
    lows = _grads(out_low, (qr, kr, vr), dout)
    for name, ours, ref, low in zip(("dq", "dk", "dv"), grads, refs, lows, strict=True):
        assert_fa2_close(name, ours, ref, low)


def _block_sizes(cfg: Config) -> int:
    """The largest block edge of this config's kernels: shapes up to 2.5 of it cross every edge."""
    sizes = [e.block_m for d in ("fwd", "bwd") if (u := cfg.unit(d)) for e in u.entries.values()]
    sizes += [e.block_n for d in ("fwd", "bwd") if (u := cfg.unit(d)) for e in u.entries.values()]
    return max(sizes)


def random_problem(cfg: Config, head_dim: int | None = None) -> None:
    """A random problem (seeded by the config and head dim): lengths up to 2.5 block edges, GQA."""
    rng = random.Random(zlib.crc32(f"{cfg.id}-{head_dim}".encode()))
    unit = cfg.unit("fwd")
    assert unit is not None
    if head_dim is None:
        head_dim = rng.choice(tiles.head_dims(unit))
    edge = _block_sizes(cfg)
    seqlen_q = rng.randint(1, 5 * edge // 2)
    seqlen_k = rng.choice([seqlen_q, rng.randint(1, 5 * edge // 2)])
    heads_k = rng.choice([1, 2])
    heads = heads_k * rng.choice([1, 2, 4, 8])
    batch = rng.choice([1, 2, 3])
    causal = rng.random() < 0.5
    num_splits = rng.choice([2, 3, 5])
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    dtype = DTYPES[cfg.dtype]
    q = _rand((batch, seqlen_q, heads, head_dim), dtype, gen)
    k = _rand((batch, seqlen_k, heads_k, head_dim), dtype, gen)
    v = _rand((batch, seqlen_k, heads_k, head_dim), dtype, gen)
    dout = _rand((batch, seqlen_q, heads, head_dim), dtype, gen)
    check_padded(cfg, q, k, v, dout, causal, num_splits=num_splits)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.id for c in CONFIGS])
def test_random_shape(cfg: Config) -> None:
    """One random problem per config, its head dim anywhere in the bucket."""
    random_problem(cfg)


@pytest.mark.parametrize("head_dim", [200, 224])
def test_head_dims_above_192_run_the_d256_unit(head_dim: int) -> None:
    """FlashAttention-2's buckets: no d224 unit; 200 (the first above 192) and 224 run d256's kernels."""
    cfg = Config("sm80", "fp16", tiles.bucket_of(head_dim))
    assert cfg.bucket == 256
    random_problem(cfg, head_dim)


# FA_EMU_SWEEP=full: every head dim 8..256 on every family and dtype (about 15 minutes on 2 cores).
FULL = [
    (Config(family, dtype, unit.head_dim), d)
    for family, arch in ARCHS.items()
    for unit in tiles.units(arch)
    if unit.direction == "fwd"
    for dtype in [unit.dtype]
    for d in tiles.head_dims(unit)
]


# Without FA_EMU_SWEEP=full this is one skipped placeholder, not 224 skips.
SWEEP = FULL if os.environ.get("FA_EMU_SWEEP") == "full" else []
_SWEEP_PARAMS = [pytest.param(c, d, id=f"{c.id}-hd{d}") for c, d in SWEEP] or [
    pytest.param(
        None, 0, id="off", marks=pytest.mark.skip(reason="FA_EMU_SWEEP=full runs every head dim 8..256")
    )
]


@pytest.mark.parametrize(("cfg", "head_dim"), _SWEEP_PARAMS)
def test_every_head_dim(cfg: Config, head_dim: int) -> None:
    random_problem(cfg, head_dim)


FEATURE_CONFIGS = [Config(family, "fp16", 64) for family in ARCHS]


def _inputs(
    cfg: Config, b: int, sq: int, sk: int, h: int, hk: int, d: int, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[cfg.dtype]
    return (
        _rand((b, sq, h, d), dtype, gen),
        _rand((b, sk, hk, d), dtype, gen),
        _rand((b, sk, hk, d), dtype, gen),
        _rand((b, sq, h, d), dtype, gen),
    )


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
@pytest.mark.parametrize(
    ("window", "causal"),
    [((37, 5), False), ((20, -1), True), ((-1, 9), False)],
    ids=["both", "left+causal", "right"],
)
def test_sliding_window(cfg: Config, window: tuple[int, int], causal: bool) -> None:
    q, k, v, dout = _inputs(cfg, 1, 150, 190, 2, 1, 64, seed=1)
    check_padded(cfg, q, k, v, dout, causal, window=window)


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
def test_softcap_and_scale(cfg: Config) -> None:
    q, k, v, dout = _inputs(cfg, 1, 97, 97, 2, 2, 56, seed=2)
    check_padded(cfg, 3 * q, k, v, dout, True, softcap=5.0, softmax_scale=0.3)


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
def test_rows_that_see_no_key(cfg: Config) -> None:
    """Causal with seqlen_q > seqlen_k: the first rows see nothing (out 0, lse +inf, no gradient)."""
    q, k, v, dout = _inputs(cfg, 2, 140, 30, 2, 1, 64, seed=3)
    check_padded(cfg, q, k, v, dout, True)


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
def test_single_rows(cfg: Config) -> None:
    q, k, v, dout = _inputs(cfg, 3, 1, 1, 1, 1, 8, seed=4)
    check_padded(cfg, q, k, v, dout, False)
    q, k, v, dout = _inputs(cfg, 1, 1, 200, 4, 1, 64, seed=5)
    check_padded(cfg, q, k, v, dout, True)


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
def test_strided_views(cfg: Config) -> None:
    """q, k, v as views into one packed (batch, seq, 3, heads, dim) tensor: row strides of 3 * heads * dim."""
    gen = torch.Generator().manual_seed(6)
    qkv = _rand((2, 77, 3, 2, 64), DTYPES[cfg.dtype], gen)
    q, k, v = qkv.unbind(2)
    dout = _rand((2, 77, 2, 64), DTYPES[cfg.dtype], gen)
    assert q.stride(1) == 3 * 2 * 64
    check_padded(cfg, q, k, v, dout, False)


@pytest.mark.parametrize("cfg", FEATURE_CONFIGS, ids=[c.id for c in FEATURE_CONFIGS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(cfg: Config, causal: bool) -> None:
    """Packed sequences of random lengths (one empty) against the reference run sequence by sequence."""
    rng = random.Random(7)
    cu_q = random_cu_seqlens(3, 150, rng)
    cu_k = random_cu_seqlens(3, 180, rng)
    cu_q.insert(2, cu_q[1])  # an empty sequence in the middle (both q and k)
    cu_k.insert(2, cu_k[1])
    gen = torch.Generator().manual_seed(8)
    dtype = DTYPES[cfg.dtype]
    heads, heads_k, d = 4, 2, 48
    q = _rand((cu_q[-1], heads, d), dtype, gen)
    k = _rand((cu_k[-1], heads_k, d), dtype, gen)
    v = _rand((cu_k[-1], heads_k, d), dtype, gen)
    dout = _rand((cu_q[-1], heads, d), dtype, gen)
    lens_q = [b - a for a, b in itertools.pairwise(cu_q)]
    lens_k = [b - a for a, b in itertools.pairwise(cu_k)]
    call = H.Call(
        q,
        k,
        v,
        causal=causal,
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32),
        max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k),
    )
    fwd, bwd = emulated(cfg, "fwd"), emulated(cfg, "bwd")
    split = emulated(cfg, "splitkv" if cfg.runs_split_kv else "fwd")
    assert fwd is not None
    assert bwd is not None
    assert split is not None
    out, lse = H.forward(fwd, call)
    split_out, split_lse = H.forward_splitkv(split, call, 4) if cfg.runs_split_kv else (out, lse)
    dq, dk, dv = H.backward(bwd, call, out, lse, dout)

    names = ("out", "dq", "dk", "dv")
    refs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    lows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for i in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if sq.start == sq.stop:
            continue
        qi, ki, vi = (t.unsqueeze(0).clone().requires_grad_() for t in (q[sq], k[sk], v[sk]))
        o_ref, lse_ref = attention_ref(qi, ki, vi, causal)
        o_low, _ = attention_ref(qi, ki, vi, causal, upcast=False)
        g_ref = _grads(o_ref, (qi, ki, vi), dout[sq].unsqueeze(0))
        g_low = _grads(o_low, (qi, ki, vi), dout[sq].unsqueeze(0))
        for name, r, lo in zip(names, (o_ref, *g_ref), (o_low, *g_low), strict=True):
            refs[name].append(r[0])
            lows[name].append(lo[0])
        rows = visible_rows(sq.stop - sq.start, sk.stop - sk.start, causal, q.device)
        check_lse(lse[:, sq], lse_ref[0], rows)
        check_lse(split_lse[:, sq], lse_ref[0], rows)
    for name, ours in zip(names, (out, dq, dk, dv), strict=True):
        assert_fa2_close(name, ours, torch.cat(refs[name]), torch.cat(lows[name]))
    assert_fa2_close("split-KV out", split_out, torch.cat(refs["out"]), torch.cat(lows["out"]))


DECODE_CONFIGS = [c for c in FEATURE_CONFIGS if c.family in ("sm75", "sm80")]  # sm86/sm90: sm80's tile at d64


@pytest.mark.parametrize("cfg", DECODE_CONFIGS, ids=[c.id for c in DECODE_CONFIGS])
@pytest.mark.parametrize("num_splits", [1, 5, 40], ids=["one", "five", "more-than-key-blocks"])
def test_decode_split_kv(cfg: Config, num_splits: int) -> None:
    """Decode's shape: one query row per sequence against a long GQA cache, split many ways (40 leaves
    some splits without a key block; their partials must weigh nothing)."""
    q, k, v, _ = _inputs(cfg, 2, 1, 600, 4, 2, 64, seed=9)
    split = emulated(cfg, "splitkv")
    assert split is not None
    for causal in (False, True):
        out, lse = H.forward_splitkv(split, H.Call(q, k, v, causal=causal), num_splits)
        ref, lse_ref = attention_ref(q, k, v, causal)
        low, _ = attention_ref(q, k, v, causal, upcast=False)
        assert_fa2_close("split-KV out", out, ref, low)
        check_lse(lse, lse_ref, visible_rows(1, 600, causal, q.device))
