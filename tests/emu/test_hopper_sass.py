"""kernels/csrc/hopper.cuh through the project's pinned NVRTC (12.9 and 13) for sm_90a: every wrapper
compiles, and the cubin's SASS (bench/kernels/kernel_model.py's pinned nvdisasm) holds the Hopper instructions
it exists for: HGMMA (wgmma), UTMALDG (TMA loads, 2d to 5d), SYNCS (mbarrier), USETMAXREG, ELECT,
UTMACCTL.PF (tensormap prefetch). Plain sm_90 is refused by the header's own #error. Not run on a GPU."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench")]

import kernel_model

from buildtool.builder import toolkits
from buildtool.builder.nvrtc import NvrtcError, open_nvrtc

CSRC = REPO / "kernels" / "csrc"

# One use of every wrapper; WN is the wgmma N under test. The producer warpgroup gives registers back,
# the consumers take them, as the forward kernel does.
PROBE = r"""
#include "hopper.cuh"
using namespace fa::sm90;
using fa::u32;
using fa::u64;
extern "C" __global__ void __launch_bounds__(384)
probe(const __grid_constant__ CUtensorMap map, float* out, int n) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = smem_addr(smem);
  const u32 bar = base + 65536;
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < 32 && elect_one()) {
      prefetch_tensormap(&map);
      mbar_arrive_expect_tx(bar, 16384);
      tma_load_2d(base, &map, bar, 0, n);
      tma_load_3d(base, &map, bar, 0, n, 1);
      tma_load_4d(base, &map, bar, 0, n, 1, 2);
      tma_load_5d(base, &map, bar, 0, n, 1, 2, 3);
      mbar_expect_tx(bar, 16);
    }
  } else {
    setmaxnreg_inc<232>();
    mbar_wait(bar, 0);
    float d[WN / 2];
    for (int i = 0; i < WN / 2; ++i) d[i] = 0.f;
    u32 a[4] = {1u, 2u, 3u, static_cast<u32>(n)};
    fence_acc(d);
    wgmma_fence();
    const u64 da = make_desc(base, 16, 1024, kSwizzle128B);
    const u64 db = make_desc(base + 16384, 16, 1024, kSwizzle64B);
    Wgmma<WN>::template ss<0, 0>(d, da, db, 0);
    Wgmma<WN>::template ss<0, 1>(d, desc_advance(da, 32), desc_advance(db, 32), 1);
    Wgmma<WN>::template rs<1>(d, a, db, 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(d);
    named_sync(1, 256);
    mbar_arrive(bar);
    fence_async_shared();
    for (int i = 0; i < WN / 2; ++i) out[threadIdx.x * (WN / 2) + i] = d[i];
  }
}
"""


def _headers() -> dict[str, str]:
    return {p.name: p.read_text() for p in CSRC.iterdir() if p.suffix in (".h", ".cuh")}


def _opcodes(sass: str) -> Counter[str]:
    """Opcode counts of nvdisasm's listing (predicates dropped, modifiers kept)."""
    ops: Counter[str] = Counter()
    for line in sass.splitlines():
        parts = line.split("*/", 1)
        if len(parts) < 2 or not parts[0].strip().startswith("/*"):
            continue
        words = parts[1].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            ops[words[0].rstrip(";")] += 1
    return ops


def _sass(cuda: int, n: int, bf16: int, tmp: Path) -> Counter[str]:
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(cuda)))
    opts = ["-std=c++17", f"-DWN={n}", f"-DFA_DTYPE_BF16={bf16}", "-Xptxas=-v"]
    out = nvrtc.compile(PROBE, "probe.cu", "sm_90a", opts, _headers())
    assert "0 bytes spill stores, 0 bytes spill loads" in out.log, out.log
    cubin = tmp / f"probe-{cuda}-{n}-{bf16}.cubin"
    cubin.write_bytes(out.image)
    done = subprocess.run(
        [str(kernel_model.nvdisasm()), "-c", str(cubin)], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return _opcodes(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("cuda", [12, 13])
@pytest.mark.parametrize(("n", "bf16"), [(8, 0), (64, 1), (176, 0), (256, 1)])
def test_hopper_wrappers_compile_to_hopper_sass(cuda: int, n: int, bf16: int, tmp_path: Path) -> None:
    ops = _sass(cuda, n, bf16, tmp_path)
    assert ops[f"HGMMA.64x{n}x16.F32{'.BF16' if bf16 else ''}"] == 3, ops
    for dims in (2, 3, 4, 5):
        assert ops[f"UTMALDG.{dims}D"] == 1, ops
    assert ops["SYNCS.PHASECHK.TRANS64.TRYWAIT"] >= 1, ops
    assert sum(c for op, c in ops.items() if op.startswith("SYNCS.ARRIVE")) >= 2, ops
    assert ops["WARPGROUP.DEPBAR.LE"] >= 1, ops  # the wait_group (ptxas may add its own)
    assert ops["ELECT"] == 1, ops
    assert ops["UTMACCTL.PF"] == 1, ops


@pytest.mark.slow
def test_register_reallocation_reaches_the_sass(tmp_path: Path) -> None:
    # ptxas drops setmaxnreg where the kernel's allocation is already at or under it: at N = 256 the
    # consumers need more than the launch bound's even share (65536 / 384 = 170), so both stay.
    ops = _sass(12, 256, 0, tmp_path)
    assert ops["USETMAXREG.TRY_ALLOC.CTAPOOL"] == 1, ops
    assert ops["USETMAXREG.DEALLOC.CTAPOOL"] == 1, ops


@pytest.mark.slow
def test_plain_sm90_is_refused_by_name() -> None:
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(12)))
    with pytest.raises(NvrtcError) as err:
        nvrtc.compile(PROBE, "probe.cu", "sm_90", ["-std=c++17", "-DWN=64"], _headers())
    assert "hopper.cuh needs sm_90a" in str(err.value.args) + str(getattr(err.value, "log", ""))


def test_the_emulator_routes_every_asm_of_hopper_cuh() -> None:
    """The emulator's copy of hopper.cuh has each asm statement, the ones inside the wgmma macro too, as
    a call of its PTX interpreter, and the accumulator operand macro as the interpreter's operand."""
    sys.path.insert(0, str(REPO / "tests" / "emu"))
    import emu_harness as H

    source = (CSRC / "hopper.cuh").read_text()
    built = (H.emulator_sources() / "hopper.cuh").read_text()
    statements = source.count("asm(") + source.count("asm volatile(")
    assert statements >= 25
    assert built.count("::emu::ptx(") == statements
    assert H._ASM.search(built) is None
    assert "#define FA_SM90_ACC_OUT(x) ::emu::out_op('+', 'f', x)" in built
