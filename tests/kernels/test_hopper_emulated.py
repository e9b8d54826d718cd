"""The sm_90a forward (kernels/csrc/hopper_fwd.cu) run on the CPU emulator (tests/emu: wgmma, mbarrier, TMA,
setmaxnreg interpreted from hopper.cuh's PTX) against the fp32 reference, with the tensor maps the binding
would encode: kernels/binding/tensor_maps.h compiled by g++ gives cuTensorMapEncodeTiled's arguments, and the
emulator's encoder takes them. The entry is the real fa_fwd_sm90a, called through a thin wrapper that passes
FaParams and the three maps as the launch would. Not a GPU run: it shows the pipeline, the swizzled layouts,
the wgmma operand descriptors, the masks and the softmax are right under the PTX ISA's definitions."""

from __future__ import annotations

import ctypes
import math
import subprocess
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
BINDING = REPO / "kernels" / "binding"
ENTRY = "fa_fwd_sm90a"

# fa_fwd_sm90a as the driver would call it: FaParams and the three maps by value (here through pointers;
# the emulator has no kernel-parameter space). __trap: the emulator's process stops (a misaligned window).
WRAPPER = r"""
#define __trap() __builtin_trap()
#include "hopper_fwd.cu"
struct HkArgs {
  const FaParams* p;
  const fa::sm90::CUtensorMap* q;
  const fa::sm90::CUtensorMap* k;
  const fa::sm90::CUtensorMap* v;
};
extern "C" __global__ void hk_fwd(const void* a) {
  const HkArgs& x = *static_cast<const HkArgs*>(a);
  fa_fwd_sm90a(*x.p, *x.q, *x.k, *x.v);
}
"""

# tensor_maps.h's hopper_maps, for ctypes.
MAPS_SOURCE = r"""
#include "tensor_maps.h"
extern "C" int hk_maps(const FaParams* p, int bf16, long long q_rows, long long q_batches, long long k_rows,
                       long long k_batches, int bucket, int block_m, int block_n, fa_tensor_maps::Encode* out) {
  const fa_tensor_maps::Source src{bf16 != 0, q_rows, q_batches, k_rows, k_batches};
  fa_tensor_maps::Maps m{};
  const fa_tensor_maps::Status s = fa_tensor_maps::hopper_maps(*p, src, bucket, block_m, block_n, &m);
  out[0] = m.q;
  out[1] = m.k;
  out[2] = m.v;
  return static_cast<int>(s);
}
"""


class Encode(ctypes.Structure):
    _fields_ = [
        ("data_type", ctypes.c_int),
        ("rank", ctypes.c_uint),
        ("global_address", ctypes.c_void_p),
        ("global_dim", ctypes.c_uint64 * 4),
        ("global_strides", ctypes.c_uint64 * 3),
        ("box_dim", ctypes.c_uint32 * 4),
        ("element_strides", ctypes.c_uint32 * 4),
        ("interleave", ctypes.c_int),
        ("swizzle", ctypes.c_int),
        ("l2_promotion", ctypes.c_int),
        ("oob_fill", ctypes.c_int),
    ]


def maps_lib(tmp: Path) -> ctypes.CDLL:
    src = tmp / "maps.cpp"
    src.write_text(MAPS_SOURCE)
    out = tmp / "maps.so"
    cc = H.cxx()
    assert cc is not None
    subprocess.run(
        [
            cc,
            "-std=c++17",
            "-shared",
            "-fPIC",
            f"-I{BINDING}",
            f"-I{REPO / 'kernels' / 'csrc'}",
            str(src),
            "-o",
            str(out),
        ],
        check=True,
    )
    lib = ctypes.CDLL(str(out))
    lib.hk_maps.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        *[ctypes.c_longlong] * 4,
        *[ctypes.c_int] * 3,
        ctypes.c_void_p,
    ]
    return lib


