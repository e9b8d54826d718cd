"""The project's own one-line faults in kernels/csrc: the mutant gate (docs/checking.md).

Each fault is one line of the kernel sources changed the way a slip of the pen would change it, with the
smallest `fa check --emulate` selection that must catch it: one unit (on one arch) and one of its
problems (fa_attn.check.problems). tests/mutants/test_mutants.py applies each to a copy of
kernels/csrc and runs that selection, so CI runs one problem per fault; the same selection by hand:

    fa check --emulate --arch 8.0 --unit fwd_fp16_d32 --problem scale --source /path/to/altered/csrc

Three of them only the emulator that runs primitives.cuh's own inline PTX and interleaves blocks with a
global race rule can catch (a plain add where dQ needs an atomic, ex2 turned into lg2, bf16 halves
swapped): they failed, as strict xfails, until it landed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    category: str  # the code path it breaks (docs/checking.md's coverage table)
    file: str  # in kernels/csrc
    old: str  # occurs exactly once in the file
    new: str
    unit: str  # the unit of the selection (its name on `arch`)
    problem: str  # the problem of the selection
    arch: str = "8.0"

    def command(self, csrc: str = "DIR") -> str:
        """The `fa check` line that must fail on this fault (applied to a copy of kernels/csrc in DIR)."""
        return (
            f"fa check --emulate --arch {self.arch} --unit {self.unit} --problem {self.problem} "
            f"--source {csrc}"
        )


MUTANTS: tuple[Mutant, ...] = (
    # softmax_scale: the caller's scale replaced by the bucket's 1/sqrt(d)
    Mutant(
        "fwd-scale-ignored", "scale", "fwd.cu",
        "blk.logit_scale = blk.softcap ? p.softcap * kLog2e : p.scale_softmax_log2;",
        "blk.logit_scale = blk.softcap ? p.softcap * kLog2e : kLog2e / sqrtf(static_cast<float>(kHeadDim));",
        "fwd_fp16_d32", "scale",
    ),
    Mutant(
        "bwd-dk-scale-ignored", "scale", "bwd.cu",
        "const float sc = params.scale_softmax;",
        "const float sc = 1.f / sqrtf(static_cast<float>(kHeadDim));",
        "bwd_fp16_d32", "scale",
    ),
    # the sliding window
    Mutant(
        "fwd-window-left-off-by-one", "window", "softmax.cuh",
        "const int lo = band.left < 0 ? -kFar : -band.left;",
        "const int lo = band.left < 0 ? -kFar : 1 - band.left;",
        "fwd_fp16_d32", "window-left",
    ),
    Mutant(
        "bwd-window-left-off-by-one", "window", "attention.cuh",
        "(left < 0 || key >= row + diag - left);",
        "(left < 0 || key > row + diag - left);",
        "bwd_fp16_d32", "window-left",
    ),
    Mutant(
        "fwd-window-right-off-by-one", "window", "softmax.cuh",
        "const int hi = band.right < 0 ? kFar : band.right;",
        "const int hi = band.right < 0 ? kFar : band.right + 1;",
        "fwd_fp16_d32", "window-right",
    ),
    Mutant(
        "causal-diagonal-off-by-one", "causal", "attention.cuh",
        "const int right = p.is_causal ? 0 : p.window_right;",
        "const int right = p.is_causal ? 1 : p.window_right;",
        "bwd_fp16_d32", "blocks-causal",
    ),
    # softcap
    Mutant(
        "fwd-softcap-scaled-wrongly", "softcap", "fwd.cu",
        "blk.tanh_scale = blk.softcap ? p.scale_softmax / p.softcap : 0.f;",
        "blk.tanh_scale = blk.softcap ? p.scale_softmax * p.softcap : 0.f;",
        "fwd_fp16_d32", "softcap",
    ),
    Mutant(
        "bwd-softcap-derivative", "softcap", "bwd.cu",
        "dtanh = 1.f - raw * raw;",
        "dtanh = 1.f - raw;",
        "bwd_fp16_d32", "softcap",
    ),
    # padded batch > 1: another batch's rows
    Mutant(
        "bwd-batch-row-sums", "batch", "attention.cuh",
        "s.dsum_row0 = bh * p.seqlen_q_rounded;",
        "s.dsum_row0 = h * p.seqlen_q_rounded;",
        "bwd_fp16_d32", "blocks",
    ),
    Mutant(
        "fwd-batch-lse-rows", "batch", "attention.cuh",
        "s.lse_row0 = bh * p.seqlen_q;",
        "s.lse_row0 = h * p.seqlen_q;",
        "fwd_fp16_d32", "blocks",
    ),
    # split-KV: shares, query blocks x splits, the combine
    Mutant(
        "splitkv-shares-overlap", "split-kv", "fwd.cu",
        "blk.keys.end = min(blk.keys.end, (split + 1) * per);",
        "blk.keys.end = min(blk.keys.end, (split + 1) * per + 1);",
        "splitkv_fp16_d32", "blocks",
    ),
    Mutant(
        "splitkv-query-block-of-split", "split-kv", "fwd.cu",
        "const Block blk = block_of(params, blockIdx.x / splits, gridDim.x / splits, split, splits);",
        "const Block blk = block_of(params, blockIdx.x % (gridDim.x / splits), gridDim.x / splits, split, splits);",
        "splitkv_fp16_d32", "blocks",
    ),
    Mutant(
        "splitkv-combine-weights", "split-kv", "fwd.cu",
        "const float w = exp_diff(lse_s[i * s.lse_rows], lse);",
        "const float w = exp_diff(lse_s[i * s.lse_rows], mx);",
        "splitkv_fp16_d32", "blocks",
    ),
    Mutant(
        "splitkv-empty-share-weighs", "split-kv", "fwd.cu",
        "sum > 0.f ? (st.max[mt][hh] * blk.logit_scale + log2_approx(sum)) * kLn2 : -pos_inf();",
        "sum > 0.f ? (st.max[mt][hh] * blk.logit_scale + log2_approx(sum)) * kLn2 : 0.f;",
        "splitkv_fp16_d32", "splits-empty",
    ),
    # paged KV
    Mutant(
        "paged-row-in-page", "paged", "attention.cuh",
        "return base + pages[key0 / page_size] * page_stride + (key0 % page_size) * row_stride;",
        "return base + pages[key0 / page_size] * page_stride;",
        "fwd_fp16_d32", "paged128",
    ),
    Mutant(
        "paged-table-row-stride", "paged", "attention.cuh",
        "s.k_pages = p.block_table + b * p.block_table_batch_stride;",
        "s.k_pages = p.block_table + b * p.page_block_size;",
        "splitkv_fp16_d32", "paged128",
    ),
    # rows that see no key
    Mutant(
        "fwd-no-key-row-divides", "no-key rows", "fwd.cu",
        "inv[hh] = sum > 0.f ? rcp_approx(sum) : 0.f;",
        "inv[hh] = rcp_approx(sum);",
        "fwd_fp16_d32", "no-key-rows",
    ),
    Mutant(
        "fwd-no-key-row-max", "no-key rows", "softmax.cuh",
        "const float max2 = mx == -pos_inf() ? 0.f : mx * logit_scale;",
        "const float max2 = mx * logit_scale;",
        "fwd_fp16_d32", "no-key-rows",
    ),
    # head dims below the bucket
    Mutant(
        "partial-k-step-skipped", "head dim", "attention.cuh",
        "if (k0 >= k_limit) break;",
        "if (k0 + 16 > k_limit) break;",
        "fwd_fp16_d32", "hdim8",
    ),
    # the key block that crosses the sequence end: P V skips only the k steps past it
    Mutant(
        "fwd-pv-partial-key-step-skipped", "key blocks", "fwd.cu",
        "accumulate_pv(o, sc, kv.v, warp_row, seqlen_k - key0, lane);",
        "accumulate_pv(o, sc, kv.v, warp_row, (seqlen_k - key0) / 16 * 16, lane);",
        "fwd_fp16_d32", "blocks",
    ),
    Mutant(
        "load-ignores-head-dim", "head dim", "tiles.cuh",
        "const bool ok = row < valid_rows && col < valid_cols;",
        "const bool ok = row < valid_rows;",
        "bwd_fp16_d64", "hdim40",
    ),
    # GQA / MQA head mapping
    Mutant(
        "gqa-head-mapping", "gqa", "attention.cuh",
        "s.kv_head = h / (p.heads / p.heads_k);",
        "s.kv_head = h % p.heads_k;",
        "fwd_fp16_d32", "gqa4",
    ),
    # the query block an output row lands in
    Mutant(
        "fwd-lse-wrong-query-block", "query blocks", "fwd.cu",
        "const int row = blk.row0 + warp_row + mt * 16 + g + hh * 8;",
        "const int row = warp_row + mt * 16 + g + hh * 8;",
        "fwd_fp16_d32", "blocks",
    ),
    # varlen with empty sequences
    Mutant(
        "varlen-key-count", "varlen", "attention.cuh",
        "end = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];",
        "end = max(1, p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);",
        "fwd_fp16_d32", "varlen",
    ),
    Mutant(
        "bwd-varlen-row-sums-head", "varlen", "attention.cuh",
        "s.dsum_row0 = s.lse_row0;",
        "s.dsum_row0 = start;",
        "bwd_fp16_d32", "varlen",
    ),
    # the KV-cache layouts
    Mutant(
        "leftpad-first-sequence", "leftpad", "attention.cuh",
        "const int first = p.leftpad_k != nullptr ? p.leftpad_k[b] : 0;",
        "const int first = p.leftpad_k != nullptr ? p.leftpad_k[0] : 0;",
        "fwd_fp16_d32", "leftpad",
    ),
    Mutant(
        "cache-batch-idx-ignored", "cache_batch_idx", "attention.cuh",
        "s.k_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;",
        "s.k_batch = b;",
        "splitkv_fp16_d32", "cache-batch-idx",
    ),
    Mutant(
        "seqused-k-one-short", "seqused_k", "attention.cuh",
        "if (p.seqused_k != nullptr) end = p.seqused_k[b];",
        "if (p.seqused_k != nullptr) end = p.seqused_k[b] - 1;",
        "fwd_fp16_d32", "kvcache",
    ),
    # the backward's preprocess: D = rowsum(dO * O) from packed halves
    Mutant(
        "unpack-high-half", "bwd preprocess", "composed.cuh",
        "FA_DEVICE float unpack_hi(u32 v) { return elem_to_float(static_cast<u16>(v >> 16)); }",
        "FA_DEVICE float unpack_hi(u32 v) { return elem_to_float(static_cast<u16>(v >> 15)); }",
        "bwd_fp16_d32", "blocks",
    ),
    # bf16 units: the other dtype's conversion (in primitives.cuh, which only the new emulator runs)
    Mutant(
        "bf16-output-rounding", "dtype", "primitives.cuh",
        'asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));',
        'asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(lo), "f"(hi));',
        "fwd_bf16_d32", "blocks",
    ),
    # faults only an emulator that interleaves blocks / runs the real PTX can see
    Mutant(
        "dq-plain-add", "dq atomics", "bwd.cu",
        "red_add_f32(dq + dq_index(r, c, group_stride), acc[i][j][e]);",
        "dq[dq_index(r, c, group_stride)] += acc[i][j][e];",
        "bwd_fp16_d32", "blocks",
    ),
    # the backward's dQ in column passes (FA_DQ_PASSES, sm 8.0's d256): every pass adds the first slice
    Mutant(
        "bwd-dq-pass-slice", "dq passes", "bwd.cu",
        "n_base = pass * kDqCols + GridQ::col0(warp);",
        "n_base = GridQ::col0(warp);",
        "bwd_fp16_d256", "blocks",
    ),
    # dQ's adds from one pointer per lane (FA_DQ_LANE_POINTER, sm 8.6's d128): the second m-tile's rows
    # added into the first's 16-row group
    Mutant(
        "bwd-dq-lane-group", "dq passes", "bwd.cu",
        "float* at = lane_dq + i * group_stride + j * 128 + e * 32;",
        "float* at = lane_dq + j * 128 + e * 32;",
        "bwd_fp16_d128", "blocks", "8.6",
    ),
    # dS held in registers through dQ's passes (FA_DQ_HOLD_DS, sm 8.0's d256): every warp row reads the
    # first warp row's dS
    Mutant(
        "bwd-dq-held-ds-rows", "dq passes", "bwd.cu",
        "load_a_frags<GridQ, kBlockN>(ds_frags, sdS, GridQ::row0(warp), lane);",
        "load_a_frags<GridQ, kBlockN>(ds_frags, sdS, 0, lane);",
        "bwd_fp16_d256", "blocks",
    ),
    # K's fragments of S held in registers (FA_K_IN_REGS, sm 8.6's d192): every warp column scores the
    # first column's keys
    Mutant(
        "bwd-k-frags-keys", "dq passes", "bwd.cu",
        "if (kKInRegs) load_held_b(k_frags, sK, GridS::col0(warp), lane);",
        "if (kKInRegs) load_held_b(k_frags, sK, 0, lane);",
        "bwd_fp16_d192", "blocks", "8.6",
    ),
    Mutant(
        "ptx-exp2-is-log2", "primitives PTX", "primitives.cuh",
        'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));',
        'asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));',
        "fwd_fp16_d32", "blocks",
    ),
    # the sm_90a forward (hopper_fwd.cu, issue 39): wgmma, mbarrier and TMA faults, run with its tensor maps
    Mutant(  # the descriptors' swizzle disagrees with the one TMA wrote (64-byte for 128-byte rows at d64)
        "sm90a-wrong-swizzle", "sm_90a swizzle", "hopper_fwd.cu",
        "constexpr sm90::Swizzle kSwizzle = kRowBytes == 128 ? sm90::kSwizzle128B : sm90::kSwizzle64B;",
        "constexpr sm90::Swizzle kSwizzle = kRowBytes == 128 ? sm90::kSwizzle64B : sm90::kSwizzle128B;",
        "fwd_fp16_d64", "blocks", "9.0a",
    ),
    Mutant(  # S masked and softmaxed before the wgmma that writes it has retired
        "sm90a-missing-wgmma-wait", "sm_90a wgmma groups", "hopper_fwd.cu",
        "      issue_scores(s, blk, sm, wg, n, slot);\n      wgmma_wait<0>();\n",
        "      issue_scores(s, blk, sm, wg, n, slot);\n",
        "fwd_fp16_d64", "blocks", "9.0a",
    ),
    Mutant(  # the consumers wait for the other phase of a K stage: they read it before its TMA lands
        "sm90a-wrong-phase", "sm_90a mbarrier phases", "hopper_fwd.cu",
        "mbar_wait(sm.k_full(slot.stage), slot.parity);",
        "mbar_wait(sm.k_full(slot.stage), slot.parity ^ 1);",
        "fwd_fp16_d64", "blocks", "9.0a",
    ),
    Mutant(  # S = Q K^T accumulates onto the last key block's scores instead of starting from zero
        "sm90a-stale-accumulator", "sm_90a accumulators", "hopper_fwd.cu",
        "k.k_major(0, k0), k0 > 0);",
        "k.k_major(0, k0), 1);",
        "fwd_fp16_d64", "blocks", "9.0a",
    ),
    Mutant(  # the key block's index taken for its page's: right for pages of one key block only
        "sm90a-wrong-page", "sm_90a paged KV", "hopper_fwd.cu",
        "return KvCoords{key0 % blk.page_size, s.k_pages[key0 / blk.page_size]};",
        "return KvCoords{key0 % blk.page_size, s.k_pages[n]};",
        "fwd_fp16_d64", "paged256", "9.0a",
    ),
)  # fmt: skip
