"""The emulator is worth trusting only if it fails broken kernels: each test here breaks one thing in a
copy of kernels/csrc (a barrier, a wait, a bound, a mask, an operand layout) and expects the emulator, or
the reference comparison behind it, to say so. Each alteration must match the source exactly once, so a
rewrite of the kernels that removes the pattern fails here instead of silently testing nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import emu_harness as H
import kv_layouts
import pytest
import tiles
import torch
from attn_reference import assert_fa2_close, attention_ref


def altered(tmp_path: Path, file: str, old: str, new: str) -> Path:
    """A copy of kernels/csrc with `old` replaced by `new` (exactly one occurrence) in `file`."""
    dst = tmp_path / "csrc"
    shutil.copytree(H.CSRC, dst)
    text = (dst / file).read_text()
    assert text.count(old) == 1, f"{file}: the pattern to alter occurs {text.count(old)} times, not once"
    (dst / file).write_text(text.replace(old, new))
    return dst


def _case(d: int = 64, sq: int = 150, sk: int = 170) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(1, sq, 2, d), (1, sk, 2, d), (1, sk, 2, d), (1, sq, 2, d)]
    return tuple(torch.randn(s, generator=gen).half() for s in shapes)


def run(
    tmp_path: Path,
    arch: str,
    direction: str,
    file: str,
    old: str,
    new: str,
    causal: bool = True,
    sq: int = 150,
) -> None:
    """Forward (and backward for direction "bwd", or the split-KV forward for "splitkv") of the altered
    kernels, checked like the real ones; `sq` query rows."""
    csrc = altered(tmp_path, file, old, new)
    q, k, v, dout = _case(sq=sq)
    call = H.Call(q, k, v, causal=causal)
    ref, _ = attention_ref(q, k, v, causal)
    low, _ = attention_ref(q, k, v, causal, upcast=False)
    if direction == "splitkv":
        split = H.Emulated(H.unit_for(arch, "splitkv", "fp16", 64), arch, csrc)
        out, _ = H.forward_splitkv(split, call, 3)
        assert_fa2_close("out", out, ref, low)
        return
    fwd = H.Emulated(H.unit_for(arch, "fwd", "fp16", 64), arch, csrc)
    out, lse = H.forward(fwd, call)
    assert_fa2_close("out", out, ref, low)
    if direction == "bwd":
        bwd = H.Emulated(H.unit_for(arch, "bwd", "fp16", 64), arch, csrc)
        H.backward(bwd, call, out, lse, dout)


def test_unaltered_sources_pass(tmp_path: Path) -> None:
    """The baseline of every case below: the same calls on the real sources raise nothing."""
    for arch in ("8.0", "7.5"):
        run(tmp_path / arch, arch, "bwd", "fwd.cu", "fa_fwd(", "fa_fwd(")
        run(tmp_path / f"{arch}-split", arch, "splitkv", "fwd.cu", "fa_fwd(", "fa_fwd(")


# fwd.cu's first barrier in the key loop: without it, the next key block's K and V (two stages, sm80's
# d64 default) or this block's V (one stage, sm75's) are fetched over a buffer other warps may still be
# reading, and this block's K is read by warps whose copy of it another thread has not finished.
LOOP_BARRIER = """    copy_wait<0>();
    __syncthreads();
    if (kStages == 2) {"""


@pytest.mark.parametrize("arch", ["8.0", "7.5"])
def test_missing_barrier_is_a_race(tmp_path: Path, arch: str) -> None:
    with pytest.raises(H.EmulatorError, match=r"race|before the cp.async"):
        run(tmp_path, arch, "fwd", "fwd.cu", LOOP_BARRIER, LOOP_BARRIER.replace("__syncthreads();", ""))


def test_split_kv_missing_pipeline_barrier(tmp_path: Path) -> None:
    """The split-KV program shares the key loop: its two-stage pipeline needs the same barrier."""
    with pytest.raises(H.EmulatorError, match=r"race|before the cp.async"):
        run(tmp_path, "8.0", "splitkv", "fwd.cu", LOOP_BARRIER, LOOP_BARRIER.replace("__syncthreads();", ""))


def test_wrong_combine_weight(tmp_path: Path) -> None:
    """Each split weighted by exp(lse_s - max) instead of exp(lse_s - lse): the weights no longer sum to 1."""
    old = "const float w = exp_diff(lse_s[i * s.lse_rows], lse);"
    with pytest.raises(AssertionError, match="out: max error"):
        run(tmp_path, "8.0", "splitkv", "fwd.cu", old, old.replace(", lse)", ", mx)"))


def test_split_ranges_that_skip_a_key_block(tmp_path: Path) -> None:
    old = "blk.keys.end = min(blk.keys.end, (split + 1) * per);"
    with pytest.raises(AssertionError, match="out: max error"):
        run(
            tmp_path,
            "8.0",
            "splitkv",
            "fwd.cu",
            old,
            old.replace("(split + 1) * per", "(split + 1) * per - 1"),
        )


def test_missing_barrier_before_the_dq_atomics(tmp_path: Path) -> None:
    """dS goes to shared memory, where other warps read it for dK and for the dQ atomics (added from
    registers since issue 38): reading it before every warp wrote it races (or, where the writer has
    not run yet, reads what no one has written)."""
    old = """      grad_scores(acc_dp, pd, s_dsum, step_dS, m_base, n_base, lane);
    }
    __syncthreads();"""
    with pytest.raises(H.EmulatorError, match=r"race|nothing has written"):
        run(tmp_path, "8.0", "bwd", "bwd.cu", old, old.replace("__syncthreads();", ""))


def test_missing_cp_async_wait(tmp_path: Path) -> None:
    """sm80: reading K before the wait that lands it."""
    with pytest.raises(H.EmulatorError, match=r"before the cp.async of thread"):
        run(tmp_path, "8.0", "fwd", "fwd.cu", LOOP_BARRIER, LOOP_BARRIER.replace("copy_wait<0>();", ""))


def test_missing_closing_barrier_in_backward(tmp_path: Path) -> None:
    """Without the closing barrier a fast warp's next step prefetches Q/dO into the stage others still
    read for dK, and overwrites lse/D. Three query blocks of 128 rows (sm90 d64's tile), not causal, so
    that one key block sees a prefetch into a stage read one step before."""
    old = "    __syncthreads();  // sP, sdS, lse/D and this stage's Q/dO are free for the next step"
    with pytest.raises(H.EmulatorError, match="race"):
        run(tmp_path, "9.0", "bwd", "bwd.cu", old, "", causal=False, sq=300)


def test_store_past_the_sequence_end(tmp_path: Path) -> None:
    """store_tile without its row bound writes a whole block of rows past the output."""
    old = "    if (row < valid_rows && col < valid_cols) {\n      st_global16"
    with pytest.raises(H.EmulatorError, match=r"outside every buffer|canary"):
        run(tmp_path, "8.0", "fwd", "tiles.cuh", old, old.replace("row < valid_rows && ", ""))


def test_load_without_zero_fill(tmp_path: Path) -> None:
    """Reading rows past the sequence end instead of zero-filling them."""
    old = "const bool ok = row < valid_rows && col < valid_cols;"
    with pytest.raises(H.EmulatorError, match="outside every buffer"):
        run(tmp_path, "7.5", "fwd", "tiles.cuh", old, "const bool ok = col < valid_cols;")


def test_causal_mask_off_by_one(tmp_path: Path) -> None:
    old = "x = (8 * j + e < keys_left) & (rel >= lo) & (rel <= hi) ? x : -pos_inf();"
    with pytest.raises(AssertionError, match="out: max error"):
        run(tmp_path, "8.0", "fwd", "softmax.cuh", old, old.replace("rel <= hi", "rel < hi"))


def test_wrong_operand_layout(tmp_path: Path) -> None:
    """V read untransposed (ldmatrix without .trans): its rows run past the written part of the tile
    (an unwritten read), and where they do not, the product is wrong."""
    old = "SmemB<KVTile, true>{v}"
    with pytest.raises((AssertionError, H.EmulatorError), match=r"out: max error|nothing has written"):
        run(tmp_path, "8.0", "fwd", "fwd.cu", old, "SmemB<KVTile, false>{v}")


def test_divergent_warp_instruction(tmp_path: Path) -> None:
    """A shuffle reached by half a warp only."""
    old = "      mx = quad_max(mx);"
    new = "      if ((threadIdx.x & 31) < 16) mx = quad_max(mx);"
    with pytest.raises(H.EmulatorError, match=r"diverge|exited|deadlock"):
        run(tmp_path, "8.0", "fwd", "softmax.cuh", old, new)


def test_barrier_skipped_by_some_threads(tmp_path: Path) -> None:
    old = "  __syncthreads();\n  u16* out = q_rows("
    new = "  if (warp != 1) __syncthreads();\n  u16* out = q_rows("
    with pytest.raises(H.EmulatorError, match=r"deadlock|exits while|race"):
        run(tmp_path, "8.0", "fwd", "fwd.cu", old, new)


def _ratio(em: H.Emulated, entry: str, kind: str) -> float:
    n, wavefronts, ideal = em.banks[entry][kind]
    assert n > 0, f"no {kind} instruction was counted in {entry}"
    return wavefronts / ideal


def test_bank_conflicts_are_counted(tmp_path: Path) -> None:
    """The swizzled tiles keep ldmatrix and the d64 copies conflict-free; without the swizzle every
    ldmatrix phase reads 8 rows from the same 4 banks, 8 wavefronts instead of 1."""
    q, k, v, _ = _case()
    unit = H.unit_for("8.0", "fwd", "fp16", 64)
    real = H.Emulated(unit, "8.0")
    H.forward(real, H.Call(q, k, v))
    assert _ratio(real, "fa_fwd", "ldmatrix") == 1.0
    assert _ratio(real, "fa_fwd", "cp.async") == 1.0
    assert _ratio(real, "fa_fwd", "st.shared") == 1.0

    csrc = altered(tmp_path, "tiles.cuh", "((col >> 3) ^ swizzle_key(row))", "(col >> 3)")
    plain = H.Emulated(unit, "8.0", csrc)
    H.forward(plain, H.Call(q, k, v))
    assert _ratio(plain, "fa_fwd", "ldmatrix") == 8.0


# ---- the KV-cache layouts' addressing (attention.cuh locate() and KvRows) ------------------------------


def run_layout(arch: str, direction: str, layout: str, csrc: Path = H.CSRC) -> None:
    """One KV-cache layout (kv_layouts.build: two query rows, GQA, a long, a short and an empty
    sequence) on the kernels of `csrc`, checked like the real ones in test_kv_layouts.py."""
    em = H.Emulated(H.unit_for(arch, direction, "fp16", 64), arch, csrc)
    problem = kv_layouts.build(
        layout, kv_layouts.key_block(arch, direction, 64), 2, True, (-1, -1), 64, seed=5
    )
    if direction == "splitkv":
        kv_layouts.check(problem, *H.forward_splitkv(em, problem.call, 2))
    else:
        kv_layouts.check(problem, *H.forward(em, problem.call))


LAYOUT_CASES = [  # (arch, direction, layout) of each case below
    ("8.0", "splitkv", "paged-1"),
    ("7.5", "fwd", "paged-1"),
    ("8.0", "fwd", "paged-3"),
    ("8.0", "splitkv", "ragged"),
    ("8.0", "fwd", "leftpad"),
    ("7.5", "splitkv", "batch_idx"),
]


def test_unaltered_layouts_pass() -> None:
    """The baseline of the cases below: the same calls on the real sources pass."""
    for arch, direction, layout in LAYOUT_CASES:
        run_layout(arch, direction, layout)


PAGE = "return base + pages[key0 / page_size] * page_stride + (key0 % page_size) * row_stride;"


@pytest.mark.parametrize(
    ("arch", "direction"), [("8.0", "splitkv"), ("7.5", "fwd")], ids=["sm80-splitkv", "sm75-fwd"]
)
def test_page_table_off_by_one(tmp_path: Path, arch: str, direction: str) -> None:
    """Each key block read from the next page of the table: real pages (the table has a spare column),
    the wrong keys."""
    new = PAGE.replace("pages[key0 / page_size]", "pages[key0 / page_size + 1]")
    with pytest.raises((AssertionError, H.EmulatorError), match=r"max error|outside every buffer"):
        run_layout(arch, direction, "paged-1", altered(tmp_path, "attention.cuh", PAGE, new))


def test_key_block_at_the_start_of_its_page(tmp_path: Path) -> None:
    """Pages of three key blocks, each block read from the start of its page."""
    new = PAGE.replace(" + (key0 % page_size) * row_stride", "")
    with pytest.raises(AssertionError, match="max error"):
        run_layout("8.0", "fwd", "paged-3", altered(tmp_path, "attention.cuh", PAGE, new))


def test_seqused_k_ignored(tmp_path: Path) -> None:
    """Every sequence taken as long as the cache: the keys past its end are other keys."""
    old = "  if (p.seqused_k != nullptr) end = p.seqused_k[b];\n"
    with pytest.raises(AssertionError, match=r"max error|must give 0"):
        run_layout("8.0", "splitkv", "ragged", altered(tmp_path, "attention.cuh", old, ""))


def test_leftpad_not_skipped(tmp_path: Path) -> None:
    """The first key counted but its row not moved: every sequence reads the rows before its keys."""
    with pytest.raises(AssertionError, match="max error"):
        run_layout("8.0", "fwd", "leftpad", altered(tmp_path, "attention.cuh", "  s.k_row0 += first;\n", ""))


def test_cache_row_ignored(tmp_path: Path) -> None:
    old = "s.k_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;"
    with pytest.raises(AssertionError, match="max error"):
        run_layout("7.5", "splitkv", "batch_idx", altered(tmp_path, "attention.cuh", old, "s.k_batch = b;"))


def test_v_read_into_registers_before_its_copies_land(tmp_path: Path) -> None:
    """FA_V_IN_REGS (sm86's d64 backward): each warp reads its V fragments once, before the query loop,
    after the wait and the barrier that land every thread's V copies; without the barrier a warp reads
    rows another thread's cp.async has not landed yet."""
    old = "    __syncthreads();  // every thread's K and V copies have landed"
    assert tiles.default_tile("8.6", "bwd", 64).v_in_regs
    with pytest.raises(H.EmulatorError, match=r"race|before the cp.async of thread"):
        run(tmp_path, "8.6", "bwd", "bwd.cu", old, "")