class HopperDevice:
    """kernel_launch.Device on the emulator for one sm_90a unit: buffers registered (bounds- and
    race-checked), tensor maps from tensor_maps.h encoded by the emulator, fa_fwd_sm90a over the grid."""

    def __init__(self, unit: tiles.KernelUnit, tmp: Path, seed: int = 1, csrc: Path = H.CSRC) -> None:
        self.unit = unit
        lib = H.build_source(WRAPPER, f"hopper_fwd-{unit.name}", "9.0a", unit.defines, csrc)
        self.em = H.EmulatedSource(lib, "9.0a", seed=seed)
        self.maps = maps_lib(tmp)
        self.keep: list[object] = []
        self.extents: dict[str, tuple[int, int]] = {}

    def place(self, name: str, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        self.em.register(name, t)
        if name in ("q", "k"):  # rows and batches of a padded (b, s, h, d) or packed (t, h, d) tensor
            self.extents[name] = (t.shape[0], 1) if t.dim() == 3 else (t.shape[1], t.shape[0])
        return t

    def output(self, name: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        t = torch.full(shape, math.nan, dtype=dtype)
        self.em.register(name, t)
        return t

    def launch(
        self, entry: str, launch: KL.EntryLaunch, grid: tuple[int, int, int], params: KL.FaParams
    ) -> None:
        assert entry == ENTRY
        enc = (Encode * 3)()
        (qr, qb), (kr, kb) = self.extents["q"], self.extents["k"]
        status = self.maps.hk_maps(
            ctypes.byref(params), self.unit.dtype == "bf16", qr, qb, kr, kb, self.unit.head_dim,
            launch.block_m, launch.block_n, enc,
        )  # fmt: skip
        assert status == 0, f"tensor_maps.h status {status}"
        raw = torch.zeros(3 * 128 + 64, dtype=torch.uint8)
        at = raw.data_ptr() + (-raw.data_ptr() % 64)
        for i, e in enumerate(enc):
            rc = self.em.lib.emu_tensor_map_encode_tiled(
                ctypes.c_void_p(at + 128 * i), e.data_type, e.rank, ctypes.c_void_p(e.global_address),
                e.global_dim, e.global_strides, e.box_dim, e.element_strides, e.interleave, e.swizzle,
                e.l2_promotion, e.oob_fill,
            )  # fmt: skip
            if rc != 0:
                raise H.EmulatorError(self.em.lib.emu_error().decode())
        args = (ctypes.c_void_p * 4)(ctypes.addressof(params), at, at + 128, at + 256)
        self.keep += [raw, params, args]
        try:
            self.em.launch("hk_fwd", grid, launch.threads, launch.smem_bytes, args)
        except H.EmulatorError as e:
            raise H.EmulatorError(f"sm 9.0a {self.unit.name}: {e}") from None


def unit_of(dtype: str, d: int) -> tiles.KernelUnit:
    return next(u for u in tiles.units("9.0a") if u.dtype == dtype and u.head_dim == d)


def run(
    unit: tiles.KernelUnit, c: KL.Call, tmp: Path, seed: int = 1, csrc: Path = H.CSRC
) -> tuple[torch.Tensor, torch.Tensor]:
    dev = HopperDevice(unit, tmp, seed, csrc)
    return KL.forward(dev, KL.UnitLaunch.of(unit), c)


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
def test_d64_fp16_two_query_blocks_three_key_blocks(tmp_path: Path, causal: bool) -> None:
    unit = unit_of("fp16", 64)
    sq, sk = shape_for(unit)
    q, k, v = tensors(1, sq, sk, 2, 2, 64, torch.float16)
    c = KL.Call(q, k, v, causal=causal)
    out, lse = run(unit, c, tmp_path)
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
def test_head_dims_gqa_window_softcap(
    tmp_path: Path, dtype, d, head_dim, heads, causal, window, softcap
) -> None:
    unit = unit_of(dtype, d)
    sq, sk = shape_for(unit)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    q, k, v = tensors(1, sq, sk + 5, heads[0], heads[1], head_dim, tdtype, seed=d)
    c = KL.Call(q, k, v, causal=causal, window=window, softcap=softcap)
    out, lse = run(unit, c, tmp_path)
    check_padded(out, lse, c)


def test_varlen_packed_sequences(tmp_path: Path) -> None:
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
    out, lse = run(unit, c, tmp_path)
    for i in range(3):
        sq_, sk_ = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        qi, ki, vi = q[sq_][None], k[sk_][None], v[sk_][None]
        ref, lse_ref = attention_ref(qi, ki, vi, True)
        low, _ = attention_ref(qi, ki, vi, True, upcast=False)
        assert_fa2_close(f"out[{i}]", out[sq_][None], ref, low)
        check_lse(lse[:, sq_], lse_ref[0], visible_rows(lens_q[i], lens_k[i], True, torch.device("cpu")))


# ---- broken copies the emulator must catch (issue 39's done-when), naming the unit ------------------------

MUTANTS = {
    # the descriptors' swizzle disagrees with the one TMA wrote (64-byte instead of 128-byte at d64)
    "wrong-swizzle": (
        "constexpr sm90::Swizzle kSwizzle = kRowBytes == 128 ? sm90::kSwizzle128B : sm90::kSwizzle64B;",
        "constexpr sm90::Swizzle kSwizzle = kRowBytes == 128 ? sm90::kSwizzle64B : sm90::kSwizzle128B;",
    ),
    # S read (masked, softmaxed) before the wgmma that writes it has retired
    "missing-wait": (
        "      issue_scores(s, blk, sm, wg, n, slot);\n      wgmma_wait<0>();\n",
        "      issue_scores(s, blk, sm, wg, n, slot);\n",
    ),
    # the consumers wait for the other parity of the K/V stages' phases: they read a stage before its TMA
    "wrong-phase": (
        "mbar_wait(sm.k_full(slot.stage), slot.parity);",
        "mbar_wait(sm.k_full(slot.stage), slot.parity ^ 1);",
    ),
    # S = Q K^T accumulates onto the previous contents instead of starting from zero at k step 0
    "stale-accumulator": (
        "k.k_major(0, k0), k0 > 0);",
        "k.k_major(0, k0), 1);",
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_copy_fails_naming_the_unit(tmp_path: Path, mutant: str) -> None:
    old, new = MUTANTS[mutant]
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for p in H.CSRC.iterdir():
        (csrc / p.name).write_text(p.read_text())
    src = csrc / "hopper_fwd.cu"
    assert src.read_text().count(old) == 1, mutant
    src.write_text(src.read_text().replace(old, new))
    unit = unit_of("fp16", 64)
    sq, sk = shape_for(unit)
    q, k, v = tensors(1, sq, sk, 2, 2, 64, torch.float16)
    c = KL.Call(q, k, v)
    with pytest.raises((H.EmulatorError, AssertionError)) as err:
        run_checked(unit, c, tmp_path, csrc)
    assert f"sm 9.0a {unit.name}:" in str(err.value), err.value


def run_checked(unit: tiles.KernelUnit, c: KL.Call, tmp: Path, csrc: Path) -> None:
    """The emulated run and the reference check, either failure naming the unit."""
    out, lse = run(unit, c, tmp, csrc=csrc)
    try:
        check_padded(out, lse, c)
    except AssertionError as e:
        raise AssertionError(f"sm 9.0a {unit.name}: {e}") from None
